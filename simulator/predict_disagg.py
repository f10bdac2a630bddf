"""Predictions of a disaggregated deployment (``simulator/disagg/``): its prefill and decode servers on
one virtual clock, driven by the same virtual client as any prediction (``simulator/predict.py``), with
the telemetry a disaggregated trial records.

Per point, beside the client's metrics: each GPU's busy fraction, power and energy (prefill servers'
GPUs first, as ``vocab.hardware.place_servers`` places them), each role's mean GPU utilisation, and the
KV each request moved per GPU. The TTFT's parts (bootstrap wait, prefill queue, prefill compute, KV
transfer, decode's first step) go into each request's record, as a live decode server reports them, and
``workloads.summarize`` averages them over the window as it does for a live trial.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.disagg.deployment import Deployment
from simulator.entities import Request
from simulator.gpus import energy_j, mem_used_bytes
from simulator.predict import (
    CLIENT_SEND_SPACING_S,
    VirtualTrial,
    gpu_summaries,
    load_config,
    run_points,
)
from simulator.sim_config import SimConfig
from simulator.vllm.disagg import VLLMDeployment
from vocab.load import LoadPoint, RequestSpec
from vocab.records import PointResult, RequestRecord
from vocab.telemetry import (
    ENERGY_J,
    J_PER_TOKEN,
    MEM_USED_MAX,
    PD_DECODE_UTIL,
    PD_PREFILL_UTIL,
    PD_TRANSFER_MB,
)


class VirtualPDTrial(VirtualTrial):
    """A disaggregated deployment on one virtual clock; load points run one after another."""

    # not super's __init__: that builds one engine
    def __init__(self, deployment: Deployment | VLLMDeployment) -> None:
        self.deployment = deployment
        self._submitted: list[Request] = []
        # the client's request seeds come from decode server 0's config, as its stream is the client's
        self._begin(deployment.decodes[0].replica.cfg, deployment.sim, deployment.replicas)

    def _dispatch(self, req: Request, prompt: np.ndarray) -> None:
        """``req`` to the prefill and decode servers the router pairs."""
        self.deployment.submit(req, prompt)
        self._submitted.append(req)

    def _reset_point(self) -> None:
        super()._reset_point()
        self._submitted = []

    def _telemetry(self, records: list[RequestRecord], output_tokens: float,
                   steady: bool, ranks: dict[int, int] | None = None) -> dict[str, float]:
        dep = self.deployment
        configs: list[SimConfig] = [rep.cfg for rep in self.replicas]
        out: dict[str, float] = {
            "sim_peak_running_reqs": float(max(r.replica.admission.peak_pool_used for r in dep.decodes)),
            MEM_USED_MAX: max(mem_used_bytes(c, s) for c in configs for s in range(c.pp)) / 2**30,
        }
        window = self._window(steady, out)
        if window is None:
            return out
        start, end, busy_by_stage = window
        width = end - start
        # each server's GPUs in placement order: every TP rank of a stage has the stage's busy time
        fractions: dict[int, float] = {}
        role_util: dict[str, list[float]] = {"prefill": [], "decode": []}
        energy = 0.0
        for r, cfg in enumerate(configs):
            role = "prefill" if r < len(dep.prefills) else "decode"
            for _ in range(cfg.dp):
                for s in range(cfg.pp):
                    busy = busy_by_stage[r, s]
                    for _ in range(cfg.rank_tp):  # an attention-DP rank's own GPUs
                        fractions[len(fractions)] = busy / width
                        role_util[role].append(busy / width)
                        energy += energy_j(cfg.hw, width, busy)
        out.update(gpu_summaries(configs[-1].hw, fractions))  # every server runs on the profile's GPUs
        out[PD_PREFILL_UTIL] = 100.0 * float(np.mean(role_util["prefill"])) if role_util["prefill"] else 0.0
        out[PD_DECODE_UTIL] = 100.0 * float(np.mean(role_util["decode"]))
        out[ENERGY_J] = energy
        if output_tokens > 0:
            out[J_PER_TOKEN] = energy / output_tokens
        out.update(self._queue_and_running(records, start, end))
        out.update(self._transfer(start, end))
        return out

    def _slots(self) -> int:
        """A request's wait runs to its prefill (``server_queue_s``), its run over the decode servers'
        slots."""
        return sum(d.replica.num_slots * d.replica.cfg.dp for d in self.deployment.decodes)

    def _transfer(self, start: float, end: float) -> dict[str, float]:
        """The KV each request that arrived in the window moved, per GPU (MB)."""
        moved = [r.pd.transfer_bytes for r in self._submitted if r.pd is not None and r.pd.first_token >= 0
                 and start <= r.pd.arrival <= end]
        return {PD_TRANSFER_MB: float(np.mean(moved)) / 1e6} if moved else {}


@dataclass(frozen=True)
class PDLayout:
    """A disaggregated deployment's servers, configured once (each role's flags resolved); ``build``
    makes a fresh deployment of them for each point."""

    prefill: SimConfig | None  # None: the fake backend's decode servers alone
    decode: SimConfig
    prefill_workers: int
    decode_workers: int
    policy: str = "round_robin"

    def build(self) -> Deployment | VLLMDeployment:
        args = self.decode.args
        prefill = [self.prefill] * self.prefill_workers if self.prefill is not None else []
        if self.decode.dialect == "vllm":  # vllm-router's sequence and NIXL's reads
            return VLLMDeployment(prefill, [self.decode] * self.decode_workers, policy=self.policy,
                                  seed=self.decode.random_seed)
        return Deployment(prefill, [self.decode] * self.decode_workers, policy=self.policy,
                          seed=self.decode.random_seed, reserved_tokens=args.num_reserved_decode_tokens,
                          moves_kv=args.disaggregation_transfer_backend != "fake")

    def fresh(self) -> VirtualPDTrial:
        return VirtualPDTrial(self.build())


def load_layout(prefill_argv: list[str], decode_argv: list[str], prefill_workers: int, decode_workers: int,
                policy: str = "round_robin") -> PDLayout:
    """The layout the servers' command lines describe (each role's flags, as its live servers get them).
    Raises ``ValueError`` as ``load_config`` does."""
    prefill = load_config(prefill_argv) if prefill_workers > 0 else None
    return PDLayout(prefill, load_config(decode_argv), prefill_workers, decode_workers, policy)


def predict_pd_trial(prefill_argv: list[str], decode_argv: list[str], prefill_workers: int,
                     decode_workers: int, points: list[LoadPoint], spec: RequestSpec,
                     policy: str = "round_robin",
                     send_spacing_s: float = CLIENT_SEND_SPACING_S) -> list[PointResult]:
    """Every point of a disaggregated trial, each on a fresh deployment, in order on one virtual clock (as
    ``predict_trial`` runs one engine's)."""
    layout = load_layout(prefill_argv, decode_argv, prefill_workers, decode_workers, policy)
    return run_points(layout.fresh, points, spec, send_spacing_s)
