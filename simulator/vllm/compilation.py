"""vLLM's compilation settings as the simulated engine reads them: ``--compilation-config`` (``-cc``, JSON)
and ``--optimization-level`` (``-O``), the parts that change a step's price.

- ``cudagraph_mode``: which steps replay CUDA graphs. ``FULL_AND_PIECEWISE`` (the default at O2 and O3):
  a uniform decode step up to the largest captured size replays one full graph, any other step of at most
  that many tokens a graph piece per layer with the attention op launched between them;
  ``FULL_DECODE_ONLY``: full graphs for decode steps, every other step runs the compiled model without
  graphs; ``PIECEWISE`` (O1): pieces for every step up to the captured size, decode steps too; ``NONE``
  (O0, or ``--enforce-eager``): no graphs. ``FULL`` (full graphs of mixed steps too) is not modelled.
- ``pass_config.fuse_allreduce_rms`` (``enable_fi_allreduce_fusion`` up to 0.12): the TP all-reduces
  fused with their RMSNorm into FlashInfer's all-reduce. Unset, each release's default
  (``PlayedRelease.fused_allreduce_bytes``); O0 and O1 leave it off.
- ``max_cudagraph_capture_size``, ``cudagraph_capture_sizes``: the largest captured size.

Every other key (custom ops, other fusion passes, splitting ops, ...) is accepted and said to price
nothing here (a start-up warning), as the simulated engine models no kernel they change.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.vllm.flag_json import json_object

MODES = ("NONE", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
LEVELS = ("0", "1", "2", "3")
# the keys read (the rest is reported as not modelled)
READ = {"cudagraph_mode", "pass_config", "max_cudagraph_capture_size", "cudagraph_capture_sizes"}
FUSION_KEYS = ("fuse_allreduce_rms", "enable_fi_allreduce_fusion")


class CompilationError(ValueError):
    """A compilation setting vLLM refuses, or one the simulated engine does not model (one line)."""


@dataclass(frozen=True)
class Compilation:
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    fuse_allreduce: bool | None = None  # None: the release's default
    max_capture: int | None = None  # None: min(2 x max_num_seqs, 512)
    ignored: tuple[str, ...] = ()  # keys given that price nothing here

    @property
    def full_graphs(self) -> bool:
        """Decode steps replay full graphs."""
        return self.cudagraph_mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")

    @property
    def pieces(self) -> bool:
        """Steps no full graph replays run vLLM's piecewise graphs."""
        return self.cudagraph_mode in ("PIECEWISE", "FULL_AND_PIECEWISE")


def read_compilation(config: str | None, level: str | None, enforce_eager: bool) -> Compilation:
    """The settings of ``--compilation-config`` (JSON) over those of ``--optimization-level`` (vLLM applies
    the level's defaults, then the config's keys); ``--enforce-eager``: no graphs."""
    if level is not None and level not in LEVELS:
        raise CompilationError(f"--optimization-level {level}: valid: {', '.join(LEVELS)}")
    mode, fuse = "FULL_AND_PIECEWISE", None
    if level == "0":
        mode, fuse = "NONE", False
    elif level == "1":
        mode, fuse = "PIECEWISE", False
    cfg = _parsed(config)
    max_capture = None
    if "cudagraph_mode" in cfg:
        mode = str(cfg["cudagraph_mode"]).upper()
        if mode == "FULL":
            raise CompilationError("--compilation-config cudagraph_mode FULL (full graphs of mixed steps) is "
                                   f"not modelled by the simulated engine (modelled: {', '.join(MODES)})")
        if mode not in MODES:
            raise CompilationError(f"--compilation-config cudagraph_mode {cfg['cudagraph_mode']!r}: valid: "
                                   f"{', '.join(MODES)}, FULL")
    passes = cfg.get("pass_config") or {}
    if not isinstance(passes, dict):
        raise CompilationError("--compilation-config pass_config: a JSON object")
    for key in FUSION_KEYS:
        if key in passes:
            fuse = bool(passes[key])
    if "max_cudagraph_capture_size" in cfg:
        max_capture = _size(cfg["max_cudagraph_capture_size"], "max_cudagraph_capture_size")
    elif "cudagraph_capture_sizes" in cfg:
        sizes = cfg["cudagraph_capture_sizes"]
        if not isinstance(sizes, list) or not sizes:
            raise CompilationError("--compilation-config cudagraph_capture_sizes: a non-empty list of sizes")
        max_capture = max(_size(s, "cudagraph_capture_sizes") for s in sizes)
    ignored = sorted({*(k for k in cfg if k not in READ), *(f"pass_config.{k}" for k in passes
                                                            if k not in FUSION_KEYS)})
    if enforce_eager:
        mode = "NONE"
    return Compilation(mode, fuse, max_capture, tuple(ignored))


def _parsed(config: str | None) -> dict:
    if config is None:
        return {}
    return json_object("--compilation-config", config, CompilationError)


def _size(value: object, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CompilationError(f"--compilation-config {key} {value!r}: an integer >= 1")
    return value
