"""``python run.py search=<name>``, in prediction: the candidates of the space judged in parallel
(``judge.py``; every one of them, or, in a space larger than ``search.max_candidates``, those Optuna's
sampler picks: ``sampled.py``), with a progress bar, then one table of them and the answer. The table
(``search/candidates.parquet`` and ``.csv`` in the run's output directory) has one row per candidate:
the values of each searched key, the status (``ok``, ``rejected``, ``over the SLOs``) and why, the GPUs,
the highest load within the SLOs, the score and the predicted metrics there. The printed answer names
the winner as a ``run.py`` command line at its load, the runners-up, and the rejections counted by
reason. All of it is the simulator's prediction, and says so.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.diagnose import overrides_text
from analysis.noise import Estimate, judge
from orchestrator.config.schema import ParasweepConf
from orchestrator.errors import ConfigError, UserError
from orchestrator.search.evaluate import (
    OK,
    OVER_SLO,
    PRUNED,
    REJECTED,
    Outcome,
    Settings,
    check_settings,
)
from orchestrator.search.judge import RUNNERS_UP, Judge, progress_bar
from orchestrator.search.sampled import sampled_outcomes
from orchestrator.search.space import candidates, parse_space, size, with_group_keys

PREDICTED = "predicted by the simulated engine in virtual time, not measured"
# what the SLOs are judged on (evaluate.steady_point): the window after the ramp, before the drain
STEADY = "each load's streams ramped in over one request duration, the window after the ramp judged"
# the predicted metrics of each candidate at its load, and how sure its throughput is (its 95 % interval,
# relative; budget_hit 1: its point ran out of virtual time or requests before its target)
SHOWN = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms", "tpot_p50_ms", "e2e_p99_ms", "output_tok_s_ci95_rel",
         "budget_hit")


@dataclass
class SearchResult:
    outcomes: list[Outcome]
    table: pd.DataFrame
    folder: Path
    answer: list[str] = dataclasses.field(default_factory=list)  # the lines printed at its end
    sampled_from: int | None = None  # the space's size when the sampler picked the candidates

    @property
    def ranked(self) -> list[Outcome]:
        ok = [o for o in self.outcomes if o.status == OK and o.score is not None and not o.same_as]
        return sorted(ok, key=lambda o: -(o.score or 0.0))


def outcome_table(outcomes: list[Outcome], keys: list[str]) -> pd.DataFrame:
    rows = []
    for o in outcomes:
        row: dict[str, Any] = {k: o.change.get(k) for k in keys}
        row.update(status=o.status, reason=o.reason, category=o.category, gpus=o.gpus or None,
                   concurrency=o.concurrency, score=o.score, limit=o.limit, miss=o.miss,
                   ceiling=o.ceiling, same_as=o.same_as, replicas_of=o.replicas_of,
                   predictions=o.predictions)
        row.update({m: o.metrics.get(m) for m in SHOWN})
        rows.append(row)
    frame = pd.DataFrame(rows)
    for k in keys:  # mixed types (null and numbers, booleans) as text, so Parquet takes the column
        frame[k] = frame[k].map(lambda v: "null" if v is None else str(v).lower() if isinstance(v, bool)
                                else str(v))
    return frame


def search_base(cfg: ParasweepConf) -> ParasweepConf:
    """The config every candidate changes: the workload gives the requests (lengths, distributions,
    API); the search chooses the load."""
    return dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, concurrency=[1], rate=[]))


def run_search(cfg: ParasweepConf, out_dir: Path, show_progress: bool = True,
               keep: int = 1 + RUNNERS_UP, overrides: tuple[str, ...] = ()) -> SearchResult:
    """The search of ``cfg.search`` on ``cfg`` as the base configuration; its table is written under
    ``out_dir/search/``. Raises a ``UserError`` (one line) for a bad search or when no candidate meets
    the SLOs, naming the one that came closest. ``overrides``: the search's own command-line overrides,
    which the winner's command line keeps (its model, hardware, workload ...)."""
    settings = check_settings(cfg)
    dims = with_group_keys(parse_space(cfg.search.space), overrides)
    cfg = search_base(cfg)
    workers = cfg.search.workers or os.cpu_count() or 1
    budget = cfg.search.max_candidates
    if budget < 1:
        raise ConfigError("search.max_candidates", budget, "an integer >= 1")
    total = size(dims)
    how = (f"{total} candidates" if total <= budget else
           f"{total} candidates, of which Optuna's TPE sampler picks {budget} (seed {cfg.search.seed})")
    print(f"[parasweep] search {cfg.search.name}: {how} of {len(dims)} keys "
          f"({', '.join(d.key for d in dims)}), objective {settings.objective}, SLOs "
          f"{slo_text(settings) or 'none'} judged in steady state ({STEADY}), on {workers} "
          f"process(es); {PREDICTED}", flush=True)
    keep = max(keep, 1 + RUNNERS_UP)
    with Judge(cfg, settings, workers, keep) as judge, progress_bar(show_progress) as progress:
        task = progress.add_task("candidates", total=min(total, budget))

        def advance() -> None:
            progress.advance(task)

        if total <= budget:
            outcomes = judge.judge(list(candidates(dims)), advance)
        else:
            outcomes = sampled_outcomes(judge, dims, budget, cfg.search.seed, advance)
    folder = out_dir / "search"
    folder.mkdir(parents=True, exist_ok=True)
    table = outcome_table(outcomes, [d.key for d in dims])
    table.to_parquet(folder / "candidates.parquet", index=False)
    table.to_csv(folder / "candidates.csv", index=False)
    result = SearchResult(outcomes, table, folder, sampled_from=total if total > budget else None)
    result.answer = answer_lines(cfg, result, settings, overrides)
    for line in result.answer:
        print(line, flush=True)
    if not result.ranked:
        raise UserError(_nothing_meets(outcomes, settings))
    return result


