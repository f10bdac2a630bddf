"""``python -m orchestrator <command>``: parasweep's commands besides ``run.py``.

- ``calibrate``: fit the simulated engine's constants to a measured run or to operator tables
  (``orchestrator/calibrate.py``).
- ``fidelity``: every published measurement replayed on the simulated engine the way it was measured,
  predicted against measured (``orchestrator/fidelity/``; docs/fidelity.md).
- ``sync``: replay the tracking writes spooled while the MLflow server was unreachable
  (``orchestrator/store/sync.py``; docs/mlflow-layout.md, "When the tracking server goes away").
"""

from __future__ import annotations

import sys

COMMANDS = ("calibrate", "fidelity", "sync")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m orchestrator {{{','.join(COMMANDS)}}} ...  (--help after a command for "
              "its options)", file=sys.stderr)
        return 2
    if argv[0] == "sync":
        from orchestrator.store.sync import main as sync

        return sync(argv[1:])
    if argv[0] == "fidelity":
        from orchestrator.fidelity.cli import main as fidelity

        return fidelity(argv[1:])
    from orchestrator.calibrate import main as calibrate

    return calibrate(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
