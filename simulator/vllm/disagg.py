"""A disaggregated vLLM deployment on one virtual clock (predictions): prefill and decode servers behind
vllm-router in PD mode, each request's KV read by its decode server over NIXL (``nixl.py`` has the flow as
the live servers play it).

Per request, as vllm-router sends it: the pair of servers by the policy (``round_robin`` or ``random``,
each role on its own), then the prefill server computes the prompt and one token (its request's answer
goes back to the router), then the decode server gets the request: it takes KV for the prompt when its
scheduler has room, reads it from the prefill server (the prompt's KV per GPU over the path between their
nodes, one read after another on each server's links), computes the last prompt token and decodes. The
request's TTFT parts: the prefill server's queue and compute, then "transfer" from the prefill's end to
the KV's arrival (the router's hop, the decode server's wait for room and the read), then the decode
server's first step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from simulator.disagg.kv_transfer import KVSide, Link, Path, bytes_per_token, path_between
from simulator.entities import KVPull, PDTimes, Request
from simulator.lockstep import build_schedulers
from simulator.sim_config import SimConfig
from simulator.timebase import Simulation
from simulator.vllm.nixl import HeldKV
from simulator.vllm.scheduler import VLLMReplica
from vocab.hardware import place_servers
from vocab.model import PD_POLICIES


@dataclass
class EngineCore:
    """One engine core of a server in the deployment (a DP rank, or the server itself)."""

    replica: VLLMReplica


class VLLMDeployment:
    """Prefill and decode vLLM servers on one clock, each pair's path and bytes per token, the router's
    pairing; the same interface as SGLang's ``simulator.disagg.deployment.Deployment``."""

    def __init__(self, prefill: list[SimConfig], decode: list[SimConfig], policy: str = "round_robin",
                 seed: int = 0) -> None:
        if policy not in PD_POLICIES:
            raise ValueError(f"policy must be one of {', '.join(PD_POLICIES)}, got {policy!r}")
        if not prefill:
            raise ValueError("a disaggregated vLLM deployment needs at least one prefill server")
        self.sim = Simulation()
        configs = [*prefill, *decode]
        nodes = place_servers([c.tp * c.pp * c.dp for c in configs], configs[0].hw.num_gpus)
        if nodes[-1] >= configs[0].hw.nodes:
            raise ValueError(f"the deployment's servers take {nodes[-1] + 1} nodes; hardware "
                             f"{configs[0].hw.name} has {configs[0].hw.nodes}")
        self.prefill_cores = [self._cores(c) for c in prefill]
        self.decode_cores = [self._cores(c) for c in decode]
        self.prefills = [core for cores in self.prefill_cores for core in cores]
        self.decodes = [core for cores in self.decode_cores for core in cores]
        self.held = [HeldKV(self.sim, [c.replica for c in cores], timeout_s=None)
                     for cores in self.prefill_cores]
        self.links = [Link(self.sim) for _ in decode]  # each decode server's GPU links
        n_p = len(prefill)
        self.paths: list[list[Path]] = [[path_between(p, nodes[i] == nodes[n_p + j])
                                         for j in range(len(decode))] for i, p in enumerate(prefill)]
        self.per_token = [[bytes_per_token(KVSide.of(p), KVSide.of(d)) for d in decode] for p in prefill]
        self.hop = decode[0].cost.p.request_path_us * 1e-6  # the router's request to the decode server
        self.policy = policy
        self._rng = random.Random(seed)
        self._next = [0, 0]

    def _cores(self, cfg: SimConfig) -> list[EngineCore]:
        return [EngineCore(r) for r in build_schedulers(cfg, self.sim, VLLMReplica)]  # type: ignore[misc]

    @property
    def replicas(self) -> list[VLLMReplica]:
        """Every server's engine cores, prefill servers first."""
        return [c.replica for c in (*self.prefills, *self.decodes)]

    def _pick(self, role: int, count: int) -> int:
        if self.policy == "random":
            return self._rng.randrange(count)
        k = self._next[role]
        self._next[role] += 1
        return k % count

    @staticmethod
    def _least_loaded(cores: list[EngineCore]) -> VLLMReplica:
        """The engine core vLLM's API server gives a request: the one holding the fewest."""
        return min((c.replica for c in cores), key=lambda r: r.load)

    def submit(self, req: Request, prompt: np.ndarray | None) -> None:
        """``req`` (what the client sees: the decode server's stream) through the router: its prefill twin
        now, itself to the decode server once the twin has finished."""
        now = self.sim.now
        req.pd = PDTimes(arrival=now, preallocated=now)  # vLLM has no bootstrap wait
        i, j = self._pick(0, len(self.prefill_cores)), self._pick(1, len(self.decode_cores))
        prefill = self._least_loaded(self.prefill_cores[i])
        twin = Request(f"{req.rid}-prefill", req.input_len, 1, req.token_seed, stream=False,
                       log_metrics=False, prompt=prompt)
        held = self.held[i]

        def answered(_: Request) -> None:  # the prefill's answer is out: the router sends the decode request
            decode = self._least_loaded(self.decode_cores[j])

            def read(r: Request, tokens: int) -> None:
                nbytes = tokens * self.per_token[i][j]

                def arrived(end: float) -> None:
                    assert r.pd is not None
                    r.pd.prefill_start, r.pd.prefill_end = twin.forward_entry, twin.first_token_time
                    r.pd.transferred, r.pd.transfer_bytes = end, nbytes
                    decode.remote_kv_in(r)

                held.read(twin.rid, self.links[j], nbytes, self.paths[i][j], arrived)

            req.remote = KVPull(read)
            req.forward_entry = twin.forward_entry  # its queueing ended when the prefill server took it
            decode.submit(req, self.sim.now + self.hop)

        twin.remote = held.hold(twin.rid, then=answered)
        prefill.submit(twin, now)
