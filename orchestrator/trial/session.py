"""Stage 2, *engine session*: a running engine to send load points to, as a context manager.

Two sessions behind one interface, so the rest of the trial does not know which it has:

* :class:`LiveSession` starts the engine's server (SGLang or the simulated engine) in its own process
  group on a free 127.0.0.1 port, retrying with another port if a trial started side by side took it
  first; waits until it is ready; reads ``/server_info`` plus the startup log into the resolved
  values; scrapes ``/metrics`` and samples the GPUs (NVML for SGLang, the simulated engine's own model
  for it) from before the first point to after the last; and on exit always stops the whole process
  group and, for SGLang, waits until NVML shows the trial's GPUs free for the next trial.
* :class:`VirtualSession` runs the simulator's model in virtual time (``predict=true``): nothing is
  launched, and each point's result comes back in seconds.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from orchestrator.engines.base import HOST
from orchestrator.errors import EngineStartError
from orchestrator.gpu_release import process_group_pids, wait_gpus_free
from orchestrator.process.server import ServerProcess, free_port, http_get_json
from orchestrator.telemetry.gpu_sources import GpuTelemetry, start_gpu_telemetry
from orchestrator.telemetry.server_log import resolved_config
from orchestrator.telemetry.server_metrics import MetricsScraper
from orchestrator.trial.plan import TrialPlan
from orchestrator.trial.recorder import TrialPaths
from vocab.load import LoadPoint, RequestSpec
from vocab.records import PointResult, RecordWriter
from vocab.telemetry import GpuSource

log = logging.getLogger("parasweep")

ProgressFn = Callable[[int, int], None]
PORT_ATTEMPTS = 3


class EngineSession(Protocol):
    """What the load driver and the recorder see of an engine, live or virtual."""

    argv: list[str]  # the server command (the last one tried, when the start failed)
    server_info: dict[str, Any]  # /server_info as the engine reported it
    resolved: dict[str, Any]  # the engine's resolved values (``resolved.*`` params)
    timings: dict[str, float]  # epoch seconds: engine_launch, engine_ready, engine_stopped
    gpu: GpuTelemetry  # where the GPU samples come from (nvml | simulated | none) and why

    def __enter__(self) -> EngineSession: ...

    def __exit__(self, *exc: object) -> None: ...

    def run_point(self, point: LoadPoint, spec: RequestSpec, records: Path,
                  on_progress: ProgressFn) -> PointResult: ...


class LiveSession:
    def __init__(self, plan: TrialPlan, paths: TrialPaths, env: dict[str, str] | None = None) -> None:
        self.plan, self.paths = plan, paths
        self.env = dict(os.environ) if env is None else env  # CUDA_VISIBLE_DEVICES as Ray set it
        # batch log lines stamped to the millisecond, so stage series join the GPU samples
        self.env.setdefault("SGLANG_LOG_MS", "1")
        self.gpu = GpuTelemetry(GpuSource.NONE, "the engine did not start")
        self.argv: list[str] = []
        self.server_info: dict[str, Any] = {}
        self.resolved: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self._server: ServerProcess | None = None
        self._scraper: MetricsScraper | None = None
        self._pids: set[int] = set()

    @property
    def url(self) -> str:
        assert self._server is not None, "the session has not started"
        return self._server.url

    def __enter__(self) -> LiveSession:
        cfg = self.plan.cfg
        self.plan.engine.prepare(cfg, self.plan.identity.trial_dir)
        self.paths.server_log.parent.mkdir(parents=True, exist_ok=True)
        self.timings["engine_launch"] = time.time()
        try:
            self._server = self._start()
            self.timings["engine_ready"] = time.time()
            self._pids = process_group_pids(self._server.pid or 0)
            self.server_info = http_get_json(self.url + "/server_info")
            # /server_info, completed by the startup log (CUDA-graph sizes, per-stage limits, backend)
            self.resolved = resolved_config(self.server_info, self.paths.read_server_log())
            self._scraper = MetricsScraper(self.url + "/metrics", self.paths.server_metrics_jsonl,
                                           cfg.telemetry.metrics_period_s).start()
            self.gpu = start_gpu_telemetry(self.plan.engine_name, self.env.get("CUDA_VISIBLE_DEVICES"),
                                           self.plan.world_size, self.url, self.paths.gpu_jsonl,
                                           cfg.telemetry.gpu_hz)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> ServerProcess:
        """A ready server. A free port can be taken by another trial between our probe and the engine's
        bind (trials start side by side): then try another port, up to PORT_ATTEMPTS times."""
        cfg = self.plan.cfg
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = free_port()
            self.argv = self.plan.argv(port)
            server = ServerProcess(self.argv, self.paths.server_log, HOST, port, env=self.env,
                                   stop_grace_s=cfg.engine.stop_grace_s)
            try:
                server.start()
                server.wait_ready(cfg.engine.startup_timeout_s)
                return server
            except EngineStartError as exc:
                server.stop()
                if attempt == PORT_ATTEMPTS or "address already in use" not in str(exc).lower():
                    raise
                log.warning("port %d was taken before the engine bound it; retrying", port)
            except BaseException:
                server.stop()
                raise
        raise AssertionError("unreachable")

    def run_point(self, point: LoadPoint, spec: RequestSpec, records: Path,
                  on_progress: ProgressFn) -> PointResult:
        from workloads import run_point

        start = time.time()
        result = run_point(self.url, point, spec, records_path=records, on_progress=on_progress)
        result.start, result.end = start, time.time()
        return result

    def __exit__(self, *exc: object) -> None:
        """Always: stop the scraper and the whole process group; give an SGLang trial's GPUs back."""
        try:
            self.gpu.stop()
            if self._scraper is not None:
                self._scraper.stop()
                self._scraper = None
            if self._server is not None:
                self._server.stop()
                self._server = None
        finally:
            if self.plan.engine_name == "sglang":  # the next trial on these GPUs needs their memory back
                for warning in wait_gpus_free(self.env.get("CUDA_VISIBLE_DEVICES"), 60.0, self._pids or None):
                    log.warning("%s", warning)
            self.timings["engine_stopped"] = time.time()


