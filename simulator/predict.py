"""Prediction mode: the live server's replica model, run in virtual time from Python.

``predict_point(argv, point, spec)`` configures the model exactly as ``python -m simulator <argv>`` would
(same parser, same ``resolve``), drives it with a *virtual client* that follows the load generator's load
modes, and returns a ``workloads.PointResult`` whose metrics come from ``workloads.summarize``. Nothing
listens on a socket and no wall clock is read: a Kimi K2 PP8 load point of 80 requests takes a few ms
of CPU.

The virtual client takes every definition from the shared vocabulary rather than restating it:

* which requests a point sends: ``LoadPoint.total_requests`` (warmup first, the first
  ``warmup_requests`` indices), or, for a closed-loop point bounded by ``duration_s``, as many as the
  workers start before its duration is over (counted from the first measured send, as in the load
  generator);
* closed loop (``concurrency``): that many workers (at most the point's request count), each sending
  the next index the instant its previous request ends;
* open loop (``rate``): request i is sent at ``LoadPoint.send_offsets()[i]`` (the very same Poisson or
  constant schedule, same seed); ``max_concurrency`` holds a request back until one in flight ends;
* what each request sends: ``workloads.payloads.build_body(spec, i)`` (lengths, distributions, prompt
  files), counted into prompt tokens as the live server counts them (``text.py``).

Timing: a request reaches the model at its send time and the client sees each token the instant it is
emitted (client lag 0; every emission event is one stream chunk); a request ends with its last token. A
closed-loop worker's next request is sent ``CLIENT_TURNAROUND_S`` (1 ms) after the previous one ended:
the HTTP/IPC round trip between an answer's last token and the next request's arrival, which a real
client cannot avoid and which decides, under PP, whether the new request catches its slot's turn. A
closed-loop point's first requests arrive ``CLIENT_SEND_SPACING_S`` (20 µs) apart, as the load
generator sends them from its one event loop: stage 0's first turn then takes the first request alone
and the rest join the next turn, as they do on a live server (see the constant).

Records are ``RequestRecord`` objects in *virtual seconds* of the model (t = 0 at the first point's
start). These are the hardware's seconds: ``--sim-time-scale`` only changes how fast the live server
plays them back, so predictions ignore it (a live simulated trial at scale F measures wall latencies
F times shorter).

Per point the metrics also carry the GPU telemetry summaries under the names a measured trial's
NVML samples are summarised under (``vocab.telemetry``; the diagnosis must not care which source it
reads, and the orchestrator tags the source). Here they come exactly from the simulator's power model
(``gpus.py``) over the point's window, the first measured send to the last measured end (warm-up
excluded, as in a measured trial and as ``output_tok_s`` counts); they are simulated, not measured:

* ``gpu_power_frac_mean`` / ``_min_gpu`` / ``_max_gpu`` and ``gpu<i>_power_frac_mean``: each GPU's
  mean power over the window / its limit. There are no samples in virtual time, so
  ``gpu_power_frac_peak`` (and ``gpu<i>_power_frac_peak``) is the busiest GPU's window mean (a 10 Hz
  sampler would see higher peaks);
* ``gpu_util_mean_pct`` and ``gpu<i>_util_mean_pct``: busy fraction x 100; ``gpu_mem_used_gib_max``:
  the memory model of ``gpus.py`` (constant while serving);
* ``energy_j``: every GPU's power integrated over the window; ``j_per_output_token``: that energy over
  the point's measured output tokens;
* ``stage_activity_mean/min/max`` and ``stage<s>_activity_mean``: each PP stage's busy fraction (the
  power above idle over the idle-to-limit range, which the linear model makes equal), averaged over
  DP replicas per stage index; mean, least and most active stage;
* ``kv_token_usage_max``: the highest KV pool use / pool size of any replica from the first measured
  send on;
* ``retracted_reqs`` (playing vLLM): the requests preempted in the window (vLLM's
  ``vllm:num_preemptions``), each to be computed again from its first token;
* ``queue_reqs_mean`` and ``running_reqs_mean``: the mean waiting queue (all replicas) and the mean
  running requests per micro-batch slot, integrated from each request's model times (its wait before
  its first prefill batch, then its run to its last token);

plus two numbers only the simulator knows: ``sim_peak_running_reqs`` and
``sim_peak_microbatches_in_flight``.
"""

from __future__ import annotations

import argparse
import bisect
import collections
from collections.abc import Callable

import numpy as np

