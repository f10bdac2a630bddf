"""vLLM-format log lines: ``(APIServer pid=N) INFO MM-DD HH:MM:SS [file.py:line] message``, the format
vLLM's logger configures (``vllm/logger.py``: level, ``%m-%d %H:%M:%S``, the source file and line) with
the process prefix its output wrapper adds (``decorate_logs``). The stamp is the engine's own clock."""

from __future__ import annotations

import os
import time
from typing import TextIO

from simulator.logs import LogWriter

_LEVEL_NAMES = {
    "debug": "DEBUG",
    "info": "INFO",
    "warning": "WARNING",
    "error": "ERROR",
    "critical": "CRITICAL",
}
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class VLLMLogWriter(LogWriter):
    """A ``LogWriter`` whose lines are vLLM's (every part of the simulator that logs, faults included,
    writes through it). ``tag`` carries the source location (``loggers.py:259``) where vLLM's would."""

    def __init__(self, level: str = "info", stream: TextIO | None = None, process: str = "APIServer") -> None:
        super().__init__(level, stream)
        self.prefix = f"({process} pid={os.getpid()}) "

    def log(self, msg: str, tag: str = "", level: str = "info") -> None:
        if _LEVELS[level] < self.level:
            return
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(self.wall()))
        where = tag.strip() or "api_server.py:1"
        self.stream.write(f"{self.prefix}{_LEVEL_NAMES[level]} {stamp} [{where}] {msg}\n")
        self.stream.flush()

    def lines(self, msgs: list[tuple[str, str]], level: str = "info") -> None:
        for tag, msg in msgs:
            self.log(msg, tag, level)
