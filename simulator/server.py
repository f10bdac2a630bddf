"""The live server: SGLang's HTTP API on aiohttp, driving the replica models in real time.

This module wires the parts together (simulated clock and ``LiveDriver``, one ``ReplicaModel`` per DP
replica, ``Reporter`` logs and ``PrometheusMetrics``, the ``Frontend``), serves the health, info and
control endpoints, and runs the process (signals, readiness). The generation endpoints are in
``generation.py``. Endpoint list and formats: docs/simulator.md, "Endpoints".
"""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
from collections.abc import Callable
from typing import Protocol

import numpy as np
import orjson
from aiohttp import web

from simulator.disagg.live import TRANSFER_PATH, LiveDecode, LivePrefill, live_role
from simulator.faults import FaultConf, FaultInjector, fail_start_out_of_memory, hold_readiness
from simulator.frontend import Frontend
from simulator.generation import GenerationAPI, json_response
from simulator.gpus import GPUS_PATH, gpu_rows
from simulator.lockstep import build_schedulers
from simulator.logs import LogWriter, startup_lines
from simulator.nodes import JOIN_TIMEOUT_S, NodeGroup, unless_stopped
from simulator.observer import Reporter
from simulator.prometheus import PrometheusMetrics
from simulator.sim_config import SimConfig
from simulator.timebase import LiveDriver, Simulation
from vocab.telemetry import GpuSource


class Served(Protocol):
    """What the process lifecycle needs of a server: its app, its faults, readiness, its clock."""

    app: web.Application
    faults: FaultConf
    ready: bool
    driver: LiveDriver
    ready_message: str  # logged once it is ready

    def side_ports(self) -> list[int]:
        """Ports beside the API's that other servers of a disaggregated deployment call (same app)."""
        ...

    async def close_peers(self) -> None:
        """Close the sessions it holds to other servers."""
        ...


ServerMaker = Callable[[SimConfig, asyncio.AbstractEventLoop, LogWriter], Served]

# After SIGTERM, open requests get this long to finish before their handlers are cancelled: a stalled or
# deadlocked stream (fault injection) must not hold the process for aiohttp's default 60 s.
SHUTDOWN_GRACE_S = 1.0


