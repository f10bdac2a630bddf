"""Hardware profile schema: one node of identical GPUs, as the simulator and the validator see it.

The YAML files live in ``conf/hardware/<name>.yaml`` (a Hydra config group); the simulated engine reads
the same files (``python -m simulator --sim-hardware <name>``). Every number cites its source in
``source`` so a reader can check it against the datasheet.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class HardwareConf:
    name: str = "???"
    gpu: str = "???"  # marketing name, e.g. "NVIDIA H200 SXM 141GB"
    num_gpus: int = 8  # GPUs in one node
    memory_gb: float = 0.0  # device memory per GPU (GB = 1e9 bytes)
    mem_bw_gbs: float = 0.0  # peak device-memory bandwidth per GPU, GB/s
    peak_tflops_bf16: float = 0.0  # dense BF16 tensor-core peak per GPU, TFLOP/s
    power_limit_w: float = 0.0  # board power limit (TDP) per GPU
    idle_power_w: float = 0.0  # power of an idle GPU with a server loaded
    interconnect: str = "pcie"  # "pcie" or "nvlink": what GPU-to-GPU traffic crosses
    link_bw_gbs: float = 0.0  # GPU-to-GPU bandwidth per direction per GPU, GB/s
    link_latency_us: float = 0.0  # one point-to-point transfer, small message
    allreduce_latency_us: float = 0.0  # one small-message all-reduce across the node (alpha term)
    kernel_launch_us: float = 0.0  # host cost per kernel launched eagerly
    graph_launch_us: float = 0.0  # host cost to replay one captured CUDA graph (one step)
    source: str = ""  # where the numbers come from (datasheets, measurements), with URLs
