"""A live simulated server in one role of a disaggregated deployment, beside its peers in other processes.

The router (``smg`` in PD mode) sends each request to a prefill and a decode server at once, with the
prefill server's host, bootstrap port and a room number that both use for it. The two servers then
exchange what SGLang's transfer engine exchanges, over the prefill server's bootstrap port:

* the decode server, once it has pre-allocated the request's KV, POSTs to ``TRANSFER_PATH`` on the prefill
  server's bootstrap port: the room, its node, and what each of its GPUs holds of a token's KV
  (``KVSide``) so that the prefill server can price the transfer;
* the prefill server answers when the request's KV has all arrived (its model's time: chunks sent after
  their forwards over the path between the two nodes), with the first token it sampled and how long the
  request queued, prefilled and transferred there.

Each process runs its own clock, so the answer carries durations. The decode server places them after its
own pre-allocation; the messages' own travel time lands in the transfer's part of the TTFT, as it would on
real servers. A request without bootstrap fields (the health probe, SGLang's warm-up host ``2.2.2.2``) is
served as SGLang's fake transfer serves it: decode gets it at once with a made-up first token, prefill
computes it and sends nothing.

A server with attention DP plays its role on every rank: a prefill server on the rank the room names
(room modulo the ranks, SGLang's ``follow_bootstrap_room``), for the router's request and the decode
server's bootstrap call alike; a decode server deals its requests to its ranks in turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from simulator.disagg.decode_role import DecodeRole
from simulator.disagg.kv_transfer import KVSide, Link, Path, bytes_per_token, path_between
from simulator.disagg.peer import PeerClient
from simulator.disagg.prefill_role import PrefillRole, Transfer
from simulator.entities import PDTimes, Request
from simulator.logs import LogWriter
from simulator.replica import ReplicaModel
from simulator.sim_config import SimConfig
from simulator.timebase import Simulation

TRANSFER_PATH = "/sim/kv_transfer"
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's warm-up and health-check requests carry this host
_NOWHERE = Path(math.inf, 0.0)  # a fake transfer: nothing moves


@dataclasses.dataclass(frozen=True)
class Bootstrap:
    """The fields the router adds to a request in PD mode."""

    host: str | None
    port: int | None
    room: int | None

    @classmethod
    def of(cls, body: dict[str, Any]) -> Bootstrap | None:
        """The request body's bootstrap fields; None when it has none (a request sent to a server
        directly)."""
        host, room = body.get("bootstrap_host"), body.get("bootstrap_room")
        if host is None and room is None:
            return None
        port = body.get("bootstrap_port")
        return cls(host, int(port) if port is not None else None, int(room) if room is not None else None)

    @property
    def fake(self) -> bool:
        return self.host in (None, FAKE_BOOTSTRAP_HOST) or self.room is None


class LivePrefill:
    """The prefill server's side: requests from the router, and the decode servers' bootstrap calls."""

    def __init__(self, cfg: SimConfig, sim: Simulation, replicas: list[ReplicaModel],
                 now: Callable[[], float], loop: asyncio.AbstractEventLoop) -> None:
        self.cfg, self.sim, self.now, self.loop = cfg, sim, now, loop
        self.roles = [PrefillRole(cfg, sim, replica=r) for r in replicas]
        self.side = KVSide.of(cfg)
        self.moves_kv = cfg.args.disaggregation_transfer_backend != "fake"
        self.receivers: dict[str, Link] = {}  # each decode server's link, as this server's transfers use it
        self._fake_room = 0

    def submit(self, req: Request, bootstrap: Bootstrap | None) -> None:
        if bootstrap is None or bootstrap.fake:
            self._fake_room -= 1  # rooms the router never uses
            room = self._fake_room
            role = self._rank(room)
            self.sim.schedule(self.now(), role.submit, req, room)
            self.sim.schedule(self.now(), role.bootstrapped, room,
                              Transfer(Link(self.sim), _NOWHERE, 0.0, lambda tok, times: None, fake=True))
            return
        assert bootstrap.room is not None
        self.sim.schedule(self.now(), self._rank(bootstrap.room).submit, req, bootstrap.room)

    def _rank(self, room: int) -> PrefillRole:
        return self.roles[room % len(self.roles)]

    async def transfer(self, request: web.Request) -> web.Response:
        """``POST TRANSFER_PATH`` from a decode server: answered when the room's KV has arrived."""
        body = await request.json(loads=orjson.loads)
        room, node, peer = int(body["room"]), int(body["node"]), str(body["peer"])
        decode = KVSide(**body["kv"])
        done: asyncio.Future = self.loop.create_future()

        def arrived(token: int, times: PDTimes) -> None:
            if not done.done():
                done.set_result((token, times))

        receiver = self.receivers.setdefault(peer, Link(self.sim))
        per_token = bytes_per_token(self.side, decode) if self.moves_kv else 0.0
        path = path_between(self.cfg, node == self.cfg.args.sim_pd_node)
        transfer = Transfer(receiver, path, per_token, arrived)
        transfer.times.preallocated = self.now()
        self.sim.schedule(self.now(), self._rank(room).bootstrapped, room, transfer)
        token, t = await done
        return web.json_response({
            "first_token": token,
            "prefill_queue_s": t.prefill_start - max(t.arrival, t.preallocated),
            "prefill_s": t.prefill_end - t.prefill_start,
            "transfer_s": t.transferred - t.prefill_end,
            "transfer_bytes": t.transfer_bytes,
        })