class SimServer:
    ready_message = "The server is fired up and ready to roll!"

    def __init__(self, cfg: SimConfig, loop: asyncio.AbstractEventLoop, log: LogWriter) -> None:
        self.cfg = cfg
        self.loop = loop
        self.log = log
        self.sim = Simulation()
        self.driver = LiveDriver(self.sim, loop, cfg.time_scale)
        log.wall = self.driver.epoch_now  # its lines stamped on its own clock, as SGLang's are
        self.replicas = build_schedulers(cfg, self.sim)
        self.metrics: PrometheusMetrics | None = None
        if cfg.args.enable_metrics:
            self.metrics = PrometheusMetrics(cfg, self.replicas, self.driver.now, lambda: self.driver.lag)
        for dp_rank, rep in enumerate(self.replicas):
            rep.observer = Reporter(cfg, log, self.metrics, dp_rank)
        self.frontend = Frontend(cfg, self.replicas, self.driver.now, loop)
        # disaggregation: the server's role takes the requests (simulator/disagg/live.py)
        self.frontend.pd = self.pd = live_role(cfg, self.sim, self.replicas, self.driver.now, loop, log)
        self.faults = FaultConf.from_args(cfg.args)
        self.generation = GenerationAPI(cfg, self.frontend,
                                        FaultInjector(self.faults, cfg, log, self.freeze_engine),
                                        self.driver.epoch)
        self.ready = False
        self.app = self._make_app()

    def side_ports(self) -> list[int]:
        """A prefill server's bootstrap port, where its decode servers ask for their KV."""
        return [self.cfg.args.disaggregation_bootstrap_port] if isinstance(self.pd, LivePrefill) else []

    async def close_peers(self) -> None:
        if isinstance(self.pd, LiveDecode):
            await self.pd.close()

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        r = app.router
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        r.add_get("/ready", self.ready_handler)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_post("/set_internal_state", self.set_internal_state)
        r.add_post("/generate", self.generation.generate)
        r.add_post("/v1/completions", self.generation.completions)
        r.add_post("/v1/chat/completions", self.generation.chat)
        r.add_get("/metrics", self.metrics_handler)
        r.add_get(GPUS_PATH, self.gpus_handler)
        if isinstance(self.pd, LivePrefill):  # served on the bootstrap port too
            r.add_post(TRANSFER_PATH, self.pd.transfer)
        return app

    def freeze_engine(self) -> None:
        """Stop the model for good (a deadlocked scheduler): no event runs again, so no token comes out;
        the HTTP side goes on accepting requests."""
        self.sim.on_schedule = None
        self.driver.stop()

    # -- health / info / control ----------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.Response(status=503)
        # As SGLang: a real 1-token generation; any output reaching the frontend after it starts counts.
        # While requests are running SGLang's scheduler answers from the next batch instead of adding the
        # probe to the load, so a prober does not change what is measured.
        fut = self.frontend.next_output()
        if not any(rep.in_flight or rep.admission.waiting or any(slot.reqs for slot in rep.slots)
                   for rep in self.replicas):
            probe = np.zeros(1, dtype=np.int64)  # SGLang's probe: input_ids [0], one new token
            self.frontend.submit([self.frontend.new_request(probe, 1, stream=False, log_metrics=False)])
        timeout = self.cfg.health_check_timeout_s
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self.log.warning(
                f"Health check failed. Server couldn't get a response from detokenizer for last "
                f"{timeout:g} seconds."
            )
            return web.Response(status=503)
        return web.Response(status=200)

    async def ready_handler(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def server_info(self, request: web.Request) -> web.Response:
        info = self.cfg.server_info()
        info["launch_command"] = " ".join([sys.executable, "-m", "simulator", *sys.argv[1:]])
        for state, rep in zip(info["internal_states"], self.replicas, strict=True):
            state["last_gen_throughput"] = rep.last_gen_throughput
            if rep.spec is not None:  # server-cumulative, as SGLang's internal state reports it
                state["avg_spec_accept_length"] = rep.spec_stats.average
            state["effective_max_running_requests_per_dp"] = rep.admission.pool_size
            state["pp_max_micro_batch_size"] = rep.admission.cap  # /set_internal_state may change it
        # Wall-clock epoch of simulated t = 0: wall = sim_wall_origin + t / sim_time_scale, and the
        # engine's own clock reads sim_wall_origin + t. With meta_info.sim_token_time a client can
        # compare each chunk's arrival to the model's schedule.
        info["sim_wall_origin"] = self.driver.wall(0.0)
        info["sim_faults"] = self.faults.active()  # injected faults (docs/simulator.md, "Fault injection")
        return json_response(info)

    async def model_info(self, request: web.Request) -> web.Response:
        cfg = self.cfg
        return json_response({
            "model_path": cfg.args.model_path,
            "served_model_name": cfg.served_model_name,
            "tokenizer_path": cfg.args.tokenizer_path or cfg.args.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": cfg.args.load_format,
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": cfg.spec.model_type,
            "architectures": [cfg.spec.architecture],
        })

    async def models(self, request: web.Request) -> web.Response:
        cfg = self.cfg
        return json_response({"object": "list", "data": [{
            "id": cfg.served_model_name, "object": "model", "created": int(cfg.startup_time),
            "owned_by": "sglang", "root": cfg.args.model_path, "parent": None,
            "max_model_len": cfg.context_len,
        }]})

    async def flush_cache(self, request: web.Request) -> web.Response:
        # SGLang 0.5.23: flushed only when every scheduler is idle; otherwise 400 at once (no timeout)
        busy = [(len(rep.admission.waiting), rep.admission.pool_used) for rep in self.replicas
                if not rep.admission.flush_cache()]
        if busy:
            queued, running = (sum(x) for x in zip(*busy, strict=True))
            self.log.warning(f"Cache not flushed because there are pending requests. #queue-req: {queued}, "
                             f"#running-req: {running}")
            return web.Response(status=400, text="Flush cache failed.\n")
        self.log.info("Cache flushed successfully!")
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there "
                                 "are running or waiting requests, the operation will not be performed.)\n")

    async def set_internal_state(self, request: web.Request) -> web.Response:
        body = await request.json(loads=orjson.loads)
        args = (body or {}).get("server_args", {})
        updated = False
        if "pp_max_micro_batch_size" in args:
            v = args["pp_max_micro_batch_size"]
            hi = max(self.cfg.max_running_requests // self.cfg.pp, 1)
            if isinstance(v, int) and 1 <= v <= hi:
                for rep in self.replicas:
                    rep.admission.cap = v
                updated = True
        cap = self.replicas[0].admission.cap
        return json_response({"updated": updated, "server_args": {"pp_max_micro_batch_size": cap}})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        if self.metrics is None:
            raise web.HTTPNotFound()
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def gpus_handler(self, request: web.Request) -> web.Response:
        """The simulated GPUs' telemetry now (``simulator/gpus.py``), whatever ``--enable-metrics`` says:
        the orchestrator samples it as it would sample NVML."""
        now = self.driver.now()
        return json_response({"source": GpuSource.SIMULATED.value, "sim_time_s": now,
                              "gpus": gpu_rows(self.cfg, self.replicas, now)})


async def _run(cfg: SimConfig, log: LogWriter, make: ServerMaker) -> int:
    loop = asyncio.get_running_loop()
    server = make(cfg, loop, log)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False,
                           shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, cfg.args.host, cfg.args.port, reuse_address=True)
    sites = [(site, cfg.args.port)]
    sites += [(web.TCPSite(runner, cfg.args.host, port, reuse_address=True), port)
              for port in server.side_ports()]
    for one, port in sites:
        try:
            await one.start()
        except OSError as e:
            print(f"OSError: cannot bind {cfg.args.host}:{port}: {e}", file=sys.stderr, flush=True)
            await runner.cleanup()
            return 1
    if server.faults.active():
        log.warning(f"Simulated faults armed: {server.faults.active()}")
    nodes = NodeGroup(cfg.args.nnodes)
    # SGLang starts one process per node, which meet at rank 0, as vLLM's multiprocessing executor does
    # (--nnodes); vLLM's one process with Ray reaches the other nodes itself
    meets = cfg.dialect == "sglang" or getattr(cfg.args, "vllm_mp_nodes", False)
    if cfg.args.nnodes > 1 and meets and not await _gather_nodes(nodes, cfg, stop, log):
        await runner.cleanup()
        return 0 if stop.is_set() else 1  # told to stop while waiting is no failure
    if await hold_readiness(server.faults, cfg.startup_time, stop, log):
        server.ready = True
        # Startup objects (config, model spec, aiohttp app) never die: keep them out of the collector's
        # full passes, which otherwise grow with them and show up as multi-ms stalls in token timing.
        gc.collect()
        gc.freeze()
        log.info(server.ready_message)
    code = await _serve_until_stopped(stop, nodes, log)
    await nodes.close()
    server.ready = False
    server.driver.stop()
    await server.close_peers()
    await runner.shutdown()
    await runner.cleanup()
    return code


