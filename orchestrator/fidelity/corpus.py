"""Published measurements as data: one JSON object per line, each a measured SGLang run with its source.

The format is documented in docs/fidelity.md; a user's own measurements in the same format are read
the same way. Only the fields the replay reads are typed here; every other field (notes, derivations,
the launch command as printed) is kept as it is. A line that is not a JSON object, or lacks or mistypes
a field the replay needs, stops the read with one line naming the file, the line number and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.errors import UserError

M = TypeVar("M", bound=BaseModel)


class CorpusError(UserError):
    """A published-measurements file that cannot be read; the message names the line."""


class Parallelism(BaseModel):
    model_config = ConfigDict(extra="allow")

    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    dp_attention: bool = False
    pp_async_batch_depth: int | None = Field(None, ge=0)
    pp_max_micro_batch_size: int | None = Field(None, ge=1)


class Role(BaseModel):
    """One role of a disaggregated run: its servers and each one's layout (``tp``: every GPU of the
    server; ``attention``: its attention-DP ranks) and flags."""

    model_config = ConfigDict(extra="forbid")

    workers: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    attention: int = Field(1, ge=1)
    server_args: dict[str, Any] = Field(default_factory=dict)


# the layout of a disaggregated run, as a replay names it and the trust bands group it (" attention DP"
# added where a role runs attention-DP ranks)
DISAGGREGATED = "disaggregated"


class Disaggregation(BaseModel):
    """A run served by prefill and decode servers behind a router (docs/fidelity.md, the format)."""

    model_config = ConfigDict(extra="forbid")

    prefill: Role
    decode: Role
    transfer_backend: str = "mooncake"


class Workload(BaseModel):
    """What the benchmark sent. ``request_rate`` is req/s or the string "inf"; lengths are tokens."""

    model_config = ConfigDict(extra="allow")

    tool: str
    dataset: str
    num_prompts: int = Field(ge=1)
    request_rate: float | None = Field(None, gt=0)
    max_concurrency: int | None = Field(None, ge=1)
    random_input_len: int | None = Field(None, ge=1)
    random_output_len: int | None = Field(None, ge=0)
    random_range_ratio: float | None = Field(None, ge=0.0, le=1.0)
    input_len: int | None = Field(None, ge=1)
    output_len: int | None = Field(None, ge=0)
    seed: int | None = None

    @field_validator("request_rate", mode="before")
    @classmethod
    def _rate(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() in ("inf", "infinity"):
            return float("inf")
        return v


class Entry(BaseModel):
    """One measured point."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1)
    source_url: str = Field(min_length=1)
    model: str
    gpu: str
    gpu_count: int = Field(ge=1)
    nodes: int = Field(1, ge=1)
    parallelism: Parallelism = Field(default_factory=Parallelism)
    server_args: dict[str, Any] = Field(default_factory=dict)
    # a disaggregated run: its roles' servers, each with its own layout and flags (over server_args)
    disaggregation: Disaggregation | None = None
    workload: Workload
    measured: dict[str, Any]
    # where parasweep should look when the names above are not in its catalogue: {"model": a folder
    # under models/ or a path, "hardware": a profile under conf/hardware/ or a path}
    parasweep: dict[str, str] = Field(default_factory=dict)
    # a number published only as a ratio to another run of the same source ("3.2x the TP8 baseline"):
    # that run's fields where they differ from this one's ("id" describes it; a server_args key set to
    # null is dropped); measured keys ending in "_relative" are then this run's number over that one's
    relative_to: dict[str, Any] | None = None

    @field_validator("measured")
    @classmethod
    def _numbers(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not any(isinstance(x, int | float) and not isinstance(x, bool) for x in v.values()):
            raise ValueError("needs at least one number")
        return v

    def reference(self) -> Entry:
        """The run this entry's relative numbers divide by: this entry with ``relative_to``'s fields."""
        if not self.relative_to:
            raise ValueError(f"{self.id}: no relative_to")
        data = self.model_dump()
        for key, value in self.relative_to.items():
            if key == "id":
                continue
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {k: v for k, v in {**data[key], **value}.items() if v is not None}
            else:
                data[key] = value
        data["id"] = f"{self.id} (reference: {self.relative_to.get('id', 'relative_to')})"
        data["relative_to"] = None
        return Entry.model_validate(data)

    def numbers(self) -> dict[str, float]:
        """The measured values that are numbers (flags such as ``ttft_is_approximate`` left out)."""
        return {k: float(v) for k, v in self.measured.items()
                if isinstance(v, int | float) and not isinstance(v, bool)}


def _where(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err["loc"]) or "(line)"


def read_json_lines(path: str | Path, model: type[M], flag: str) -> list[M]:
    """Every object of the JSON-lines file at ``path`` as ``model`` (blank lines and lines starting with
    ``#`` skipped; ids unique). Raises :class:`CorpusError` naming the first bad line and field; ``flag``
    is the option the file was given with, for the message."""
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise CorpusError(f"{flag} {file}: cannot read it ({e.strerror or e})") from None
    entries: list[M] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{file} line {n}: not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(data, dict):
            raise CorpusError(f"{file} line {n}: a JSON object per line is expected, "
                              f"got {type(data).__name__}")
        try:
            entry = model.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            ident = data.get("id", "?")
            more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
            raise CorpusError(f"{file} line {n} ({ident}): {_where(first)}: {first['msg']}{more}") from None
        ident = str(getattr(entry, "id", ""))
        if ident in seen:
            raise CorpusError(f"{file} line {n}: id {ident!r} already used on line {seen[ident]}")
        seen[ident] = n
        entries.append(entry)
    if not entries:
        raise CorpusError(f"{flag} {file}: no entries (one JSON object per line expected)")
    return entries


def read_corpus(path: str | Path) -> list[Entry]:
    """Every entry of the JSON-lines file at ``path`` (blank lines and lines starting with ``#`` skipped).
    Raises :class:`CorpusError` naming the first bad line."""
    return read_json_lines(path, Entry, "--published")
