"""Exec a command that dies with its parent: ``python -m orchestrator.process.deathsig -- argv...``.

The engine runs in its own process group (so the trial can kill the whole tree), which also takes it
out of reach of Ray's own child cleanup. If the trial's worker process dies without running its
``finally`` (OOM kill, force-cancel), PR_SET_PDEATHSIG still sends the engine SIGTERM. Done in a tiny
exec wrapper because ``preexec_fn`` is unsafe in a threaded parent such as a Ray worker.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        sys.exit("usage: python -m orchestrator.process.deathsig -- COMMAND [ARGS...]")
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() == 1:  # the parent died before prctl took effect
            sys.exit(1)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
