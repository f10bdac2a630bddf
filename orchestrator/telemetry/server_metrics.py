"""Scrape the engine's Prometheus ``/metrics`` on a fixed period, appended to disk as they come.

Histogram buckets are skipped (their ``_sum`` and ``_count`` are kept): per-request latency already
comes from the client's records, and buckets would multiply the rows by ~20. So are the constant
``_created`` timestamps prometheus_client adds to counters and histograms, and the ``# HELP`` lines.

The scraper runs in the load generator's process, on a thread: parsing a scrape there (8 ms of pure
Python for the simulated engine's 340 lines, holding the interpreter's lock) would stall the load
generator's event loop as long, once a second, and every timestamp it takes with it. So the scraper
only drops those lines (a few string tests) and writes the text, one JSON line per scrape
(``{"ts": ..., "text": ...}``); :func:`read_samples` parses it afterwards into one row per sample.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from workloads import clock


def kept_lines(text: str) -> str:
    """The exposition without what :func:`parse_samples` drops anyway (bucket and ``_created`` samples)
    and without ``# HELP``: what a scrape keeps on disk. Parses to the same samples."""
    kept = []
    for line in text.splitlines():
        if line.startswith("# HELP"):
            continue
        if not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name.endswith(("_bucket", "_created")):
                continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def parse_samples(text: str, ts: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")):
                continue
            rows.append({"ts": ts, "name": sample.name, "labels": json.dumps(sample.labels, sort_keys=True),
                         "value": float(sample.value)})
    return rows


class MetricsScraper:
    """A background thread: GET /metrics every ``period_s``, append JSON lines to ``jsonl_path``."""

    def __init__(self, url: str, jsonl_path: Path, period_s: float = 1.0) -> None:
        self.url, self.jsonl_path, self.period_s = url, jsonl_path, period_s
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)

    def start(self) -> MetricsScraper:
        self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def scrape_once(self) -> None:
        ts = clock.now()  # the records' clock: the engine's seconds for a time-scaled simulated engine
        try:
            with urllib.request.urlopen(self.url, timeout=5) as resp:
                text = resp.read().decode("utf-8", "replace")
        except OSError:
            self.errors += 1
            return
        with self.jsonl_path.open("a") as f:
            f.write(json.dumps({"ts": ts, "text": kept_lines(text)}) + "\n")

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scrape_once()
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
            self.scrape_once()  # a final sample closes the last load point's window


def read_samples(jsonl_path: Path) -> pd.DataFrame | None:
    """The scraped samples as one frame (None when nothing was scraped)."""
    if not jsonl_path.exists() or jsonl_path.stat().st_size == 0:
        return None
    import orjson

    rows: list[dict[str, object]] = []
    with jsonl_path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            entry = orjson.loads(line)
            if "text" in entry:  # one scrape, as the scraper writes it
                rows += parse_samples(entry["text"], entry["ts"])
            else:  # one sample per line, as earlier releases wrote them
                rows.append(entry)
    return pd.DataFrame(rows, columns=["ts", "name", "labels", "value"])
