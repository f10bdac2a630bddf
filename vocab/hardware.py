"""Hardware profiles: a node of identical GPUs, or a cluster of such nodes joined by a network, as the
simulator and the validator see it.

The YAML files live in ``conf/hardware/<name>.yaml`` (a Hydra config group, shipped as package data);
the simulated engine reads the same files (``python -m simulator --sim-hardware <name>``), or a profile
written out for one trial. Every number cites its source in ``source`` so a reader can check it
against the datasheet.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from vocab.assets import hardware_dir


@dataclass
class HardwareConf:
    name: str = "???"
    gpu: str = "???"  # marketing name, e.g. "NVIDIA H200 SXM 141GB"
    num_gpus: int = 8  # GPUs in one node
    memory_gb: float = 0.0  # device memory per GPU (GB = 1e9 bytes)
    mem_bw_gbs: float = 0.0  # peak device-memory bandwidth per GPU, GB/s
    peak_tflops_bf16: float = 0.0  # dense BF16 tensor-core peak per GPU, TFLOP/s
    # dense FP8 tensor-core peak per GPU, TFLOP/s: what an FP8-weight GEMM runs at (0: no FP8 tensor cores,
    # FP8 weights are widened and multiplied at the BF16 peak)
    peak_tflops_fp8: float = 0.0
    power_limit_w: float = 0.0  # board power limit (TDP) per GPU
    idle_power_w: float = 0.0  # power of an idle GPU with a server loaded
    interconnect: str = "pcie"  # "pcie" or "nvlink": what GPU-to-GPU traffic crosses
    link_bw_gbs: float = 0.0  # GPU-to-GPU bandwidth per direction per GPU, GB/s
    link_latency_us: float = 0.0  # one point-to-point transfer, small message
    allreduce_latency_us: float = 0.0  # one small-message all-reduce across the node (alpha term)
    kernel_launch_us: float = 0.0  # host cost per kernel launched eagerly
    graph_launch_us: float = 0.0  # host cost to replay one captured CUDA graph (one step)
    source: str = ""  # where the numbers come from (datasheets, measurements), with URLs
    # the measured kernel tables of this GPU (an aiconfigurator-core system, e.g. "h100_sxm"); null: none
    kernel_tables: str | None = None
    # a box without kernel tables of its own whose TP all-reduce is priced from another system's measured
    # all-reduce table (an aiconfigurator-core system of the same GPU generation on the same bus, e.g. the
    # L4 box from "l40s"); the roofline prices the rest. null: the roofline's alpha-beta all-reduce
    collective_tables: str | None = None
    # a cluster: this many such nodes, joined by a network of this bandwidth per GPU per direction
    # (400 Gb/s InfiniBand or RoCE per GPU = 50 GB/s) and this one-message latency
    nodes: int = 1
    internode_bw_gbs: float = 0.0
    internode_latency_us: float = 0.0

    @property
    def cluster_gpus(self) -> int:
        return self.num_gpus * self.nodes


def place_servers(gpus: list[int], per_node: int) -> list[int]:
    """The node of each of a deployment's servers (their GPU counts, in order): each takes the next GPUs
    of the current node, or the next node when they do not fit (a server never spans nodes)."""
    nodes, node, used = [], 0, 0
    for n in gpus:
        if used + n > per_node and used > 0:
            node, used = node + 1, 0
        nodes.append(node)
        used += n
    return nodes


class HardwareError(ValueError):
    pass


def resolve_hardware_path(name_or_path: str) -> Path:
    """A bare name is looked up among the shipped profiles; anything ending in .yaml/.yml/.json is a path."""
    if name_or_path.endswith((".yaml", ".yml", ".json")):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise HardwareError(f"hardware profile file not found: {path}")
        return path
    path = hardware_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in hardware_dir().glob("*.yaml"))
        raise HardwareError(f"unknown hardware profile {name_or_path!r}; known: {', '.join(known)}")
    return path


def load_hardware(name_or_path: str) -> HardwareConf:
    path = resolve_hardware_path(name_or_path)
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise HardwareError(f"{path}: expected a mapping of HardwareConf fields")
    known = {f.name for f in dataclasses.fields(HardwareConf)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise HardwareError(f"{path}: unknown HardwareConf fields: {', '.join(unknown)}")
    hw = HardwareConf(**data)
    for field in ("memory_gb", "mem_bw_gbs", "peak_tflops_bf16", "power_limit_w", "link_bw_gbs"):
        if float(getattr(hw, field)) <= 0:
            raise HardwareError(f"{path}: {field} must be > 0")
    if hw.interconnect not in ("pcie", "nvlink"):
        raise HardwareError(f"{path}: interconnect must be 'pcie' or 'nvlink', got {hw.interconnect!r}")
    if hw.num_gpus < 1:
        raise HardwareError(f"{path}: num_gpus must be >= 1")
    if hw.nodes < 1:
        raise HardwareError(f"{path}: nodes must be >= 1")
    if hw.nodes > 1 and (hw.internode_bw_gbs <= 0 or hw.internode_latency_us <= 0):
        raise HardwareError(f"{path}: a cluster of {hw.nodes} nodes needs internode_bw_gbs and "
                            "internode_latency_us > 0")
    return hw
