"""Where the test suite's time goes, per test file, from pytest's JUnit XML (``--junitxml``).

    python scripts/test_durations.py AFTER.xml [--before BEFORE.xml] [--top N]

Prints a Markdown table: each file's test count and summed test time (setup + call + teardown, as
pytest reports them), and with ``--before`` the same for an earlier run beside it. Under pytest-xdist
the summed times are each worker's wall time for its tests, so they add up to more than the run's wall
time: compare the whole run's wall time (``time make test``) for the speed-up, and this table for
where the time is spent.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def per_file(junit: Path) -> tuple[Counter[str], Counter[str]]:
    """(seconds, tests) per test file."""
    seconds: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for case in ET.parse(junit).iter("testcase"):
        name = case.get("classname", "").split(".")[-1] + ".py"
        seconds[name] += float(case.get("time") or 0.0)
        count[name] += 1
    return seconds, count


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("after", type=Path)
    parser.add_argument("--before", type=Path)
    parser.add_argument("--top", type=int, default=25, help="files shown, longest first (default 25)")
    args = parser.parse_args(argv)
    after, n_after = per_file(args.after)
    before, n_before = per_file(args.before) if args.before else (Counter(), Counter())
    files = sorted(set(after) | set(before), key=lambda f: -max(after[f], before[f]))
    if args.before:
        print("| file | tests before | s before | tests after | s after |")
        print("|---|---:|---:|---:|---:|")
    else:
        print("| file | tests | s |")
        print("|---|---:|---:|")
    for f in files[: args.top]:
        row = [f"`{f}`"] + ([str(n_before[f]), f"{before[f]:.1f}"] if args.before else [])
        print("| " + " | ".join([*row, str(n_after[f]), f"{after[f]:.1f}"]) + " |")
    rest = files[args.top:]
    if rest:
        row = [f"{len(rest)} other files"] + ([str(sum(n_before[f] for f in rest)),
                                               f"{sum(before[f] for f in rest):.1f}"] if args.before else [])
        print("| " + " | ".join([*row, str(sum(n_after[f] for f in rest)),
                                 f"{sum(after[f] for f in rest):.1f}"]) + " |")
    total = ["**all**"]
    if args.before:
        total += [str(sum(n_before.values())), f"{sum(before.values()):.1f}"]
    print("| " + " | ".join([*total, str(sum(n_after.values())), f"{sum(after.values()):.1f}"]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