from simulator.cli import build_parser
from simulator.entities import Request
from simulator.gpus import energy_j, mem_used_bytes, power_w
from simulator.lockstep import build_schedulers
from simulator.replica import ReplicaModel
from simulator.resolve import FlagError, resolve
from simulator.router import Router
from simulator.sim_config import SimConfig
from simulator.text import chat_prompt, completion_prompts, generate_prompts
from simulator.timebase import Simulation
from vocab.hardware import HardwareConf
from vocab.load import LoadPoint, RequestSpec
from vocab.records import PointResult, RequestRecord
from vocab.telemetry import (
    ENERGY_J,
    J_PER_TOKEN,
    KV_USAGE_MAX,
    MEM_USED_MAX,
    POWER_FRAC_MAX_GPU,
    POWER_FRAC_MEAN,
    POWER_FRAC_MIN_GPU,
    POWER_FRAC_PEAK,
    QUEUE_MEAN,
    RANK_KV_USAGE,
    RANK_QUEUE,
    RANK_QUEUE_SPREAD,
    RANK_RUNNING,
    RANK_RUNNING_IMBALANCE,
    RETRACTED,
    RUNNING_MEAN,
    STAGE_ACTIVITY_MAX,
    STAGE_ACTIVITY_MEAN,
    STAGE_ACTIVITY_MIN,
    UTIL_MEAN,
    engine_layout,
    per_gpu,
    per_replica,
    per_stage,
)

__all__ = ["VirtualTrial", "load_config", "predict_point", "predict_trial", "resolved_server_info",
           "run_points"]

# Closed loop: simulated seconds from a request's last token leaving the scheduler to the same worker's
# next request reaching it. On one host this is detokenizer -> HTTP chunk -> client -> new HTTP request
# -> tokenizer manager -> scheduler: about 0.1 ms per hop over five hops (ZMQ, loopback TCP, Python
# handlers). It matters under PP: a request arriving after its slot's turn waits one ring period.
CLIENT_TURNAROUND_S = 1e-3
# Closed loop: the gap between two of a point's first sends. The load generator starts its workers one
# after another on one event loop, about 20 µs apart (measured in its request records). Under PP the
# gap decides micro-batch membership: stage 0's scheduler takes the first request alone (its turn
# starts the moment that request arrives) and the others, arriving during the host time of that turn,
# together in the next turn; the closed loop then keeps that grouping. Sent all at once, every request
# lands in one micro-batch, and the demo's PP8 points are predicted 3-8 % low. Any gap from 1 µs to
# ~150 µs gives the same grouping on the demo (Kimi K2 PP8, C = 8 and 32); gaps above that, as a
# heavily loaded client produces, split the burst further (docs/simulator.md, "Arrival timing").
CLIENT_SEND_SPACING_S = 20e-6
# SGLang's server warm-up (``_execute_server_warmup``): one request of these prompt ids and output tokens per
# DP replica, sent by the server itself before it reports ready
WARMUP_PROMPT = (10, 11, 12)
WARMUP_OUTPUT_TOKENS = 8
# How often (virtual seconds) a point with a ``ci_target`` asks its stop rule, as the load generator does
STABLE_CHECK_S = 0.5
CHECK_GROWTH = 0.1
VIRTUAL_MIN_DURATIONS = 20.0
MAX_EVENTS_PER_POINT = 50_000_000  # a guard against a model bug turning into an endless loop


class _ArgError(ValueError):
    pass


def _parser() -> argparse.ArgumentParser:
    p = build_parser()

    def error(message: str) -> None:  # a library raises instead of exiting the process
        raise _ArgError(f"simulator flags: {message}")

    p.error = error  # type: ignore[method-assign]
    return p


def load_config(argv: list[str]) -> SimConfig:
    """``argv`` (SGLang + ``--sim-*`` flags, without ``python -m simulator``) -> the resolved config.

    Raises ``ValueError`` with the message the live server would print (bad flag, invalid layout,
    weights that do not fit, ...). ``serve MODEL <vLLM flags>`` plays vLLM, as the live server does."""
    if argv[:1] == ["serve"]:
        from simulator.vllm.cli import parse, resolved

        return resolved(parse([str(a) for a in argv], exit_on_error=False))
    args = _parser().parse_args([str(a) for a in argv])
    if args.random_seed is None:
        args.random_seed = 0  # token ids only; fixed so predictions are reproducible
    try:
        return resolve(args)
    except FlagError as e:
        raise ValueError(str(e)) from e


def resolved_server_info(argv: list[str]) -> dict:
    """The dict ``GET /server_info`` of ``python -m simulator <argv>`` returns (``/parasweep_sim/info``
    where it plays vLLM), without serving."""
    cfg = load_config(argv)
    if cfg.dialect == "vllm":  # what /parasweep_sim/info says where it plays vLLM (no /server_info)
        from simulator.vllm.info import played_info

        info = played_info(cfg)
    else:
        info = cfg.server_info()
    info["launch_command"] = " ".join(["python", "-m", "simulator", *[str(a) for a in argv]])
    return info


