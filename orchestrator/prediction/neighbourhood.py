"""The layouts around a configuration: every other way to split the model over the same GPUs. The
diagnosis tries them for every finding beside the finding's own knobs, and the end of a sweep tries
them against the sweep's trials; none is left out because a rule of thumb says it cannot win (over
PCIe, say): the prediction decides, and a layout that cannot run says why.

For a trial on N GPUs: every tensor x pipeline x data-parallel split of N (each a divisor), and for a
MoE model each split with tp > 1 also with its experts spread over the TP group (``ep.size = tp``); on
vLLM, whose expert parallelism spans every GPU of the engine, over all its DP ranks' GPUs instead
(``ep.size = tp x dp``; a MoE model's DP ranks with a pipeline are not modelled, so not tried).
Leaving the pipeline (pp = 1) drops its knobs (async depth 0, the micro-batch cap to the engine's
default), which mean nothing without it. A MoE model is also tried with the whole set of GPUs as one TP
group whose every GPU is an attention-DP rank (``dp.attention``), its experts spread over all of them:
the layout DeepSeek-style deployments serve large batches with (on vLLM that is the split of one DP
rank per GPU with the experts over all of them, among the splits already).
A speculative trial's splits with a pipeline go without speculation (SGLang runs neither together as
parasweep launches it), and its own split is tried without speculation and with one draft step.

Disaggregated serving on the same GPUs is a layout too: servers of one TP size t (t dividing N, at most
a node), N / t of them split every way into prefill and decode servers (at least one of each), without
a pipeline or speculation. A disaggregated trial's neighbours are every aggregated split of its GPUs
and the other such deployments.
"""

from __future__ import annotations

from typing import Any

from orchestrator.config.model_info import model_info
from orchestrator.config.schema import ParasweepConf, plays_vllm, world_size

ATTN_DP_KEY = "dp.attention"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(cfg: ParasweepConf) -> list[dict[str, Any]]:
    """Every other split of ``cfg``'s GPUs, as changes of it (module docstring), the current one left
    out; at most a few dozen for a node of 8 or 16 GPUs."""
    gpus = world_size(cfg)
    moe = model_info(cfg.model.path).is_moe
    vllm = plays_vllm(cfg)
    # a disaggregated trial: every aggregated split is another layout, its own included
    current = (cfg.tp.size, cfg.pp.size, cfg.dp.size, cfg.ep.size) if not cfg.pd.enabled else None
    leave = {"pd.enabled": False} if cfg.pd.enabled else {}
    out: list[dict[str, Any]] = []
    for tp in _divisors(gpus):
        for pp in _divisors(gpus // tp):
            dp = gpus // (tp * pp)
            if vllm and moe and dp > 1 and pp > 1:
                continue
            spread = tp * dp if vllm else tp
            for ep in sorted({1, spread} if moe else {1}):
                if (tp, pp, dp, ep) == current:
                    continue
                change: dict[str, Any] = {**leave, "tp.size": tp, "pp.size": pp}
                if dp != cfg.dp.size:
                    change["dp.size"] = dp
                if ep != cfg.ep.size:
                    change["ep.size"] = ep
                if pp == 1 and cfg.pp.async_depth:
                    change["pp.async_depth"] = 0
                if pp == 1 and cfg.pp.micro_batch_size is not None:
                    change["pp.micro_batch_size"] = None
                if pp > 1 and cfg.spec.algorithm != "none":  # SGLang pipelines no speculation parasweep runs
                    change["spec.algorithm"] = "none"
                out.append(change)
    if moe and gpus > 1 and not vllm:  # the whole node as one TP/EP group with data-parallel attention
        out.append({**leave, "tp.size": gpus, "pp.size": 1, "ep.size": gpus, ATTN_DP_KEY: gpus,
                    **({"dp.size": 1} if cfg.dp.size != 1 else {}),
                    **({"pp.async_depth": 0} if cfg.pp.async_depth else {})})
    out += _speculation(cfg)
    out += _disaggregated(cfg, gpus)
    return out


def _role_layout(cfg: ParasweepConf, change: dict[str, Any], wanted: dict[str, int]) -> None:
    """Give both roles the ``wanted`` sizes in as few keys as the trial allows: where a role sets a size
    of its own (``pd.decode.tp``), the roles' keys; else the trial's (``tp.size``), which they take."""
    roles = (cfg.pd.prefill, cfg.pd.decode)
    for key, value in wanted.items():
        trial = getattr(cfg, key).size
        if any(getattr(r, key) is not None for r in roles):
            for name, r in zip(("prefill", "decode"), roles, strict=True):
                if (getattr(r, key) or trial) != value:
                    change[f"pd.{name}.{key}"] = value
        elif trial != value:
            change[f"{key}.size"] = value


def _disaggregated(cfg: ParasweepConf, gpus: int) -> list[dict[str, Any]]:
    """Prefill and decode servers of one TP size on the same GPUs, split every way (module docstring);
    the trial's own deployment left out. None where the trial's fake backend runs decode alone."""
    if cfg.pd.enabled and cfg.pd.transfer_backend == "fake":
        return []
    out: list[dict[str, Any]] = []
    pd = cfg.pd
    for tp in _divisors(gpus):
        servers = gpus // tp
        if tp > cfg.hardware.num_gpus or servers < 2:
            continue
        same_servers = all((r.tp or cfg.tp.size) == tp and (r.pp or cfg.pp.size) == 1
                           and (r.dp or cfg.dp.size) == 1 for r in (pd.prefill, pd.decode))
        for prefill in range(1, servers):
            if pd.enabled and same_servers and (pd.prefill.workers, pd.decode.workers) == (
                    prefill, servers - prefill):  # the trial's own deployment
                continue
            change: dict[str, Any] = {"pd.enabled": True} if not pd.enabled else {}
            if plays_vllm(cfg) and pd.transfer_backend != "nixl":  # vLLM's one connector parasweep runs
                change["pd.transfer_backend"] = "nixl"
            change.update({"pd.prefill.workers": prefill, "pd.decode.workers": servers - prefill})
            # experts over the TP group where the trial spreads them
            _role_layout(cfg, change, {"tp": tp, "pp": 1, "dp": 1, "ep": tp if cfg.ep.size > 1 else 1})
            if cfg.pp.async_depth:
                change["pp.async_depth"] = 0
            if cfg.pp.micro_batch_size is not None:
                change["pp.micro_batch_size"] = None
            if cfg.spec.algorithm != "none":  # no speculation in a disaggregated deployment yet
                change["spec.algorithm"] = "none"
            out.append(change)
    return out


def _speculation(cfg: ParasweepConf) -> list[dict[str, Any]]:
    """A speculative trial's own layout without speculation, and with the smallest speculation SGLang
    runs (one draft step, no tree) where it drafts more."""
    if cfg.spec.algorithm == "none":
        return []
    out: list[dict[str, Any]] = [{"spec.algorithm": "none"}]
    if cfg.spec.algorithm != "ngram" and (cfg.spec.num_steps, cfg.spec.topk) != (1, 1):
        out.append({"spec.num_steps": 1, "spec.topk": 1, "spec.num_draft_tokens": 2})
    return out
