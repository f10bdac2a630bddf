"""The live server playing vLLM: the simulator's engine parts (clock, replica models, the frontend, the
generation endpoints, faults) behind vLLM's routes, with vLLM's metrics, log lines and start-up lines.

Routes: ``/health`` (200 once ready: vLLM checks the engine core is alive, it runs no generation),
``/v1/models``, ``/version``, ``/metrics``, ``/v1/completions``, ``/v1/chat/completions`` and
``/reset_prefix_cache`` (a development endpoint of vLLM's, served where ``VLLM_SERVER_DEV_MODE=1``); no
``/generate`` and no ``/server_info``. The simulator's own: ``/parasweep_sim/gpus`` (the simulated GPUs)
and ``/parasweep_sim/info`` (what it plays, on which clock).
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web

from simulator import __version__
from simulator.faults import FaultConf, FaultInjector
from simulator.frontend import Frontend
from simulator.generation import GenerationAPI, json_response
from simulator.gpus import GPUS_PATH, SIM_INFO_PATH, gpu_rows
from simulator.lockstep import build_schedulers
from simulator.logs import LogWriter
from simulator.server import serve as serve_engine
from simulator.sim_config import SimConfig
from simulator.timebase import LiveDriver, Simulation
from simulator.vllm.info import played_info
from simulator.vllm.logs import VLLMLogWriter
from simulator.vllm.metrics import VLLMMetrics
from simulator.vllm.nixl import READ_PATH, side_channel
from simulator.vllm.nixl_live import LiveNixl
from simulator.vllm.reporter import STATS_INTERVAL_S, StatsLine, VLLMReporter
from simulator.vllm.scheduler import VLLMReplica
from vocab.telemetry import GpuSource


class VLLMServer:
    ready_message = "Application startup complete."

    def __init__(self, cfg: SimConfig, loop: asyncio.AbstractEventLoop, log: LogWriter) -> None:
        self.cfg, self.loop, self.log = cfg, loop, log
        self.sim = Simulation()
        self.driver = LiveDriver(self.sim, loop, cfg.time_scale)
        log.wall = self.driver.epoch_now
        self.replicas: list[VLLMReplica] = build_schedulers(cfg, self.sim, VLLMReplica)  # type: ignore[assignment]
        self.metrics = VLLMMetrics(cfg.served_model_name, self.replicas, cfg.context_len)
        self.stats: list[StatsLine] = []
        for engine, rep in enumerate(self.replicas):
            reporter = VLLMReporter(self.metrics, engine)
            rep.observer = reporter
            rep.step_hook = reporter.on_step
            self.stats.append(StatsLine(rep, reporter, engine, cfg.args.vllm_release, log))
        self.frontend = Frontend(cfg, self.replicas, self.driver.now, loop)  # type: ignore[arg-type]
        # --kv-transfer-config: this server's NIXL connector (both roles, per request)
        self.nixl = (
            LiveNixl(cfg, self.sim, self.replicas, self.driver.now, loop, log, self.metrics.with_nixl())
            if cfg.args.vllm_kv_transfer is not None else None)
        self.faults = FaultConf.from_args(cfg.args)
        self.generation = GenerationAPI(
            cfg, self.frontend, FaultInjector(self.faults, cfg, log, self.freeze_engine), self.driver.epoch,
            self.nixl,
        )
        self.ready = False
        self.app = self._make_app()
        if cfg.args.log_stats:
            self._stats_task = loop.create_task(self._log_stats())

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/v1/models", self.models)
        r.add_get("/version", self.version)
        r.add_get("/metrics", self.metrics_handler)
        r.add_post("/v1/completions", self.generation.completions)
        r.add_post("/v1/chat/completions", self.generation.chat)
        r.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        r.add_get(GPUS_PATH, self.gpus_handler)
        r.add_get(SIM_INFO_PATH, self.sim_info)
        if self.nixl is not None:  # served on the side channel's port too
            r.add_post(READ_PATH, self.nixl.read_handler)
        return app

    def side_ports(self) -> list[int]:
        """The NIXL side channel, where decode servers read this server's KV."""
        return [self.nixl.port] if self.nixl is not None else []

    async def close_peers(self) -> None:
        if self.nixl is not None:
            await self.nixl.close()

    def freeze_engine(self) -> None:
        """A deadlocked engine core: no step runs again; the API server goes on answering."""
        self.sim.on_schedule = None
        self.driver.stop()

    async def _log_stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_INTERVAL_S / self.cfg.time_scale)
            if self.ready:
                now = self.driver.now()
                for line in self.stats:
                    line.tick(now)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def models(self, request: web.Request) -> web.Response:
        cfg = self.cfg
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": cfg.served_model_name,
                        "object": "model",
                        "created": int(cfg.startup_time),
                        "owned_by": "vllm",
                        "root": cfg.args.model_path,
                        "parent": None,
                        "max_model_len": cfg.context_len,
                        "permission": [],
                    }
                ],
            }
        )

    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": self.cfg.args.vllm_release})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return web.Response(
            body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        # vLLM answers 200 either way; the cache is reset only where no request holds any of it
        if not all(rep.admission.flush_cache() for rep in self.replicas):
            self.log.warning(
                "Failed to reset prefix cache because some blocks are not freed yet.", "block_pool.py:1"
            )
        else:
            self.log.info("Resetting prefix cache", "api_server.py:1")
        return web.Response(status=200)

    async def gpus_handler(self, request: web.Request) -> web.Response:
        now = self.driver.now()
        return json_response(
            {
                "source": GpuSource.SIMULATED.value,
                "sim_time_s": now,
                "gpus": gpu_rows(self.cfg, self.replicas, now),
            }
        )  # type: ignore[arg-type]

    async def sim_info(self, request: web.Request) -> web.Response:
        """What this server is (parasweep's simulated engine playing a vLLM release) and its clock:
        wall = sim_wall_origin + t / sim_time_scale."""
        cfg = self.cfg
        return json_response(
            {
                **played_info(cfg),
                "sim_time_scale": cfg.time_scale,
                "sim_wall_origin": self.driver.wall(0.0),
                "sim_faults": self.faults.active(),
                "launch_command": " ".join([sys.executable, "-m", "simulator", *cfg.args.vllm_argv]),
            }
        )


