"""AIConfigurator's own estimate of one aggregated SGLang serving point.

aiconfigurator-core ships measured serving runs (``systems/silicon_sample.csv``) next to the estimator
that AIConfigurator checks against them. To set parasweep's predictions beside AIConfigurator's on the
same rows, this module asks the installed core estimator for the TTFT and TPOT of one ``agg`` row, the
way AIConfigurator's accuracy tool does it: that tool calls the upper ``aiconfigurator`` package's
``cli_estimate`` once per row (mode agg, backend sglang, the row's sizes, batch, parallelism and
quantization, everything else left at its default). ``cli_estimate`` is not installed here, so its agg
path is rebuilt from the core pieces it is made of:

- tables: the row's SGLang version if the core serves it; otherwise, as the tool retries, the default
  version (the system's ``current`` slot: core 0.12.0 answers only its slot versions, 0.5.14 and
  0.5.16, and refuses a row's 0.5.9). The tool retries on the message "Failed to load perf database",
  which core 0.12.0 no longer gives for such a version; this module retries on the refusal it gives.
  Silicon data only (``SILICON`` mode), no transfer policy;
- the model: ``ModelConfig`` from the row's parallelism and GEMM/MoE quantization; the missing MoE width
  inferred for MoE models; KV-cache and attention precision left to the checkpoint's quantization
  config (an fp8/fp8_block/nvfp4 checkpoint implies an FP8 KV cache and FP8 attention, downgraded to
  BF16 attention where the tables hold none); no speculative decoding;
- the run: ``run_agg`` of a fresh SGLang backend (what the upper package's ``InferenceSession``
  forwards to; a fresh one, because a backend caches its results by sizes alone, not by model), with a
  context budget of one prompt (``ctx_tokens = isl``), the backend's default memory fraction and
  sequence length. Its TTFT is one prefill step times a queueing factor that grows with the steps
  needed to admit the whole batch; its TPOT averages the mixed and decode-only steps.

A disaggregated row (``estimate_disagg``) is estimated as the upper package's disaggregated path does it
(``DisaggInferenceSession.run_disagg`` behind ``cli_estimate``): each role's model from its own layout, the
prefill server's TTFT from a static context-only pass of ``prefill_batch_size`` prompts (the CSV's 1) times
its latency correction 1.1 and the autoscale TTFT correction 1.8, the decode server's TPOT from a static
generation-only pass of ``decode_batch_size`` sequences times its correction 1.08 (the constants of
aiconfigurator 0.12.0's ``cli/api.py`` and ``sdk/picking.py``). The worker counts only rate-match
throughput there, so they change neither number. The upper package's cross-node expert communication
resolver is not rebuilt: it answers nothing for an expert group within one node, as every such row's is.

A checkpoint is read from the configs bundled with the core. AIConfigurator downloads any other from
Hugging Face; this module does not go online, and instead reads a bundled checkpoint whose config has
the same architecture (``meta-llama/Llama-3.1-8B-Instruct`` is priced as ``Meta-Llama-3.1-8B``: the two
configs differ only in their end-of-sequence tokens), or gives no estimate.

Whatever the core refuses (an unknown model or system, a parallelism it cannot lay out, a model that
does not fit in memory) comes back as an estimate without numbers and a one-line reason. Answers are
cached per row's arguments; the core itself caches its tables per system and version and each
checkpoint's config, so only the first estimate on a system pays for loading tables (about a second).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the core is imported only when an estimate is asked for: it is an optional dependency
    from aiconfigurator_core.sdk.perf_database import PerfDatabase

BACKEND = "sglang"
# Hub ids with no bundled config, and the bundled checkpoint with the same architecture that prices them.
SAME_ARCHITECTURE = {"meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
                     "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
                     "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B"}
REASON_CHARS = 300  # a reason is cut to this length; the core's messages can run to several sentences
# aiconfigurator 0.12.0's constants for a single disaggregated estimate
PREFILL_CORRECTION = 1.1  # cli/api.py DEFAULT_PREFILL_LATENCY_CORRECTION_SCALE
DECODE_CORRECTION = 1.08  # cli/api.py DEFAULT_DECODE_LATENCY_CORRECTION_SCALE
TTFT_AUTOSCALE = 1.8  # sdk/picking.py _AUTOSCALE_TTFT_CORRECTION_FACTOR, applied to the prefill TTFT


@dataclass(frozen=True)
class AicEstimate:
    ttft_ms: float | None
    tpot_ms: float | None
    why_none: str = ""  # one line: why AIC gives no estimate (out of memory, unsupported model/system, ...)
    version: str = ""  # the table version AIC used, e.g. "0.5.14"


def estimate_agg(model_path: str, system: str, isl: float, osl: float, batch_size: float | None,
                 tp: float | None, pp: float | None, attention_dp: float | None, moe_tp: float | None,
                 moe_ep: float | None, gemm_quant: str | float | None, moe_quant: str | float | None,
                 backend_version: str | None, backend: str = BACKEND) -> AicEstimate:
    """AIConfigurator's TTFT and TPOT (ms) for one aggregated row of ``silicon_sample.csv`` served by
    ``backend`` (sglang, or vllm: the core's vLLM tables and backend).

    The arguments are the row's columns as they stand (``tp_size`` included, even where it holds TP×EP).
    An empty or NaN cell is left out, as the accuracy tool leaves it out of its call: the version and
    quantizations then take the core's defaults, the batch ``cli_estimate``'s 128, TP, PP and attention
    DP 1, and a missing MoE width is inferred from the other. Never raises."""
    try:
        sizes = (_size(isl), _size(osl), _size(batch_size, 128), _size(tp, 1), _size(pp, 1),
                 _size(attention_dp, 1), _size(moe_tp), _size(moe_ep))
    except (TypeError, ValueError) as exc:
        return AicEstimate(None, None, why_none=f"a size is not a number: {_reason(exc)}")
    if sizes[0] is None or sizes[1] is None:
        return AicEstimate(None, None, why_none="the row gives no input or output length")
    return _estimate(model_path, system, *sizes, _text(gemm_quant), _text(moe_quant), _text(backend_version),
                     backend)


def _size(value: float | None, default: int | None = None) -> int | None:
    """A CSV size cell as an int, ``default`` where it is empty or NaN."""
    return default if value is None or math.isnan(value) else int(value)


def _text(value: str | float | None) -> str | None:
    """A CSV text cell, None where it is empty or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value).strip() or None


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, KeyError):  # an unknown quantization name: KeyError('fp6')
        text = f"unknown name {text}"
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


