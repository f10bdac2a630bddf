"""What a load point is and what its requests look like: the words the load generator, the simulator's
prediction and the orchestrator's load plan share.

* :class:`LoadPoint`: one load level, closed loop (``concurrency``) or open loop (``rate``), and how
  long it lasts; its :attr:`LoadPoint.label` is the metric prefix (``c8``, ``r2.5``).
* :class:`RequestSpec`: what each request sends (API, lengths and their distributions, prompts, or a
  :class:`Source` of real traffic: a dataset or a timed trace).
* :func:`parse_arrival`: an arrival process as written in a config (``poisson``, ``gamma:CV``, ...).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from vocab.metric_keys import PointLabel
from vocab.prompts import load_prompts

# Open-loop arrival processes. ``gamma:CV``: gamma-distributed gaps whose coefficient of variation is CV
# (1 is Poisson, above 1 burstier, below 1 more regular); ``trace``: a trace's own timestamps.
ARRIVALS: tuple[str, ...] = ("poisson", "gamma:CV", "constant", "trace")


def parse_arrival(text: str) -> tuple[str, float]:
    """``poisson`` -> ("poisson", 1.0); ``gamma:2`` -> ("gamma", 2.0); ``constant``; ``trace``.
    Raises ValueError naming what would be valid."""
    kind, _, param = str(text).strip().partition(":")
    if kind in ("poisson", "constant", "trace") and not param:
        return kind, 1.0
    if kind == "gamma":
        try:
            cv = float(param)
        except ValueError:
            cv = math.nan
        if cv > 0 and math.isfinite(cv):
            return kind, cv
        raise ValueError("gamma needs its coefficient of variation, a number > 0 (e.g. gamma:2), "
                         f"got {text!r}")
    raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, got {text!r}")


Api = Literal["generate", "completions", "chat"]
APIS: tuple[str, ...] = ("generate", "completions", "chat")

ENDPOINTS: dict[str, str] = {
    "generate": "/generate",
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}


@dataclass(frozen=True)
class LoadPoint:
    """One load level: exactly one of ``concurrency`` (closed loop) or ``rate`` (open loop, req/s).

    The point's length is ``num_requests`` measured requests, or ``duration_s`` seconds of measured
    sends, or both (whichever ends first). In duration mode, closed-loop workers stop taking new
    requests ``duration_s`` after the first measured send and the requests in flight then finish;
    open loop sends every request whose scheduled time falls within ``duration_s`` of the first
    measured one (the count is fixed by the schedule, so it is known up front).

    ``ramp_s`` (closed loop): the streams enter one by one, stream k at ``k / C * ramp_s`` seconds (a
    parasweep trial sets it to about one request's predicted duration); 0: all at once (a burst).

    ``ci_target``: stop the point early once its throughput is known to within this fraction (the
    relative half-width of the 95 % confidence interval of its window's batch means, e.g. 0.03), the
    request count and ``duration_s`` then being upper bounds. None: run the whole count.
    ``latency_ci_target``: with ``ci_target``, the stop rule also waits for the TTFT and ITL p99 of
    the window's requests to be known to within this fraction (their distribution-free 95 % intervals);
    a point in virtual time sets both (``orchestrator.points.virtual``).

    ``schedule`` (``arrival="trace"``): every request's send offset in seconds, warm-up first, taken
    from a trace (already scaled and windowed); ``rate`` is then the schedule's mean rate, the point's
    name.

    ``sessions`` (multi-turn traffic): the number of turns of each session, in order; a session sends
    its turns one after another, the next ``think_s`` seconds after the previous answer ended. Closed
    loop: ``concurrency`` sessions in flight, each stream taking the next session when its session
    ends. Open loop: sessions arrive at ``rate`` per second (their first turns on the ``arrival``
    process's schedule, :meth:`session_offsets`). Request indices run over the sessions' turns in order
    (session 0's turns first).
    """

    num_requests: int | None = None
    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "poisson"  # see ARRIVALS
    max_concurrency: int | None = None
    warmup_requests: int = 0
    seed: int = 0  # seeds the Poisson arrival schedule
    duration_s: float | None = None
    ramp_s: float = 0.0
    ci_target: float | None = None
    latency_ci_target: float | None = None
    schedule: tuple[float, ...] | None = None
    sessions: tuple[int, ...] | None = None
    think_s: float = 0.0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.rate is not None and not (self.rate > 0 and np.isfinite(self.rate)):
            raise ValueError("rate must be a positive finite number of requests per second")
        kind, _ = parse_arrival(self.arrival)
        if (kind == "trace") != (self.schedule is not None):
            raise ValueError("a trace's schedule goes with arrival='trace', and only with it")
        if self.schedule is not None and (not self.schedule or any(
                b < a for a, b in zip(self.schedule, self.schedule[1:], strict=False))):
            raise ValueError("a schedule is a non-empty list of non-decreasing send offsets")
        if self.sessions is not None:
            if not self.sessions or min(self.sessions) < 1:
                raise ValueError("sessions: every session has at least one turn")
            if self.schedule is not None or self.max_concurrency is not None:
                raise ValueError("sessions arrive at a rate or run in closed loop: not on a trace's "
                                 "schedule, and not under a max_concurrency cap")
            if self.num_requests is None:
                raise ValueError("sessions need num_requests (their turns, warm-up excluded)")
        if not (self.think_s >= 0 and np.isfinite(self.think_s)):
            raise ValueError("think_s must be a number of seconds >= 0")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s (or both)")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError("num_requests must be >= 1")
        if self.warmup_requests < 0:
            raise ValueError("warmup_requests must be >= 0")
        if self.duration_s is not None and not (self.duration_s > 0 and np.isfinite(self.duration_s)):
            raise ValueError("duration_s must be a positive number of seconds")
        if not (self.ramp_s >= 0 and np.isfinite(self.ramp_s)):
            raise ValueError("ramp_s must be a number of seconds >= 0")
        if self.ci_target is not None and not 0 < self.ci_target < 1:
            raise ValueError("ci_target must be a fraction between 0 and 1, e.g. 0.03 (or None)")

    @property
    def point_label(self) -> PointLabel:
        if self.concurrency is not None:
            return PointLabel.closed(self.concurrency)
        assert self.rate is not None
        return PointLabel.open(self.rate)

    @property
    def label(self) -> str:
        """``c8`` for concurrency 8, ``r2.5`` / ``r200`` for rates (the MLflow metric prefix)."""
        return str(self.point_label)

    @property
    def open_loop(self) -> bool:
        return self.rate is not None

    @property
    def measured_requests(self) -> int | None:
        """Measured requests this point sends, if known before it runs (None: closed loop by duration)."""
        if self.sessions is None and self.open_loop and (self.duration_s is not None
                                                         or self.schedule is not None):
            return len(self.send_offsets()) - self.warmup_requests
        return self.num_requests

    @property
    def streams(self) -> int | None:
        """Closed loop: the requests kept in flight once every stream has entered, the concurrency or
        the point's whole count where that is smaller (None: open loop)."""
        if self.concurrency is None:
            return None
        if self.sessions is not None:
            return min(self.concurrency, len(self.sessions))
        return self.concurrency if self.measured_requests is None else min(self.concurrency,
                                                                          self.total_requests)

    @property
    def total_requests(self) -> int:
        """Warmup plus measured requests; for a closed-loop point bounded only by duration, the
        warmup plus the concurrency (the least it can send; it sends more)."""
        n = self.measured_requests
        if n is None:
            assert self.concurrency is not None
            return self.warmup_requests + self.concurrency
        return self.warmup_requests + n

    def send_offsets(self) -> np.ndarray:
        """Send time of every request (warmup first), in seconds from the schedule start."""
        if self.rate is None:
            raise ValueError("closed-loop points have no send schedule")
        return _offsets(
            self.rate, self.arrival, self.seed, self.warmup_requests, self.num_requests, self.duration_s,
            self.schedule,
        )

    def session_offsets(self) -> np.ndarray:
        """Open loop on sessions: when each session's first turn is sent, in seconds from the schedule
        start (the arrival process at ``rate`` sessions per second)."""
        if self.rate is None or self.sessions is None:
            raise ValueError("only an open-loop point of sessions has session arrivals")
        return _offsets(self.rate, self.arrival, self.seed, 0, len(self.sessions), None, None)

    def session_starts(self) -> tuple[int, ...]:
        """The request index of each session's first turn (closed loop on sessions), and one past the
        last turn at the end."""
        assert self.sessions is not None
        return _session_starts(self.sessions)


@functools.lru_cache(maxsize=8)
def _session_starts(sessions: tuple[int, ...]) -> tuple[int, ...]:
    return (0, *np.cumsum(sessions).tolist())


@functools.lru_cache(maxsize=32)
def _offsets(
    rate: float, arrival: str, seed: int, warmup: int, num: int | None, duration: float | None,
    schedule: tuple[float, ...] | None,
) -> np.ndarray:
    kind, cv = parse_arrival(arrival)

    def make(n: int) -> np.ndarray:
        if kind == "trace":
            assert schedule is not None
            return np.asarray(schedule[:n], dtype=float)
        if kind == "constant":
            return np.arange(n, dtype=float) / rate
        rng = np.random.default_rng(seed)
        if kind == "gamma":
            # shape 1/CV^2 gives gaps whose coefficient of variation is CV; the scale keeps the mean
            # gap 1/rate (shape 1 is the exponential: Poisson)
            shape = 1.0 / (cv * cv)
            gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n)
        else:
            gaps = rng.exponential(1.0 / rate, size=n)
        gaps[0] = 0.0  # the first request opens the schedule
        return np.cumsum(gaps)

    if kind == "trace":
        assert schedule is not None
        out = make(len(schedule) if num is None else min(len(schedule), warmup + num))
        if duration is not None and len(out) > warmup:
            keep = int(np.searchsorted(out, out[warmup] + duration, side="left"))
            out = out[:max(keep, warmup + 1)]
    elif duration is None:
        assert num is not None
        out = make(warmup + num)
    else:
        # Enough arrivals to cover the window almost surely; the same seed gives the same prefix.
        n = warmup + int(rate * duration * 1.2) + 64
        while True:
            out = make(n)
            if out[-1] > out[min(warmup, n - 1)] + duration:
                break
            n *= 2
        t_measured = out[warmup]
        keep = int(np.searchsorted(out, t_measured + duration, side="left"))
        keep = max(keep, warmup + 1)
        if num is not None:
            keep = min(keep, warmup + num)
        out = out[:keep]
    out.setflags(write=False)
    return out


DISTRIBUTIONS = ("fixed", "uniform", "normal", "exponential", "lognormal")


@dataclass(frozen=True)
class LengthDist:
    """A length distribution around a nominal length ``n`` (its mean, up to clipping at 1).

    ``kind:param`` as written on the command line:

    * ``fixed``: always ``n``.
    * ``uniform:R``: integers uniform in ``[n(1-R), n(1+R)]`` (0 <= R <= 1; mean ``n``).
    * ``normal:CV``: normal with mean ``n`` and standard deviation ``CV * n``, rounded.
    * ``exponential``: exponential with mean ``n``, rounded up (heavy on short lengths).
    * ``lognormal:SIGMA``: lognormal with mean ``n`` and log-space sigma ``SIGMA`` (long tail).

    Every sample is clipped to ``[1, max_len]`` when ``max_len`` is set (else ``[1, inf)``).
    """

    n: int
    kind: str = "fixed"
    param: float = 0.0
    max_len: int | None = None

    @classmethod
    def parse(cls, text: str, n: int, max_len: int | None = None) -> LengthDist:
        kind, _, param = text.strip().partition(":")
        if kind not in DISTRIBUTIONS:
            raise ValueError(f"length distribution must be one of {', '.join(DISTRIBUTIONS)}, got {text!r}")
        needs = kind in ("uniform", "normal", "lognormal")
        if needs and not param:
            raise ValueError(f"{kind} needs a parameter, e.g. {kind}:0.5")
        if not needs and param:
            raise ValueError(f"{kind} takes no parameter, got {text!r}")
        try:
            value = float(param) if param else 0.0
        except ValueError:
            raise ValueError(f"bad parameter in {text!r}") from None
        if kind == "uniform" and not 0 <= value <= 1:
            raise ValueError("uniform:R needs 0 <= R <= 1")
        if kind in ("normal", "lognormal") and not value > 0:
            raise ValueError(f"{kind} needs a positive parameter")
        return cls(n, kind, value, max_len)

    def sample(self, rng: np.random.Generator) -> int:
        n, kind, p = self.n, self.kind, self.param
        if kind == "fixed":
            v = float(n)
        elif kind == "uniform":
            lo, hi = round(n * (1 - p)), round(n * (1 + p))
            v = float(rng.integers(lo, hi + 1))
        elif kind == "normal":
            v = round(rng.normal(n, p * n))
        elif kind == "exponential":
            v = math.ceil(rng.exponential(n))
        else:  # lognormal with mean n: mu = ln(n) - sigma^2 / 2
            v = round(rng.lognormal(math.log(n) - p * p / 2, p))
        out = max(1, int(v))
        return min(out, self.max_len) if self.max_len else out

    @property
    def mean(self) -> float:
        """The nominal mean (before clipping)."""
        return float(self.n)

    @property
    def upper(self) -> int | None:
        """The longest length a sample can take (None: unbounded)."""
        if self.kind == "fixed":
            bound: int | None = self.n
        elif self.kind == "uniform":
            bound = round(self.n * (1 + self.param))
        else:
            bound = None
        if self.max_len is not None:
            return self.max_len if bound is None else min(bound, self.max_len)
        return bound



SOURCES: tuple[str, ...] = ("random", "sharegpt", "mooncake", "azure", "shared-prefix")
TRACE_SOURCES: tuple[str, ...] = ("mooncake", "azure")


@dataclass(frozen=True)
class SharedPrefix:
    """SGLang's generated-shared-prefix shape: ``groups`` system prompts of ``system_len`` tokens, each
    followed in ``prompts_per_group`` requests by a question of ``question_len`` tokens of its own, each
    asking for ``output_len`` tokens. One pass sends every (group, question) once, in a seeded shuffle;
    with ``zipf`` (an exponent > 0) each request's group is drawn instead, group k with weight
    1 / (k + 1) ** zipf, so a few groups are popular and the rest rare."""

    groups: int = 16
    prompts_per_group: int = 8
    system_len: int = 2048
    question_len: int = 128
    output_len: int = 256
    zipf: float | None = None

    def __post_init__(self) -> None:
        for name in ("groups", "prompts_per_group", "system_len", "question_len", "output_len"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.zipf is not None and not (math.isfinite(self.zipf) and self.zipf > 0):
            raise ValueError(f"zipf must be an exponent > 0 (or null: every group equally often), "
                             f"got {self.zipf!r}")


@dataclass(frozen=True)
class Source:
    """Real traffic to send instead of generated prompts (``workloads/sources/`` reads it).

    * ``kind``: ``sharegpt`` (conversations: prompts and recorded answers' lengths), ``mooncake``
      (a JSONL trace: timestamps, lengths, prefix block hashes) or ``azure`` (a CSV trace: timestamps
      and lengths).
    * ``path``: the file; None takes the copy parasweep ships (or installs, for ShareGPT).
    * ``tokenizer``: how text becomes token ids: ``quicktok:<encoding>`` or a ``tokenizer.json`` path.
    * ``multi_turn`` (ShareGPT): one request per turn, each carrying the conversation so far; else one
      request per conversation, its first turn. ``think_s``: seconds between an answer and the
      session's next question.
    * ``context``: the model's context length: a request longer than it is skipped and counted.
    * ``start_s`` / ``window_s`` (traces): the part of the trace to replay, from its first timestamp.
    * ``block_size`` (Mooncake): tokens per prefix block hash.
    * ``shared_prefix`` (``shared-prefix``): the groups' shape (:class:`SharedPrefix`).
    """

    kind: str
    path: str | None = None
    tokenizer: str = "quicktok:llama3"
    multi_turn: bool = False
    think_s: float = 0.0
    context: int | None = None
    start_s: float = 0.0
    window_s: float | None = None
    block_size: int = 512
    shared_prefix: SharedPrefix = field(default_factory=SharedPrefix)

    def __post_init__(self) -> None:
        if self.kind not in SOURCES[1:]:
            raise ValueError(f"a source is one of {', '.join(SOURCES[1:])}, got {self.kind!r}")
        if self.multi_turn and self.kind != "sharegpt":
            raise ValueError("multi-turn sessions come from ShareGPT conversations")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if not (self.think_s >= 0 and math.isfinite(self.think_s)):
            raise ValueError("think_s must be a number of seconds >= 0")
        if self.start_s < 0 or (self.window_s is not None and not self.window_s > 0):
            raise ValueError("a trace window starts at 0 s or later and lasts more than 0 s")

    @property
    def timed(self) -> bool:
        """Whether the source carries arrival times (a trace)."""
        return self.kind in TRACE_SOURCES


@dataclass(frozen=True)
class RequestSpec:
    """What to send. Every request set is a pure function of these fields and the request index.

    ``model`` is the OpenAI ``model`` field; ``None`` lets :func:`workloads.run_point` ask
    ``GET /v1/models`` once (and omit the field if the server cannot say).
    ``continuous_usage`` asks OpenAI servers for a running ``usage`` on every chunk, which
    gives exact per-chunk token counts when the server coalesces tokens.
    ``input_dist`` / ``output_dist`` draw each request's lengths around ``input_len`` /
    ``output_len`` (see :class:`LengthDist`; ``fixed`` by default), clipped at ``input_max_len`` /
    ``output_max_len`` when set.
    ``prompt_file`` takes prompts from a JSONL file instead (row ``index % rows``, or a
    seeded shuffle with ``shuffle_prompts``); a row's ``output_len`` overrides ``output_len``.
    ``source`` takes requests from real traffic instead (see :class:`Source`): lengths, prompts and
    output lengths are then the source's, and token ids beyond ``vocab_size`` are folded into it.
    """

    api: Api = "generate"
    input_len: int = 128
    output_len: int = 128
    seed: int = 0
    vocab_size: int = 32000
    model: str | None = None
    continuous_usage: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)
    input_dist: str = "fixed"
    output_dist: str = "fixed"
    prompt_file: str | None = None
    shuffle_prompts: bool = False
    input_max_len: int | None = None  # samples of input_dist / output_dist are clipped at these
    output_max_len: int | None = None
    source: Source | None = None

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError("input_len and output_len must be >= 1")
        if self.vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")
        self.input_lengths()
        self.output_lengths()
        if self.prompt_file is not None:
            rows = load_prompts(self.prompt_file)
            if self.api == "chat" and any(r.input_ids is not None for r in rows):
                raise ValueError("prompt rows given as input_ids cannot be sent to the chat API")
        if self.source is not None and self.prompt_file is not None:
            raise ValueError("give a prompt file or a source, not both")
        if self.source is not None and self.source.kind != "sharegpt" and self.api == "chat":
            raise ValueError(f"a {self.source.kind} trace has token counts, not text: send it with the "
                             "generate or completions API")

    @property
    def path(self) -> str:
        return ENDPOINTS[self.api]

    def input_lengths(self) -> LengthDist:
        return LengthDist.parse(self.input_dist, self.input_len, self.input_max_len)

    def output_lengths(self) -> LengthDist:
        return LengthDist.parse(self.output_dist, self.output_len, self.output_max_len)
