"""``python -m orchestrator <command>``: parasweep's commands besides ``run.py``.

- ``calibrate``: fit the simulated engine's constants to a measured run or to operator tables
  (``orchestrator/calibrate.py``).
"""

from __future__ import annotations

import sys

COMMANDS = ("calibrate",)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m orchestrator {{{','.join(COMMANDS)}}} ...  (--help after a command for "
              "its options)", file=sys.stderr)
        return 2
    from orchestrator.calibrate import main as calibrate

    return calibrate(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