class VirtualSession:
    """The same trial on the simulator's virtual clock. Points run in order in one simulation (the
    engine's state carries over from one point to the next, as on a live server)."""

    def __init__(self, plan: TrialPlan) -> None:
        from orchestrator.engines.sim import SimEngine

        self.plan = plan
        self._sim = SimEngine()
        self.argv = self._sim.simulator_flags(plan.cfg, 30000, plan.identity.trial_dir)
        self.server_info: dict[str, Any] = {}
        self.resolved: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        # the per-point summaries come from the simulator's power model (no series in virtual time)
        self.gpu = GpuTelemetry(GpuSource.SIMULATED, "the simulator's model, in virtual time")
        self._results: dict[str, PointResult] = {}

    def __enter__(self) -> VirtualSession:
        from simulator.predict import resolved_server_info

        self._sim.prepare(self.plan.cfg, self.plan.identity.trial_dir)
        self.server_info = resolved_server_info(self.argv)
        self.resolved = resolved_config(self.server_info, "")
        return self

    def run_point(self, point: LoadPoint, spec: RequestSpec, records: Path,
                  on_progress: ProgressFn) -> PointResult:
        from simulator.predict import predict_trial

        if not self._results:  # one simulation for every point, as the engine would see them
            results = predict_trial(self.argv, self.plan.points, spec)
            self._results = {p.label: r for p, r in zip(self.plan.points, results, strict=True)}
        result = self._results[point.label]
        with RecordWriter(records) as writer:
            for record in result.records:
                writer.write(record)
        # the point's window on the simulated clock (virtual seconds)
        times = [t for r in result.records for t in (r.send_time, r.end_time) if t is not None]
        result.start, result.end = (min(times), max(times)) if times else (0.0, 0.0)
        on_progress(len(result.records), len(result.records))
        return result

    def __exit__(self, *exc: object) -> None:
        return None