def slo_text(settings: Settings) -> str:
    return ", ".join(f"{k} <= {v:g}" for k, v in settings.slo.items())


def _nothing_meets(outcomes: list[Outcome], settings: Settings) -> str:
    over = [o for o in outcomes if o.status == OVER_SLO and o.miss is not None]
    if not over:
        reasons = collections.Counter(o.category for o in outcomes)
        first = reasons.most_common(1)[0][0] if reasons else "no candidate"
        return f"search.space: no candidate can run on this node (most common reason: {first})"
    closest = min(over, key=lambda o: o.miss or float("inf"))
    return (f"search.slo: no candidate meets {slo_text(settings)}; closest: "
            f"{overrides_text(closest.change)} misses by {100 * ((closest.miss or 1.0) - 1):.0f}% "
            f"({closest.reason})")


def answer_lines(cfg: ParasweepConf, result: SearchResult, settings: Settings,
                 task: tuple[str, ...] = ()) -> list[str]:
    """The end of a search: counts, the winner as a command line, the runners-up, the rejections."""
    outcomes, ranked = result.outcomes, result.ranked
    counts = collections.Counter(o.status for o in outcomes)
    twins = sum(1 for o in outcomes if o.same_as)
    replicas = sum(1 for o in outcomes if o.replicas_of)
    judged = (f"{len(outcomes)} of {result.sampled_from} candidates (picked by Optuna's TPE sampler, seed "
              f"{cfg.search.seed}; the best of those, not of the whole space)" if result.sampled_from
              else f"{len(outcomes)} candidates")
    lines = [f"Search {cfg.search.name}: {judged}: {counts.get(OK, 0)} within the SLOs, "
             f"{counts.get(OVER_SLO, 0)} over them at any load, {counts.get(PRUNED, 0)} could not win "
             f"(their ceiling, from the cost model or their highest load, below the best predicted), "
             f"{counts.get(REJECTED, 0)} rejected; "
             f"{twins} the same engine as another, {replicas} more replicas of another (their load from "
             f"its replicas', confirmed in full where it could enter the best few); "
             f"{sum(o.predictions for o in outcomes)} load points predicted; {PREDICTED}."]
    if ranked:
        best = ranked[0]
        lines.append(f"Best: {overrides_text(best.change)} at concurrency {best.concurrency}: "
                     f"{_scored(best, settings)}; a higher load: {best.limit}")
        lines += command_lines(cfg, best.change, best.concurrency, task)
        # more replicas of the best's engine are the same choice of engine: the noise question is about
        # the best other one
        rival = next((o for o in ranked[1:] if _family(o) != _family(best)), None)
        if rival is not None:
            verdict = judge([_score_estimate(best), _score_estimate(rival)])
            if verdict is not None and not verdict.clear:
                lines.append(f"  The best other engine ({overrides_text(rival.change)}) is {verdict.text()}: "
                             "either is the answer as far as the prediction can tell them apart")
        for o in ranked[1:1 + RUNNERS_UP]:
            lines.append(f"Runner-up: {overrides_text(o.change)} at concurrency {o.concurrency}: "
                         f"{_scored(o, settings)}; {_lost(o, best)}")
    reasons = collections.Counter(o.category for o in outcomes if o.status == REJECTED)
    for reason, n in reasons.most_common():
        example = next(o for o in outcomes if o.status == REJECTED and o.category == reason)
        lines.append(f"Rejected {n}: {reason} (e.g. {overrides_text(example.change)})")
    lines.append(f"Every candidate: {result.folder / 'candidates.csv'}")
    return lines


