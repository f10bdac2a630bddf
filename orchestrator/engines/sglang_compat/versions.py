"""What differs between SGLang versions: flag spellings, the flag set itself, and the facts of each
recorded release (routes, metrics, environment variables) the adapter relies on.

The facts were read from SGLang's released wheels by ``scripts/sglang_facts.py`` and are committed in
``releases/sglang-<version>.json``; docs/sglang-adapter.md summarises them. Where the exact release of
a change is unknown (a gap between two versions that were checked), the installed flag set decides;
the version thresholds are only the fallback when no flag set is at hand.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from importlib import resources

Version = tuple[int, ...]

NEWEST_KNOWN = "0.5.23"  # the newest SGLang whose facts are recorded in this package
# The oldest release parasweep launches. Older ones differ where a trial cannot work around it: 0.5.3
# and 0.4.6.post5 serve no /server_info (only /get_server_info), stamp their logs to the second (no
# SGLANG_LOG_MS), and 0.4.6.post5 answers /health before warm-up and labels its scheduler metrics
# without pp_rank, so every PP stage would collapse into one series.
OLDEST_SUPPORTED = "0.5.9"
# releases/sglang-<v>.json of the supported range (older ones: evidence): both ends, and the releases on
# either side of each version threshold below (docs/sglang-adapter.md, "Releases recorded")
RECORDED = ("0.5.9", "0.5.10", "0.5.12", "0.5.13", "0.5.14", "0.5.16", "0.5.19", "0.5.20", "0.5.21", "0.5.22",
            "0.5.23")


def parse_version(text: str) -> Version:
    """``"0.5.23"`` -> (0, 5, 23); pre/post/dev suffixes (``0.4.6.post5``, ``0.5.10rc0``) are dropped:
    flag sets change between releases, not between a release and its post-release."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(x) for x in m.group(1).split("."))


@dataclass(frozen=True)
class Spelling:
    flag: str
    since: Version = (0,)  # first release known to accept it
    until: Version | None = None  # first release known to reject it (None: still accepted)

    def in_range(self, v: Version) -> bool:
        return v >= self.since and (self.until is None or v < self.until)


# --schedule-policy values newer than the supported range's start: the first release that accepts each
# (read from each release's choices list; every other value in SCHEDULE_POLICIES is in all of them)
SCHEDULE_POLICY_SINCE: dict[str, Version] = {"hrrn": (0, 5, 20), "shortest-prefill-first": (0, 5, 22)}


# Canonical name (the newest dest) -> spellings, newest first.
RENAMES: dict[str, tuple[Spelling, ...]] = {
    # renamed in 0.5.4 (PR #11279)
    "pp_max_micro_batch_size": (Spelling("--pp-max-micro-batch-size", (0, 5, 4)),
                                Spelling("--max-micro-batch-size", until=(0, 5, 4))),
    # new in 0.5.7; absent in 0.5.4-0.5.6
    "pp_async_batch_depth": (Spelling("--pp-async-batch-depth", (0, 5, 7)),),
    # the -decode/-prefill split is new in 0.5.14; the old names stay deprecated aliases of the decode
    # flags up to 0.5.19 and are gone from 0.5.20, where they are ambiguous prefixes of the split ones
    "cuda_graph_max_bs_decode": (Spelling("--cuda-graph-max-bs-decode", (0, 5, 14)),
                                 Spelling("--cuda-graph-max-bs", until=(0, 5, 20))),
    "cuda_graph_bs_decode": (Spelling("--cuda-graph-bs-decode", (0, 5, 14)),
                             Spelling("--cuda-graph-bs", until=(0, 5, 20))),
    # renamed in 0.5.10; the old name stays a deprecated alias up to 0.5.19 and is gone from 0.5.20
    "incremental_streaming_output": (Spelling("--incremental-streaming-output", (0, 5, 10)),
                                     Spelling("--stream-output", until=(0, 5, 20))),
    # new in 0.5.22 (with the alias --attention-data-parallel-size); 0.5.21 has neither, and releases
    # before 0.5.22 express attention DP as --enable-dp-attention with --dp-size N
    "attn_dp_size": (Spelling("--attn-dp-size", (0, 5, 22)),),
}
# Older names users may write in server.extra_args -> canonical name.
ALIASES: dict[str, str] = {
    "max_micro_batch_size": "pp_max_micro_batch_size",
    "cuda_graph_max_bs": "cuda_graph_max_bs_decode",
    "cuda_graph_bs": "cuda_graph_bs_decode",
    "stream_output": "incremental_streaming_output",
}


