"""``--speculative-config`` as the played vLLM release reads it (``vllm/config/speculative.py``,
``SpeculativeConfig``), resolved into the simulator's speculative decoding (``speculative.params``).

vLLM drafts a chain: ``num_speculative_tokens`` (k) tokens per request per step, verified with the
request's own next token in one target forward of k + 1 tokens. With EAGLE, EAGLE-3 and a model's MTP
layers the drafter runs in the same step, after the target: one pass over every token the step scheduled,
then k - 1 passes of one token per request; n-gram drafts come from the host (no draft model). What is
modelled, with vLLM's own words where it refuses (docs/vllm-adapter.md, "Speculative decoding"):

- the methods ``eagle``, ``eagle3``, ``mtp`` (and its model-specific aliases, which vLLM renames to
  ``mtp``), ``ngram`` and ``draft_model`` (a whole smaller model: refused by 0.11 and 0.12, named
  explicitly from 0.15);
- ``num_speculative_tokens`` is required (a draft checkpoint's ``n_predict`` is not read);
- the KV look-ahead: eagle, eagle3 and mtp (and draft_model from 0.15) hold k slots more per running
  request while it drafts, n-gram none;
- asynchronous scheduling: off by default up to 0.12 and refused there with any method but EAGLE/MTP;
  on by default from 0.15 but turned off (with vLLM's warning) for ngram and draft_model up to 0.19;
  0.34 leaves it on whatever the method.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from simulator.speculative.params import SpecParams
from simulator.vllm.flag_json import json_object

# vLLM method -> the simulator's algorithm (SGLang's spelling: NEXTN is a model's MTP layers)
METHODS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "ngram": "NGRAM",
           "draft_model": "STANDALONE"}
# model-specific MTP names vLLM renames to "mtp" (MTPModelTypes; the ones of every played release)
MTP_ALIASES = ("deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "ernie_mtp", "qwen3_next_mtp", "longcat_flash_mtp",
               "pangu_ultra_moe_mtp", "glm4_moe_lite_mtp", "exaone_moe_mtp", "step3p5_mtp", "glm_ocr_mtp",
               "nemotron_h_mtp", "qwen3_5_mtp")
EAGLE_KIND = ("eagle", "eagle3", "mtp")  # vLLM's EagleModelTypes among the modelled methods
NGRAM_LOOKUP = 5  # prompt_lookup_min and _max where neither is given
# from 0.34 the rejection sampler can accept by given rates instead of the drafts' own agreement
SYNTHETIC_SINCE = Version("0.34")
# the keys the simulated engine reads; any other is refused as not modelled
KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
        "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length")


class SpecConfigError(ValueError):
    """A ``--speculative-config`` the played release refuses, or one the simulated engine does not model."""


@dataclass(frozen=True)
class VLLMSpec:
    """The resolved configuration: the simulator's parameters and what vLLM adds around them."""

    params: SpecParams
    method: str  # vLLM's name, after its renaming
    lookahead: int  # KV slots held beyond the step's tokens per drafting request
    warnings: tuple[str, ...] = ()
    # 0.34's synthetic rejection sampler: the unconditional chance that the first i + 1 drafts are all
    # accepted, position by position (None: the drafts' own acceptance)
    synthetic: tuple[float, ...] | None = None

    @property
    def k(self) -> int:
        return self.params.num_steps


