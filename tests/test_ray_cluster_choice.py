"""Which Ray a sweep runs on. ``ray.address`` unset: a fresh local instance of the sweep's own, listening
on loopback only, whatever other cluster runs on the machine (even one named by ``RAY_ADDRESS``) and
after one was killed without ``ray stop`` (its ``ray_current_cluster`` file left behind).
``ray.address=auto`` or ``host:port``: that cluster joined as it is, said at the start. An address that
nothing answers on: one line, exit 2."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from orchestrator.errors import ConfigError, UserError
from orchestrator.launcher.ray_cluster import init_ray
from orchestrator.process.server import free_port
from tests.conftest import NO_DRAWING, ROOT, run_cli

ONE_TRIAL = ["-m", "model=tiny-test", "parallelism=pp2", "workload=tiny", "pp.async_depth=0", *NO_DRAWING]
LOCAL = [*ONE_TRIAL, "ray.num_cpus=2"]
CURRENT_CLUSTER = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"


# ---- without a cluster (fast) -----------------------------------------------------------------------

def test_an_address_nothing_answers_on_is_one_line_before_ray_starts() -> None:
    port = free_port()
    with pytest.raises(UserError) as err:
        init_ray(f"127.0.0.1:{port}", None, None)
    message = str(err.value)
    assert f"ray.address=127.0.0.1:{port}: no Ray cluster answers there" in message
    assert "\n" not in message and "valid: " in message
    with pytest.raises(UserError, match=r"ray\.address=nonsense: not an address; valid: null"):
        init_ray("nonsense", None, None)


def test_declared_resources_are_refused_with_a_joined_cluster() -> None:
    from orchestrator.config.schema import ParasweepConf
    from orchestrator.config.validate import _validate_ray

    cfg = ParasweepConf()
    cfg.ray.address, cfg.ray.num_gpus = "auto", 8
    with pytest.raises(ConfigError) as err:
        _validate_ray(cfg)
    assert str(err.value).startswith("ray.num_gpus=8: invalid (a cluster that is joined keeps the resources")
    cfg.ray.address = None
    _validate_ray(cfg)  # a local Ray takes them


# ---- against a real `ray start` cluster on this machine (slow) ----------------------------------------

def _descendants(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _run_watching_sockets(args: list[str], workdir: Path, env: dict[str, str]
                          ) -> tuple[subprocess.CompletedProcess[str], dict[str, set[str]]]:
    """``python run.py ARGS``; meanwhile every listening TCP socket of its process tree (driver, Ray's
    GCS, raylet, agents, workers, engines), by process name."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], cwd=workdir, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env})
    listening: dict[str, set[str]] = {}
    try:
        while proc.poll() is None:
            for p in _descendants(proc.pid):
                with contextlib.suppress(psutil.Error):
                    for c in p.net_connections(kind="tcp"):
                        if c.status == psutil.CONN_LISTEN:
                            listening.setdefault(p.name(), set()).add(c.laddr.ip)
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), listening


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


@contextlib.contextmanager
def ray_cluster() -> Iterator[str]:
    """A cluster started the way a user starts one (``ray start --head``, 8 declared GPUs); yields its
    address. The caller may kill it outright; whatever is left is killed at the end."""
    port = free_port()
    ray_cli = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
    subprocess.run([*ray_cli, "start", "--head", f"--port={port}", "--num-gpus=8", "--num-cpus=2",
                    "--include-dashboard=false", "--disable-usage-stats"],
                   check=True, capture_output=True, text=True, timeout=120)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        kill_cluster(port)


def kill_cluster(port: int) -> None:
    """SIGKILL every process of the cluster on ``port`` (no ``ray stop``: its files stay behind)."""
    for p in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if f"gcs_server_port={port}" in cmdline or f":{port} " in cmdline + " ":
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)