async def _gather_nodes(nodes: NodeGroup, cfg: SimConfig, stop: asyncio.Event, log: LogWriter) -> bool:
    """Rank 0 of a trial across nodes: open --dist-init-addr and wait for every other rank (stopped or
    timed out: False, with the reason on stderr)."""
    address = cfg.args.dist_init_addr
    try:
        await nodes.open(address)
    except OSError as e:
        print(f"OSError: cannot open the process group at --dist-init-addr {address}: {e}", file=sys.stderr,
              flush=True)
        return False
    log.info(f"Waiting for {cfg.args.nnodes - 1} other node(s) to join at {address}")
    timeout = cfg.args.dist_timeout or JOIN_TIMEOUT_S
    gathered = await unless_stopped(asyncio.wait_for(nodes.all_in.wait(), timeout), stop)
    if gathered is not None and gathered.exception() is None:  # its exception: the timeout
        log.info(f"All {cfg.args.nnodes} nodes joined the process group")
        return True
    await nodes.close()
    if not stop.is_set():
        print(f"RuntimeError: {len(nodes.joined)} of {cfg.args.nnodes - 1} other node(s) joined at {address} "
              f"within {timeout:g} s (--dist-timeout)", file=sys.stderr, flush=True)
    return False


async def _serve_until_stopped(stop: asyncio.Event, nodes: NodeGroup, log: LogWriter) -> int:
    """0 when told to stop; 1 when a node of a trial across nodes went away (its collectives broke)."""
    if await unless_stopped(nodes.lost.wait(), stop) is None:
        return 0
    print(f"RuntimeError: node rank {nodes.lost_rank} of {nodes.nnodes} left the process group; the "
          "collectives across nodes cannot go on", file=sys.stderr, flush=True)
    return 1


def serve(cfg: SimConfig, log: LogWriter | None = None, make: ServerMaker = SimServer,
          startup: Callable[[SimConfig, LogWriter], None] = startup_lines) -> int:
    """Serve until SIGTERM/SIGINT: SGLang's server by default; another engine's where ``log``, ``make`` and
    ``startup`` are its log format, its server (the same parts behind its own routes) and its start-up
    lines (``simulator/vllm/server.py``)."""
    log = log or LogWriter(cfg.args.log_level)
    if FaultConf.from_args(cfg.args).oom_at_start:
        return fail_start_out_of_memory(cfg, log)
    startup(cfg, log)
    runner: Callable = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a declared dependency on Linux
        pass
    try:
        return runner(_run(cfg, log, make))
    except KeyboardInterrupt:
        return 0
    finally:
        sys.stdout.flush()