def parse_spec_config(text: str, release: str, model_path: str, has_mtp_layers: bool) -> VLLMSpec:
    """``--speculative-config`` (a JSON object) as ``release`` reads it for the target at ``model_path``."""
    conf = json_object("--speculative-config", text, SpecConfigError)
    v = Version(release)
    warnings: list[str] = []
    unknown = sorted(set(conf) - set(KEYS))
    if unknown:
        raise SpecConfigError(f"--speculative-config keys not modelled by the simulated engine: "
                              f"{', '.join(unknown)} (modelled: {', '.join(KEYS)})")
    method = conf.get("method")
    model = conf.get("model")
    if method in MTP_ALIASES:
        warnings.append(f"method `{method}` is deprecated and replaced with mtp.")
        method = "mtp"
    if model in ("ngram", "[ngram]") and method is None:
        method = "ngram"
    if method is None and model is not None:
        lowered = str(model).lower()
        method = ("eagle" if "eagle-" in lowered else "eagle3" if "eagle3" in lowered
                  else "draft_model" if v >= Version("0.17") else None)
        if method is None:
            raise SpecConfigError(
                "Speculative decoding with draft model is not supported yet. Please consider using other "
                "speculative decoding methods such as ngram, medusa, eagle, or mtp."
                if v < Version("0.15") else "Unsupported speculative method: 'None'")
    if method not in METHODS:
        raise SpecConfigError(f"--speculative-config method {method!r} is not modelled by the simulated "
                              f"engine (modelled: {', '.join(METHODS)})")
    if method == "draft_model" and v < Version("0.15"):
        raise SpecConfigError("Draft model speculative decoding is not supported yet. Please consider using "
                              "other speculative decoding methods such as ngram, medusa, eagle, or mtp.")
    k = conf.get("num_speculative_tokens")
    if k is None:
        raise SpecConfigError("num_speculative_tokens must be provided with speculative model unless the "
                              "draft model config contains an n_predict parameter.")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise SpecConfigError(f"Expected num_speculative_tokens to be greater than zero ({k}).")
    if method in ("eagle", "eagle3", "draft_model") and model is None:
        raise SpecConfigError("num_speculative_tokens was provided but without speculative model.")
    if method == "mtp":
        if not has_mtp_layers:
            raise SpecConfigError("--speculative-config method 'mtp': the target's config.json has no MTP "
                                  "layers (num_nextn_predict_layers)")
        if k > 1:
            warnings.append("Enabling num_speculative_tokens > 1 will run multiple times of forward on same "
                            "MTP layer, which may result in lower acceptance rate")
        model = model_path
    if method == "ngram":
        lo, hi = conf.get("prompt_lookup_min"), conf.get("prompt_lookup_max")
        lo, hi = lo or hi or NGRAM_LOOKUP, hi or lo or NGRAM_LOOKUP
        if lo > hi:
            raise SpecConfigError(f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
        model = None
    lookahead = k if (method in EAGLE_KIND or (method == "draft_model" and v >= Version("0.15"))) else 0
    asked = METHODS[method]
    params = SpecParams(algorithm="EAGLE" if asked == "NEXTN" else asked, asked=asked, num_steps=k, topk=1,
                        num_draft_tokens=k + 1, draft_model_path=model, warnings=tuple(warnings))
    synthetic = _synthetic(conf, k, v, warnings)
    return VLLMSpec(params, method, lookahead, tuple(warnings), synthetic)


def _synthetic(conf: dict, k: int, v: Version, warnings: list[str]) -> tuple[float, ...] | None:
    """0.34's ``rejection_sample_method: synthetic``: the per-position rates, given or from a mean length
    (vLLM's minimum-variance schedule), checked as vLLM checks them. Before 0.34 the default model runner
    does not read it: the drafts' own acceptance applies (said so)."""
    method = conf.get("rejection_sample_method")
    rates, length = conf.get("synthetic_acceptance_rates"), conf.get("synthetic_acceptance_length")
    if v < SYNTHETIC_SINCE:
        if method is not None or rates is not None or length is not None:
            warnings.append("rejection_sample_method and the synthetic acceptance are not read by this "
                            "release's default model runner: the drafts' own acceptance applies")
        return None
    if method != "synthetic":
        if rates is not None or length is not None:
            raise SpecConfigError("synthetic_acceptance_rates / synthetic_acceptance_length are only valid "
                                  "with rejection_sample_method='synthetic'.")
        return None
    if (rates is None) == (length is None):
        raise SpecConfigError("rejection_sample_method='synthetic' requires exactly one of "
                              "synthetic_acceptance_rates or synthetic_acceptance_length.")
    if rates is not None:
        if not isinstance(rates, list) or len(rates) != k:
            raise SpecConfigError(f"synthetic_acceptance_rates must have length {k}, got {rates}.")
        if not all(isinstance(r, int | float) and 0.0 <= r <= 1.0 for r in rates):
            raise SpecConfigError(f"synthetic_acceptance_rates entries must be in [0, 1], got {rates}.")
        if any(rates[i] > rates[i - 1] for i in range(1, k)):
            raise SpecConfigError(f"synthetic_acceptance_rates must be non-increasing, got {rates}.")
        return tuple(float(r) for r in rates)
    if not isinstance(length, int | float) or not 1.0 <= length <= k + 1:
        raise SpecConfigError(f"synthetic_acceptance_length must be in [1, {k + 1}], got {length}.")
    drafts = float(length) - 1  # all-or-nothing positions, the fraction at the first partial one
    full = int(drafts)
    return tuple(([1.0] * full + [drafts - full] + [0.0] * k)[:k])


def conditional_rates(unconditional: tuple[float, ...]) -> list[float]:
    """Each position's acceptance given the ones before it (the simulator's acceptance model)."""
    out, before = [], 1.0
    for r in unconditional:
        out.append(r / before if before > 0 else 0.0)
        before = r
    return out


def async_with_spec(release: str, method: str, asked: bool | None, default: bool) -> tuple[bool, str]:
    """Whether asynchronous scheduling runs with this method (``asked``: --async-scheduling as given, None
    where unset; ``default``: the release's own), and the warning vLLM logs where it turns it off. A
    SpecConfigError where vLLM refuses the combination (``VllmConfig.__post_init__``)."""
    v = Version(release)
    if v >= Version("0.34"):
        return (default if asked is None else asked), ""
    eagle_kind = method in EAGLE_KIND
    if asked:
        if v >= Version("0.16") and method == "draft_model":
            return True, ""
        if not eagle_kind:
            kinds, end = ("EAGLE/MTP/Draft Model/NGram GPU", "") if v >= Version("0.18") else \
                ("EAGLE/MTP/Draft Model", ".") if v >= Version("0.16") else \
                ("EAGLE/MTP", ".") if v >= Version("0.15") else ("EAGLE/MTP", "")
            raise SpecConfigError(f"Currently, async scheduling is only supported with {kinds} kind of "
                                  f"speculative decoding{end}")
        return True, ""
    if asked is False or not default:
        return False, ""
    if not eagle_kind:
        return False, (f"Async scheduling not supported with {method}-based speculative decoding and will be "
                       "disabled.")
    return True, ""