@functools.cache
def _estimate(model_path: str, system: str, isl: int, osl: int, batch_size: int, tp: int, pp: int,
              attention_dp: int, moe_tp: int | None, moe_ep: int | None, gemm_quant: str | None,
              moe_quant: str | None, backend_version: str | None, backend: str = BACKEND) -> AicEstimate:
    try:
        version, database = _database(system, backend_version, backend)
    except Exception as exc:
        return AicEstimate(None, None, why_none=_reason(exc))
    try:
        ttft, tpot = _run_agg(_checkpoint(model_path), system, database, isl, osl, batch_size, tp, pp,
                              attention_dp, moe_tp, moe_ep, gemm_quant, moe_quant, backend)
    except Exception as exc:
        return AicEstimate(None, None, why_none=_reason(exc), version=version)
    return AicEstimate(ttft, tpot, version=version)


@dataclass(frozen=True)
class RoleCells:
    """One role's cells of a disaggregated row, as they stand (NaN where empty)."""

    batch_size: float | None
    tp: float | None
    pp: float | None
    attention_dp: float | None
    moe_tp: float | None
    moe_ep: float | None

    def sizes(self) -> tuple[int | None, ...]:
        return (_size(self.batch_size, 1), _size(self.tp, 1), _size(self.pp, 1), _size(self.attention_dp, 1),
                _size(self.moe_tp), _size(self.moe_ep))