class LiveDecode:
    """The decode server's side: requests from the router, each pre-allocated here and its KV fetched
    from the prefill server the router named."""

    def __init__(self, cfg: SimConfig, sim: Simulation, replicas: list[ReplicaModel],
                 now: Callable[[], float], loop: asyncio.AbstractEventLoop, log: LogWriter) -> None:
        self.cfg, self.sim, self.now, self.loop, self.log = cfg, sim, now, loop, log
        self.roles = [DecodeRole(cfg, sim, replica=r, reserved_tokens=cfg.args.num_reserved_decode_tokens)
                      for r in replicas]
        self._dealt = 0
        self.kv = dataclasses.asdict(KVSide.of(cfg))
        self.peer = f"{cfg.args.host}:{cfg.args.port}"
        self.client = PeerClient(loop)

    def submit(self, req: Request, bootstrap: Bootstrap | None) -> None:
        role = self.roles[self._dealt % len(self.roles)]  # the ranks in turn
        self._dealt += 1
        if bootstrap is None or bootstrap.fake:
            self.sim.schedule(self.now(), role.submit, req, role.fake_arrived)
            return
        port = bootstrap.port if bootstrap.port is not None else self.cfg.args.disaggregation_bootstrap_port
        room = int(bootstrap.room or 0)
        self.sim.schedule(self.now(), role.submit, req,
                          lambda r: self._fetch_soon(role, r, str(bootstrap.host), port, room))

    def _fetch_soon(self, role: DecodeRole, req: Request, host: str, port: int, room: int) -> None:
        self.client.spawn(self._fetch(role, req, host, port, room, self.sim.now))

    async def _fetch(self, role: DecodeRole, req: Request, host: str, port: int, room: int,
                     preallocated: float) -> None:
        body = {"room": room, "node": self.cfg.args.sim_pd_node, "peer": self.peer, "kv": self.kv}
        try:
            data = await self.client.post(f"http://{host}:{port}{TRANSFER_PATH}", body)
        except (aiohttp.ClientError, OSError, ValueError) as e:
            self.log.error(f"Decode transfer failed for request rank=0 req.rid={req.rid} "
                           f"req.bootstrap_room={room} with exception {e}")
            self.sim.schedule(self.now(), role.fail, req, f"KV transfer from {host}:{port} failed: {e}")
            return
        now = self.now()
        start = preallocated + data["prefill_queue_s"]
        times = PDTimes(prefill_start=start, prefill_end=start + data["prefill_s"], transferred=now,
                        transfer_bytes=data["transfer_bytes"])
        self.sim.schedule(now, role.kv_arrived, req, int(data["first_token"]), times)

    async def close(self) -> None:
        await self.client.close()


def live_role(cfg: SimConfig, sim: Simulation, replicas: list[ReplicaModel], now: Callable[[], float],
              loop: asyncio.AbstractEventLoop, log: LogWriter) -> LivePrefill | LiveDecode | None:
    """The server's role (``--disaggregation-mode``) on each of its ranks; None for a server that does
    both."""
    mode = cfg.args.disaggregation_mode
    if mode == "prefill":
        return LivePrefill(cfg, sim, replicas, now, loop)
    if mode == "decode":
        return LiveDecode(cfg, sim, replicas, now, loop, log)
    return None