def command_lines(cfg: ParasweepConf, change: dict[str, Any], concurrency: int | None,
                  task: tuple[str, ...] = ()) -> list[str]:
    """A candidate as a person runs it: its ``run.py`` command line at ``concurrency`` (the search's
    own overrides kept, its search turned off) and its engine's launch command (SGLang's, or ``vllm
    serve`` for a candidate on vLLM)."""
    from orchestrator.config.schema import plays_vllm, server_nodes, world_size
    from orchestrator.prediction.modelled import apply_change
    from orchestrator.search.measure import base_overrides

    changed, _ = apply_change(cfg, change)
    # a deployment wider than a node runs in prediction (a live one is every server and the router on
    # one host); its SGLang servers then listen on their nodes' addresses, not the loopback
    across = changed.pd.enabled and world_size(changed) > changed.hardware.num_gpus
    base = [shlex.quote(o) for o in base_overrides(task, change)]
    off = ["search.name=null"] if any(o.startswith(("experiment=", "search=")) for o in task) else []
    run_py = " ".join(["python", "run.py", *base, *off, overrides_text(change),
                       f"workload.concurrency=[{concurrency}]", *(["predict=true"] if across else [])])
    lines = [f"  {run_py}" + ("  (across nodes: in prediction)" if across else "")]
    if plays_vllm(changed):
        command, release = vllm_command(cfg, change)
        return [*lines, f"  vLLM as parasweep would launch it ({release}'s flags; random weights of the "
                        f"config folder, no tokenizer): {command}",
                "  To serve the real model: the weights' folder or Hugging Face id as the model, without "
                "--load-format dummy and --skip-tokenizer-init"]
    lines.append(f"  SGLang as parasweep measures it (0.5.23's flags; random weights of the config folder, "
                 f"no tokenizer): {sglang_command(cfg, change)}")
    if changed.pd.enabled and len(set(server_nodes(changed))) > 1:
        lines.append("  Across nodes: each server's --host is its node's address, and the router's --prefill "
                     "and --decode URLs those addresses")
    if cfg.model.weights:
        lines.append(f"  SGLang serving the real model ({cfg.model.weights}): "
                     f"{sglang_command(cfg, change, cfg.model.weights)}")
    else:
        lines.append("  To serve the real model: --model-path the weights' folder or Hugging Face id, "
                     "without --load-format dummy and --skip-tokenizer-init (model.weights names them)")
    return lines


def sglang_command(cfg: ParasweepConf, change: dict[str, Any], weights: str | None = None) -> str:
    """The SGLang launch command of ``cfg`` with ``change``, as parasweep would start it (port 30000,
    secrets masked; behind the router package, one server per DP replica and the router, joined by
    ``&``); with ``weights`` (a local folder or Hugging Face id), serving those real weights
    with their tokenizer instead of random weights from a config-only folder."""
    from orchestrator.config.schema import router_process
    from orchestrator.engines.base import sglang_flags
    from orchestrator.engines.router import routed_launch
    from orchestrator.prediction.modelled import apply_change
    from orchestrator.redact import redact_argv

    changed, env = apply_change(cfg, change)
    prefix = [f"{k}={v}" for k, v in env.items()]  # engine environment variables the change sets

    def server(c: ParasweepConf, port: int) -> list[str]:
        flags = sglang_flags(c, port)
        if weights:
            flags = _serving(flags, weights)
        return redact_argv(["python", "-m", "sglang.launch_server", *flags])

    if changed.pd.enabled:
        return _disaggregated_command(changed, prefix, server)
    if not router_process(changed, "sglang"):
        return shlex.join([*prefix, *server(changed, 30000)])
    # one server per replica on its own GPUs (ports 30001..), the router in front on 30000
    launch = routed_launch(changed, server, [30001 + rank for rank in range(changed.dp.size)], 30000, 29000,
                           None, python="python")
    replicas = [shlex.join([f"CUDA_VISIBLE_DEVICES={gpus}", *prefix, *argv])
                for argv, gpus in launch.replicas]
    return " & ".join([*replicas, shlex.join(launch.router)])