def estimate_disagg(model_path: str, system: str, isl: float, osl: float, prefill: RoleCells,
                    decode: RoleCells, gemm_quant: str | float | None, moe_quant: str | float | None,
                    backend_version: str | None, backend: str = BACKEND) -> AicEstimate:
    """AIConfigurator's TTFT and TPOT (ms) for one disaggregated row of ``silicon_sample.csv`` served by
    ``backend`` (module doc). Never raises."""
    try:
        sizes = (_size(isl), _size(osl), prefill.sizes(), decode.sizes())
    except (TypeError, ValueError) as exc:
        return AicEstimate(None, None, why_none=f"a size is not a number: {_reason(exc)}")
    if sizes[0] is None or sizes[1] is None:
        return AicEstimate(None, None, why_none="the row gives no input or output length")
    return _estimate_disagg(model_path, system, *sizes, _text(gemm_quant), _text(moe_quant),
                            _text(backend_version), backend)


@functools.cache
def _estimate_disagg(model_path: str, system: str, isl: int, osl: int, prefill: tuple, decode: tuple,
                     gemm_quant: str | None, moe_quant: str | None, backend_version: str | None,
                     backend: str = BACKEND) -> AicEstimate:
    try:
        version, database = _database(system, backend_version, backend)
    except Exception as exc:
        return AicEstimate(None, None, why_none=_reason(exc))
    try:
        checkpoint = _checkpoint(model_path)
        ttft = _run_static(checkpoint, system, database, isl, osl, *prefill, gemm_quant, moe_quant,
                           context=True, backend=backend)["ttft"] * TTFT_AUTOSCALE
        tpot = _run_static(checkpoint, system, database, isl, osl, *decode, gemm_quant, moe_quant,
                           context=False, backend=backend)["tpot"]
    except Exception as exc:
        return AicEstimate(None, None, why_none=_reason(exc), version=version)
    return AicEstimate(float(ttft), float(tpot), version=version)


@functools.cache
def _database(system: str, requested: str | None, backend: str = BACKEND) -> tuple[str, PerfDatabase]:
    """(version, tables) for a system: the requested version of ``backend`` if the core serves it, else the
    default one. The core refuses a version outside its slots with a ValueError (and answers None for a
    version it cannot load)."""
    from aiconfigurator_core.sdk.perf_database import get_latest_database_version

    if requested is not None:
        try:
            database = _tables(system, requested, backend)
        except ValueError:
            database = None
        if database is not None:
            return requested, database
    version = get_latest_database_version(system=system, backend=backend)
    if version is None:
        raise ValueError(f"aiconfigurator-core has no {backend} tables for system {system!r}")
    database = _tables(system, version, backend)
    if database is None:
        raise ValueError(f"aiconfigurator-core could not load its {backend} {version} tables for {system!r}")
    return version, database


def _tables(system: str, version: str, backend: str = BACKEND) -> PerfDatabase | None:
    from aiconfigurator_core.sdk.perf_database import get_database_view

    return get_database_view(system, backend, version, allow_missing_data=False, database_mode="SILICON",
                             transfer_policy=None)


@functools.cache
def _checkpoint(model_path: str) -> str:
    """The checkpoint AIConfigurator reads for a model: its bundled config, or one of the same
    architecture."""
    from aiconfigurator_core.sdk.common import DefaultHFModels

    if model_path in DefaultHFModels:
        return model_path
    if model_path in SAME_ARCHITECTURE:
        return SAME_ARCHITECTURE[model_path]
    raise LookupError(f"no config for {model_path} is bundled with aiconfigurator-core "
                      "(AIConfigurator would download it from Hugging Face)")


