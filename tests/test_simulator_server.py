"""The simulated engine as a real server process: flags, endpoints, metrics, logs and PP behaviour.

Every server is started with ``python -m simulator`` on a free loopback port (its own process group,
killed in a finalizer). Behavioural checks read the model's own clock (``meta_info.sim_*``, simulated
seconds in ``/metrics``), so they do not depend on how loaded the machine is; nothing asserts on the
wall clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from simulator.costs import decode_shape
from simulator.predict import load_config

pytestmark = pytest.mark.slow  # every test here starts server processes

REPO = Path(__file__).resolve().parent.parent
KIMI = str(REPO / "models" / "kimi-k2")
TINY = str(REPO / "models" / "tiny-test")
PCIE = "rtx-pro-6000-pcie-x8"
READY_LINE = "The server is fired up and ready to roll!"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args: list[str], tmp: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"sim-{self.port}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115  (closed in stop())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simulator", *args, "--port", str(self.port)],
            cwd=tmp,  # cwd anywhere: the package is installed
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30  # a timeout for a broken server, not a measurement
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"simulator exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.02)
        else:
            raise RuntimeError(f"simulator not ready:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path: str, body: dict) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def sse(self, path: str, body: dict) -> list[dict | str]:
        status, raw = self.post(path, body)
        assert status == 200, raw
        events: list[dict | str] = []
        for block in raw.decode().split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        return events

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sim")


def _start(request: pytest.FixtureRequest, tmp: Path, args: list[str]) -> Server:
    holder: list[Server] = []

    def fin() -> None:
        for s in holder:
            s.stop()

    request.addfinalizer(fin)
    srv = Server(args, tmp)
    holder.append(srv)
    return srv


PP8 = ["--model-path", KIMI, "--pp-size", "8", "--sim-hardware", PCIE, "--enable-metrics",
       "--random-seed", "7", "--decode-log-interval", "8"]


@pytest.fixture(scope="module")
def kimi_pp8(request: pytest.FixtureRequest, tmp_module: Path) -> Server:
    return _start(request, tmp_module, [*PP8, "--sim-time-scale", "20"])


@pytest.fixture(scope="module")
def kimi_pp8_mb1(request: pytest.FixtureRequest, tmp_module: Path) -> Server:
    return _start(request, tmp_module, [*PP8, "--sim-time-scale", "20", "--pp-max-micro-batch-size", "1"])


@pytest.fixture(scope="module")
def tiny(request: pytest.FixtureRequest, tmp_module: Path) -> Server:
    return _start(request, tmp_module, ["--model-path", TINY, "--sim-hardware", "h100-sxm-x8",
                                        "--enable-metrics",
                                        "--random-seed", "1", "--decode-log-interval", "4"])


# -- command line ---------------------------------------------------------------------------------------


def _run_cli(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulator", *args], cwd=tmp,
                          capture_output=True, text=True, timeout=30)


def test_unknown_flag_is_an_argparse_error(tmp_path: Path) -> None:
    r = _run_cli(["--model-path", TINY, "--sim-hardware", PCIE, "--no-such-flag", "1"], tmp_path)
    assert r.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in r.stderr


def test_abbreviated_flag_is_rejected(tmp_path: Path) -> None:
    r = _run_cli(["--model-path", TINY, "--sim-hardware", PCIE, "--tp", "2"], tmp_path)
    assert r.returncode == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model-path", KIMI, "--tp-size", "8", "--ep-size", "3"], "ep_size (3) must divide tp_size (8)"),
        (["--model-path", TINY, "--pp-size", "8"], "pp_size (8) must be <= num_hidden_layers (4)"),
        (["--model-path", TINY, "--tp-size", "4", "--pp-size", "4"], "exceeds the 8 GPUs"),
        (["--model-path", KIMI, "--tp-size", "4"], "Not enough memory"),
        (["--model-path", TINY, "--sim-hardware", "no-such-box"], "unknown hardware profile"),
    ],
)
def test_invalid_configs_fail_with_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    if "--sim-hardware" not in args:
        args = [*args, "--sim-hardware", PCIE]
    r = _run_cli(args, tmp_path)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


# -- resolved configuration -----------------------------------------------------------------------------


def test_server_info_resolves_sglang_auto_defaults(kimi_pp8: Server) -> None:
    status, raw = kimi_pp8.get("/server_info")
    assert status == 200
    info = json.loads(raw)
    assert info["pp_size"] == 8 and info["tp_size"] == 1 and info["pp_async_batch_depth"] == 0
    cap_tokens, ctx = info["max_total_num_tokens"], info["context_len"]
    assert ctx == 262144
    # The PP8 KV pool (about 727K tokens) is under 4 contexts, so SGLang's estimate pool / context * 512
    # is below its floor of 2048 (and 2048 is under half the pool); the per-slot cap is 2048 // 8.
    assert 4096 < cap_tokens < 4 * ctx
    assert info["max_running_requests"] == 2048
    state = info["internal_states"][0]
    # SGLang 0.5.23's places: the unset input null at the top level, the scheduler's value in its state
    assert info["pp_max_micro_batch_size"] is None and state["pp_max_micro_batch_size"] == 256
    assert state["effective_max_running_requests_per_dp"] == 2048
    assert state["memory_usage"]["token_capacity"] == cap_tokens
    assert set(state["memory_usage"]) == {"weight", "kvcache", "token_capacity", "graph"}
    assert info["chunked_prefill_size"] == 8192  # 96 GB card: the < 160 GB tier
    assert info["disable_overlap_schedule"] is True  # forced by pp > 1
    assert info["version"] == "0.5.23" and info["engine"] == "parasweep-sim" and info["sim_version"]
    assert info["sim_hardware"] == PCIE
    assert info["sim_stage_layers"] == [7, 7, 7, 8, 8, 8, 8, 8]  # remainder to the last stages


def test_explicit_micro_batch_size_is_honoured(kimi_pp8_mb1: Server) -> None:
    info = json.loads(kimi_pp8_mb1.get("/server_info")[1])
    assert info["pp_max_micro_batch_size"] == 1


def test_model_info_and_models(tiny: Server) -> None:
    mi = json.loads(tiny.get("/model_info")[1])
    assert mi["architectures"] == ["Qwen3MoeForCausalLM"] and mi["is_generation"] is True
    models = json.loads(tiny.get("/v1/models")[1])
    assert models["data"][0]["id"] == TINY and models["data"][0]["max_model_len"] == 4096


# -- generation APIs ------------------------------------------------------------------------------------


def test_generate_stream_is_cumulative(tiny: Server) -> None:
    events = tiny.sse("/generate", {"text": "hello " * 40, "stream": True,
                                    "sampling_params": {"max_new_tokens": 17, "ignore_eos": True}})
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 17
    last = chunks[-1]
    assert len(last["output_ids"]) == 17
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 17}
    assert last["meta_info"]["prompt_tokens"] == 60  # 240 characters / 4
    for c in chunks:
        assert len(c["output_ids"]) == c["meta_info"]["completion_tokens"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_generate_non_stream_and_batch(tiny: Server) -> None:
    status, raw = tiny.post("/generate", {"input_ids": [[1, 2, 3], [4, 5]],
                                          "sampling_params": {"max_new_tokens": 5}})
    assert status == 200
    out = json.loads(raw)
    assert [len(o["output_ids"]) for o in out] == [5, 5]
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [3, 2]


def test_too_long_request_is_rejected(tiny: Server) -> None:
    status, raw = tiny.post("/generate", {"input_ids": [1] * 100,
                                          "sampling_params": {"max_new_tokens": 5000}})
    assert status == 400
    assert "maximum context length of 4096" in json.loads(raw)["error"]["message"]
    status, raw = tiny.post("/v1/completions", {"prompt": [1] * 10, "max_tokens": 9999})
    assert status == 400 and json.loads(raw)["object"] == "error"


def test_completions_stream_with_usage(tiny: Server) -> None:
    events = tiny.sse("/v1/completions", {"model": "m", "prompt": [5] * 32, "max_tokens": 9, "stream": True,
                                          "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 32
    assert usage["usage"]["completion_tokens"] == 9 and usage["usage"]["total_tokens"] == 41
    content = events[:-2]
    assert all(e["object"] == "text_completion" for e in content)
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(e["choices"][0]["text"] for e in content).count(" ") == 9  # one word per token


def test_chat_stream_with_usage(tiny: Server) -> None:
    events = tiny.sse("/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "x" * 40}], "max_completion_tokens": 6,
        "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    first, usage = events[0], events[-2]
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert usage["usage"]["prompt_tokens"] == 3 + 4 + 10
    finals = [e for e in events[1:-2] if e["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])


def test_chat_non_stream(tiny: Server) -> None:
    status, raw = tiny.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 4})
    body = json.loads(raw)
    assert status == 200 and body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] == 4 and body["choices"][0]["finish_reason"] == "length"


# -- metrics and logs -----------------------------------------------------------------------------------


def _samples(text: str, name: str) -> list[tuple[dict, float]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[line.index("{"):line.rindex("}")]))
            out.append((labels, float(line.rsplit(" ", 1)[1])))
    return out


def test_metrics_have_one_series_set_per_pp_rank(kimi_pp8: Server) -> None:
    kimi_pp8.post("/generate", {"input_ids": [1] * 50, "sampling_params": {"max_new_tokens": 20}})
    status, raw = kimi_pp8.get("/metrics")
    assert status == 200
    text = raw.decode()
    running = _samples(text, "sglang:num_running_reqs")
    assert sorted(int(lab["pp_rank"]) for lab, _ in running) == list(range(8))
    for lab, _ in running:
        assert lab["engine_type"] == "unified" and lab["tp_rank"] == "0" and lab["moe_ep_rank"] == "0"
        assert lab["model_name"] == KIMI
    for name in ("sglang:num_queue_reqs", "sglang:gen_throughput", "sglang:token_usage",
                 "sglang:num_used_tokens", "sglang:max_total_num_tokens"):
        assert len(_samples(text, name)) == 8, name
    modes = {lab["mode"] for lab, _ in _samples(text, "sglang:realtime_tokens_total")}
    assert modes == {"prefill_compute", "prefill_cache", "decode"}
    for name in ("sglang:time_to_first_token_seconds_count", "sglang:inter_token_latency_seconds_count",
                 "sglang:e2e_request_latency_seconds_count", "sglang:prompt_tokens_total",
                 "sglang:generation_tokens_total", "sglang:num_requests_total"):
        assert sum(v for _, v in _samples(text, name)) > 0, name
    busy = _samples(text, "parasweep_sim:stage_busy_seconds_total")
    assert sorted(int(lab["pp_rank"]) for lab, _ in busy) == list(range(8))
    assert all(v > 0 for _, v in busy)
    power = _samples(text, "parasweep_sim:gpu_power_watts")
    assert len(power) == 8 and all(40.0 <= v <= 600.0 for _, v in power)
    assert "parasweep_sim:microbatches_in_flight" in text


LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)((?: (?:DP|PP|TP|EP)\d+)*)\] (.*)$")


def test_log_lines_parse(kimi_pp8: Server) -> None:
    kimi_pp8.post("/generate", {"input_ids": [[1] * 30] * 4, "sampling_params": {"max_new_tokens": 40}})
    lines = [LINE.match(x) for x in kimi_pp8.log().splitlines() if x.strip()]
    assert all(lines), "every stdout line has the SGLang prefix"
    msgs = [(m.group(2).strip(), m.group(3)) for m in lines]
    assert ("", READY_LINE) in msgs
    limits = [(tag, msg) for tag, msg in msgs if msg.startswith("max_total_num_tokens=")]
    assert sorted(tag for tag, _ in limits) == [f"PP{k}" for k in range(8)]
    fields = dict(kv.split("=") for kv in limits[0][1].split(", "))
    assert int(fields["max_running_requests"]) == json.loads(kimi_pp8.get("/server_info")[1])[
        "max_running_requests"]
    assert fields["available_gpu_mem"].endswith(" GB")
    decode = [(tag, msg) for tag, msg in msgs if msg.startswith("Decode batch, ")]
    assert decode and {tag for tag, _ in decode} == {f"PP{k}" for k in range(8)}
    kv = dict(p.split(": ", 1) for p in decode[-1][1][len("Decode batch, "):].split(", "))
    assert set(kv) == {"#running-req", "#token", "token usage", "cuda graph", "gen throughput (token/s)",
                       "#queue-req"}
    assert any(msg.startswith("Prefill batch, #new-seq: ") for _, msg in msgs)


def test_ready_line_and_sigterm_exits_zero(tmp_path: Path) -> None:
    srv = Server(["--model-path", TINY, "--sim-hardware", "h200-nvlink-x8"], tmp_path)
    try:
        assert READY_LINE in srv.log()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=10) == 0
    finally:
        srv.stop()


# -- the PP model's behaviour ---------------------------------------------------------------------------


def _batch_run(srv: Server, n: int, prompt: int, out: int) -> list[dict]:
    status, raw = srv.post("/generate", {"input_ids": [[3] * prompt] * n,
                                         "sampling_params": {"max_new_tokens": out, "ignore_eos": True}})
    assert status == 200
    return [o["meta_info"] for o in json.loads(raw)]


def _itl(meta: dict, out: int) -> float:
    """Mean simulated time between a request's tokens after the first."""
    return (meta["sim_e2e_latency"] - meta["sim_first_token_latency"]) / (out - 1)


