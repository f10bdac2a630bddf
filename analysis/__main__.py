"""``python -m analysis <command>``: reading results back from the MLflow store.

- ``report [RUN_ID]``: one self-contained HTML file for a sweep or a trial (``analysis/report_html.py``);
- ``compare``: trials of several sweeps side by side, Pareto fronts, the best under SLOs
  (``analysis/compare/``).
"""

from __future__ import annotations

import sys

COMMANDS = ("report", "compare")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m analysis {{{','.join(COMMANDS)}}} ...  (--help after a command for its "
              "options)", file=sys.stderr)
        return 2
    if argv[0] == "report":
        from analysis.report_html import main as report

        return report(argv[1:])
    from analysis.compare import main as compare

    return compare(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