def _server_prompt(spec: RequestSpec, body: dict) -> np.ndarray:
    """The prompt's token ids as the live server reads one request body of ``spec``'s API."""
    if spec.api == "chat":
        return chat_prompt(body["messages"])
    if spec.api == "completions":
        return completion_prompts(body["prompt"])[0]
    return generate_prompts(body)[0][0]


def engine_schedulers(cfg: SimConfig, sim: Simulation) -> list[ReplicaModel]:
    """The engine's schedulers: SGLang's (``lockstep.build_schedulers``), or vLLM's engine cores where
    the configuration plays vLLM."""
    if cfg.dialect == "vllm":
        from simulator.vllm.scheduler import VLLMReplica

        return build_schedulers(cfg, sim, VLLMReplica)
    return build_schedulers(cfg, sim)


class VirtualTrial:
    """One engine instance (all DP replicas) on one virtual clock; load points run one after another."""

    def __init__(self, cfg: SimConfig) -> None:
        sim = Simulation()
        self._begin(cfg, sim, engine_schedulers(cfg, sim))
        self.router = Router(cfg.router, cfg.schedulers)
        if cfg.server_warmup:
            self._warm_up()

    def _begin(self, cfg: SimConfig, sim: Simulation, replicas: list[ReplicaModel]) -> None:
        """What every virtual trial holds: the config its requests' seeds come from, the clock, the
        replicas whose busy time marks its windows, and the client's state."""
        self.cfg, self.sim, self.replicas = cfg, sim, replicas
        # busy seconds of every stage at the window's bounds: (when, {(replica, stage): seconds}); the
        # steady window, and the whole measured span for a point too short to have one
        self._marks: dict[str, tuple[float, dict[tuple[int, int], float]]] = {}
        # requests preempted since start at each bound (vLLM's schedulers count them; SGLang's admission
        # reserves every decode token and never retracts in the model)
        self._preempted: dict[str, int] = {}
        self._seq = 0
        # where each request went, with several schedulers (read and dropped by the client at its send)
        self.rank_of: dict[str, int] = {}
        self.turnaround = CLIENT_TURNAROUND_S
        self.send_spacing = CLIENT_SEND_SPACING_S

    def _warm_up(self) -> None:
        """SGLang's server warm-up, before anything is measured: one short request through every replica,
        run until it drained. It leaves the engine as a served engine idles: under PP the stages go on
        turning their ring of slots with stage 0 a pass ahead, where a never-used engine has them all at
        its first pass, and the first requests of a point group differently into micro-batches (Kimi K2
        PP8 at async depth 16 on the PCIe node, c32: 131 tok/s warm, 110 cold). A live trial's engine is
        warm too before its first point: the readiness wait's ``/health`` runs a 1-token probe on it."""
        prompt = np.asarray(WARMUP_PROMPT, dtype=np.int64)
        for r, rep in enumerate(self.replicas):
            req = Request(f"warmup-{r}", len(prompt), WARMUP_OUTPUT_TOKENS, r, stream=False, prompt=prompt)
            rep.submit(req, self.sim.now)
        while self.sim.peek() is not None:
            self.sim.run_until(self.sim.peek() + 1.0)

    def submit(self, prompt: np.ndarray, max_new_tokens: int) -> Request:
        """A streamed request, arriving now."""
        self._seq += 1
        seed = self.cfg.random_seed * 1_000_003 + self._seq
        req = Request(f"v{self._seq}", len(prompt), max_new_tokens, seed, stream=True, prompt=prompt)
        self._dispatch(req, prompt)
        return req

    def _dispatch(self, req: Request, prompt: np.ndarray) -> None:
        """``req`` to the replica (or attention-DP rank) the router picks."""
        rank = self.router.pick(prompt, [r.load for r in self.replicas])
        if self.cfg.schedulers > 1:
            self.rank_of[req.rid] = rank
        self.replicas[rank].submit(req, self.sim.now + self.cfg.cost.p.request_path_us * 1e-6)

    # -- one point ------------------------------------------------------------------------------------

    def run_point(self, point: LoadPoint, spec: RequestSpec) -> PointResult:
        """One point, after the previous ones. A closed-loop point of multi-turn traffic runs as
        sessions (``workloads.sources.as_sessions``), as the orchestrator's load plan makes it."""
        from workloads import summarize, validity_reasons
        from workloads.prefix_reuse import offered_reuse
        from workloads.sources import as_sessions
        from workloads.window import targets_met

        point = as_sessions(point, spec)
        sim = self.sim
        self._reset_point()
        self._marks, self._preempted = {}, {}
        client = _VirtualClient(self, point, spec)
        client.start()
        events = 0
        while sim.peek() is not None:
            events += sim.run_until(sim.peek() + 1.0)
            if events > MAX_EVENTS_PER_POINT:
                raise RuntimeError(f"prediction of {point.label} did not drain after {events} events")
        records = [client.records[i] for i in sorted(client.records)]
        unfinished = [r.index for r in records if r.end_time is None]
        if unfinished:
            raise RuntimeError(f"prediction of {point.label}: requests {unfinished[:5]} never finished")

        metrics = summarize(records, point, lag_ms=[0.0])
        if client.tracker is not None and point.duration_s is not None:
            # a point run until its numbers are known, within a budget: 1 when the budget (its duration,
            # or the count that guards it) ended it first (``orchestrator.points.virtual``), 0 when the
            # rule stopped it or its numbers were known by its end (the budget falling between two checks)
            metrics["budget_hit"] = 0.0 if client.enough or targets_met(metrics, point) else 1.0
        metrics.update(offered_reuse(records, client.sent_ids.__getitem__))
        # the window's bounds as the records' rule chose them (``workloads.window``)
        bounds = (("open" if metrics.get("window_turned") == 1.0 else "held", "close")
                  if metrics.get("window_steady") == 1.0 else ("first", "last"))
        metrics.update(self._telemetry(records, metrics["output_tokens"], bounds, client.rank_of_index))
        reasons = validity_reasons(metrics, point)
        return PointResult(point, metrics, reasons, records)

    def _reset_point(self) -> None:
        for rep in self.replicas:
            rep.peak_in_flight = rep.in_flight
            rep.admission.peak_pool_used = rep.admission.pool_used
            # each point starts on an empty prefix cache, as the live trial flushes it between points
            flushed = rep.admission.flush_cache()
            assert flushed, "a point starts only once the previous one drained"

    def mark(self, bound: str) -> None:
        """Keep the stages' busy time now as ``bound``: ``open``/``close`` (the steady window, see
        ``workloads.window``), ``held`` (where a point too short for its turnover opens it instead) or
        ``first``/``last`` (the first measured send, a measured request's end).
        Busy time is read at the instant itself; reading it later for a past instant would not be exact
        (``StageBusy`` folds finished intervals as time is read)."""
        now = self.sim.now
        self._preempted[bound] = sum(getattr(rep.admission, "preemptions", 0) for rep in self.replicas)
        self._marks[bound] = (now, {(r, s): rep.busy[s].busy_total(now) for r, rep in enumerate(self.replicas)
                                    for s in range(rep.cfg.pp)})
        if bound == "open" or (bound == "first" and "open" not in self._marks):
            for rep in self.replicas:
                rep.admission.peak_kv_used = rep.admission.held_tokens

    def _window(self, bounds: tuple[str, str], out: dict[str, float]
                ) -> tuple[float, float, dict[tuple[int, int], float]] | None:
        """The window the throughput was measured over (``workloads.window``: the steady one, else the
        whole measured span) and each (replica, stage)'s busy seconds in it; None when it has no width.
        Sets ``kv_token_usage_max`` in ``out`` when the window's bounds are known."""
        if not all(b in self._marks for b in bounds):
            return None
        start, busy_start = self._marks[bounds[0]]
        end, busy_end = self._marks[bounds[1]]
        out[KV_USAGE_MAX] = max(r.admission.peak_kv_used / r.admission.kv_capacity for r in self.replicas)
        if self.cfg.dialect == "vllm":  # preempted requests, as vLLM's counter would show over the window
            out[RETRACTED] = float(self._preempted[bounds[1]] - self._preempted[bounds[0]])
        if end - start <= 0:
            return None
        return start, end, {key: busy_end[key] - busy_start[key] for key in busy_end}

    def _telemetry(self, records: list[RequestRecord], output_tokens: float,
                   bounds: tuple[str, str], ranks: dict[int, int] | None = None) -> dict[str, float]:
        cfg, hw = self.cfg, self.cfg.hw
        out: dict[str, float] = {
            "sim_peak_running_reqs": float(max(rep.admission.peak_pool_used for rep in self.replicas)),
            "sim_peak_microbatches_in_flight": float(max(rep.peak_in_flight for rep in self.replicas)),
            MEM_USED_MAX: max(mem_used_bytes(cfg, s) for s in range(cfg.pp)) / 2**30,
        }
        window = self._window(bounds, out)
        if window is None:
            return out
        start, end, busy = window
        width = end - start
        out.update(self._queue_and_running(records, start, end))
        if ranks:
            out.update(self._per_rank(records, start, end, ranks))
        # every TP rank of a stage has the stage's busy time
        layout = engine_layout(cfg.rank_tp, cfg.pp, cfg.schedulers)
        out.update(gpu_summaries(hw, {p.gpu: busy[p.dp, p.pp] / width for p in layout}))
        energy = sum(energy_j(hw, width, busy[p.dp, p.pp]) for p in layout)
        out[ENERGY_J] = energy
        if output_tokens > 0:  # the window's energy over the window's tokens
            out[J_PER_TOKEN] = energy / output_tokens
        # activity = busy fraction; a stage index averaged over the DP replicas
        activity = [sum(busy[r, s] for r in range(cfg.schedulers)) / (cfg.schedulers * width)
                    for s in range(cfg.pp)]
        for s, a in enumerate(activity):
            out[per_stage(s, "activity_mean")] = a
        out[STAGE_ACTIVITY_MEAN] = sum(activity) / len(activity)
        out[STAGE_ACTIVITY_MIN] = min(activity)
        out[STAGE_ACTIVITY_MAX] = max(activity)
        return out


    def _queue_and_running(self, records: list[RequestRecord], start: float, end: float) -> dict[str, float]:
        """The scheduler's mean waiting queue (all replicas) and mean running requests per micro-batch
        slot over the window, integrated exactly from each request's model times: it waits from its
        arrival (its send: the virtual client has no lag) for ``server_queue_s``, then runs until its
        last token. Warm-up requests count: they occupy the server all the same."""
        waiting = running = 0.0
        for r in records:
            if r.send_time is None or r.end_time is None or r.server_queue_s is None:
                continue
            admitted = r.send_time + r.server_queue_s
            waiting += max(0.0, min(admitted, end) - max(r.send_time, start))
            running += max(0.0, min(r.end_time, end) - max(admitted, start))
        width = end - start
        return {QUEUE_MEAN: waiting / width, RUNNING_MEAN: running / width / self._slots()}

    def _per_rank(self, records: list[RequestRecord], start: float, end: float,
                  ranks: dict[int, int]) -> dict[str, float]:
        """Each scheduler's mean running and waiting requests over the window (as ``_queue_and_running``,
        request by request, by the scheduler it went to), its highest KV use, and how unevenly they were
        loaded: what a live engine's per-rank reports give (``analysis.telemetry``, RANK_*)."""
        n = self.cfg.schedulers
        waiting, running = [0.0] * n, [0.0] * n
        for r in records:
            rank = ranks.get(r.index)
            if rank is None or r.send_time is None or r.end_time is None or r.server_queue_s is None:
                continue
            admitted = r.send_time + r.server_queue_s
            waiting[rank] += max(0.0, min(admitted, end) - max(r.send_time, start))
            running[rank] += max(0.0, min(r.end_time, end) - max(admitted, start))
        width = end - start
        slots = self._slots() // n
        out = {}
        for k, rep in enumerate(self.replicas):
            out[per_replica(k, RANK_RUNNING)] = running[k] / width / slots
            out[per_replica(k, RANK_QUEUE)] = waiting[k] / width
            out[per_replica(k, RANK_KV_USAGE)] = rep.admission.peak_kv_used / rep.admission.kv_capacity
        mean = sum(running) / n / width / slots
        if mean > 0:
            out[RANK_RUNNING_IMBALANCE] = max(running) / width / slots / mean
        out[RANK_QUEUE_SPREAD] = (max(waiting) - min(waiting)) / width
        return out

    def _slots(self) -> int:
        """The micro-batch slots requests run in: every DP replica's, each replica's PP stages plus its
        async depth."""
        return self.cfg.schedulers * (self.cfg.pp + (self.cfg.depth if self.cfg.pp > 1 else 0))


