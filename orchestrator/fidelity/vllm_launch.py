"""A published vLLM entry's launch as the simulated engine playing vLLM takes it (``python -m simulator
serve MODEL <vLLM flags>``): its layout and the vLLM flags of its ``server_args`` (by vLLM's dest names),
played as the nearest recorded release not newer than the one it ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from orchestrator.fidelity.catalog import NotModelled
from orchestrator.fidelity.corpus import Entry
from simulator.vllm.releases import NEWEST, PLAYED

# server_args keys (vLLM's dests) the simulated engine models, and their flags
VALUED = (
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("block_size", "--block-size"),
    ("max_model_len", "--max-model-len"),
    ("kv_cache_dtype", "--kv-cache-dtype"),
    ("quantization", "--quantization"),
    ("max_cudagraph_capture_size", "--max-cudagraph-capture-size"),
    ("long_prefill_token_threshold", "--long-prefill-token-threshold"),
    ("moe_backend", "--moe-backend"),
    ("compilation_config", "--compilation-config"),
)
SWITCHES = (("enable_prefix_caching", "--enable-prefix-caching"), ("async_scheduling", "--async-scheduling"))


def played_release(version: str) -> tuple[str, str]:
    """(the recorded release the simulated engine plays for ``version``, what is assumed): the newest
    recorded one not newer than it, the newest for a build without a release number (a nightly)."""
    try:
        older = [v for v in PLAYED if Version(v) <= Version(version)]
    except InvalidVersion:
        return NEWEST, f"vLLM {version!r} has no release number: played as {NEWEST}"
    if not older:
        return PLAYED[0], f"vLLM {version} is older than every recorded release: played as {PLAYED[0]}"
    return older[-1], "" if older[-1] == version else f"vLLM {version} played as {older[-1]}"


def vllm_argv(
    entry: Entry, model_dir: Path, profile: Path, calibration: str | None
) -> tuple[list[str], list[str]]:
    """(the simulated engine's command line without ``python -m simulator``, what is assumed)."""
    p, a = entry.parallelism, entry.server_args
    if p.dp_attention:
        raise NotModelled("dp_attention is SGLang's: vLLM's data parallelism is parallelism.dp")
    release, note = played_release(str(getattr(entry, "vllm_version", "") or NEWEST))
    argv = [
        "serve",
        str(model_dir),
        "--sim-hardware",
        str(profile),
        "--sim-step-costs",
        "auto",
        *(["--sim-calibration", calibration] if calibration else []),
        "--sim-vllm-release",
        release,
        "--tensor-parallel-size",
        str(p.tp),
        "--pipeline-parallel-size",
        str(p.pp),
        *(["--data-parallel-size", str(p.dp)] if p.dp > 1 else []),
        "--seed",
        "0",
    ]
    if p.ep > 1:
        if p.ep != p.tp * p.dp:
            raise NotModelled(
                f"experts over {p.ep} GPUs with TP{p.tp} x DP{p.dp}: vLLM spreads them over every GPU "
                "of the engine"
            )
        argv.append("--enable-expert-parallel")
    argv += _flags(a)
    return argv, [note] if note else []


def _flags(a: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, flag in VALUED:
        if a.get(key) is not None:
            out += [flag, str(a[key])]
    for key, flag in SWITCHES:
        if isinstance(a.get(key), bool):
            out.append(flag if a[key] else "--no-" + flag[2:])
    if a.get("enforce_eager") is True:
        out.append("--enforce-eager")
    return out
