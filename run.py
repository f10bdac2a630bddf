"""parasweep entry point.

    python run.py                                   one trial with the default configuration
    python run.py -m pp.async_depth=0,4,8,16        a sweep: one trial per value, scheduled on Ray
    python run.py dry_run=true -m pp.async_depth=0,8   print each trial's server argv, launch nothing
    python run.py search=llama-70b-h100             search layouts and knobs in prediction
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from orchestrator.cli import finish, one_line_error, preflight_overrides, wrap_group_lines
from orchestrator.config.schema import register_configs
from orchestrator.errors import UserError
from orchestrator.reproduce import expand_reproduce

register_configs()
USER_ERRORS: list[UserError] = []


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def trial(cfg: DictConfig) -> dict[str, Any] | None:
    from orchestrator.search.job import run_search_job
    from orchestrator.trial.hydra_job import run_trial

    try:
        if cfg.search.name:  # search=<name>: candidates judged in prediction, no trial of its own
            return run_search_job(cfg)
        return run_trial(cfg)
    except UserError as exc:  # re-raised by main(): Hydra would print its own "Error executing job"
        USER_ERRORS.append(exc)
        return None


def _terminate(_signum: int, frame: Any) -> None:
    """SIGTERM does what Ctrl-C does. Hand it to SIGINT's current handler: while the load generator's
    event loop runs, that handler cancels the loop's main task cleanly, where an exception raised here
    could land inside a transport callback and be logged and swallowed by the loop."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not _terminate:
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def repeated(args: list[str]) -> bool:
    """Whether the command line asks for more than one repeat of each trial (``repeats=N``, N > 1)."""
    for arg in args:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "repeats" and value.strip().isdigit() and int(value) > 1:
            return True
    return False


def main() -> int:
    # let configuration errors reach us as exceptions, so each becomes one readable line
    os.environ["HYDRA_FULL_ERROR"] = "1"
    # A shell without job control (a batch script's `cmd &`) starts background commands with SIGINT
    # ignored, and Python keeps an inherited SIG_IGN: `kill -INT` to the driver would then do nothing,
    # and Ray's processes and the engines, started from here, would inherit the ignore. Ctrl-C's
    # handler, whatever we inherited (docs/platform-notes.md, Ray: Signals).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)  # SIGTERM stops trials exactly like Ctrl-C
    code = 0
    try:
        sys.argv[1:] = expand_reproduce(sys.argv[1:])  # reproduce=<RUN_ID> -> that run's overrides
        # Hydra's argparse rejects overrides on both sides of -m; users write them either way
        flags = [a for a in sys.argv[1:] if a in ("-m", "--multirun")]
        if not flags and repeated(sys.argv[1:]):
            flags = ["-m"]  # repeats=N runs N trials: a sweep, even of one configuration
        sys.argv[1:] = flags + [a for a in sys.argv[1:] if a not in ("-m", "--multirun")]
        preflight_overrides(sys.argv[1:])
        if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
            help_text = io.StringIO()
            with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
                trial()  # Hydra prints the help and exits
            print(wrap_group_lines(help_text.getvalue()), end="")
            return 0
        trial()
        if USER_ERRORS:
            raise USER_ERRORS[0]
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:
        message, code = one_line_error(exc)
        print(f"parasweep: {message}", file=sys.stderr)
    code = finish(code)
    if code == 130:  # after finish(): by now every trial that ran is stopped and closed
        print("parasweep: interrupted; running trials were stopped and marked killed, queued ones "
              "never started", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