def gpu_summaries(hw: HardwareConf, frac: dict[int, float]) -> dict[str, float]:
    """Each GPU's and the trial's power and utilisation summaries from each GPU's busy fraction over the
    window (``frac``, by GPU index): no samples in virtual time, so a GPU's peak is its window mean."""
    out: dict[str, float] = {}
    power_frac = {g: power_w(hw, f) / hw.power_limit_w for g, f in frac.items()}
    for g, pf in power_frac.items():
        out[per_gpu(g, "power_frac_mean")] = out[per_gpu(g, "power_frac_peak")] = pf
        out[per_gpu(g, "util_mean_pct")] = 100.0 * frac[g]
    out[POWER_FRAC_MEAN] = sum(power_frac.values()) / len(power_frac)
    out[POWER_FRAC_MIN_GPU] = min(power_frac.values())
    out[POWER_FRAC_MAX_GPU] = out[POWER_FRAC_PEAK] = max(power_frac.values())
    out[UTIL_MEAN] = 100.0 * sum(frac.values()) / len(frac)
    return out


class _VirtualClient:
    """The load generator's side of one point, in virtual time: sends, records, load modes, the ramp
    and the stop rule, as ``workloads.scheduler`` and ``workloads.shard`` define them."""

    def __init__(self, trial: VirtualTrial, point: LoadPoint, spec: RequestSpec) -> None:
        from workloads.window import StabilityTracker  # imported late: the workloads package is large

        self.trial = trial
        self.sim = trial.sim
        self.point = point
        self.spec = spec
        from workloads.payloads import build_body, request_ids

        self.build_body = build_body
        self.request_ids = request_ids
        # each request's prompt ids as the client sent them (None: text, which the server tokenizes),
        # for the prompts' offered reuse
        self.sent_ids: dict[int, np.ndarray | None] = {}
        self.rank_of_index: dict[int, int] = {}  # request index -> the scheduler it went to (several only)
        self.records: dict[int, RequestRecord] = {}
        self.in_flight = 0
        self.held: collections.deque[tuple[int, float]] = collections.deque()  # open loop, over the cap
        # closed loop: the next index a worker takes; None = no count (bounded by duration_s only)
        self.next_index = 0
        self.limit = point.total_requests if point.measured_requests is not None else None
        self.deadline: float | None = None  # end of the duration_s window, set by the first measured send
        self.first_measured_sent = False
        self.window_target = 1  # requests in flight that end the ramp (closed loop: the concurrency)
        self.held_at: float | None = None  # when the load first held (``window_target`` in flight)
        self.ended_since_held = 0  # requests (sessions) ended since: C of them are one turnover
        self.held_marked = False
        self.window_open = False
        self.window_closed = False
        # a point run until its numbers are known, p99s included (orchestrator/points/virtual.py: a trial's
        # own) is judged on a window of at least VIRTUAL_MIN_DURATIONS request durations: once the rule
        # stops it, the requests in flight finish with no new prefills among them and, when they run in
        # step, deliver faster for about one duration still inside the window; at that length it weighs
        # under half of one of the window's ten batches
        floor = VIRTUAL_MIN_DURATIONS if point.latency_ci_target is not None else 0.0
        self.tracker = (StabilityTracker(point, point.ci_target, floor) if point.ci_target is not None
                        else None)
        self.enough = False
        self.checks_from = 0.0
        self.open_sends_left = 0
        # closed loop on sessions: each session's first index (and one past the last), the next session
        # a stream takes
        self.starts = point.session_starts() if point.sessions is not None else None
        self.session_firsts = set(self.starts or ())
        self.next_session = 0
        # what the window's ramp waits for: requests in flight, or with sessions sessions begun and not
        # ended (a session thinking between turns has nothing in flight and is still one of the C)
        self.load_held = 0

    def start(self) -> None:
        point, sim = self.point, self.sim
        t0 = sim.now
        if point.open_loop and self.starts is not None:
            # sessions arriving at a rate: each session's first turn on the schedule, the later ones
            # after its answers (``_on_output``)
            firsts = [(self.starts[s], off) for s, off in enumerate(point.session_offsets().tolist())
                      if self.starts[s] < point.total_requests]
            self.open_sends_left = len(firsts)
            for i, off in firsts:
                sim.schedule(t0 + off, self._open_send, i, t0 + off)
        elif point.open_loop:
            offsets = point.send_offsets().tolist()
            self.open_sends_left = len(offsets)
            for i, off in enumerate(offsets):
                sim.schedule(t0 + off, self._open_send, i, t0 + off)
        else:
            assert point.concurrency is not None
            workers = point.streams
            assert workers is not None
            self.window_target = workers
            # stream k enters at k / C * ramp_s; a burst (ramp_s 0) leaves the load generator's one
            # event loop ~20 µs apart (CLIENT_SEND_SPACING_S)
            step = point.ramp_s / point.concurrency if point.ramp_s > 0 else self.trial.send_spacing
            for k in range(workers):
                if k == 0 or step <= 0:
                    self._enter_one(None)
                else:
                    sim.schedule(t0 + k * step, self._enter_one, None)
        if self.tracker is not None:
            self.checks_from = t0
            sim.schedule(t0 + STABLE_CHECK_S, self._check_stable, None)

    def _enter_one(self, _: None) -> None:
        i = self._claim(self.sim.now)
        if i is not None:
            self._send(i, None)

    def _check_stable(self, _: None) -> None:
        assert self.tracker is not None
        if self._sending_over():
            return
        now = self.sim.now
        self.enough = self.tracker.stable(now)
        if not self.enough:
            step = STABLE_CHECK_S
            if self.point.duration_s is not None:
                # a point that runs until its numbers are known may run for minutes of virtual time:
                # each check a tenth later than the last keeps their count logarithmic in its length
                step = max(step, CHECK_GROWTH * (now - self.checks_from))
            self.sim.schedule(now + step, self._check_stable, None)

    def _sending_over(self) -> bool:
        if self.point.open_loop:
            return self.open_sends_left == 0
        if self.starts is not None and self.next_session >= len(self.starts) - 1:
            return True
        if self.limit is not None and self.next_index >= self.limit:
            return True
        return self.deadline is not None and self.sim.now >= self.deadline

    def _claim(self, send_at: float, after: int | None = None) -> int | None:
        """The index a closed-loop worker sends at ``send_at``, or None when the point has sent enough: its
        request count is reached, the duration window (opened by the first measured send) is over, or
        the stop rule said its throughput is known. With sessions, ``after`` is the index the worker
        just finished: its session's next turn, else the first turn of the next session."""
        point = self.point
        new_session = False
        if self.starts is None:
            i = self.next_index
        elif after is not None and self.next_turn(after) is not None:
            i = after + 1
        elif self.next_session < len(self.starts) - 1:
            i, new_session = self.starts[self.next_session], True
        else:
            return None
        if self.enough or (self.limit is not None and i >= self.limit):
            return None
        if i >= point.warmup_requests and point.duration_s is not None:
            if self.deadline is None:
                self.deadline = send_at + point.duration_s
            elif send_at >= self.deadline:
                return None
        if self.starts is None:
            self.next_index += 1
        elif new_session:
            self.next_session += 1
        return i

    def next_turn(self, i: int) -> int | None:
        """With sessions: the index of the turn after request ``i`` in its session (None: its last)."""
        assert self.starts is not None
        return i + 1 if i + 1 < self.starts[bisect.bisect_right(self.starts, i)] else None

    def _send(self, i: int, scheduled: float | None) -> None:
        now = self.sim.now
        fast = self.request_ids(self.spec, i)  # token ids sent as they are: no body to build
        if fast is not None:
            prompt, n_in, n_out = fast
            self.sent_ids[i] = prompt
        else:
            body, n_in, n_out = self.build_body(self.spec, i)
            prompt = _server_prompt(self.spec, body)
            sent = body.get("input_ids", body.get("prompt"))
            self.sent_ids[i] = np.asarray(sent, dtype=np.int64) if isinstance(sent, list) else None
        warmup = i < self.point.warmup_requests
        rec = RequestRecord(point=self.point.label, index=i, warmup=warmup,
                            scheduled_time=scheduled, send_time=now, first_byte_time=now, input_tokens=n_in)
        self.records[i] = rec
        req = self.trial.submit(prompt, n_out)
        if self.trial.rank_of:
            self.rank_of_index[i] = self.trial.rank_of.pop(req.rid)
        req.notify = lambda: self._on_output(req, rec)
        self.in_flight += 1
        if self.starts is None or i in self.session_firsts:
            self.load_held += 1
        if self.tracker is not None:
            self.tracker.sent(i, now, warmup)
        if not warmup and not self.first_measured_sent:
            self.first_measured_sent = True
            self.trial.mark("first")
        if self.held_at is None and self.load_held >= self.window_target:
            self.held_at = now
            self.ended_since_held = 0
        if self.held_at is not None and self.first_measured_sent and not self.held_marked:
            self.held_marked = True
            self.trial.mark("held")  # where a point too short for its turnover opens its window
        self._maybe_open()  # on a send: the one that replaced the turnover's last request opens it
        if self.point.open_loop and self.window_open and scheduled is not None:
            self.trial.mark("close")  # the last send on the schedule closes an open-loop window

    def _maybe_open(self) -> None:
        """On a send: open the window if the ramp is over (``workloads.window``): the load has held for
        one turnover (closed loop: C ends since C were first in flight; open loop: at once), and the
        first measured request has been sent."""
        if self.window_open or not self.first_measured_sent or self.held_at is None:
            return
        if self.point.open_loop or self.ended_since_held >= self.window_target:
            self.window_open = True
            self.trial.mark("open")

    def _on_output(self, req: Request, rec: RequestRecord) -> None:
        sim = self.sim
        rec.output_tokens = record_emission(req, rec, sim.now, rec.output_tokens)
        if req.finished and rec.end_time is None:
            rec.end_time = sim.now
            rec.finish_reason = (req.finish_reason or {}).get("type", "length")
            req.notify = None
            self.in_flight -= 1
            if self.starts is None or rec.index + 1 in self.session_firsts:
                self.load_held -= 1
                if self.held_at is not None:
                    self.ended_since_held += 1
            if not rec.warmup:
                self.trial.mark("last")
            if self.tracker is not None:
                self.tracker.ended(rec)
            if not self.point.open_loop:
                turnaround = self.trial.turnaround
                if self.starts is not None and self.next_turn(rec.index) is not None:
                    turnaround += self.point.think_s  # the session's next turn, after its think time
                i = self._claim(sim.now + turnaround, rec.index)
                if i is None:
                    if self.held_marked and not self.window_closed:
                        self.window_closed = True  # the first stream not replaced closes the window
                        self.trial.mark("close")
                    return
                if turnaround > 0:
                    sim.schedule(sim.now + turnaround, self._send, i, None)
                else:
                    self._send(i, None)
            elif self.starts is not None:  # a session arriving at a rate: its next turn
                nxt = self.next_turn(rec.index)
                if nxt is not None and nxt < self.point.total_requests and not self.enough:
                    sim.schedule(sim.now + self.trial.turnaround + self.point.think_s, self._send, nxt, None)
            elif self.held:
                self._send(*self.held.popleft())

    def _open_send(self, i: int, scheduled: float) -> None:
        self.open_sends_left -= 1
        if self.enough:
            return
        cap = self.point.max_concurrency
        if cap and self.in_flight >= cap:
            self.held.append((i, scheduled))
        else:
            self._send(i, scheduled)