@pytest.mark.slow
def test_local_sweeps_ignore_other_clusters_and_auto_joins_one(tmp_path: Path) -> None:
    for name in ("local", "auto", "refused", "after", "gone"):
        (tmp_path / name).mkdir()
    with ray_cluster() as address:
        port = int(address.rsplit(":", 1)[1])
        assert f":{port}" in CURRENT_CLUSTER.read_text()  # what Ray's own ray.init() would follow

        # a cluster runs and RAY_ADDRESS names it: a local sweep still starts its own, on loopback
        result, listening = _run_watching_sockets(LOCAL, tmp_path / "local", {"RAY_ADDRESS": address})
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Ray: a local instance of this sweep's own at 127.0.0.1:" in result.stdout
        assert "1 trial(s), status ok" in result.stdout
        assert "Token authentication" not in result.stdout + result.stderr
        assert {"gcs_server", "raylet"} <= set(listening), listening
        exposed = {name: ips for name, ips in listening.items() if not all(map(_is_loopback, ips))}
        assert exposed == {}

        # auto: that cluster, with its resources as they are
        joined = run_cli([*ONE_TRIAL, "ray.address=auto"], tmp_path / "auto", timeout=300, store=True)
        assert joined.returncode == 0, joined.stdout + joined.stderr
        assert "(ray.address=auto): 1 node(s), 8 GPU(s)" in joined.stdout
        assert "1 trial(s), status ok" in joined.stdout
        # resources are the cluster's: declaring some is refused in one line
        refused = run_cli([*ONE_TRIAL, "ray.address=auto", "ray.num_gpus=4"], tmp_path / "refused")
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines()[-1].startswith("parasweep: ray.num_gpus=4: invalid")

        kill_cluster(port)  # killed outright: ray_current_cluster now names a cluster that is gone
        time.sleep(1.0)
        assert f":{port}" in CURRENT_CLUSTER.read_text()
        after = run_cli(LOCAL, tmp_path / "after", timeout=300, store=True)
        assert after.returncode == 0, after.stdout + after.stderr
        assert "Ray: a local instance of this sweep's own" in after.stdout
        # and a gone cluster named outright is one line, exit 2
        gone = run_cli([*ONE_TRIAL, f"ray.address={address}"], tmp_path / "gone")
        assert gone.returncode == 2
        last = gone.stderr.strip().splitlines()[-1]
        assert f"ray.address={address}: no Ray cluster answers there" in last
    if CURRENT_CLUSTER.exists() and f":{port}" in CURRENT_CLUSTER.read_text():
        CURRENT_CLUSTER.unlink()  # leave the machine as it was before the test


@contextlib.contextmanager
def two_node_cluster() -> Iterator[str]:
    """Two Ray nodes on this machine, each with 8 declared GPUs, started as a user starts a cluster
    (``ray start --head`` here, ``ray start --address`` for the second); yields the head's address.
    Ray's token authentication is on for local clusters: the second node, and anyone naming the
    address, pass ``RAY_AUTH_MODE=token`` (the token is in ``~/.ray/auth_token``)."""
    port = free_port()
    ray_cli = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
    common = ["--num-gpus=8", "--num-cpus=2", "--disable-usage-stats", "--object-store-memory=100000000"]
    try:
        subprocess.run([*ray_cli, "start", "--head", f"--port={port}", "--include-dashboard=false", *common],
                       check=True, capture_output=True, text=True, timeout=120)
        subprocess.run([*ray_cli, "start", f"--address=127.0.0.1:{port}", *common], check=True,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "RAY_AUTH_MODE": "token"})
        yield f"127.0.0.1:{port}"
    finally:
        kill_cluster(port)


