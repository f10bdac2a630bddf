"""What ``run.py`` does around Hydra: one-line errors for bad input, and closing the sweep (its
parent run's status, the summary table, the command that opens the MLflow UI)."""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from orchestrator.errors import UserError
from vocab.assets import group_options
from vocab.metric_keys import MetricKey, point_metrics
from vocab.status import Tag, TrialStatus, simulated

if TYPE_CHECKING:
    from orchestrator.sweep import SweepState

CONFIG_GROUPS = ("engine", "model", "hardware", "parallelism", "workload", "experiment")
# the engine tags of runs whose numbers come from the simulated engine (live, and in virtual time)


HELP_WIDTH = 100  # `python run.py --help` stays within this many columns


def wrap_group_lines(text: str, width: int = HELP_WIDTH) -> str:
    """Hydra lists each config group's options on one line (``workload: azure, demo, ...``), however
    many there are: wrap such a line at ``width``, the continuation indented under the first option."""
    out = []
    for line in text.splitlines():
        name, sep, options = line.partition(": ")
        if len(line) > width and sep and re.fullmatch(r"[\w/.-]+", name) and ", " in options:
            out += textwrap.wrap(options, width=width, initial_indent=name + sep,
                                 subsequent_indent=" " * (len(name) + len(sep)), break_on_hyphens=False)
        else:
            out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def preflight_overrides(args: list[str]) -> None:
    """Reject unknown config-group options (``model=foo``) before Hydra composes anything."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    candidates = [a for a in args if "=" in a and not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(candidates)
    except Exception:  # Hydra reports syntax errors itself (one_line_error formats them)
        return
    for ov in overrides:
        group = ov.key_or_group.lstrip("+~")
        if group not in CONFIG_GROUPS or ov.is_delete():
            continue
        if ov.is_sweep_override():
            values = list(ov.sweep_string_iterator())
        else:
            values = [ov.get_value_element_as_str()]
        options = group_options(group)
        for value in values:
            if value not in options and not (group == "experiment" and value == "null"):
                raise UserError(f"{group}={value}: unknown {group}; valid: {', '.join(options)}")


def _schema_keys(path: str) -> list[str]:
    from orchestrator.config.schema import ParasweepConf

    node = OmegaConf.structured(ParasweepConf)
    if path:
        node = OmegaConf.select(node, path)
    return sorted(node.keys()) if node is not None and hasattr(node, "keys") else []


def _type_word(message: str) -> str:
    m = re.search(r"could not be converted to (\w+)", message)
    if m:
        return {"Integer": "an integer", "Float": "a number", "Boolean": "true or false"}.get(
            m.group(1), m.group(1).lower())
    m = re.search(r"Invalid value '[^']*', expected one of \[([^\]]*)\]", message)
    if m:
        return m.group(1)
    if "ListConfig" in message or "list" in message.lower():
        return "a list, e.g. [8] or [1,8,32]"
    return "a value of the key's type"


def one_line_error(exc: BaseException) -> tuple[str, int]:
    """Map an exception to (one line, exit code): 2 for user mistakes, 1 for failures."""
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

    if isinstance(exc, UserError):
        return str(exc), 2
    if isinstance(exc, OSError) and exc.filename:
        # at this level an OSError is the output location: Hydra's run/sweep directory or runs/ here
        return (f"{exc.filename}: cannot be written ({exc.strerror or type(exc).__name__}); valid: a "
                "writable directory (run from one, or set hydra.run.dir / hydra.sweep.dir)", 2)
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else None
    inner = cause or (exc if isinstance(exc, OmegaConfBaseException) else None)
    if isinstance(inner, ConfigKeyError | ValidationError | OmegaConfBaseException) and inner is not None:
        key = getattr(inner, "full_key", None) or ""
        first = str(inner).splitlines()[0]
        if isinstance(inner, ConfigKeyError) or "not in" in first:
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            if parent == "server.extra_args":
                return (f"{key}: engine flags are added with a leading +; valid: "
                        f"+{key}=VALUE (true for a bare flag)", 2)
            where = f"under {parent}" if parent else "at the top level"
            return (f"{key}: unknown config key; valid keys {where}: {', '.join(_schema_keys(parent))}", 2)
        value = getattr(inner, "value", None)
        shown = f"={value}" if value is not None else ""
        return f"{key}{shown}: invalid ({first}); valid: {_type_word(first)}", 2
    if isinstance(exc, MissingConfigException):
        m = re.search(r"Could not find '([^/']+)/([^']+)'", str(exc))
        if m:
            return (f"{m.group(1)}={m.group(2)}: unknown {m.group(1)}; valid: "
                    f"{', '.join(group_options(m.group(1)))}", 2)
        return str(exc).splitlines()[0], 2
    if isinstance(exc, OverrideParseException):
        why = re.sub(r"\s*See https?://\S+ for details\.?", "", str(exc.message)).strip()
        return (f"{exc.override}: cannot be parsed ({why}); valid: key=value, key=a,b,c to sweep "
                "(with -m), key=[1,8,32] for a list, quoted values for spaces", 2)
    if isinstance(exc, HydraException):
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        return text, 2
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", 1


def finish(code: int) -> int:
    """Close the sweep's parent run and print its end (analysis/report.py: the engine, the table, the
    findings; then the HTML report, the trial files, the MLflow UI); the process exit code.

    Nothing here may end the sweep in a traceback: the trials' numbers are already in the store, so a
    part that cannot be shown is named in one line and the rest goes on; the sweep run is closed with
    its status whatever happens to the summary. A tracking server that went away during the sweep
    gets its spooled writes first, if it is back; if it is not, the sweep's end is spooled too and
    one line says so."""
    from orchestrator import sweep

    state = sweep.ACTIVE
    _shutdown_ray()  # also ends the trials' workers, which finishes their spool files
    if state is None or state.run_id is None:
        return code
    _sync_spool(state.uri)
    runs, status = _close_sweep(state, code)
    if runs is not None and (runs or state.mode != "search"):  # None: the store could not be read
        _guarded("show the sweep's summary", lambda: _show_sweep(state, runs, status))
    elif runs is not None:  # a search that measured nothing: its answer is its description
        from orchestrator.store.tracking import Tracker

        _guarded("describe the search run", lambda: _describe_sweep(
            Tracker(state.uri, state.experiment), state.run_id, [], status, _search_answer(state)))
    if code == 0 and status != "ok":
        code = 1
    return code


def _sync_spool(uri: str) -> None:
    """Replay what this sweep's processes (and any earlier run) spooled for this server, so the end of
    the sweep reads every trial back; silent when there is nothing, or the server is still away (the
    sweep's end then says so itself)."""
    from orchestrator.store.tracking import close_spools, is_http

    if not is_http(uri):
        return
    close_spools()  # this process's own files too: finished, so the sync may take them

    def replay() -> None:
        from orchestrator.store.sync import sync_spool

        for line in sync_spool(only_uri=uri).lines:
            print(f"parasweep: spool: {line}", flush=True)

    _guarded("replay the spooled tracking writes", replay)


def _close_sweep(state: SweepState, code: int) -> tuple[list[Any] | None, str]:
    """Close trials left running and then the sweep run itself, with the overall status: ``(the
    sweep's trial runs, that status)``. A store that cannot be read gives ``(None, "failed")``
    (``killed`` after Ctrl-C): a sweep whose trials cannot be found did not succeed. A tracking
    server that cannot be reached gives ``(None, the status the trial directories say)``, and the
    closing is left to the sync."""
    from orchestrator.store.spool import is_placeholder
    from orchestrator.store.stale import upload_partial
    from orchestrator.store.tracking import Tracker, interrupted_status, sweep_status, unreachable

    runs: list[Any] | None = None
    tracker: Any = None
    try:
        tracker = Tracker(state.uri, state.experiment)
        if is_placeholder(state.run_id):  # the sweep run itself is only in the spool
            return None, _spool_sweep_end(tracker, state, code)
        runs = tracker.children(state.run_id)
        interrupted = interrupted_status(code)
        for run in runs:  # a trial whose worker was killed outright never closed its own run
            if run.data.tags.get(Tag.STATUS) == TrialStatus.RUNNING:
                # nor saved its files (the signal reached its worker before the soft cancel did): the
                # records and logs it wrote as it ran go up now, as for a stale run (Ray has stopped
                # the workers by now, so nothing else writes them)
                trial_dir = run.data.tags.get(Tag.TRIAL_DIR)
                if trial_dir and Path(trial_dir).is_dir():
                    upload_partial(tracker, run.info.run_id, Path(trial_dir))
                tracker.finish(run.info.run_id, interrupted.value)
                run.data.tags[Tag.STATUS] = interrupted.value
    except Exception as exc:
        if tracker is not None and unreachable(exc):
            return None, _spool_sweep_end(tracker, state, code)
        _say_failed(f"read the trials of sweep run {state.run_id}", exc)
    statuses = [r.data.tags.get(Tag.STATUS) for r in runs or []]
    # a search that measured nothing (search.measure_top=0) succeeded by predicting
    status = sweep_status(code, statuses, none_ok=state.mode == "search")
    if tracker is not None:  # the sweep run is closed even when its trials could not be read
        _guarded(f"close sweep run {state.run_id} with status {status}",
                 lambda: tracker.finish(state.run_id, status))
    return runs, status


def _spool_sweep_end(tracker: Any, state: SweepState, code: int) -> str:
    """The tracking server is away at the sweep's end: leave closing the sweep run to the sync, say so
    in one line, and decide the exit status from the trial directories (each trial's
    ``progress.json`` holds its final status), the only record of the trials this process can read."""
    from orchestrator.progress import read_progress
    from orchestrator.redact import redact_url
    from orchestrator.store.spool import spool_files, spool_root
    from orchestrator.store.sync import SYNC_COMMAND
    from orchestrator.store.tracking import close_spools, sweep_status

    tracker.close_sweep_later(state.run_id, code)
    close_spools()  # finished: the next run.py or the sync command may take it
    root = spool_root()
    print(f"parasweep: tracking server {redact_url(state.uri)} unreachable; results spooled to "
          f"{_shown_path(root)}/ ({len(spool_files(root))} file(s)); run `{SYNC_COMMAND}` when it is back",
          file=sys.stderr, flush=True)
    sweep_dir = Path(state.sweep_dir)
    trial_dirs = sorted({p.parent for p in sweep_dir.glob("*/progress.json")}) if state.multirun \
        else [sweep_dir]
    trials = f"{_shown_path(sweep_dir)}/<n>/" if state.multirun else _shown_path(sweep_dir)
    print(f"Trial files: {trials} (records, telemetry, diagnosis.json)", flush=True)
    return sweep_status(code, [(read_progress(d) or {}).get("status") for d in trial_dirs])


def _show_sweep(state: SweepState, runs: list[Any], status: str) -> None:
    from rich.console import Console

    from analysis.report import MAX_WIDTH, print_sweep_summary
    from orchestrator.store.tracking import Tracker, runs_url, ui_command

    # a terminal's width, at most 100 columns; 100 in logs and pipes (the README shows this output)
    console = Console(width=min(Console().width, MAX_WIDTH) if sys.stdout.isatty() else MAX_WIDTH)
    tracker = Tracker(state.uri, state.experiment)
    what = "prediction (virtual time, simulated engine)" if state.mode == "prediction" else "sweep"
    instead: dict[str, Any] = {}
    if state.mode != "search":  # a search's own answer is its end
        _guarded("predict what to run instead", lambda: instead.update(_run_instead(state, runs, tracker)))
    _guarded("show the summary table", lambda: print_sweep_summary(
        runs, f"{what} {state.run_id}: {len(runs)} trial(s), status {status}", console, state.uri))
    if instead:
        _guarded("show what to run instead", lambda: _show_instead(instead, console))
    sweep_dir = Path(state.sweep_dir)
    if state.plots:
        _log_plots(tracker, state.run_id, runs, sweep_dir)
    _describe_sweep(tracker, state.run_id, runs, status, _search_answer(state))
    console.print()
    if state.html:
        report = _html_report(tracker, state.run_id, state.uri, sweep_dir)
        if report is not None:
            console.print(f"Report: {_shown_path(report)}", highlight=False, markup=False)
    else:
        console.print(f"Report: not written (report.html=false; python -m analysis report {state.run_id})",
                      highlight=False, markup=False)
    trials = f"{_shown_path(sweep_dir)}/<n>/" if state.multirun else _shown_path(sweep_dir)
    console.print(f"Trial files: {trials} (records, telemetry, diagnosis.json{', plots' * state.plots})",
                  highlight=False, markup=False)
    url = runs_url(state.experiment_id or "0", state.uri)
    # commands are printed whole, never wrapped by rich: a long one continues with a shell backslash
    ui = _ui_uri(state.uri)
    where = " (from this directory)" if ui != state.uri else ""
    console.print("\n".join([f"Browse the runs in the MLflow UI{where}:",
                             *_shell_lines(ui_command(ui), console.width), f"  then open {url}"]),
                  highlight=False, markup=False, soft_wrap=True)


def _run_instead(state: SweepState, runs: list[Any], tracker: Any) -> dict[str, Any]:
    """What to run instead (``orchestrator/search/instead.py``), kept as ``instead.json`` in the sweep
    directory and the sweep run, where the HTML report finds it."""
    import json

    from orchestrator.prediction.at_load import shared_cache
    from orchestrator.search.instead import run_instead, sweep_trials

    sweep_dir = Path(state.sweep_dir)
    answer = run_instead(sweep_trials(runs, state.uri), shared_cache(sweep_dir))
    path = sweep_dir / "instead.json"
    path.write_text(json.dumps(answer, indent=1))
    tracker.log_artifact(state.run_id, path)
    return answer


def _show_instead(answer: dict[str, Any], console: Any) -> None:
    """The lines of ``analysis.report.instead_lines``, then the command lines, each printed whole."""
    from analysis.report import instead_lines

    lines = instead_lines(answer, console.width)
    if not lines:
        return
    console.print()
    for line in lines:
        style = "bold" if line.startswith("Run this") else "dim" if line.startswith("  Both") else ""
        console.print(line, highlight=False, markup=False, style=style)
    r = answer.get("recommend")
    if not r:
        return
    commands = [("", r["run_py"])]
    if r.get("vllm"):
        commands.append((f"  vLLM as parasweep would launch it ({r['vllm_release']}'s flags, random weights, "
                         "no tokenizer):", r["vllm"]))
    if r.get("sglang"):
        commands.append(("  SGLang as parasweep measures it (0.5.23's flags, random weights, no tokenizer):",
                         r["sglang"]))
    if r.get("sglang_weights"):
        commands.append(("  SGLang serving the real model:", r["sglang_weights"]))
    for head, command in commands:
        if head:
            console.print(head, highlight=False, markup=False)
        indent = "    " if head else "  "
        console.print("\n".join(_shell_lines(command, console.width, indent, indent + "    ")),
                      highlight=False, markup=False, soft_wrap=True)


def _guarded(doing: str, step: Callable[[], object]) -> None:
    """Run one step of the sweep's end; if it fails, say in one line what could not be done."""
    try:
        step()
    except Exception as exc:
        _say_failed(doing, exc)


def _say_failed(doing: str, exc: BaseException) -> None:
    """``parasweep: could not <doing> (<error>)`` on stderr, one line; the traceback goes to the log
    at debug level (``hydra.verbose=parasweep`` prints it), never to the user's screen."""
    import logging

    first = str(exc).splitlines()[0] if str(exc) else ""
    print(f"parasweep: could not {doing} ({type(exc).__name__}: {first})", file=sys.stderr)
    logging.getLogger("parasweep").debug("could not %s", doing, exc_info=exc)


def _html_report(tracker: Any, sweep_run_id: str, uri: str, sweep_dir: Path) -> Path | None:
    """The sweep's HTML report (``analysis/report_html.py``), logged as an artifact of the sweep run;
    None when it could not be written (the numbers are in the store whatever happens here)."""
    try:
        from analysis.report_html import build_report

        path = Path(build_report(sweep_run_id, uri, out=sweep_dir / "report.html"))
        tracker.log_artifact(sweep_run_id, path)
        return path
    except Exception as exc:  # a convenience, like the plots
        _say_failed("write the sweep's HTML report", exc)
        return None


def _shown_path(path: Path) -> str:
    """A path as short as it can be said: relative to the current directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _shell_lines(command: str, width: int, indent: str = "  ", more: str = "      ") -> list[str]:
    """A shell command broken before its options into lines of at most ``width`` where it can be
    (continued with `` \\``; ``indent`` before the first line, ``more`` before the others), so it can
    still be pasted whole."""
    units: list[str] = []
    for word in command.split(" "):  # an option and its value stay together
        if units and units[-1].startswith("--") and " " not in units[-1] and not word.startswith("-"):
            units[-1] += " " + word
        else:
            units.append(word)
    lines = [indent + units[0]]
    for unit in units[1:]:
        if len(lines[-1]) + 1 + len(unit) + 2 <= width:  # 2: the " \\" that may follow
            lines[-1] += " " + unit
        else:
            lines[-1] += " \\"
            lines.append(more + unit)
    return lines


def _ui_uri(uri: str) -> str:
    """A sqlite store under the current directory as a relative URI (``sqlite:///runs/mlflow.db``):
    the command that opens it is then short enough to print whole."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and Path(uri.removeprefix(prefix)).is_absolute():
        shown = _shown_path(Path(uri.removeprefix(prefix)))
        if not Path(shown).is_absolute():
            return prefix + shown
    return uri


def _search_answer(state: SweepState) -> str:
    """A search's answer (``search/answer.md`` in its output folder), or "" for a sweep."""
    path = Path(state.sweep_dir) / "search" / "answer.md"
    return path.read_text() if state.mode == "search" and path.is_file() else ""


def _describe_sweep(tracker: Any, sweep_run_id: str, runs: list[Any], status: str, preface: str = "") -> None:
    """The sweep run's description (a Markdown table of its trials, after ``preface``: a search's
    answer) and roll-up metrics, so the parent row of the runs table says something before it is
    expanded."""
    from analysis.report import point_labels

    try:
        labels = point_labels(runs)
        ordered = [run for _, run in sorted(enumerate(runs), key=lambda ir: _trial_num(ir[1], ir[0]))]
        lines = [*([preface] if preface else []), f"**{status}**: {len(runs)} trial(s)", "",
                 "| trial | status | " + " | ".join(f"{p} tok/s" for p in labels) + " |",
                 "|---|---|" + "---|" * len(labels)]
        # output tok/s per run and load point, from the per-point metrics
        tok_s = {run.info.run_id: {str(p): m["output_tok_s"]
                                   for p, m in point_metrics(run.data.metrics).items() if "output_tok_s" in m}
                 for run in runs}
        for run in ordered:
            values = tok_s[run.info.run_id]
            cells = [f"{values[p]:.1f}" if p in values else "-" for p in labels]
            status_cell = run.data.tags.get(Tag.STATUS, "?")
            lines.append(f"| {run.info.run_name} | {status_cell} | {' | '.join(cells)} |")
        tracker.set_tags(sweep_run_id, {Tag.NOTE: "\n".join(lines)[:7900]})
        rollup = [(str(MetricKey.at(p, "output_tok_s", prefix="best")),
                   max(t[p] for t in tok_s.values() if p in t), 0) for p in labels]
        counts = {s.value: sum(1 for r in runs if r.data.tags.get(Tag.STATUS) == s)
                  for s in TrialStatus if s is not TrialStatus.RUNNING}
        tracker.log_metrics(sweep_run_id, rollup + [(f"trials_{s}", float(n), 0) for s, n in counts.items()])
    except Exception as exc:  # a convenience: the trials' own runs hold the numbers
        _say_failed("describe the sweep run", exc)


def _log_plots(tracker: Any, sweep_run_id: str, runs: list[Any], sweep_dir: Path) -> None:
    """Per-trial plots into each child run (load curves; GPU and stage series where the trial has
    them), and every trial on one chart in the sweep's run. Each trial is drawn on its own: one that
    cannot be drawn is logged and the others, and the sweep's chart, still are."""
    import tempfile

    from analysis.plots import plot_energy_per_token, plot_sweep, plot_trial
    from analysis.report import points_from_metrics
    from vocab.telemetry import J_PER_TOKEN, GpuSource

    # trials are keyed "#<num> <label>": two trials may share a label (a repeated value, a reproduced
    # sweep's namesakes), and one must not hide the other on the sweep's chart
    by_key: dict[str, Any] = {}
    energy: dict[str, Any] = {}
    sources: set[str] = set()
    any_simulated = False
    ordered = sorted(enumerate(runs), key=lambda ir: _trial_num(ir[1], ir[0]))
    # a trial without a directory (its files were not kept) draws into scratch space, gone once logged
    with tempfile.TemporaryDirectory(prefix="parasweep-plots-") as scratch:
        for index, run in ordered:
            num = _trial_num(run, index)
            # a trial's run is named "#<num> <label>" already (older ones may lack the number)
            label = (run.info.run_name or "").removesuffix(" (predicted)").removeprefix(f"#{num} ")
            key = f"#{num} {label}"
            try:
                points = points_from_metrics(run.data.metrics)
                by_key[key] = points
                source = run.data.tags.get(Tag.GPU_TELEMETRY, GpuSource.NONE.value)
                per_token = {c: m[J_PER_TOKEN] for c, m in points.items() if J_PER_TOKEN in m}
                if per_token:
                    energy[key] = per_token
                    sources.add(source)
                simulated = _simulated(run)
                any_simulated |= simulated
                trial_dir = run.data.tags.get(Tag.TRIAL_DIR)
                out = Path(trial_dir) / "plots" if trial_dir else Path(scratch) / run.info.run_id / "plots"
                paths = plot_trial(points, key, out, simulated=simulated)
                if trial_dir:
                    paths += _telemetry_plots(Path(trial_dir), key, source, simulated, run.data.params)
                for path in paths:  # scratch plots must be copied if they go to the spool
                    tracker.log_artifact(run.info.run_id, path, "plots", scratch=not trial_dir)
            except Exception as exc:  # plots are a convenience; the numbers are already stored
                _say_failed(f"draw the plots of trial {key}", exc)
    try:
        plots = plot_sweep(by_key, "every trial of the sweep", sweep_dir / "plots", simulated=any_simulated)
        if energy:  # a sweep mixes sources only when some trials had no NVML: name them all
            source = sources.pop() if len(sources) == 1 else \
                "mixed: " + ", ".join(GpuSource(s).describe() for s in sorted(sources))
            path = plot_energy_per_token(energy, source, "every trial of the sweep",
                                         sweep_dir / "plots" / "energy_per_token.png")
            plots += [path] if path else []
        for path in plots:
            tracker.log_artifact(sweep_run_id, path, "plots")
    except Exception as exc:
        _say_failed("draw the sweep's plots", exc)


def _trial_num(run: Any, fallback: int) -> int:
    """The trial's number (its directory under the sweep's); its place in the list when untagged."""
    try:
        return int(run.data.tags.get(Tag.TRIAL_NUM, fallback))
    except ValueError:
        return fallback


def _simulated(run: Any) -> bool:
    """Whether the run's numbers come from the simulated engine (live or in virtual time): its plots
    must say so. Decided by the engine, not the GPU telemetry source: a live simulated trial with
    ``telemetry.gpu_hz=0`` has no GPU source at all, yet every number in it is simulated."""
    return simulated(run.data.tags.get(Tag.ENGINE, ""))


def _telemetry_plots(trial_dir: Path, label: str, source: str, simulated: bool,
                     params: dict[str, str]) -> list[Path]:
    """GPU power and utilisation over time, and per-stage running and queued requests, from the trial
    directory's Parquet files (drawn here, after the trial, so no GPU waits on matplotlib)."""
    import json

    import pandas as pd

    from analysis.plots import plot_gpu_timeline, plot_stage_queues
    from vocab.telemetry import engine_layout

    folder = trial_dir / "telemetry"
    windows_file = folder / "point_windows.json"
    windows = {k: tuple(v) for k, v in json.loads(windows_file.read_text()).items()} \
        if windows_file.exists() else {}
    layout = engine_layout(*(int(params.get(f"{k}.size", 1)) for k in ("tp", "pp", "dp")))
    out = []
    if (folder / "gpu.parquet").exists():
        path = plot_gpu_timeline(pd.read_parquet(folder / "gpu.parquet"), layout, windows, source, label,
                                 trial_dir / "plots" / "gpu_timeline.png")
        out += [path] if path else []
    if (folder / "stage_series.parquet").exists():
        origin = ("the simulated engine's log and /metrics, not measured" if simulated
                  else "the engine's log and /metrics")
        path = plot_stage_queues(pd.read_parquet(folder / "stage_series.parquet"), windows, origin, label,
                                 trial_dir / "plots" / "stage_queues.png")
        out += [path] if path else []
    return out


def _shutdown_ray() -> None:
    ray: Any = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
