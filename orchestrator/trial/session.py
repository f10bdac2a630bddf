"""Stage 2, *engine session*: a running engine to send load points to, as a context manager.

Two sessions behind one interface, so the rest of the trial does not know which it has:

* :class:`LiveSession` starts the engine's server (SGLang or the simulated engine) in its own process
  group on a free 127.0.0.1 port, retrying with another port if a trial started side by side took it
  first; waits until it is ready; reads ``/server_info`` plus the startup log into the resolved
  values; scrapes ``/metrics`` and samples the GPUs (NVML for SGLang, the simulated engine's own model
  for it) from before the first point to after the last; and on exit always stops the whole process
  group and, for SGLang, waits until NVML shows the trial's GPUs free for the next trial. Before an
  SGLang launch it checks that no other process holds those GPUs (bounded wait, then the trial fails).
  While a point runs, it watches the engine (:class:`EngineWatch`): the process exiting, ``/health``
  going unanswered (:mod:`orchestrator.process.health`) or the point outliving
  ``workload.point_timeout_s`` stops the point within a fraction of a second of being noticed, and
  :meth:`LiveSession.run_point` raises :class:`~orchestrator.errors.EngineFailure` with the point
  cut short.
* :class:`VirtualSession` runs the simulator's model in virtual time (``predict=true``): nothing is
  launched, and each point's result comes back in seconds.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

from orchestrator.config.schema import (
    gpus_per_node,
    plays_vllm,
    role_config,
    router_process,
    trial_nodes,
)
from orchestrator.engines.base import HOST, NodePlace
from orchestrator.engines.router import pd_launch, routed_launch
from orchestrator.engines.sglang_compat.speculative import simulated_acceptance_env
from orchestrator.errors import EngineFailure, EngineStartError
from orchestrator.gpu_release import RELEASE_WAIT_S, ensure_gpus_free, process_group_pids, wait_gpus_free
from orchestrator.process.health import HealthProber
from orchestrator.process.node_engines import EngineFiles, OtherNodes, head_address
from orchestrator.process.replicas import ReplicaGroup, Worker
from orchestrator.process.server import (
    ServerProcess,
    exit_reason,
    failed_scheduler,
    free_port,
    free_port_block,
    log_tail,
)
from orchestrator.telemetry.gpu_sources import GpuTelemetry, start_gpu_telemetry
from orchestrator.telemetry.server_metrics import MetricsScraper
from orchestrator.trial.plan import TrialPlan
from orchestrator.trial.recorder import TrialPaths
from vocab.load import LoadPoint, RequestSpec
from vocab.records import ENGINE_FAILED, PointResult, RecordWriter
from vocab.status import simulated
from vocab.telemetry import GpuSource
from workloads import clock
from workloads.backend import sim_clock

log = logging.getLogger("parasweep")

ProgressFn = Callable[[int, int], None]
PORT_ATTEMPTS = 3


class EngineSession(Protocol):
    """What the load driver and the recorder see of an engine, live or virtual."""

    argv: list[str]  # the server command (the last one tried, when the start failed)
    router_argv: list[str]  # the router's command, where the router package runs in front of DP replicas
    server_info: dict[str, Any]  # /server_info as the engine reported it
    resolved: dict[str, Any]  # the engine's resolved values (``resolved.*`` params)
    timings: dict[str, float]  # epoch seconds: engine_launch, engine_ready, engine_stopped
    gpu: GpuTelemetry  # where the GPU samples come from (nvml | simulated | none) and why
    other_node_places: list[dict[str, str]]  # across nodes: where ranks 1.. run (environment.placement)

    def __enter__(self) -> EngineSession: ...

    def __exit__(self, *exc: object) -> None: ...

    def run_point(self, point: LoadPoint, spec: RequestSpec, records: Path,
                  on_progress: ProgressFn) -> PointResult:
        """One point's result; a live session raises EngineFailure (carrying the point cut short)
        when the engine fails during it."""
        ...


class Companions(Protocol):
    """The processes beside the watched one that the trial needs: its other nodes' engines, or its DP
    replicas behind the router."""

    def gone_first(self, head_code: int | None) -> str | None: ...


class EngineWatch:
    """``should_stop`` for one point: why the point must stop now, or None. Asked by the load generator
    every 0.2 s, so each question is cheap: a ``waitpid`` without blocking, an attribute read (the
    health prober's verdict, kept up to date by its own thread) and a clock read."""

    def __init__(self, server: ServerProcess, prober: HealthProber | None, point_timeout_s: float | None,
                 others: Companions | None = None) -> None:
        self.server, self.prober, self.point_timeout_s = server, prober, point_timeout_s
        # across nodes: the engines of the trial's other nodes; behind a router: the DP replicas
        self.others = others
        # the point's time starts at the first question, asked just before its first request is sent:
        # the client's set-up before that (the load generator's first imports, the cache flush, the
        # energy counter's read, the full garbage collection before a point) is not the point's, and
        # on a busy machine it took 10 s of a 20 s limit
        self.started: float | None = None
        self.reason: str | None = None  # the first reason given: the load generator stops on it
        self.timed_out = False

    def engine_problem(self) -> str | None:
        """The engine's process has exited (on any node of the trial, or any DP replica behind the
        router, or the router itself), or it no longer answers ``/health``."""
        assert self.server.proc is not None
        code = self.server.proc.poll()
        gone = self.others.gone_first(code) if self.others is not None else None
        if gone is not None:  # another node's engine or a DP replica went first (or the router)
            return gone
        if code is not None:
            return exit_reason(code) + failed_scheduler(self.server.log_path)
        verdict = self.prober.verdict if self.prober is not None else None
        return f"engine not answering /health: {verdict}" if verdict else None

    def __call__(self) -> str | None:
        if self.reason is None:
            self.reason = self.engine_problem()
        limit = self.point_timeout_s
        now = time.monotonic()
        self.started = now if self.started is None else self.started
        if self.reason is None and limit is not None and now - self.started > limit:
            self.timed_out = True
            self.reason = f"point timed out after {limit:g} s (workload.point_timeout_s)"
        return self.reason


def failure_message(point: str, result: PointResult, reason: str, timed_out: bool, log_path: Path,
                    other_nodes: str = "") -> str:
    """First line: what happened, in which point, how far it got; then the engine's log tail (and the
    other nodes' ones, across nodes), and the first line once more at the end, where the end-of-sweep
    summary looks for a failed trial's reason (it takes the last line: for a start failure, the log's
    last line usually says why)."""
    measured = [r for r in result.records if not r.warmup]
    answered = sum(1 for r in measured if r.error is None)
    unanswered = sum(1 for r in result.records if r.error_kind == "aborted")
    total = result.point.num_requests
    if timed_out:
        first = (f"point {point} {reason.removeprefix('point ')}; {unanswered} "
                 f"request{'' if unanswered == 1 else 's'} unanswered")
    else:
        of = f" of {total}" if total is not None else ""
        first = f"{reason} during point {point} after {answered}{of} requests"
    others = f"{other_nodes}\n" if other_nodes else ""
    return f"{first}\nengine log tail ({log_path}):\n{log_tail(log_path)}\n{others}{first}"


class LiveSession:
    def __init__(self, plan: TrialPlan, paths: TrialPaths, env: dict[str, str] | None = None) -> None:
        self.plan, self.paths = plan, paths
        self.env = dict(os.environ) if env is None else env  # CUDA_VISIBLE_DEVICES as Ray set it
        # what the engine is read by: SGLang's batch lines stamped to the millisecond, so stage series join
        # the GPU samples; vLLM's development endpoints (its prefix-cache reset)
        for key, value in plan.engine.launch_env().items():
            self.env.setdefault(key, value)
        # dummy draft weights accept nothing: SGLang's own override sets the accept length assumed
        self.env.update(simulated_acceptance_env(plan.cfg, plan.engine_name, self.env))
        self.gpu = GpuTelemetry(GpuSource.NONE, "the engine did not start")
        self.argv: list[str] = []
        self.router_argv: list[str] = []
        self.server_info: dict[str, Any] = {}
        self.resolved: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self._server: ServerProcess | None = None
        self._scrapers: list[MetricsScraper] = []
        self._prober: HealthProber | None = None
        self._others: OtherNodes | None = None  # node ranks 1.. of a trial across nodes
        self._group: ReplicaGroup | None = None  # DP replicas behind the router (dp.router_impl)
        self._speaker_url = ""  # behind the router: the server whose /server_info stands for the engine
        self._server_urls: list[str] = []  # disaggregated: every server, in placement order
        self._worker_metrics: list[tuple[str, Path]] = []  # behind the router: the others' /metrics
        self._router_metrics_url = ""
        self._pids: set[int] = set()
        self._engine_clock = ExitStack()

    @property
    def other_node_places(self) -> list[dict[str, str]]:
        return self._others.places if self._others is not None else []

    @property
    def url(self) -> str:
        assert self._server is not None, "the session has not started"
        return self._server.url

    def __enter__(self) -> LiveSession:
        cfg = self.plan.cfg
        self.plan.engine.prepare(cfg, self.plan.identity.trial_dir)
        self.paths.server_log.parent.mkdir(parents=True, exist_ok=True)
        if not simulated(self.plan.engine_name):
            self._check_gpus_free()
        self.timings["engine_launch"] = time.time()
        try:
            routed = router_process(cfg, self.plan.engine_name) or cfg.pd.enabled
            if cfg.pd.enabled:
                self._server = self._retrying_taken_ports(self._start_disaggregated)
            else:
                self._server = self._retrying_taken_ports(self._start_routed) if routed else self._start()
            self.timings["engine_ready"] = time.time()
            self._pids = process_group_pids(self._server.pid or 0)
            if self._group is not None:
                for replica in self._group.replicas:
                    self._pids |= process_group_pids(replica.pid or 0)
            # behind the router, replica 0 (disaggregated: decode server 0) speaks for the engine: the
            # router has no /server_info or /metrics of its own (its metrics are scraped apart), and
            # server.log is that server's
            engine_url = self._speaker_url or self.url
            self.server_info = self.plan.engine.server_info(engine_url)
            # what it says of itself, completed by the startup log (SGLang: CUDA-graph sizes, per-stage
            # limits, backend; vLLM: the KV cache's tokens, async scheduling)
            self.resolved = self.plan.engine.resolved(self.server_info, self.paths.read_server_log())
            if "SGLANG_SIMULATE_ACC_LEN" in self.env and cfg.spec.algorithm != "none":
                # the accept length SGLang was told to verify at: where this run's acceptance came from
                self.resolved["sglang_simulate_acc_len"] = self.env["SGLANG_SIMULATE_ACC_LEN"]
            self._use_engine_clock()
            self._start_scrapers(engine_url)
            # the simulated engine reports every GPU it models (behind the router: replica 0's; of a
            # disaggregated deployment, every server's, prefill servers first); NVML sees this node's
            replicas = cfg.dp.size if routed else 1
            sim = simulated(self.plan.engine_name)
            sampled = self.plan.world_size // replicas if sim else gpus_per_node(cfg)
            self.gpu = start_gpu_telemetry(self.plan.engine_name, self.env.get("CUDA_VISIBLE_DEVICES"),
                                           sampled, engine_url, self.paths.gpu_jsonl, cfg.telemetry.gpu_hz,
                                           self._server_urls if sim else None)
            # the router's /health answers 200 whatever its replicas do: each replica has its own prober
            self._prober = None if routed else HealthProber(self.url).start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _use_engine_clock(self) -> None:
        """A simulated engine played faster or slower than real time (``engine.time_scale``) is measured
        on its own clock: every timestamp of the trial (records, GPU samples, scrapes, point windows)
        then reads its seconds, as its log and ``meta_info`` do, so its latencies and rates are the
        model's and not F times off. Until the session ends."""
        if simulated(self.plan.engine_name) and (sim := sim_clock(self.server_info)) is not None:
            self._engine_clock.enter_context(clock.engine_clock(*sim))

    def _start_scrapers(self, engine_url: str) -> None:
        """``/metrics`` of the engine (behind the router: replica 0) into ``server_metrics.jsonl``, which
        the analysis reads; the other replicas' and the router's own beside it."""
        period = self.plan.cfg.telemetry.metrics_period_s
        targets = [(engine_url + "/metrics", self.paths.server_metrics_jsonl), *self._worker_metrics]
        if self._group is not None:
            targets.append((self._router_metrics_url, self.paths.router_metrics_jsonl))
        self._scrapers = [MetricsScraper(url, path, period).start() for url, path in targets]

    def _retrying_taken_ports(self, start: Callable[[], ServerProcess]) -> ServerProcess:
        """``start`` (one server, or servers behind a router), again on fresh ports when a port probed
        free was taken before its server bound it (trials start side by side), up to PORT_ATTEMPTS
        times; every other start failure at once."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return start()
            except EngineStartError as exc:
                if attempt == PORT_ATTEMPTS or "address already in use" not in str(exc).lower():
                    raise
                self._stop_engines(None)
                self._group = None
                log.warning("a port was taken before its server bound it; starting again on new ports")
        raise AssertionError("unreachable")

    def _start_routed(self) -> ServerProcess:
        """The DP replicas, each a server of one replica on its slice of the trial's GPUs, then the
        router in front of them; the router's server is the trial's (its URL takes the load)."""
        cfg, trial_dir = self.plan.cfg, self.plan.identity.trial_dir
        ports = [free_port() for _ in range(cfg.dp.size)]
        port, prometheus_port = free_port(), free_port()
        launch = routed_launch(cfg, lambda one, p: self.plan.engine.argv(one, p, trial_dir), ports, port,
                               prometheus_port, self.env.get("CUDA_VISIBLE_DEVICES"))
        self.argv, self.router_argv = launch.replicas[0][0], launch.router
        self._router_metrics_url = f"http://{HOST}:{prometheus_port}/metrics"
        self._speaker_url = f"http://{HOST}:{ports[0]}"
        self._worker_metrics = [(f"http://{HOST}:{p}/metrics", self.paths.replica_metrics_jsonl(rank))
                                for rank, p in enumerate(ports) if rank]
        self._group = ReplicaGroup(self.paths, cfg.engine.stop_grace_s)
        self._group.start_replicas([(argv, p, {**self.env, "CUDA_VISIBLE_DEVICES": gpus})
                                    for (argv, gpus), p in zip(launch.replicas, ports, strict=True)],
                                   cfg.engine.startup_timeout_s)
        return self._group.start_router(self.router_argv, port, cfg.engine.startup_timeout_s)

    def _start_disaggregated(self) -> ServerProcess:
        """Every prefill and decode server on its slice of the trial's GPUs (each prefill server with a
        bootstrap port of its own), then the router in PD mode in front of them; the router's server is
        the trial's. Decode server 0 speaks for the engine (``server.log``, ``/server_info``)."""
        cfg, trial_dir = self.plan.cfg, self.plan.identity.trial_dir
        n = cfg.pd.prefill.workers + cfg.pd.decode.workers
        ports = [free_port() for _ in range(n)]
        port, prometheus_port = free_port(), free_port()
        taken = {*ports, port, prometheus_port}
        launch = pd_launch(cfg, lambda one, p: self.plan.engine.argv(one, p, trial_dir), ports,
                           lambda _, width: free_port_block(width, taken), port, prometheus_port,
                           self.env.get("CUDA_VISIBLE_DEVICES"))
        speaker = next(s for s in launch.servers if s.role == "decode" and s.index == 0)
        self.argv, self.router_argv = speaker.argv, launch.router
        self._router_metrics_url = f"http://{HOST}:{prometheus_port}/metrics"
        self._speaker_url = f"http://{HOST}:{speaker.port}"
        self._server_urls = [f"http://{HOST}:{s.port}" for s in launch.servers]
        self._worker_metrics = [(f"http://{HOST}:{s.port}/metrics",
                                  self.paths.worker_metrics_jsonl(s.role, s.index))
                                 for s in launch.servers if s is not speaker]
        self._group = ReplicaGroup(self.paths, cfg.engine.stop_grace_s)
        workers = [Worker(s.name, s.argv, s.port, {**self.env, **s.env, "CUDA_VISIBLE_DEVICES": s.gpus},
                          self.paths.worker_log(s.role, s.index)) for s in launch.servers]
        self._group.start_workers(workers, cfg.engine.startup_timeout_s)
        return self._group.start_router(self.router_argv, port, cfg.engine.startup_timeout_s)

    def _check_gpus_free(self) -> None:
        """A leftover on the trial's GPUs (an earlier trial's engine still letting go, a stray process)
        would change what this trial measures: wait for it a bounded time, else fail the trial. Without
        a CUDA_VISIBLE_DEVICES mask the engine takes the first world-size GPUs (NVML's index order,
        which is CUDA's on a node of identical GPUs); only those are checked."""
        cvd = self.env.get("CUDA_VISIBLE_DEVICES")
        if cvd is None:
            cvd = ",".join(str(i) for i in range(self.plan.world_size))
        for warning in ensure_gpus_free(cvd, on_wait=log.warning):
            log.warning("%s", warning)

    def _start(self) -> ServerProcess:
        """A ready server: rank 0 (the other nodes' engines first where the trial spans nodes) on a free
        port, started again on another where that one was taken (:meth:`_retrying_taken_ports`)."""
        return self._retrying_taken_ports(self._start_on_a_free_port)

    def _start_on_a_free_port(self) -> ServerProcess:
        cfg = self.plan.cfg
        nodes = trial_nodes(cfg)
        head = head_address() if nodes > 1 else HOST  # where the other nodes join rank 0
        port = free_port()
        argvs = [self.plan.argv(port, NodePlace(rank, head)) for rank in range(nodes)]
        self.argv = argvs[0]
        server = ServerProcess(self.argv, self.paths.server_log, HOST, port, env=self.env,
                               stop_grace_s=cfg.engine.stop_grace_s)
        try:
            if nodes > 1:  # the other nodes first: they wait for rank 0, which waits for them all
                self._others = OtherNodes(self.paths.server_log.parent, gpus_per_node(cfg),
                                          cfg.ray.cpus_per_trial)
                self._others.start({rank: argv for rank, argv in enumerate(argvs) if rank},
                                   {"SGLANG_LOG_MS": "1"}, cfg.engine.stop_grace_s,
                                   EngineFiles.under(self.plan.engine.files_dir(self.plan.identity.trial_dir)),
                                   self.plan.engine_name)
            server.start()
            if self._others is not None and server.proc is not None:
                self._others.watch_head(server.proc)
            server.wait_ready(cfg.engine.startup_timeout_s,
                              self._others.problem if self._others is not None else None)
            return server
        except EngineStartError as exc:
            self._stop_engines(server)
            raise EngineStartError(self._with_other_logs(str(exc))) from None
        except BaseException:
            self._stop_engines(server)
            raise

    def _stop_engines(self, server: ServerProcess | None) -> None:
        """Rank 0's process group, then the other nodes' (each keeps its log beside rank 0's); behind
        a router, the router and then every replica's group."""
        try:
            if server is not None:
                server.stop()
        finally:
            if self._others is not None:
                self._others.stop()
            if self._group is not None:
                self._group.stop()

    def _other_log_tails(self) -> str:
        """The other nodes' log tails, or the other DP replicas' and the router's."""
        if self._others is not None:
            return self._others.log_tails()
        return self._group.log_tails() if self._group is not None else ""

    def _with_other_logs(self, message: str) -> str:
        """A failure's message with the other processes' log tails (kept once they were stopped)."""
        tails = self._other_log_tails()
        return f"{message}\n{tails}" if tails else message

    def run_point(self, point: LoadPoint, spec: RequestSpec, records: Path,
                  on_progress: ProgressFn) -> PointResult:
        """One point, watched: raises :class:`EngineFailure` (carrying the point cut short) when the
        engine exits or stops answering during it, or it outlives ``workload.point_timeout_s``."""
        from workloads import run_point

        assert self._server is not None, "the session has not started"
        workload = self.plan.cfg.workload
        watch = EngineWatch(self._server, self._prober, workload.point_timeout_s, self._others or self._group)
        # every point starts on an empty prefix cache: an earlier point's prompts (the same first
        # requests, by index) would otherwise be hits it never offered; a cache that would not flush
        # is said on the point (cache_flushed 0). The router passes it on to every replica; its own
        # prefix tree (where it routes) is kept, so a prefix goes back to the replica it went to before
        flushed = self.plan.engine.flush_cache(self.url)
        self.gpu.mark()  # the energy counter read at the point's start and end (it is costly to read)
        start = clock.now()
        result = run_point(self.url, point, spec, records_path=records, on_progress=on_progress,
                           sock_read_timeout=workload.stall_timeout_s,
                           read_timeout_setting="workload.stall_timeout_s", should_stop=watch)
        result.start, result.end = start, clock.now()
        self.gpu.mark()
        result.metrics["cache_flushed"] = 1.0 if flushed else 0.0
        reason = watch.reason
        if reason is None:
            # an engine that died as the point ended: its last requests can fail (refused) faster
            # than the 0.2 s between two polls, so the point ran to its end against a dead engine
            reason = watch.engine_problem()
            if reason is not None:
                result.invalid_reasons.insert(0, ENGINE_FAILED + reason)
                result.metrics["valid"] = 0.0
        if reason is not None:
            # Stop the failed engine now, before the telemetry readers are stopped: against a frozen
            # engine each would wait out its read timeout first; against a killed one they fail fast.
            if self._prober is not None:
                self._prober.stop()
                self._prober = None
            self._stop_engines(self._server)
            self._server = None
            tails = self._other_log_tails()
            raise EngineFailure(failure_message(point.label, result, reason, watch.timed_out,
                                                self.paths.server_log, tails), result)
        return result

    def __exit__(self, *exc: object) -> None:
        """Always: stop the scraper and the whole process group; give an SGLang trial's GPUs back."""
        try:
            if self._prober is not None:  # first: it would see the stop below as the engine failing
                self._prober.stop()
                self._prober = None
            self.gpu.stop()
            for scraper in self._scrapers:
                scraper.stop()
            self._scrapers = []
            self._stop_engines(self._server)
            self._server = None
        finally:
            self._engine_clock.close()  # the samplers that stamped on it are stopped
            if not simulated(self.plan.engine_name):  # the next trial on these GPUs needs their memory back
                for warning in wait_gpus_free(self.env.get("CUDA_VISIBLE_DEVICES"), RELEASE_WAIT_S,
                                              self._pids or None):
                    log.warning("%s", warning)
            self.timings["engine_stopped"] = time.time()


