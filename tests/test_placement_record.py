"""Where a trial ran, as recorded and shown: the place of this process (host, Ray node, GPU UUIDs) and
the lines the end of a sweep prints from the trials' tags."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

from analysis.report import short_uuids, where_lines
from orchestrator.environment import gpu_uuids, joined_placement, placement
from vocab.status import Tag

NODE_A = "a1b2c3d4" + "0" * 48
NODE_B = "e5f6a7b8" + "1" * 48


def _run(num: int, host: str | None, node: str = NODE_A, uuids: str = "GPU-8f0c1d2e-aaaa-bbbb") -> Any:
    tags = {Tag.TRIAL_NUM: str(num), Tag.OVERRIDES: f"x={num}"}
    if host:
        tags.update({Tag.HOST: host, Tag.RAY_NODE_ID: node, Tag.GPU_UUIDS: uuids})
    return SimpleNamespace(data=SimpleNamespace(tags=tags))


def test_the_place_of_this_process() -> None:
    where = placement("sim", "0,1")
    assert where == {"host": socket.gethostname(), "ray_node_id": "none (not run by Ray)",
                     "gpu_uuids": "none (the simulated engine uses no GPU)"}
    # SGLang's trials ask NVML; on a machine without a GPU it says why there are none
    found = gpu_uuids("0")
    assert isinstance(found, str) and found.startswith("none (")


def test_where_lines_one_node_or_one_line_a_trial() -> None:
    same = [_run(0, "gpu-a"), _run(1, "gpu-a")]
    assert where_lines(same) == ["Where: every trial on host gpu-a, Ray node a1b2c3d4; GPUs GPU-8f0c1d2e"]
    two = [_run(1, "gpu-b", NODE_B, "GPU-11112222-x,GPU-33334444-y"), _run(0, "gpu-a")]
    assert where_lines(two) == [
        "Where: #0 x=0 on host gpu-a, Ray node a1b2c3d4; GPUs GPU-8f0c1d2e",
        "Where: #1 x=1 on host gpu-b, Ray node e5f6a7b8; GPUs GPU-11112222,GPU-33334444"]
    sim = "none (the simulated engine uses no GPU)"
    assert where_lines([_run(0, "vm", NODE_A, sim), _run(1, "vm", NODE_B, sim)]) == [
        "Where: #0 x=0 on host vm, Ray node a1b2c3d4", "Where: #1 x=1 on host vm, Ray node e5f6a7b8",
        f"Where: GPUs of every trial: {sim}"]
    assert where_lines([_run(0, None)]) == []  # a prediction records no place
    assert short_uuids("none (the simulated engine uses no GPU)") == "none (the simulated engine uses no GPU)"


def test_a_trial_across_nodes_records_every_node() -> None:
    rank0 = {"host": "gpu-a", "ray_node_id": NODE_A, "gpu_uuids": "GPU-1,GPU-2"}
    rank1 = {"host": "gpu-b", "ray_node_id": NODE_B, "gpu_uuids": "GPU-3,GPU-4"}
    assert joined_placement([rank0, rank1]) == {"host": "gpu-a,gpu-b", "ray_node_id": f"{NODE_A},{NODE_B}",
                                                "gpu_uuids": "GPU-1,GPU-2,GPU-3,GPU-4"}
    sim = "none (the simulated engine uses no GPU)"  # a reason every node gives, once
    assert joined_placement([{**rank0, "gpu_uuids": sim}, {**rank1, "gpu_uuids": sim}])["gpu_uuids"] == sim
    across = _run(0, "gpu-a,gpu-b", f"{NODE_A},{NODE_B}", sim)
    assert where_lines([across]) == [f"Where: every trial on host gpu-a,gpu-b, Ray node a1b2c3d4,e5f6a7b8; "
                                     f"GPUs {sim}"]


def test_a_reproduction_compares_hosts_but_not_ray_nodes() -> None:
    from orchestrator.reproduce import _env_lines

    old = {"host": "gpu-a", "ray_node_id": NODE_A, "gpu_uuids": "GPU-1"}
    assert _env_lines(old, {**old, "ray_node_id": NODE_B})[1] == "env: no differences"  # a new Ray each sweep
    lines, summary = _env_lines(old, {**old, "host": "gpu-b", "gpu_uuids": "GPU-2"})
    assert summary == "env: 2 difference(s)" and "    host: gpu-a -> gpu-b" in lines