@dataclass(frozen=True)
class FlagSet:
    """The option strings one SGLang version's parser accepts, each with its argparse dest."""

    version: str
    options: dict[str, str]  # option string -> dest
    takes_value: dict[str, bool] = field(default_factory=dict)
    source: str = ""  # where the list came from, for messages
    choices: dict[str, list[object]] = field(default_factory=dict)  # option string -> the values it accepts

    def __contains__(self, flag: str) -> bool:
        return flag in self.options

    def dest(self, flag: str) -> str | None:
        return self.options.get(flag)

    def prefix_matches(self, flag: str) -> list[str]:
        """What argparse's abbreviation matching would expand ``flag`` to (why we never abbreviate)."""
        return sorted(o for o in self.options if o.startswith(flag) and o != flag)

    def to_json(self) -> dict[str, object]:
        """One entry per option string: options of one dest may differ in whether a value follows
        (0.5.16's bare --disable-piecewise-cuda-graph stores into --cuda-graph-backend-prefill's dest)."""
        return {"sglang_version": self.version, "how": self.source,
                "actions": [{"options": [opt], "dest": dest, "takes_value": self.takes_value.get(opt, True),
                             **({"choices": self.choices[opt]} if opt in self.choices else {})}
                            for opt, dest in self.options.items()]}

    @classmethod
    def from_json(cls, data: dict, source: str | None = None) -> FlagSet:
        options: dict[str, str] = {}
        takes: dict[str, bool] = {}
        choices: dict[str, list[object]] = {}
        for action in data["actions"]:
            for opt in action["options"]:
                options[opt] = action["dest"]
                takes[opt] = bool(action.get("takes_value", True))
                if action.get("choices"):
                    choices[opt] = list(action["choices"])
        return cls(str(data["sglang_version"]), options, takes, source or str(data.get("how", "")), choices)


@dataclass(frozen=True)
class ReleaseFacts:
    """What one SGLang release offers, as read from its wheel (``scripts/sglang_facts.py``)."""

    version: str
    flags: FlagSet
    routes: dict[str, list[str]]  # path -> methods
    metrics: dict[str, dict[str, object]]  # exposed name -> {"type", "labelnames"}
    scheduler_labels: list[str]  # the labels on every scheduler metric
    scheduler_labels_conditional: list[str]  # labels added where a setting asks (dp_rank, priority)
    env: list[str]  # SGLANG_* variables the release reads
    pd: dict[str, object]  # disaggregation: the transfer backends it accepts, its PD fields' defaults

    @classmethod
    @functools.cache  # a handful of committed files, each read once per process
    def load(cls, version: str) -> ReleaseFacts:
        path = resources.files(__package__).joinpath(f"releases/sglang-{version}.json")
        data = json.loads(path.read_text())
        flags = FlagSet.from_json({"sglang_version": data["sglang_version"], "actions": data["flags"]},
                                  source=f"recorded flag set of SGLang {version} (read from {data['wheel']})")
        metrics = data["metrics"]
        return cls(version, flags, data["routes"], metrics["series"], metrics["scheduler_labels"],
                   metrics["scheduler_labels_conditional"], data["env"], data.get("pd", {}))


def release_facts(version: str) -> ReleaseFacts:
    """The recorded release that stands for ``version``: the newest recorded one at or below it (a
    release between two recorded ones behaves like the older of them until it is recorded itself)."""
    v = parse_version(version)
    eligible = [r for r in RECORDED if parse_version(r) <= v]
    return ReleaseFacts.load(eligible[-1] if eligible else RECORDED[0])


def recorded_flag_set(version: str = NEWEST_KNOWN) -> FlagSet:
    """The recorded flag set of a release in ``RECORDED``: the fallback where SGLang is absent."""
    return ReleaseFacts.load(version).flags


def supported(version: str) -> bool:
    return parse_version(version) >= parse_version(OLDEST_SUPPORTED)


def spelling(canonical: str, version: str, flags: FlagSet | None) -> str | None:
    """The flag that means ``canonical`` on this version, or None where the version has no such flag.

    With a flag set, the newest spelling it contains wins (exact even for releases between the checked
    ones); without one, the version ranges decide."""
    choices = RENAMES.get(canonical)
    if choices is None:  # not renamed in any known release; the preflight checks it exists
        return "--" + canonical.replace("_", "-")
    if flags is not None:
        return next((s.flag for s in choices if s.flag in flags), None)
    v = parse_version(version)
    return next((s.flag for s in choices if s.in_range(v)), None)


def canonical_name(key: str) -> str:
    """A ``server.extra_args`` key or flag (``--cuda-graph-max-bs``, ``cuda_graph_max_bs``) as a dest-like
    canonical name (``cuda_graph_max_bs_decode``)."""
    name = key.lstrip("-").replace("-", "_")
    return ALIASES.get(name, name)
