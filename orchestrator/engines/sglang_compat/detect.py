"""Which SGLang the engine interpreter has, and which flags it accepts (cached per version).

Everything runs in ``engine.python`` as a subprocess: parasweep's own interpreter need not have SGLang,
and importing SGLang here would pull torch into the orchestrator.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.engines.sglang_compat.versions import (
    NEWEST_KNOWN,
    OLDEST_SUPPORTED,
    FlagSet,
    recorded_flag_set,
    supported,
)
from orchestrator.errors import ConfigError, UserError

PROBE_TIMEOUT_S = 180.0  # importing sglang (and torch) on a cold node file system can take a while
# the cached flag set's format: 2 keeps whether a value follows per option string; a file without it
# kept that per dest, wrong where the options of one dest differ, and is probed again
CACHE_FORMAT = 3  # 3: each option's choices
_MARK = "PARASWEEP_FLAGS "  # SGLang may print warnings on stdout; our line is the marked one
_VERSION_CODE = "import sglang; print(sglang.__version__)"
# The parser is built exactly as SGLang builds it (present from 0.4.x to 0.5.23; see
# docs/sglang-adapter.md, "Flag sets and renames").
_FLAGS_CODE = (
    "import argparse, json\n"
    "from sglang.srt.server_args import ServerArgs\n"
    "p = argparse.ArgumentParser()\n"
    "ServerArgs.add_cli_args(p)\n"
    "print(" + repr(_MARK) + " + json.dumps([[a.option_strings, a.dest, a.nargs != 0,"
    " [c for c in a.choices] if isinstance(a.choices, (list, tuple)) else None]"
    " for a in p._actions if a.option_strings], default=str))\n"
)


@dataclass(frozen=True)
class SGLangTarget:
    """The SGLang a trial's command line is built for and checked against."""

    version: str
    flags: FlagSet
    installed: bool  # False: SGLang is absent and the newest recorded flag set stands in
    python: str

    def describe(self) -> str:
        if self.installed:
            return f"sglang {self.version} ({self.python}); flags checked against its parser"
        return (f"sglang: not installed for {self.python}; argv built for SGLang {self.version} "
                f"and checked against its recorded flag set")


def cache_dir() -> Path:
    """``$PARASWEEP_CACHE_DIR``, else ``$XDG_CACHE_HOME/parasweep``, else ``~/.cache/parasweep``."""
    if os.environ.get("PARASWEEP_CACHE_DIR"):
        return Path(os.environ["PARASWEEP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "parasweep"


def _run(python: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    if shutil.which(python) is None and not Path(python).is_file():
        raise ConfigError("engine.python", python, "a Python interpreter that has SGLang installed",
                          "no such executable")
    try:
        return subprocess.run([python, *args], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise UserError(f"engine.python={python}: `{' '.join(args)}` did not finish within "
                        f"{PROBE_TIMEOUT_S:g} s") from exc
    except OSError as exc:
        raise ConfigError("engine.python", python, "a Python interpreter that has SGLang installed",
                          str(exc)) from exc


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def installed_version(python: str) -> str | None:
    """SGLang's ``__version__`` in that interpreter; None where SGLang is not installed there."""
    out = _run(python, ["-c", _VERSION_CODE])
    if out.returncode != 0:
        if "No module named 'sglang'" in out.stderr:
            return None
        # installed but broken (a missing CUDA library, a torch mismatch): launching would fail too
        raise UserError(f"engine.python={python}: `import sglang` failed: {_last_line(out.stderr)}")
    return _last_line(out.stdout)


def flags_from_help(text: str, version: str, source: str = "") -> FlagSet:
    """Option strings from argparse ``--help`` output (the fallback where the parser cannot be built).

    Each option line of argparse's help starts with two spaces and a dash; the invocation part ends
    at the first run of two spaces. Help-suppressed options are absent, which errs on the strict side."""
    options: dict[str, str] = {}
    takes: dict[str, bool] = {}
    in_options = False
    for line in text.splitlines():
        if re.match(r"^(options|optional arguments|[\w -]+):\s*$", line):
            in_options = True  # section headers: argparse groups list their options below them
            continue
        if not in_options or not re.match(r"^  -", line):
            continue
        invocation = re.split(r"\s{2,}", line.strip())[0]
        parts = re.split(r", (?=-)", invocation)
        names = [p.split(" ")[0] for p in parts]
        dest = max(names, key=len).lstrip("-").replace("-", "_")  # best guess; help shows no dest
        for part, name in zip(parts, names, strict=True):
            options[name] = dest
            takes[name] = " " in part  # a metavar or choices follow the flag
    return FlagSet(version, options, takes, source or f"`--help` of SGLang {version}")


def _probe_flags(python: str, version: str) -> FlagSet:
    out = _run(python, ["-c", _FLAGS_CODE])
    marked = [ln for ln in out.stdout.splitlines() if ln.startswith(_MARK)]
    if out.returncode == 0 and marked:
        actions = json.loads(marked[-1][len(_MARK):])
        options = {opt: dest for opts, dest, *_ in actions for opt in opts}
        takes = {opt: bool(t) for opts, _, t, *_ in actions for opt in opts}
        choices = {opt: list(c) for opts, _, _, *rest in actions for opt in opts for c in rest[:1] if c}
        return FlagSet(version, options, takes, f"parser of SGLang {version} ({python})", choices)
    # the parser moved in this version: its --help output still lists every visible option
    help_out = _run(python, ["-m", "sglang.launch_server", "--help"])
    if help_out.returncode != 0:
        raise UserError(f"engine.python={python}: could not read SGLang {version}'s flags: "
                        f"{_last_line(help_out.stderr or out.stderr)}")
    return flags_from_help(help_out.stdout, version, f"`--help` of SGLang {version} ({python})")


def flag_set(python: str, version: str) -> FlagSet:
    """The flags SGLang ``version`` accepts, from the cache or from ``python``'s installed SGLang."""
    safe = re.sub(r"[^\w.+-]", "_", version)  # a version string from the install becomes a file name
    path = cache_dir() / f"sglang-flags-{safe}.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("cache_format") == CACHE_FORMAT:
            return FlagSet.from_json(cached, source=f"cached flag set ({path})")
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    flags = _probe_flags(python, version)
    try:  # atomic: trials starting side by side may write the same file
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
            json.dump({**flags.to_json(), "cache_format": CACHE_FORMAT}, tmp)
        os.replace(tmp.name, path)
    except OSError:
        pass  # a read-only home only costs the probe next time
    return flags


_TARGETS: dict[str, SGLangTarget] = {}


def resolve_target(python: str) -> SGLangTarget:
    """The SGLang installed for ``python`` (probed once per process), or the newest recorded version."""
    if python not in _TARGETS:
        version = installed_version(python)
        if version is None:
            _TARGETS[python] = SGLangTarget(NEWEST_KNOWN, recorded_flag_set(NEWEST_KNOWN), False, python)
        elif not supported(version):
            raise UserError(f"engine.python={python} has SGLang {version}; parasweep launches SGLang "
                            f"{OLDEST_SUPPORTED} to {NEWEST_KNOWN} (older releases serve no /server_info "
                            f"and label metrics without pipeline stages): install sglang>={OLDEST_SUPPORTED}")
        else:
            _TARGETS[python] = SGLangTarget(version, flag_set(python, version), True, python)
    return _TARGETS[python]