@pytest.mark.slow  # two Ray nodes, an mlflow server and two trials; in this module: it starts a cluster
def test_two_whole_node_trials_run_side_by_side_on_two_nodes(tmp_path: Path) -> None:
    import json
    import socket

    from mlflow.tracking import MlflowClient

    from tests.mlflow_server import MlflowServer

    with MlflowServer(tmp_path / "server") as server, two_node_cluster() as address:
        result = run_cli(["-m", f"ray.address={address}", f"tracking.uri={server.url}", "model=llama-3.1-8b",
                          "parallelism=tp8", "hardware=h100-sxm-x8", "workload.concurrency=[1]",
                          "workload.requests_per_point=4", "workload.warmup_requests=0",
                          "workload.input_len=32", "workload.output_len=400", "server.random_seed=0,1"],
                         tmp_path, timeout=400, env={"RAY_AUTH_MODE": "token"})
        assert result.returncode == 0, result.stdout + result.stderr
        assert "[parasweep] Ray: joined the cluster at " in result.stdout
        assert "2 node(s), 16 GPU(s), at most 8 on one node" in result.stdout
        client = MlflowClient(tracking_uri=server.url)
        runs = client.search_runs(["1"], "tags.`parasweep.kind` = 'trial'")
        assert len(runs) == 2 and all(r.data.tags["parasweep.status"] == "ok" for r in runs)
        # each on a node of its own, recorded so
        nodes = {r.data.tags["parasweep.ray_node_id"] for r in runs}
        assert len(nodes) == 2 and all(len(n) == 56 for n in nodes)
        assert {r.data.tags["parasweep.host"] for r in runs} == {socket.gethostname()}
        where = [line for line in result.stdout.splitlines() if line.startswith("Where: #")]
        assert len(where) == 2 and where[0].split("Ray node ")[1][:8] != where[1].split("Ray node ")[1][:8]
        # side by side: the scheduler started both before either finished (a decision of the scheduler's;
        # whether their load windows overlap too depends on how fast a busy machine starts each engine)
        (schedule,) = (tmp_path / "runs" / "multirun").glob("*/*/schedule.json")
        rows = json.loads(schedule.read_text())
        assert max(r["submitted"] for r in rows) < min(r["finished"] for r in rows)
        # their files went up through the tracking server, which keeps them (no shared file system needed)
        kept = tmp_path / "server" / "artifacts" / "1"
        for run in runs:
            assert (kept / run.info.run_id / "artifacts" / "env.json").is_file()
        assert not (tmp_path / "runs" / "mlflow.db").exists()


