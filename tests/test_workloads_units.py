"""Load generator pieces that need no server: payloads, load points and their scheduling (on a fake
clock), length distributions, prompt files, records. (SSE parsing and token accounting: see
tests/test_workloads_hotpath.py.)"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import orjson
import pytest

from vocab.load import LengthDist
from workloads import (
    LoadPoint,
    RecordWriter,
    RequestRecord,
    RequestSpec,
    read_records,
    records_to_dataframe,
    scheduler,
)
from workloads.payloads import build_body, build_request

# ---------------------------------------------------------------------------------------------
# payloads


def test_generate_body_has_exact_random_ids_and_sampling_params() -> None:
    spec = RequestSpec(api="generate", input_len=37, output_len=9, seed=3, vocab_size=500)
    body, n_in, n_out = build_body(spec, 0)
    assert (n_in, n_out) == (37, 9)
    assert len(body["input_ids"]) == 37
    assert all(0 <= t < 500 for t in body["input_ids"])
    assert body["sampling_params"] == {"max_new_tokens": 9, "ignore_eos": True, "temperature": 0}
    assert body["stream"] is True
    assert "model" not in body


def test_requests_are_reproducible_per_seed_and_index() -> None:
    spec = RequestSpec(api="generate", input_len=64, seed=7)
    a = [build_request(spec, i).body for i in range(5)]
    b = [build_request(spec, i).body for i in range(5)]
    assert a == b
    assert len(set(a)) == 5  # requests differ from each other
    assert build_request(spec, 3).body == a[3]  # independent of what was generated before
    assert build_request(RequestSpec(api="generate", input_len=64, seed=8), 0).body != a[0]


def test_openai_bodies() -> None:
    comp, _, _ = build_body(RequestSpec(api="completions", input_len=10, output_len=4, model="m"), 1)
    assert isinstance(comp["prompt"], list) and len(comp["prompt"]) == 10
    assert comp["max_tokens"] == 4 and comp["ignore_eos"] is True and comp["stream"] is True
    assert comp["stream_options"] == {"include_usage": True}
    assert comp["model"] == "m"
    chat, _, _ = build_body(RequestSpec(api="chat", input_len=50, output_len=4, continuous_usage=True), 1)
    assert chat["max_completion_tokens"] == 4 and chat["ignore_eos"] is True
    assert len(chat["messages"][0]["content"].split()) == 50
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "model" not in chat


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        RequestSpec(api="embeddings")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RequestSpec(input_len=0)


# ---------------------------------------------------------------------------------------------
# load points


def test_labels_and_validation() -> None:
    assert LoadPoint(num_requests=1, concurrency=8).label == "c8"
    assert LoadPoint(num_requests=1, rate=2.5).label == "r2.5"
    assert LoadPoint(num_requests=1, rate=200).label == "r200"
    assert LoadPoint(num_requests=1, rate=200.0).label == "r200"
    for bad in (
        {"concurrency": 1, "rate": 1.0},
        {},
        {"concurrency": 0},
        {"rate": -1.0},
        {"rate": math.inf},
        {"rate": 1.0, "arrival": "burst"},
    ):
        with pytest.raises(ValueError):
            LoadPoint(num_requests=1, **bad)  # type: ignore[arg-type]


def test_send_offsets_are_absolute_and_reproducible() -> None:
    const = LoadPoint(num_requests=8, rate=4.0, arrival="constant", warmup_requests=2).send_offsets()
    assert const.tolist() == [i / 4.0 for i in range(10)]
    p1 = LoadPoint(num_requests=2000, rate=50.0, seed=1).send_offsets()
    p2 = LoadPoint(num_requests=2000, rate=50.0, seed=1).send_offsets()
    assert np.array_equal(p1, p2) and p1[0] == 0.0 and np.all(np.diff(p1) >= 0)
    assert 1999 / p1[-1] == pytest.approx(50.0, rel=0.08)


def test_open_loop_duration_schedule_is_fixed_up_front() -> None:
    p = LoadPoint(rate=100.0, arrival="poisson", duration_s=2.0, warmup_requests=5, seed=9)
    offs = p.send_offsets()
    assert offs[-1] - offs[5] < 2.0 and len(offs) == p.total_requests
    assert abs(p.measured_requests - 200) < 60  # type: ignore[operator]
    again = LoadPoint(rate=100.0, arrival="poisson", duration_s=2.0, warmup_requests=5, seed=9).send_offsets()
    assert np.array_equal(offs, again)
    # The same seed gives the same arrivals whether the point is bounded by count or duration.
    counted = LoadPoint(rate=100.0, arrival="poisson", num_requests=50, warmup_requests=5, seed=9)
    assert np.allclose(counted.send_offsets(), offs[:55])


class _FakeTime:
    """A perf_counter that only moves when a request says so (the scheduler's only clock)."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def test_closed_loop_duration_stops_new_sends_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeTime()
    monkeypatch.setattr(scheduler, "time", fake)
    sent: list[tuple[int, float]] = []

    async def send(i: int, scheduled: float | None) -> None:
        sent.append((i, fake.now))
        await asyncio.sleep(0)
        fake.now += 0.25  # every request takes 250 ms of the fake clock

    point = LoadPoint(concurrency=2, duration_s=1.0, warmup_requests=2)
    asyncio.run(scheduler.drive(point, send))
    measured = [t for i, t in sent if i >= 2]
    first = measured[0]
    # The first measured send opens the window; nothing is sent at or after its end.
    assert all(t < first + 1.0 for t in measured) and len(measured) >= 2
    assert [i for i, _ in sent] == list(range(len(sent)))  # one shared counter, no index skipped
    capped = []

    async def count(i: int, scheduled: float | None) -> None:
        capped.append(i)
        await asyncio.sleep(0)

    asyncio.run(scheduler.drive(LoadPoint(concurrency=3, duration_s=30.0, num_requests=6), count))
    assert sorted(capped) == list(range(6))  # the count ends the point before the duration


def test_shards_split_indices_and_concurrency() -> None:
    assert [scheduler.shard_share(10, k, 3) for k in range(3)] == [4, 3, 3]
    seen: list[list[int]] = [[], []]

    for k in range(2):

        async def send(i: int, scheduled: float | None, k: int = k) -> None:
            seen[k].append(i)

        asyncio.run(
            scheduler.drive(
                LoadPoint(num_requests=9, concurrency=3, warmup_requests=1), send, shard=k, shards=2
            )
        )
    assert sorted(seen[0]) == [0, 2, 4, 6, 8] and sorted(seen[1]) == [1, 3, 5, 7, 9]


# ---------------------------------------------------------------------------------------------
# request lengths and prompt files


def test_length_distributions_are_seeded_and_centred() -> None:
    for text in ("uniform:0.5", "normal:0.2", "exponential", "lognormal:0.5"):
        spec = RequestSpec(input_len=200, output_len=50, input_dist=text, output_dist=text, seed=4)
        lens = [build_body(spec, i)[1] for i in range(2000)]
        assert lens == [build_body(spec, i)[1] for i in range(2000)]  # reproducible
        assert min(lens) >= 1 and len(set(lens)) > 10
        assert abs(np.mean(lens) / 200 - 1) < 0.08, text
    uni = [LengthDist.parse("uniform:0.5", 100).sample(np.random.default_rng(i)) for i in range(500)]
    assert min(uni) >= 50 and max(uni) <= 150
    body, n_in, n_out = build_body(
        RequestSpec(input_len=64, input_dist="uniform:0.5", output_dist="exponential"), 7
    )
    assert len(body["input_ids"]) == n_in and body["sampling_params"]["max_new_tokens"] == n_out
    for bad in ("uniform", "uniform:2", "pareto:1", "fixed:3"):
        with pytest.raises(ValueError):
            RequestSpec(input_dist=bad)


def test_prompt_file_bodies(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": "one two three", "output_len": 3},
        {"messages": [{"role": "user", "content": "hello there"}]},
        {"text": "four five six seven"},
    ]
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    spec = RequestSpec(api="chat", output_len=5, prompt_file=str(path))
    bodies = [build_body(spec, i) for i in range(4)]
    assert bodies[0][0]["messages"] == [{"role": "user", "content": "one two three"}] and bodies[0][2] == 3
    assert bodies[1][0]["messages"] == rows[1]["messages"] and bodies[1][2] == 5
    assert bodies[3][0] == bodies[0][0]  # wraps around
    gen = build_body(RequestSpec(api="generate", prompt_file=str(path)), 2)[0]
    assert gen["text"] == "four five six seven"
    shuffled = RequestSpec(api="completions", prompt_file=str(path), shuffle_prompts=True, seed=1)
    first_pass = sorted(build_body(shuffled, i)[0]["prompt"] for i in range(3))
    assert first_pass == sorted(["one two three", "hello there", "four five six seven"])
    (tmp_path / "ids.jsonl").write_text('{"input_ids": [1, 2, 3]}\n')
    with pytest.raises(ValueError, match="chat"):
        RequestSpec(api="chat", prompt_file=str(tmp_path / "ids.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"nothing": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        RequestSpec(prompt_file=str(tmp_path / "bad.jsonl"))


# ---------------------------------------------------------------------------------------------
# records


def _records() -> list[RequestRecord]:
    ok = RequestRecord(
        "c2",
        1,
        send_time=1024.0,
        first_token_time=1024.125,
        end_time=1025.0,
        chunk_times=[1024.125, 1024.375, 1024.75, 1024.875],
        chunk_tokens=[2, 1, 3, 0],
        input_tokens=10,
        output_tokens=6,
        finish_reason="length",
        http_status=200,
    )
    failed = RequestRecord(
        "c2", 2, warmup=True, send_time=1024.25, end_time=1024.5, error="HTTP 500: x", error_kind="http_5xx"
    )
    return [ok, failed]


def test_records_jsonl_roundtrip_torn_line_and_dataframe(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "records.jsonl"
    with RecordWriter(path) as w:
        for r in _records():
            w.write(r)
    with path.open("ab") as fh:
        fh.write(b'{"point": "c2", "ind')  # a write torn by a crash
    back = list(read_records(path))
    assert back == _records()
    df = records_to_dataframe(back)
    assert len(df) == 2 and df.loc[0, "chunk_tokens"] == [2, 1, 3, 0] and bool(df.loc[1, "warmup"])
    df.to_parquet(tmp_path / "records.parquet")