def _ring_trip(extra: list[str], batch: int, ctx: int) -> float:
    """The cost model's ring trip of one micro-batch (stages, hops, return, host time)."""
    cfg = load_config([*PP8, *extra])
    return cfg.cost.ring_trip(decode_shape([ctx] * batch))


def test_pp8_depth0_default_cap_is_one_microbatch_per_ring(kimi_pp8: Server, kimi_pp8_mb1: Server) -> None:
    prompt, out = 100, 48
    default = _batch_run(kimi_pp8, 8, prompt, out)
    # All 8 arrive together and fit one slot (cap = 2048 // 8): one micro-batch of 8, so each token costs
    # a full ring trip and the ring yields 8 tokens per period.
    ring = _ring_trip([], 8, prompt + out // 2)
    per_token = [(m["sim_e2e_latency"] - m["sim_first_token_latency"]) / (out - 1) for m in default]
    for t in per_token:
        assert t == pytest.approx(ring, rel=0.05)
    # With one request per slot, 8 micro-batches share the ring: expert work per step shrinks (the
    # roofline: D(1) = 8 vs D(8) = 59.5 experts read per layer; the measured INT4 Marlin MoE: 0.18 ms for
    # one token against 1.07 ms for eight). The last stage then paces the ring, and at depth 0 its host
    # waits for each of its forwards before building the next: a token every 8 x (its step + that host
    # work), about 1.6x the default's throughput. (Prefill is left out: eight 100-token prefills touch
    # most experts either way.)
    mb1 = _batch_run(kimi_pp8_mb1, 8, prompt, out)
    decode_tput_default = sum(1 / _itl(m, out) for m in default)
    decode_tput_mb1 = sum(1 / _itl(m, out) for m in mb1)
    assert decode_tput_default == pytest.approx(8 / ring, rel=0.05)
    cfg = load_config([*PP8, "--pp-max-micro-batch-size", "1"])
    shape, h = decode_shape([prompt + out // 2]), cfg.cost.host_costs()
    gap = h.process(1) + h.gloo_recv + h.schedule(1) + h.object_recv + h.prepare(1)
    paced = max(cfg.cost.ring_trip(shape), 8 * (cfg.cost.stage_time(7, shape) + gap))
    assert decode_tput_mb1 == pytest.approx(8 / paced, rel=0.1)
    assert decode_tput_mb1 > 1.4 * decode_tput_default
    lines = kimi_pp8_mb1.log().splitlines()
    decode = [x for x in lines if "Decode batch, " in x]
    assert decode and all("#running-req: 1," in x for x in decode)
    decode_default = [x for x in kimi_pp8.log().splitlines() if "Decode batch, #running-req: 8," in x]
    assert len(decode_default) >= 8  # lock-step: all 8 stages report the same micro-batch


def test_busy_time_shows_bubbles_at_one_microbatch(kimi_pp8: Server) -> None:
    """One micro-batch in an 8-stage ring keeps each stage busy about 1/8 of the time."""
    text = kimi_pp8.get("/metrics")[1].decode()
    before = {lab["pp_rank"]: v for lab, v in _samples(text, "parasweep_sim:stage_busy_seconds_total")}
    t_before = _samples(text.replace("parasweep_sim:sim_time_seconds ", "parasweep_sim:sim_time_seconds{} "),
                        "parasweep_sim:sim_time_seconds")[0][1]
    metas = _batch_run(kimi_pp8, 8, 50, 64)
    text = kimi_pp8.get("/metrics")[1].decode()
    after = {lab["pp_rank"]: v for lab, v in _samples(text, "parasweep_sim:stage_busy_seconds_total")}
    span = max(m["sim_e2e_latency"] for m in metas)
    t_after = _samples(text.replace("parasweep_sim:sim_time_seconds ", "parasweep_sim:sim_time_seconds{} "),
                       "parasweep_sim:sim_time_seconds")[0][1]
    assert t_after - t_before >= span
    for rank in map(str, range(8)):
        frac = (after[rank] - before[rank]) / span
        assert 0.05 < frac < 0.35, (rank, frac)


def test_a_scrape_is_kept_as_text_and_read_back_as_the_samples_a_parse_gives(kimi_pp8: Server,
                                                                               tmp_path: Path) -> None:
    # the scraper writes each scrape's text (parsing it would hold the load generator's interpreter
    # lock for milliseconds); read back, it is the samples a parse of the whole scrape gives
    from orchestrator.telemetry.server_metrics import MetricsScraper, parse_samples, read_samples

    kimi_pp8.post("/generate", {"input_ids": [1] * 50, "sampling_params": {"max_new_tokens": 20}})
    path = tmp_path / "server_metrics.jsonl"
    MetricsScraper(kimi_pp8.url + "/metrics", path).scrape_once()
    full = kimi_pp8.get("/metrics")[1].decode()
    (scrape,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert "_bucket" in full and "_bucket" not in scrape["text"] and "# HELP" not in scrape["text"]
    frame = read_samples(path)
    assert frame is not None
    parsed = parse_samples(full, scrape["ts"])
    rows = frame.to_dict("records")
    assert [(r["name"], r["labels"]) for r in rows] == [(r["name"], r["labels"]) for r in parsed]
    assert len(parsed) > 100
    # the idle engine's counters and gauges do not move between the two scrapes (its clock does)
    assert [r for r in rows if r["name"].startswith("sglang:")] == [
        r for r in parsed if r["name"].startswith("sglang:")]