def _engines_of(join: str) -> list[psutil.Process]:
    """The engine processes (any node) of the trial whose nodes meet at ``join`` (--dist-init-addr)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info["cmdline"] or []
        if "simulator" in cmdline and join in cmdline:
            found.append(p)
    return found


ACROSS_NODES = ["model=kimi-k2", "hardware=h100-sxm-x8-2nodes-ib", "workload.concurrency=[1]",
                "workload.warmup_requests=0", "workload.input_len=32"]


@pytest.mark.slow  # two Ray nodes, an mlflow server and three trials; in this module: it starts a cluster
def test_trials_across_two_nodes_run_an_engine_on_each_and_fail_when_one_goes(tmp_path: Path) -> None:
    import json
    import threading

    from mlflow.tracking import MlflowClient

    from tests.mlflow_server import MlflowServer

    for name in ("ok", "killed", "crashed"):
        (tmp_path / name).mkdir()
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    with MlflowServer(tmp_path / "server") as server, two_node_cluster() as address:
        common = ["-m", f"ray.address={address}", f"tracking.uri={server.url}", *ACROSS_NODES]
        result = run_cli([*common, "parallelism=tp8pp2,pp16", "workload.requests_per_point=3",
                          "workload.output_len=24"], tmp_path / "ok", timeout=500, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "2 trial(s), status ok" in result.stdout, result.stdout
        client = MlflowClient(tracking_uri=server.url)
        runs = client.search_runs(["1"], "tags.`parasweep.kind` = 'trial'")
        assert len(runs) == 2 and all(r.data.tags["parasweep.status"] == "ok" for r in runs)
        for run in runs:  # where it ran: both nodes, rank 0's first
            nodes = run.data.tags["parasweep.ray_node_id"].split(",")
            assert len(nodes) == 2 and len(set(nodes)) == 2 and all(len(n) == 56 for n in nodes)
            assert len(run.data.tags["parasweep.host"].split(",")) == 2
        for trial in sorted((tmp_path / "ok" / "runs" / "multirun").glob("*/*/[0-9]")):
            argv = json.loads((trial / "server" / "argv.json").read_text())
            join = argv[argv.index("--dist-init-addr") + 1]
            assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "0"
            assert not join.startswith("127.")  # rank 0's node address, which the other nodes reach
            # rank 0 served only once node 1 had joined it, and node 1's log came back to the trial
            assert "All 2 nodes joined the process group" in (trial / "server" / "server.log").read_text()
            node1 = (trial / "server" / "server-node1.log").read_text()
            assert f"node rank 1 of 2: joined rank 0 at {join}" in node1
            assert _engines_of(join) == []  # nothing left on any node
            assert len(json.loads((trial / "env.json").read_text())["ray_node_id"].split(",")) == 2
        kept = tmp_path / "server" / "artifacts" / "1"
        for run in runs:
            assert (kept / run.info.run_id / "artifacts" / "server" / "server-node1.log").is_file()

        # node 1's engine killed during the load: the trial fails, naming the node, and nothing is left
        killed: list[str] = []

        def kill_node1_engine() -> None:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not killed:
                for progress in (tmp_path / "killed" / "runs" / "multirun").glob("*/*/0/progress.json"):
                    with contextlib.suppress(ValueError, OSError):
                        if json.loads(progress.read_text()).get("point") is None:
                            continue  # the load has not started
                        # rank 0's command names the trial's files; node 1's has its --dist-init-addr
                        (head,) = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                                   if "--dist-init-addr" in (p.info["cmdline"] or [])
                                   and str(progress.parent) in " ".join(p.info["cmdline"])]
                        join = head[head.index("--dist-init-addr") + 1]
                        for p in _engines_of(join):
                            cmdline = p.cmdline()
                            if cmdline[cmdline.index("--node-rank") + 1] == "1":
                                p.send_signal(signal.SIGKILL)
                                killed.append(join)
                time.sleep(0.2)

        killer = threading.Thread(target=kill_node1_engine, daemon=True)
        killer.start()
        failed = run_cli([*common, "parallelism=tp8pp2", "workload.requests_per_point=4",
                          "workload.output_len=3000"], tmp_path / "killed", timeout=500, env=env)
        killer.join(timeout=10)
        assert killed, failed.stdout + failed.stderr
        assert "engine on node 1 exited with code -9 (SIGKILL) during point" in failed.stdout + failed.stderr
        (trial,) = client.search_runs(["1"], "tags.`parasweep.kind` = 'trial' and "
                                             "tags.`parasweep.status` = 'failed'")
        assert _engines_of(killed[0]) == []
        (error,) = (tmp_path / "killed" / "runs" / "multirun").glob("*/*/0/error.txt")
        assert "node 1 engine log tail" in error.read_text()  # each node's log tail, in the error

        # rank 0's engine fails (a crash after one answer): the trial blames rank 0, not node 1, whose
        # engine only followed it down
        crashed = run_cli([*common, "parallelism=tp8pp2", "workload.requests_per_point=4",
                           "workload.output_len=24", "engine.sim_faults.crash_after_requests=1"],
                          tmp_path / "crashed", timeout=500, env=env)
        out = crashed.stdout + crashed.stderr
        assert "failed #0" in out and "engine exited with code" in out and "engine on node 1" not in out, out


@pytest.mark.slow  # two Ray nodes and a trial; in this module: it starts a cluster
def test_a_vllm_trial_across_two_nodes_runs_its_workers_headless_on_the_second(tmp_path: Path) -> None:
    import json

    from tests.mlflow_server import MlflowServer

    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    with MlflowServer(tmp_path / "server") as server, two_node_cluster() as address:
        result = run_cli(["-m", f"ray.address={address}", f"tracking.uri={server.url}", "engine=sim-vllm",
                          "parallelism=tp8pp2", *ACROSS_NODES, "workload.requests_per_point=3",
                          "workload.output_len=24"], tmp_path, timeout=500, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "1 trial(s), status ok" in result.stdout, result.stdout
        (trial,) = sorted((tmp_path / "runs" / "multirun").glob("*/*/[0-9]"))
        argv = json.loads((trial / "server" / "argv.json").read_text())
        master = argv[argv.index("--master-addr") + 1]
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "0"
        assert not master.startswith("127.") and "--headless" not in argv  # rank 0's node serves
        join = f"{master}:{argv[argv.index('--master-port') + 1]}"
        assert "All 2 nodes joined the process group" in (trial / "server" / "server.log").read_text()
        node1 = (trial / "server" / "server-node1.log").read_text()
        assert f"headless multiproc executor, with head node address {join}" in node1
        assert _engines_of(join) == []  # nothing left on any node
