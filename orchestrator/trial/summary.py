"""What a finished trial says about itself: the facts the diagnosis reads, its timings, and the run
description a person reads in the MLflow UI. Plain functions of the trial's typed results."""

from __future__ import annotations

import logging
from typing import Any

from analysis.diagnose import StepEstimate, TrialFacts
from orchestrator.config.model_info import model_info
from orchestrator.config.schema import ParasweepConf, plays_vllm, role_config, role_gpus, router_process
from orchestrator.trial.plan import TrialPlan
from vocab.model import ROUTER_PACKAGE
from vocab.records import PointResult
from vocab.status import TrialStatus
from vocab.telemetry import GpuSource

log = logging.getLogger("parasweep")


def measured_window(result: PointResult) -> tuple[float, float]:
    """The point's steady window (``workloads.window``: after the ramp, before the drain), the one its
    throughput and token counts come from: the window its telemetry is summarised over too."""
    from workloads.window import steady_window

    window = steady_window(result.records, result.point)
    if window is None:
        return result.start, result.end
    return window.start, window.end


def trial_facts(cfg: ParasweepConf, resolved: dict[str, Any], results: list[PointResult],
                extras: dict[str, dict[str, float]], gpu_source: GpuSource, engine: str) -> TrialFacts:
    """``engine`` is the trial's engine tag (``sim``, ``sim-predict``, ``sglang``): evidence from the
    simulated engine says so even when no GPU telemetry was sampled."""
    points = {r.point.label: {**r.metrics, **extras.get(r.point.label, {}),
                              "invalid_reason": "; ".join(r.invalid_reasons)} for r in results}
    concurrency = {r.point.label: r.point.concurrency for r in results if r.point.concurrency is not None}
    # a disaggregated deployment's decode servers speak for it (its resolved flags are decode server 0's):
    # the engine's layout is theirs, not the trial's own keys, which a role may override
    shown = role_config(cfg, "decode") if cfg.pd.enabled else cfg
    steps: dict[str, StepEstimate] = {}
    layers: tuple[int, ...] = ()
    try:
        from orchestrator.prediction.modelled import modelled_steps

        servers = cfg.pd.decode.workers if cfg.pd.enabled else 1  # the streams shared between them
        steps, layers = modelled_steps(shown, {k: -(-c // servers) for k, c in concurrency.items()}, resolved)
    except Exception as exc:  # a model the cost model cannot describe: those rules stay quiet
        log.warning("no cost-model estimates for the diagnosis: %s", exc)
    input_len, output_len = _mean_lengths(cfg, results)
    info = model_info(cfg.model.path)
    return TrialFacts(
        pp_size=shown.pp.size, async_depth=shown.pp.async_depth, resolved=resolved, points=points,
        concurrency=concurrency, idle_power_w=cfg.hardware.idle_power_w,
        power_limit_w=cfg.hardware.power_limit_w, tp_size=shown.tp.size, dp_size=shown.dp.size,
        attn_dp=shown.dp.attention, latent_kv=info.latent_kv, moe=info.is_moe,
        interconnect=cfg.hardware.interconnect, gpu_source=gpu_source.value, engine=engine,
        plays="vllm" if plays_vllm(cfg) else "sglang", steps=steps,
        stage_layers=layers, input_len=input_len, output_len=output_len, dp_router=cfg.dp.router,
        spec_algorithm=cfg.spec.algorithm, spec_drafts=_spec_drafts(cfg), pd=_deployment(cfg))


def _deployment(cfg: ParasweepConf) -> dict[str, int] | None:
    """A disaggregated trial's servers, as the rules on the deployment read them."""
    if not cfg.pd.enabled:
        return None
    return {"prefill_workers": cfg.pd.prefill.workers, "decode_workers": cfg.pd.decode.workers,
            "prefill_gpus": role_gpus(cfg, "prefill"), "decode_gpus": role_gpus(cfg, "decode"),
            "reserved_decode_tokens": cfg.pd.reserved_decode_tokens or 0}


def _spec_drafts(cfg: ParasweepConf) -> dict[str, str]:
    """The drafts the trial's model could speculate with when it does not, each with the acceptance a
    prediction of it assumes (spec.acceptance as set, on the workload's kind of text)."""
    from orchestrator.engines.drafts import acceptance_flag, has_mtp_layers
    from simulator.speculative.acceptance import AcceptanceError, parse_acceptance

    if cfg.spec.algorithm != "none":
        return {}
    kinds = [a for a in ("eagle3", "eagle") if a in (cfg.model.drafts or {})]
    if has_mtp_layers(cfg):
        kinds.append("mtp")
    out = {}
    for kind in kinds:
        try:  # SGLang's usual depth for the note; the prediction resolves the model's own
            acceptance = parse_acceptance(acceptance_flag(cfg), kind, 3)
        except (AcceptanceError, ValueError):
            continue  # nothing published for it and no acceptance given: it cannot be predicted
        out[kind] = acceptance.source.split(": ")[0]
    return out


def _mean_lengths(cfg: ParasweepConf, results: list[PointResult]) -> tuple[float, float]:
    """The workload's mean prompt and output lengths: the config's for generated prompts; for real
    traffic (datasets, traces, shared prefixes) the means of the requests the trial sent."""
    if cfg.workload.source == "random":
        return float(cfg.workload.input_len), float(cfg.workload.output_len)
    sent = [r for res in results for r in res.records if r.error is None and r.input_tokens > 0]
    if not sent:
        return 0.0, 0.0
    return (sum(r.input_tokens for r in sent) / len(sent), sum(r.output_tokens for r in sent) / len(sent))


def trial_timings(t: dict[str, float]) -> dict[str, float]:
    """``trial/<name>`` metrics: seconds in total, starting the engine, under load, and the rest."""
    out = {"total_s": (t.get("end") or max(t.values())) - t["task_start"]}
    if "engine_ready" in t and "engine_launch" in t:
        out["engine_start_s"] = t["engine_ready"] - t["engine_launch"]
    if "load_end" in t and "load_start" in t:
        out["load_s"] = t["load_end"] - t["load_start"]
        if "engine_start_s" in out:
            out["overhead_s"] = out["total_s"] - out["engine_start_s"] - out["load_s"]
    return out


def describe_trial(plan: TrialPlan, status: TrialStatus, results: list[PointResult],
                   extras: dict[str, dict[str, float]], findings: list[dict[str, Any]],
                   gpu_source: GpuSource, gpu_note: str, where: dict[str, str]) -> list[str]:
    """The run's description (Markdown): the layout, where it ran (``where``: environment.placement;
    empty for a prediction), a table of the points, the findings."""
    from orchestrator.config.traffic import traffic_note
    from orchestrator.prediction.modelled import step_costs_label
    from vocab.telemetry import ENERGY_J, J_PER_TOKEN, POWER_FRAC_MEAN

    c = plan.cfg
    source = ("predicted in virtual time by the simulated engine" if c.predict
              else f"engine {plan.engine_name}")
    lines = [f"**{status.value}**: {plan.identity.label}", "",
             f"{c.model.name} on {c.hardware.name}, tp={c.tp.size} pp={c.pp.size} ep={c.ep.size} "
             f"dp={c.dp.size}, async depth {c.pp.async_depth}, {source}", "",
             *([f"Ran on host {where['host']}, Ray node {where['ray_node_id']}; "
                f"GPUs: {where['gpu_uuids']}", ""] if where else []),
             *([f"DP: {_routing(plan)}", ""] if c.dp.size > 1 else []),
             *([f"Disaggregated: {_servers_line(c)}", ""] if c.pd.enabled else []),
             f"GPU telemetry: {gpu_source.describe()} ({gpu_note})", "",
             f"Step costs of the simulator's numbers and predictions: {step_costs_label(c)}", "",
             *([f"Traffic: {traffic_note(c)}", ""] if c.workload.source != "random" else [])]
    if results:
        lines += ["| point | output tok/s | TTFT p99 ms | ITL p99 ms | power % of limit | J/token | valid |",
                  "|---|---|---|---|---|---|---|"]
        for r in results:
            m = {**r.metrics, **extras.get(r.point.label, {})}
            nan = float("nan")
            lines.append(f"| {r.point.label} | {m.get('output_tok_s', nan):.1f} | "
                         f"{m.get('ttft_p99_ms', nan):.1f} | {m.get('itl_p99_ms', nan):.2f} | "
                         f"{100 * m.get(POWER_FRAC_MEAN, nan):.0f} | {m.get(J_PER_TOKEN, nan):.2f} | "
                         f"{int(m.get('valid', 1))} |")
        if any(ENERGY_J in {**r.metrics, **extras.get(r.point.label, {})} for r in results):
            lines += ["", f"Power and energy: {gpu_source.describe()}."]
    if findings:
        lines += ["", "Findings (diagnosis.json):"]
        lines += [f"- **{f['severity']}** {f['title']}: {f['suggestion'].splitlines()[0]}" for f in findings]
    return lines


def _servers_line(cfg: ParasweepConf) -> str:
    """A disaggregated trial's servers, each role's layout, how its KV moves and what stands in front."""
    def role(name: str) -> str:
        one = role_config(cfg, name)
        n = getattr(cfg.pd, name).workers
        return (f"{n} {name} server{'s' if n != 1 else ''} of tp={one.tp.size} pp={one.pp.size} "
                f"ep={one.ep.size} dp={one.dp.size}")

    router = "vllm-router" if plays_vllm(cfg) else "the smg router"
    return (f"{role('prefill')}, {role('decode')}; KV over {cfg.pd.transfer_backend}, {router} in PD mode "
            "in front")


def _routing(plan: TrialPlan) -> str:
    """Who spread the requests over the trial's DP replicas, and whether that was modelled."""
    c = plan.cfg
    if c.predict:
        return (f"{c.dp.size} replicas, requests spread {c.dp.router} by the simulated engine's model of "
                "that policy (a prediction)")
    if router_process(c, plan.engine_name):
        return (f"{c.dp.size} servers of one replica each behind the router package ({ROUTER_PACKAGE}, "
                f"--policy {c.dp.router}); server.log and the engine's numbers are replica 0's")
    who = "SGLang's DP controller" if plan.engine_name == "sglang" else "the simulated engine's model"
    return f"{c.dp.size} replicas in one server, requests spread {c.dp.router} by {who}"
