"""What an older SGLang release did by default, for replaying a run measured on it.

The simulated engine resolves its flags as the SGLang releases parasweep launches do (0.5.x). A run
published on 0.2-0.4 was served with other defaults, and replaying it "the way it was measured" means
launching it with those: read from each release's own ``server_args.py`` and
``model_executor/cuda_graph_runner.py`` (the wheels on PyPI: sglang 0.2.12, 0.3.0, 0.3.4.post1, 0.4.0,
0.4.5.post3), each default applied only where the published launch did not set it:

- ``mem_fraction_static`` by TP size: 0.88 (TP1), 0.87 (TP2), 0.85 (TP4), 0.83 (TP8 before 0.4, 0.81
  from 0.4), 0.79 (TP16); from 0.4.5, a GPU of more than 80 GiB keeps all but 13 GiB;
- ``chunked_prefill_size``: off before 0.3, 8192 from 0.3;
- CUDA graphs captured up to batch 160 (``[1, 2, 4] + 8·(1..20)`` to 0.4.0, ``cuda_graph_max_bs``
  unset above 25 GB afterwards, the same list);
- the overlap scheduler: absent before 0.3.4, off by default in 0.3.x (``--enable-overlap-schedule``),
  on from 0.4.0;
- ``--enable-dp-attention`` (0.4.1.post2's ``server_args.py``): attention-DP ranks as many as TP ranks,
  the overlap scheduler off and the chunked prefill halved. Later releases keep the overlap scheduler
  and divide the chunk by the rank count (0.5.9, 0.5.23), as the simulated engine does.

A version is read from the entry's ``sglang_version`` text ("~0.4.0 (docker, Dec 2024)", "main @
2024-10-21 (~0.3.4)"); from 0.5 on, or without a version, nothing is changed.
"""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

GRAPH_MAX_BS = 160  # every release before 0.5 captured batch sizes up to 160 on a large GPU
LARGE_GPU_MIB = 81920  # 0.4.5's threshold for the "all but 13 GiB" fraction
RESERVED_MIB = 13 * 1024
# the first release after the one read (0.4.1.post2) that turned the overlap scheduler off under DP
# attention; which release dropped that is not known here, so only releases up to it are treated so
DP_ATTENTION_OVERLAP_SINCE = Version("0.4.2")


def release(text: str | None) -> Version | None:
    """The release a ``sglang_version`` text names (the first x.y.z in it), or None."""
    m = re.search(r"(\d+\.\d+\.\d+(?:\.post\d+)?)", text or "")
    if not m:
        return None
    try:
        return Version(m.group(1))
    except InvalidVersion:
        return None


def _mem_fraction(v: Version, tp: int, gpu_mem_mib: float) -> float:
    if v >= Version("0.4.5") and gpu_mem_mib > LARGE_GPU_MIB:
        return round((gpu_mem_mib - RESERVED_MIB) / gpu_mem_mib, 3)
    if tp >= 16:
        return 0.79
    if tp >= 8:
        return 0.81 if v >= Version("0.4.0") else 0.83
    return 0.85 if tp >= 4 else 0.87 if tp >= 2 else 0.88


def release_defaults(text: str | None, server_args: dict[str, object], tp: int,
                     gpu_mem_mib: float, dp_attention: bool = False) -> tuple[list[str], list[str]]:
    """The simulated engine's flags for the release's defaults the launch left unset, and a note for
    each (empty for 0.5 and later, or an unknown version)."""
    v = release(text)
    if v is None or v >= Version("0.5.0"):
        return [], []
    flags: list[str] = []
    notes: list[str] = []
    old_dp_attention = dp_attention and v < DP_ATTENTION_OVERLAP_SINCE
    if server_args.get("mem_fraction_static") is None:
        frac = _mem_fraction(v, tp, gpu_mem_mib)
        flags += ["--mem-fraction-static", f"{frac:g}"]
        notes.append(f"mem_fraction_static {frac:g}")
    if server_args.get("chunked_prefill_size") is None:
        chunk = 8192 if v >= Version("0.3.0") else -1
        if old_dp_attention and chunk > 0:
            # halved whatever the rank count; given times the ranks, as the simulated engine (0.5.23)
            # divides it by them
            flags += ["--chunked-prefill-size", str(chunk // 2 * tp)]
            notes.append(f"chunked_prefill_size {chunk // 2} per attention-DP rank")
        else:
            flags += ["--chunked-prefill-size", str(chunk)]
            notes.append("chunked prefill off" if chunk < 0 else f"chunked_prefill_size {chunk}")
    flags += ["--cuda-graph-max-bs-decode", str(GRAPH_MAX_BS)]
    notes.append(f"CUDA graphs to batch {GRAPH_MAX_BS}")
    overlap = server_args.get("enable_overlap_schedule") is True or ((
        v >= Version("0.4.0") and server_args.get("overlap_schedule") is not False) and not old_dp_attention)
    if not overlap:
        flags.append("--disable-overlap-schedule")
        notes.append("no overlap scheduler")
    return flags, [f"SGLang {v}'s defaults where the launch set none: " + ", ".join(notes)]