def _model(checkpoint: str, system: str, database: PerfDatabase, tp: int, pp: int, attention_dp: int,
           moe_tp: int | None, moe_ep: int | None, gemm_quant: str | None, moe_quant: str | None,
           context: bool, backend: str = BACKEND):  # -> the core's BaseModel
    """The core's model of ``checkpoint`` at one layout, resolved as the upper package resolves it (the
    context-attention precision against the tables only for a role that runs prefills)."""
    from aiconfigurator_core.sdk.config import ModelConfig
    from aiconfigurator_core.sdk.config_builders import build_model_config
    from aiconfigurator_core.sdk.models import (
        check_is_moe,
        get_model,
        resolve_context_fmha_by_data,
        resolve_dsv4_moe_arch,
        resolve_nvfp4_for_system,
    )

    if check_is_moe(checkpoint):
        moe_tp, moe_ep = ModelConfig(tp_size=tp, attention_dp_size=attention_dp, moe_tp_size=moe_tp,
                                     moe_ep_size=moe_ep).resolve_moe_parallelism()
    model_config = build_model_config(tp, pp, attention_dp, moe_tp, moe_ep, gemm_quant_mode=gemm_quant,
                                      moe_quant_mode=moe_quant)
    if context:
        resolve_context_fmha_by_data(model_config, checkpoint, database, backend, is_context_role=True)
    resolve_dsv4_moe_arch(model_config, checkpoint, system_name=system, backend_name=backend)
    resolve_nvfp4_for_system(model_config, system, checkpoint)
    return get_model(checkpoint, model_config, backend)


def _run_static(checkpoint: str, system: str, database: PerfDatabase, isl: int, osl: int, batch_size: int,
                tp: int, pp: int, attention_dp: int, moe_tp: int | None, moe_ep: int | None,
                gemm_quant: str | None, moe_quant: str | None, context: bool, backend: str = BACKEND) -> dict:
    """One role's static pass (context-only for prefill, generation-only for decode) with the upper
    package's latency correction for that role: the core's result row."""
    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.config import RuntimeConfig

    model = _model(checkpoint, system, database, tp, pp, attention_dp, moe_tp, moe_ep, gemm_quant, moe_quant,
                   context=context)
    summary = get_backend(backend).run_static(
        model, database, RuntimeConfig(isl=isl, osl=osl, batch_size=batch_size),
        "static_ctx" if context else "static_gen",
        latency_correction_scale=PREFILL_CORRECTION if context else DECODE_CORRECTION)
    role = "prefill" if context else "decode"
    if summary.check_oom():
        raise RuntimeError(f"out of memory: {checkpoint}'s {role} server at tp={tp} dp={attention_dp} "
                           f"exceeds {system}'s memory")
    result = summary.get_result_dict()
    if result is None:
        raise RuntimeError(f"the estimator produced no {role} result for this configuration")
    return result


def _run_agg(checkpoint: str, system: str, database: PerfDatabase, isl: int, osl: int, batch_size: int,
             tp: int, pp: int, attention_dp: int, moe_tp: int | None, moe_ep: int | None,
             gemm_quant: str | None, moe_quant: str | None, backend: str = BACKEND) -> tuple[float, float]:
    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.config import RuntimeConfig

    model = _model(checkpoint, system, database, tp, pp, attention_dp, moe_tp, moe_ep, gemm_quant, moe_quant,
                   context=True, backend=backend)
    summary = get_backend(backend).run_agg(
        model, database, RuntimeConfig(isl=isl, osl=osl, batch_size=batch_size), ctx_tokens=isl,
        max_seq_len=None, free_gpu_memory_fraction=None, decode_tokens_per_iteration=1.0)
    if summary.check_oom():
        raise RuntimeError(f"out of memory: {checkpoint}'s weights, activations and the batch's KV cache "
                           f"exceed {system}'s memory at tp={tp} pp={pp} dp={attention_dp}")
    result = summary.get_result_dict()
    if result is None:
        raise RuntimeError("the estimator produced no result for this configuration")
    return float(result["ttft"]), float(result["tpot"])
