"""Trials wider than one node: a hardware profile that describes a cluster, validation that tells "does
not fit a node" from "does not fit the cluster", one SGLang argv per node valid for 0.5.23 (rank 0
serving), the simulated engine's nodes meeting at rank 0 before it serves and failing together, and a
cost model that charges the network where a TP group or a pipeline boundary crosses it. Trials launched
across the nodes of a real Ray cluster are in tests/test_ray_cluster_choice.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf, trial_nodes
from orchestrator.config.validate import validate
from orchestrator.engines.base import NodePlace, sglang_flags
from orchestrator.engines.sglang_compat import SGLangTarget, recorded_flag_set
from orchestrator.errors import ConfigError
from simulator.cli import build_parser
from simulator.costs import decode_shape
from simulator.estimates import decode_step
from simulator.resolve import FlagError, resolve
from vocab.assets import model_dir
from vocab.hardware import load_hardware

CLUSTER = "h100-sxm-x8-2nodes-ib"
T0523 = SGLangTarget("0.5.23", recorded_flag_set("0.5.23"), True, "python")


def kimi(tp: int, pp: int, dp: int = 1, hardware: str = CLUSTER) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.model.name, cfg.model.path = "kimi-k2", "models/kimi-k2"
    cfg.hardware = load_hardware(hardware)
    cfg.tp.size, cfg.pp.size, cfg.dp.size = tp, pp, dp
    cfg.engine.name, cfg.workload.concurrency = "sim", [8]
    return cfg


def test_a_cluster_profile() -> None:
    hw = load_hardware(CLUSTER)
    assert (hw.nodes, hw.num_gpus, hw.cluster_gpus, hw.internode_bw_gbs) == (2, 8, 16, 50.0)
    assert load_hardware("h100-sxm-x8").nodes == 1


def test_does_not_fit_a_node_or_the_cluster() -> None:
    with pytest.raises(ConfigError) as e:
        validate(kimi(8, 2, hardware="h100-sxm-x8"))
    assert "needs 16 GPUs: does not fit a node" in str(e.value)
    with pytest.raises(ConfigError) as e:
        validate(kimi(8, 4))
    assert "needs 32 GPUs: does not fit the cluster" in str(e.value)
    assert "at most 16 (hardware h100-sxm-x8-2nodes-ib is 2 nodes of 8 GPUs)" in str(e.value)


def test_what_a_trial_across_nodes_must_be() -> None:
    for tp, pp, dp, fragment in ((4, 3, 1, "a multiple of 8 (whole nodes of hardware"),
                                 (8, 1, 2, "dp.size=2: invalid (SGLang refuses data-parallel replicas")):
        cfg = kimi(tp, pp, dp)
        cfg.predict = True
        with pytest.raises(ConfigError) as e:
            validate(cfg)
        assert fragment in str(e.value)
    measured = kimi(8, 2)  # measured across nodes: on a Ray cluster only (a local Ray is one node)
    with pytest.raises(ConfigError) as e:
        validate(measured)
    assert "across nodes: ray.address=auto or host:port of a Ray cluster, or predict=true" in str(e.value)
    measured.ray.address = "auto"
    validate(measured)
    for flag in ("predict", "dry_run"):
        cfg = kimi(8, 2)
        setattr(cfg, flag, True)
        validate(cfg)
        assert trial_nodes(cfg) == 2


def test_one_sglang_argv_per_node_valid_for_0_5_23() -> None:
    cfg = kimi(8, 2)
    argvs = [sglang_flags(cfg, 30000, T0523, NodePlace(rank, "10.0.0.7")) for rank in range(trial_nodes(cfg))]
    for rank, argv in enumerate(argvs):  # checked against 0.5.23's recorded flag set as they were built
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--dist-init-addr") + 1] == "10.0.0.7:30001"  # rank 0's node
        assert argv[argv.index("--port") + 1] == "30000"
    rank_at = argvs[0].index("--node-rank") + 1  # only the rank differs
    assert argvs[0][:rank_at] == argvs[1][:rank_at] and argvs[0][rank_at + 1:] == argvs[1][rank_at + 1:]
    assert "--nnodes" not in sglang_flags(kimi(8, 1), 30000, T0523)  # one node: none of it


def test_the_files_an_engine_command_names_are_carried_to_another_node(tmp_path: Path) -> None:
    from orchestrator.process.node_engines import EngineFiles

    trial = tmp_path / "trial" / "engine"
    (trial / "model").mkdir(parents=True)
    (trial / "hardware.yaml").write_text("name: h\n")
    (trial / "model" / "config.json").write_text("{}")
    files = EngineFiles.under(trial)
    assert sorted(files.contents) == ["hardware.yaml", "model/config.json"]
    argv = ["python", "-m", "simulator", "--sim-hardware", str(trial / "hardware.yaml"), "--model-path",
            str(trial / "model"), "--served-model-name", str(tmp_path / "trial" / "engine-x")]
    elsewhere = tmp_path / "node1"
    moved = files.place(elsewhere, argv)
    assert moved[4] == str(elsewhere / "hardware.yaml") and moved[6] == str(elsewhere / "model")
    assert moved[8] == argv[8]  # only paths under the folder move (not a name that shares its prefix)
    assert (elsewhere / "hardware.yaml").read_text() == "name: h\n"
    assert (elsewhere / "model" / "config.json").read_text() == "{}"
    assert EngineFiles.under(tmp_path / "none").place(elsewhere, argv) == argv  # SGLang's: nothing to carry


def _engine(tp: int, pp: int, nnodes: int, hardware: str = CLUSTER, model: str = "kimi-k2"):
    args = ["--model-path", str(model_dir(f"models/{model}")), "--tp-size", str(tp), "--pp-size", str(pp),
            "--sim-hardware", hardware, "--random-seed", "0"]
    if nnodes > 1:
        args += ["--nnodes", str(nnodes), "--dist-init-addr", "127.0.0.1:5000"]
    return resolve(build_parser().parse_args(args))


def test_the_simulated_engine_takes_the_multi_node_flags_as_sglang_does() -> None:
    for args, fragment in (((8, 2, 3), "nnodes (3) must be between 1 and the 2 node(s)"),
                           ((8, 4, 2), "exceeds the 16 GPUs of h100-sxm-x8-2nodes-ib (2 nodes)"),
                           ((8, 2, 1), "exceeds the 8 GPUs")):
        with pytest.raises(FlagError, match=r".*") as e:
            _engine(*args)
        assert fragment in str(e.value)
    parsed = build_parser().parse_args(["--model-path", str(model_dir("models/kimi-k2")), "--tp-size", "8",
                                        "--pp-size", "2", "--nnodes", "2", "--node-rank", "1",
                                        "--dist-init-addr", "h:1", "--sim-hardware", CLUSTER])
    with pytest.raises(FlagError) as e:
        resolve(parsed)
    assert "only rank 0 is modelled; the simulated engine's other ranks stand by" in str(e.value)


def _node_engine(rank: int, port: int, join: str, tmp_path: Path) -> subprocess.Popen[str]:
    """The simulated engine of node ``rank`` of a TP8xPP2 Kimi trial: the command SGLang's would get."""
    argv = [sys.executable, "-m", "simulator", "--model-path", str(model_dir("models/kimi-k2")),
            "--tp-size", "8", "--pp-size", "2", "--nnodes", "2", "--node-rank", str(rank),
            "--dist-init-addr", join, "--sim-hardware", CLUSTER, "--port", str(port), "--dist-timeout", "60"]
    log = (tmp_path / f"node{rank}.log").open("w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _wait_for(what: str, path: Path, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    """Until ``what`` is in the log at ``path`` (the process must stay alive meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while what not in (path.read_text() if path.exists() else ""):
        assert proc.poll() is None, path.read_text()
        assert time.monotonic() < deadline, f"no {what!r} in {path}"
        time.sleep(0.1)


@pytest.mark.slow  # engine processes
def test_the_simulated_engines_nodes_meet_before_serving_and_fail_together(tmp_path: Path) -> None:
    from orchestrator.process.server import free_port

    port, join = free_port(), f"127.0.0.1:{free_port()}"
    head = _node_engine(0, port, join, tmp_path)
    procs = [head]
    node0, node1 = tmp_path / "node0.log", tmp_path / "node1.log"
    try:
        _wait_for("Waiting for 1 other node(s) to join at " + join, node0, head)
        assert not _ready(port)  # alone, rank 0 does not serve
        follower = _node_engine(1, free_port(), join, tmp_path)
        procs.append(follower)
        _wait_for("node rank 1 of 2: joined rank 0 at " + join, node1, follower)
        _wait_for("ready to roll", node0, head)
        assert _ready(port)  # both in: rank 0 serves; node 1 serves nothing
        follower.send_signal(signal.SIGKILL)  # node 1 lost: rank 0 cannot go on
        assert head.wait(timeout=30) == 1
        assert "node rank 1 of 2 left the process group" in node0.read_text()
        # rank 0 lost without a word: its follower ends with an error
        head = _node_engine(0, port, join, tmp_path)
        follower = _node_engine(1, free_port(), join, tmp_path)
        procs += [head, follower]
        _wait_for("ready to roll", node0, head)
        head.send_signal(signal.SIGKILL)
        assert follower.wait(timeout=30) == 1
        assert "node rank 0 at " + join + " went away" in node1.read_text()
        # rank 0 stopped: it tells its follower, which stops too, cleanly
        head = _node_engine(0, port, join, tmp_path)
        follower = _node_engine(1, free_port(), join, tmp_path)
        procs += [head, follower]
        _wait_for("ready to roll", node0, head)
        head.send_signal(signal.SIGTERM)
        assert head.wait(timeout=30) == 0 and follower.wait(timeout=30) == 0
        assert "node rank 1 of 2: rank 0 stopped; stopping too" in node1.read_text()
        # a follower still waiting to join, told to stop: exit 0
        waiting = _node_engine(1, free_port(), join, tmp_path)
        procs.append(waiting)
        _wait_for("node rank 1 of 2: joining rank 0 at " + join, node1, waiting)
        waiting.send_signal(signal.SIGTERM)
        assert waiting.wait(timeout=30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    # a rank outside the trial's nodes, or an address that is not HOST:PORT: one line, exit 1
    base = [sys.executable, "-m", "simulator", "--model-path", str(model_dir("models/kimi-k2")),
            "--tp-size", "8", "--pp-size", "2", "--nnodes", "2", "--sim-hardware", CLUSTER]
    bad = subprocess.run([*base, "--node-rank", "2", "--dist-init-addr", join], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "node_rank 2 is not in 0..1 (--nnodes 2)" in bad.stderr
    bad = subprocess.run([*base, "--dist-init-addr", "headnode"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert bad.stderr.strip() == ("ValueError: --dist-init-addr 'headnode' is not HOST:PORT (rank 0's "
                                  "address, where the other nodes join)")


def test_crossing_nodes_costs_what_the_network_costs() -> None:
    def llama(tp: int, pp: int, nnodes: int, hardware: str = CLUSTER):  # fits one node, so comparable
        return _engine(tp, pp, nnodes, hardware, "llama-3.1-70b")

    tp16, tp8pp2, inside = llama(16, 1, 2), llama(8, 2, 2), llama(8, 1, 1)
    shape = decode_shape([512] * 16)
    # every TP all-reduce of a group wider than a node crosses the network: its latency on a decode
    # step's few tokens, its bandwidth (50 GB/s against NVLink's 450) on a prefill's many
    assert tp16.cost.allreduce_time(16) > 2 * inside.cost.allreduce_time(16)
    assert tp16.cost.allreduce_time(4096) > 5 * inside.cost.allreduce_time(4096)
    # TP8 x PP2: the collectives stay on NVLink, the one stage boundary crosses the network
    assert tp8pp2.cost.allreduce_time(16) == pytest.approx(inside.cost.allreduce_time(16))
    hop = tp8pp2.cost.hop_times(shape)
    assert len(hop) == 1 and hop[0] > llama(4, 2, 1).cost.hop_times(shape)[0]  # 4x2 fits one node
    # a decode step of TP16 spends more of itself communicating than TP8 x PP2's trip does
    a, b = decode_step(tp16, 16, 512), decode_step(tp8pp2, 16, 512)
    assert a.comm_s / a.step_s > b.comm_s / b.step_s
    # eight GPUs of the two-node profile are one node: the same costs as the one-node profile
    one = llama(8, 1, 1, "h100-sxm-x8")
    assert one.cost.stage_time(0, shape) == pytest.approx(inside.cost.stage_time(0, shape))


@pytest.mark.parametrize("version", ["0.11.2", "0.19.0", "0.34.0"])
def test_one_vllm_argv_per_node_of_its_multiprocessing_executor(version: str) -> None:
    from orchestrator.engines.vllm_compat.command import vllm_argv

    cfg = kimi(8, 2)
    cfg.engine.name = "vllm"
    argvs = [vllm_argv(cfg, "python", 30000, version, NodePlace(rank, "10.0.0.7")) for rank in range(2)]
    for rank, argv in enumerate(argvs):  # checked against the release's recorded flags as they were built
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.7"  # rank 0's node
        assert argv[argv.index("--master-port") + 1] == "30001"
    assert "--headless" not in argvs[0] and "--headless" in argvs[1]  # workers only beyond rank 0
    cfg.dp.size = 2
    with pytest.raises(ConfigError, match=r"^dp.size=2: invalid \(parasweep spans nodes with vLLM's TP"):
        vllm_argv(cfg, "python", 30000, version)


def _vllm_node(rank: int, port: int, master_port: int, tmp_path: Path) -> subprocess.Popen[str]:
    """The simulated engine playing vLLM on node ``rank`` of a TP8xPP2 Kimi trial (the flags parasweep
    gives a real vLLM there)."""
    argv = [sys.executable, "-m", "simulator", "serve", str(model_dir("models/kimi-k2")),
            "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2", "--nnodes", "2",
            "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(master_port),
            "--sim-hardware", CLUSTER, "--port", str(port), *(["--headless"] if rank else [])]
    log = (tmp_path / f"vllm-node{rank}.log").open("w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.slow  # engine processes
def test_the_simulated_vllm_nodes_meet_before_serving_and_fail_together(tmp_path: Path) -> None:
    from orchestrator.process.server import free_port

    port, master = free_port(), free_port()
    join = f"127.0.0.1:{master}"
    head = _vllm_node(0, port, master, tmp_path)
    procs = [head]
    node0, node1 = tmp_path / "vllm-node0.log", tmp_path / "vllm-node1.log"
    try:
        _wait_for("Waiting for 1 other node(s) to join at " + join, node0, head)
        assert not _ready(port)
        follower = _vllm_node(1, free_port(), master, tmp_path)
        procs.append(follower)
        _wait_for(f"headless multiproc executor, with head node address {join}", node1, follower)
        _wait_for("Application startup complete.", node0, head)
        assert _ready(port)  # both in: rank 0 serves; the headless node serves nothing
        follower.send_signal(signal.SIGKILL)
        assert head.wait(timeout=30) == 1
        assert "node rank 1 of 2 left the process group" in node0.read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    bad = subprocess.run([sys.executable, "-m", "simulator", "serve", str(model_dir("models/kimi-k2")),
                          "-tp", "8", "-pp", "2", "--nnodes", "2", "--node-rank", "1",
                          "--sim-hardware", CLUSTER],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "--node-rank > 0 needs --headless" in bad.stderr
