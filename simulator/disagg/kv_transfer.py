"""How long a request's KV takes from a prefill server to a decode server.

Each GPU of the prefill server sends what its peers on the decode server need of the layers it holds;
each GPU of the decode server receives what it holds. With the same layout on both sides a prompt token
moves its KV share per GPU: GQA's K and V of the GPU's KV heads (replicated when there are fewer KV heads
than TP ranks), MLA's latent vector whole on every attention-TP rank (SGLang keeps it replicated, so every
rank sends a copy). A decode side with more TP ranks than the prefill side makes each prefill GPU serve
several decode GPUs (SGLang 0.5.10 and later map ranks at run time); the GPU that moves the most bytes
sets the time. The GPUs move their shares side by side, each over its own link.

A transfer's time is its bytes per GPU over the path's bandwidth per GPU (the GPUs' link when both servers
share a node, the hardware profile's network across nodes) plus one message latency of that path (the
backend's fixed cost: the RDMA write's completion and the status message behind it). The backends that
move KV (mooncake, nixl, mooncake_tcp) are not told apart; ``fake`` moves nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulator.sim_config import SimConfig
from simulator.timebase import Simulation


@dataclass(frozen=True)
class KVSide:
    """What one GPU of a server holds of a token's KV: its TP size, the most layers any of its GPUs holds,
    and the bytes per layer (what a decode server tells its prefill server at the bootstrap)."""

    tp: int
    layers: int
    per_layer: float

    @classmethod
    def of(cls, cfg: SimConfig) -> KVSide:
        """A server's side; with attention DP, one rank's: a request's KV lives on its rank's GPUs."""
        cost = cfg.lockstep.rank_cost if cfg.lockstep is not None else cfg.cost
        st = cost.stages[0]
        return cls(cfg.rank_tp, max(s.layers for s in cost.stages), st.kv_bytes_per_token / st.layers)


def bytes_per_token(prefill: KVSide, decode: KVSide) -> float:
    """KV bytes per prompt token that the busiest GPU of the pair moves (sends or receives)."""
    fan_out = max(1.0, decode.tp / prefill.tp)  # decode GPUs each prefill GPU serves
    send = prefill.layers * max(prefill.per_layer, fan_out * decode.per_layer)
    return max(send, decode.layers * decode.per_layer)


@dataclass(frozen=True)
class Path:
    """Where a transfer goes: bandwidth per GPU (bytes/s) and one message's latency (s)."""

    bandwidth: float
    latency: float


def path_between(cfg: SimConfig, same_node: bool) -> Path:
    """The path from a prefill server's GPUs to a decode server's: the node's GPU link, or the network."""
    hw = cfg.hw
    if same_node:
        return Path(hw.link_bw_gbs * 1e9, hw.link_latency_us * 1e-6)
    return Path(hw.internode_bw_gbs * 1e9, hw.internode_latency_us * 1e-6)


class Link:
    """One server's GPU links, one transfer after another (first come, first served). A transfer holds
    the sender's link and the receiver's together; it starts when both are free."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.free_at = 0.0


def send(sim: Simulation, sender: Link, receiver: Link, nbytes: float, path: Path,
         done: Callable[[float], None] | None) -> float:
    """Queue ``nbytes`` (per GPU) from ``sender`` to ``receiver`` over ``path``; ``done(end)`` at the end.
    Returns when it ends."""
    start = max(sim.now, sender.free_at, receiver.free_at)
    end = start + nbytes / path.bandwidth + path.latency
    sender.free_at = receiver.free_at = end
    if done is not None:
        sim.schedule(end, done, end)
    return end
