"""A disaggregated deployment on one virtual clock: its prefill and decode servers, where each sits, and
the router's choice of a pair for each request. Predictions run this; the live servers run one role each.

Servers take the GPUs of the hardware profile's nodes in order, prefill servers first, each within one
node (``vocab.hardware.place_servers``): that decides which pairs share a node and which send their KV
over the network.

A server with attention DP has one role per rank, its ranks in lockstep (``simulator/lockstep.py``): a
prefill server takes a request on the rank its room names (SGLang's ``follow_bootstrap_room``: room
modulo the ranks), a decode server deals its requests to its ranks in turn.
"""

from __future__ import annotations

import random

import numpy as np

from simulator.disagg.decode_role import DecodeRole
from simulator.disagg.kv_transfer import KVSide, Path, bytes_per_token, path_between
from simulator.disagg.prefill_role import PrefillRole, Transfer
from simulator.entities import PDTimes, Request
from simulator.lockstep import build_schedulers
from simulator.replica import ReplicaModel
from simulator.sim_config import SimConfig
from simulator.timebase import Simulation
from vocab.hardware import place_servers
from vocab.model import DEFAULT_RESERVED_DECODE_TOKENS, PD_POLICIES


def world(cfg: SimConfig) -> int:
    return cfg.tp * cfg.pp * cfg.dp


class Deployment:
    """Prefill and decode servers on one clock, each pair's path and bytes per token, the router's pairing."""

    def __init__(self, prefill: list[SimConfig], decode: list[SimConfig], policy: str = "round_robin",
                 seed: int = 0, reserved_tokens: int = DEFAULT_RESERVED_DECODE_TOKENS,
                 moves_kv: bool = True, sim: Simulation | None = None) -> None:
        if policy not in PD_POLICIES:
            raise ValueError(f"policy must be one of {', '.join(PD_POLICIES)}, got {policy!r}")
        self.sim = sim if sim is not None else Simulation()
        configs = [*prefill, *decode]
        self.nodes = place_servers([world(c) for c in configs], configs[0].hw.num_gpus)
        if self.nodes[-1] >= configs[0].hw.nodes:
            raise ValueError(f"the deployment's servers take {self.nodes[-1] + 1} nodes; hardware "
                             f"{configs[0].hw.name} has {configs[0].hw.nodes}")
        # each server's roles, one per attention-DP rank (one without attention DP)
        self.prefill_ranks = [[PrefillRole(c, self.sim, replica=r) for r in build_schedulers(c, self.sim)]
                              for c in prefill]
        self.decode_ranks = [[DecodeRole(c, self.sim, reserved_tokens=reserved_tokens, replica=r)
                              for r in build_schedulers(c, self.sim)] for c in decode]
        self.prefills = [role for ranks in self.prefill_ranks for role in ranks]
        self.decodes = [role for ranks in self.decode_ranks for role in ranks]
        self._dealt = [0] * len(decode)  # each decode server's next rank
        n_p = len(prefill)
        self.paths: list[list[Path]] = [[path_between(p, self.nodes[i] == self.nodes[n_p + j]) for j in
                                         range(len(decode))] for i, p in enumerate(prefill)]
        self.per_token = [[bytes_per_token(KVSide.of(p), KVSide.of(d)) if moves_kv else 0.0 for d in decode]
                          for p in prefill]
        self.policy = policy
        self._rng = random.Random(seed)
        self._next = 0
        self._room = 0  # SGLang's bootstrap_room: the id both servers know the request by

    @property
    def replicas(self) -> list[ReplicaModel]:
        """Every server's replica models (its ranks'), prefill servers first."""
        return [r.replica for r in (*self.prefills, *self.decodes)]

    def pick(self) -> tuple[int, int]:
        """The prefill and decode server of the next request (each policy applied to each role)."""
        n_p, n_d = max(1, len(self.prefill_ranks)), len(self.decode_ranks)
        if self.policy == "random":
            return self._rng.randrange(n_p), self._rng.randrange(n_d)
        k = self._next
        self._next += 1
        return k % n_p, k % n_d

    def _decode_rank(self, j: int) -> DecodeRole:
        ranks = self.decode_ranks[j]
        self._dealt[j] += 1
        return ranks[(self._dealt[j] - 1) % len(ranks)]

    def submit(self, req: Request, prompt: np.ndarray | None) -> None:
        """``req`` (what the client sees: the decode server's stream) and its prefill twin, sent to the
        pair the router picks at once."""
        req.pd = PDTimes(arrival=self.sim.now)
        if not self.prefills:  # the fake backend: a decode server alone, its KV garbage and instant
            decode = self._decode_rank(self.pick()[1])
            decode.submit(req, decode.fake_arrived)
            return
        i, j = self.pick()
        self._room += 1
        room = self._room
        ranks = self.prefill_ranks[i]
        prefill, decode = ranks[room % len(ranks)], self._decode_rank(j)
        twin = Request(f"{req.rid}-prefill", req.input_len, 1, req.token_seed, stream=False,
                       log_metrics=False, prompt=prompt)
        path, per_token = self.paths[i][j], self.per_token[i][j]

        def preallocated(r: Request) -> None:
            prefill.bootstrapped(room, Transfer(decode.link, path, per_token,
                                                lambda tok, times: decode.kv_arrived(r, tok, times)))

        decode.submit(req, preallocated)
        prefill.submit(twin, room)