def startup_lines(cfg: SimConfig, log: LogWriter) -> None:
    """What vLLM prints on the way up that parasweep reads (its version, the KV cache's size, the
    concurrency it allows, async scheduling, the token budget), after the simulator's own line."""
    a = cfg.args
    log.info(
        f"parasweep simulated engine {__version__} playing vLLM {a.vllm_release} on {cfg.hw.name} "
        f"(step costs: {cfg.step_costs.label()}): no GPU runs here",
        "simulator:1",
    )
    log.info(f"vLLM API server version {a.vllm_release}", "api_server.py:1")
    spec = a.vllm_speculative
    spec_repr = (f"SpeculativeConfig(method={spec.method!r}, model={spec.params.draft_model_path!r}, "
                 f"num_spec_tokens={spec.k})" if spec is not None else "None")
    # vLLM's engine configuration line, with the fields parasweep reads (the real one lists every config)
    log.info(f"Initializing a V1 LLM engine (v{a.vllm_release}) with config: model={a.model_path!r}, "
             f"speculative_config={spec_repr}", "core.py:1")
    if a.vllm_kv_transfer is not None:  # the engine id is the connector's (LiveNixl), not logged here
        host, port = side_channel()
        log.info(f"Creating v1 connector with name: {a.vllm_kv_transfer.connector} (kv_role "
                 f"{a.vllm_kv_transfer.role}; side channel {host}:{port})", "factory.py:64")
    log.info(f"Asynchronous scheduling is {'enabled' if a.async_scheduling else 'disabled'}.", "vllm.py:1")
    log.info(
        f"Chunked prefill is enabled with max_num_batched_tokens={cfg.chunked_prefill_size}.",
        "scheduler.py:1",
    )
    tokens = cfg.max_total_num_tokens
    log.info(f"GPU KV cache size: {tokens:,} tokens", "kv_cache_utils.py:1319")
    log.info(
        f"Maximum concurrency for {cfg.context_len:,} tokens per request: {tokens / cfg.context_len:.2f}x",
        "kv_cache_utils.py:1324",
    )
    for warning in cfg.warnings:
        log.warning(warning, "simulator:1")
    log.info(f"Starting vLLM API server 0 on http://{a.host}:{a.port}", "launcher.py:1")


def serve(cfg: SimConfig) -> int:
    return serve_engine(cfg, VLLMLogWriter(), VLLMServer, startup_lines)  # type: ignore[arg-type]