def record_emission(req: Request, rec: RequestRecord, now: float, emitted: int) -> int:
    """The client's view of an emission: ``req``'s tokens beyond the ``emitted`` so far reach it as one
    stream chunk of ``rec`` at ``now`` (the first also sets its TTFT, the model's queue wait and the cached
    prompt tokens). Returns the tokens emitted so far."""
    n = len(req.output_ids)
    if n <= emitted:
        return emitted
    if rec.first_token_time is None:
        rec.first_token_time = now
        # the model's queue wait (a disaggregated request's from its arrival at the router)
        rec.server_queue_s = req.forward_entry - (req.pd.arrival if req.pd is not None else req.arrival)
        rec.cached_tokens = req.cached
        if req.pd is not None:  # a disaggregated deployment: its TTFT's parts, as a decode server reports
            rec.pd_parts_s = list(req.pd.parts().values())
    rec.chunk_times.append(now)
    rec.chunk_tokens.append(n - emitted)
    return n


def predict_trial(argv: list[str], points: list[LoadPoint], spec: RequestSpec,
                  send_spacing_s: float = CLIENT_SEND_SPACING_S) -> list[PointResult]:
    """Every point of one trial, in order on one virtual clock: each starts the instant the previous one
    drained (a live trial also starts the next point only after the previous one's requests ended).

    Each point runs on a fresh engine configured once by ``argv`` and warmed up as SGLang's server warms
    itself up (``VirtualTrial._warm_up``), so its prediction does not depend on the points before it: the
    same as a search or a diagnosis predicts that load alone. Nothing a real engine keeps between points
    would change it: no request is running, the prefix cache is flushed before each point, and an idle
    engine's PP stages turn their ring the same way whatever they served before.
    """
    engine = load_config(argv)
    return run_points(lambda: VirtualTrial(engine), points, spec, send_spacing_s)


def run_points(fresh: Callable[[], VirtualTrial], points: list[LoadPoint], spec: RequestSpec,
               send_spacing_s: float = CLIENT_SEND_SPACING_S) -> list[PointResult]:
    """Each point on a fresh engine (``fresh()``), one after another on one virtual clock."""
    results: list[PointResult] = []
    now = 0.0
    for p in points:
        trial = fresh()
        trial.send_spacing = send_spacing_s
        trial.sim.now = max(trial.sim.now, now)  # after its warm-up, and after the point before
        results.append(trial.run_point(p, spec))
        now = trial.sim.now
    return results


def predict_point(argv: list[str], point: LoadPoint, spec: RequestSpec,
                  send_spacing_s: float = CLIENT_SEND_SPACING_S) -> PointResult:
    """One load point against a fresh engine configured by ``argv``, in virtual time (see module doc).
    ``send_spacing_s=0`` sends a closed-loop point's first requests all at once (the textbook case)."""
    return predict_trial(argv, [point], spec, send_spacing_s)[0]