def vllm_command(cfg: ParasweepConf, change: dict[str, Any]) -> tuple[str, str]:
    """(the ``vllm serve`` command of ``cfg`` with ``change`` as parasweep would start it (port 8000,
    secrets masked), the release whose flags it was checked against: ``vllm.release``, else the newest
    recorded)."""
    from orchestrator.engines.vllm import target_release
    from orchestrator.engines.vllm_compat.command import vllm_argv
    from orchestrator.prediction.modelled import apply_change
    from orchestrator.redact import redact_argv

    changed, env = apply_change(cfg, change)
    version = target_release(None, changed.vllm.release)[0]
    argv = vllm_argv(changed, "python", 8000, version)
    # `vllm serve` is the command users type; parasweep runs the same entry point through its Python
    served = ["vllm", *argv[argv.index("serve"):]]
    return shlex.join([*(f"{k}={v}" for k, v in env.items()), *redact_argv(served)]), version


def _disaggregated_command(cfg: ParasweepConf, prefix: list[str],
                           server: Callable[[ParasweepConf, int], list[str]]) -> str:
    """Every prefill and decode server of a disaggregated deployment on its GPUs (ports 30001..,
    bootstrap ports from ``pd.bootstrap_port`` or SGLang's default up), the router in PD mode in front
    on 30000. Across nodes each server is marked with its node, its GPUs numbered within it; the
    router's URLs then need the nodes' addresses instead of 127.0.0.1."""
    from orchestrator.config.schema import server_nodes
    from orchestrator.engines.router import pd_launch
    from orchestrator.engines.sglang_compat.disagg import DEFAULT_BOOTSTRAP_PORT

    count = cfg.pd.prefill.workers + cfg.pd.decode.workers
    launch = pd_launch(cfg, server, [30001 + i for i in range(count)],
                       lambda offset, _: DEFAULT_BOOTSTRAP_PORT + offset, 30000, 29000, None, python="python")
    nodes = server_nodes(cfg)
    across = len(set(nodes)) > 1
    used: collections.Counter[int] = collections.Counter()
    commands = []
    for one, node in zip(launch.servers, nodes, strict=True):
        width = len(one.gpus.split(","))
        gpus = ",".join(str(used[node] + g) for g in range(width))
        used[node] += width
        env = [f"{k}={v}" for k, v in one.env.items()]
        command = shlex.join([f"CUDA_VISIBLE_DEVICES={gpus}", *env, *prefix, *one.argv])
        commands.append(f"[node {node}] {command}" if across else command)
    return " & ".join([*commands, shlex.join(launch.router)])


def _serving(flags: list[str], weights: str) -> list[str]:
    """Flags that load ``weights`` and their tokenizer: the model path replaced, the dummy load format
    and the skipped tokenizer dropped."""
    out: list[str] = []
    skip = 0
    for i, flag in enumerate(flags):
        if skip:
            skip -= 1
            continue
        if flag == "--model-path":
            out += [flag, weights]
            skip = 1
        elif flag == "--load-format" and i + 1 < len(flags) and flags[i + 1] == "dummy":
            skip = 1
        elif flag != "--skip-tokenizer-init":
            out.append(flag)
    return out


def _score_estimate(o: Outcome) -> Estimate:
    """A candidate's score with the 95 % interval of its window's throughput (batch means of the
    predicted point: what a steady closed loop of that length can tell apart)."""
    return Estimate.scaled(o.score or 0.0, o.metrics.get("output_tok_s_ci95_rel"))


def _family(o: Outcome) -> str:
    """The engine whose replicas ``o`` runs: its own change, or the one it was judged from."""
    return o.family or overrides_text(o.change)


def _lost(o: Outcome, best: Outcome) -> str:
    """Why a runner-up lost: how far below the best it scores, and what held its load down."""
    behind = 100.0 * (1.0 - (o.score or 0.0) / (best.score or 1.0))
    same = ", the best's engine with another count of replicas" if _family(o) == _family(best) else ""
    return f"{behind:.0f}% below the best{same}; held at this load by {o.limit}"


def _scored(o: Outcome, settings: Settings) -> str:
    m = o.metrics
    rel = m.get("output_tok_s_ci95_rel", float("nan"))
    sure = f" ±{100 * rel:.0f} %" if math.isfinite(rel) else " (interval not known)"
    short = " (short of its target: its point's budget ran out)" if m.get("budget_hit") == 1.0 else ""
    parts = [f"{settings.objective} {o.score:,.1f}", f"{o.gpus} GPU(s)",
             f"{m.get('output_tok_s', float('nan')):,.0f} tok/s{sure}{short}",
             f"TTFT p99 {m.get('ttft_p99_ms', float('nan')):,.0f} ms",
             f"ITL p99 {m.get('itl_p99_ms', float('nan')):,.1f} ms"]
    return ", ".join(parts)