class VirtualSession:
    """The same trial on the simulator's virtual clock. Points run in order in one simulation (the
    engine's state carries over from one point to the next, as on a live server)."""

    def __init__(self, plan: TrialPlan) -> None:
        from orchestrator.engines.sim import SimEngine
        from orchestrator.engines.sim_vllm import SimVLLMEngine

        self.plan = plan
        self._sim = SimVLLMEngine() if plays_vllm(plan.cfg) else SimEngine()
        # a disaggregated deployment's decode servers stand for it (the client's streams are theirs)
        shown = role_config(plan.cfg, "decode") if plan.cfg.pd.enabled else plan.cfg
        self.argv = self._sim.simulator_flags(shown, 30000, plan.identity.trial_dir)
        self.router_argv: list[str] = []  # the model routes the requests itself
        self.server_info: dict[str, Any] = {}
        self.resolved: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        # the per-point summaries come from the simulator's power model (no series in virtual time)
        self.gpu = GpuTelemetry(GpuSource.SIMULATED, "the simulator's model, in virtual time")
        self._results: dict[str, PointResult] = {}
        self.other_node_places: list[dict[str, str]] = []  # it runs nowhere

    def __enter__(self) -> VirtualSession:
        from simulator.predict import resolved_server_info

        self._sim.prepare(self.plan.cfg, self.plan.identity.trial_dir)
        self.server_info = resolved_server_info(self.argv)
        self.resolved = self._sim.resolved(self.server_info, "")
        return self

    def run_point(self, point: LoadPoint, spec: RequestSpec, records: Path,
                  on_progress: ProgressFn) -> PointResult:
        from orchestrator.engines.virtual import virtual_trials
        from orchestrator.points.virtual import in_virtual_time
        from simulator.predict import run_points

        if not self._results:  # one simulation for every point, as the engine would see them
            fresh = virtual_trials(self.plan.cfg, self.plan.identity.trial_dir)
            # run until their numbers are known (orchestrator/points/virtual.py), under the same labels
            points = [in_virtual_time(p, self.plan.cfg.workload.predicted) for p in self.plan.points]
            results = run_points(fresh, points, spec)
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
