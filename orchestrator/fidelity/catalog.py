"""Which of parasweep's model folders and hardware profiles stand for a published run's model and GPU.

Published runs name models by their Hugging Face id and GPUs as their vendor prints them. A model maps
to a folder under ``models/`` holding the public ``config.json`` of that architecture; a checkpoint that
only fine-tunes another (Llama 3.3 70B on Llama 3.1 70B's architecture, DeepSeek-R1 on V3's) maps to
the architecture's folder, and the replay says so. A GPU maps to a hardware profile under
``conf/hardware/``; a run across several nodes gets that profile with its node count and, where the
source does not state the network between nodes, an assumed 400 Gb/s InfiniBand port per GPU (the
assumption is reported with the entry). An entry can name its folder and profile itself
(``"parasweep": {"model": ..., "hardware": ...}``), which is how a user's own measurements on their own
model or GPU are replayed.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from vocab.assets import hardware_dir, models_dir

# (pattern on the lower-cased HF id, folder under models/, what the mapping assumes or "")
MODELS: tuple[tuple[str, str, str], ...] = (
    (r"llama-3\.1-8b|meta-llama-3\.1-8b", "llama-3.1-8b", ""),
    (r"meta-llama-3-8b", "llama-3.1-8b",
     "Llama-3-8B has Llama-3.1-8B's shapes (32 layers, hidden 4,096, 8 KV heads, vocab 128,256)"),
    (r"llama-3\.1-70b", "llama-3.1-70b", ""),
    (r"llama-3\.3-70b", "llama-3.1-70b", "Llama 3.3 70B has Llama 3.1 70B's architecture"),
    (r"llama-3\.1-405b", "llama-3.1-405b", ""),
    (r"qwen3-8b-fp8", "qwen3-8b-fp8", ""),
    (r"qwen3-8b", "qwen3-8b", ""),
    (r"qwen3-30b-a3b", "qwen3-30b-a3b", ""),
    (r"qwen3-32b", "qwen3-32b", ""),
    (r"qwen3-235b-a22b-fp8", "qwen3-235b-a22b-fp8", ""),
    (r"qwen3-235b-a22b", "qwen3-235b-a22b", ""),
    (r"deepseek-v3\.1", "deepseek-v3", "DeepSeek-V3.1 has DeepSeek-V3's architecture"),
    (r"deepseek-r1", "deepseek-v3", "DeepSeek-R1 has DeepSeek-V3's architecture"),
    (r"deepseek-v3", "deepseek-v3", ""),
    (r"kimi-k2", "kimi-k2", ""),
)
# models whose architecture the simulated engine does not price, with the reason
UNMODELLED_MODELS: tuple[tuple[str, str], ...] = (
    (r"gpt-oss", "gpt-oss (MXFP4 experts, attention sinks, sliding-window layers) is not a family the "
                 "simulated engine prices"),
)
# (pattern on the GPU as published, hardware profile under conf/hardware/)
GPUS: tuple[tuple[str, str], ...] = (
    (r"h20\b.*141|h20-3e", "h20-141gb-x8"),
    (r"h20\b", "h20-x8"),
    (r"h200", "h200-nvlink-x8"),
    (r"h100", "h100-sxm-x8"),
    (r"b200", "b200-sxm-x8"),
    (r"b300", "b300-sxm-x8"),
    (r"a100", "a100-sxm-x8"),
    (r"a40\b", "a40-pcie-x4"),
    (r"\bl4\b", "l4-pcie-x8"),
)
# an assumed network between nodes where the source states none: one 400 Gb/s port per GPU
ASSUMED_INTERNODE_BW_GBS = 50.0
ASSUMED_INTERNODE_LATENCY_US = 10.0


class NotModelled(Exception):
    """The entry names something parasweep has no model of; the message says what and why."""


def model_folder(name: str, own: str | None) -> tuple[Path, str]:
    """(folder with config.json, what the mapping assumes) for the published model ``name``."""
    if own:
        path = Path(own) if Path(own).is_absolute() else models_dir() / own
        if not (path / "config.json").is_file():
            raise NotModelled(f"parasweep.model {own!r}: no config.json in {path}")
        return path, ""
    key = name.lower()
    for pattern, why in UNMODELLED_MODELS:
        if re.search(pattern, key):
            raise NotModelled(why)
    for pattern, folder, note in MODELS:
        if re.search(pattern, key):
            path = models_dir() / folder
            if (path / "config.json").is_file():
                return path, note
            raise NotModelled(f"model {name}: no config.json shipped for {folder}")
    raise NotModelled(f"model {name}: not in parasweep's catalogue (give \"parasweep\": {{\"model\": ...}})")


def hardware_profile(gpu: str, own: str | None) -> Path:
    """The profile file for the published GPU ``gpu``."""
    if own:
        path = Path(own) if own.endswith((".yaml", ".json")) else hardware_dir() / f"{own}.yaml"
        if not path.is_file():
            raise NotModelled(f"parasweep.hardware {own!r}: no profile at {path}")
        return path
    key = gpu.lower()
    for pattern, name in GPUS:
        if re.search(pattern, key):
            path = hardware_dir() / f"{name}.yaml"
            if path.is_file():
                return path
            raise NotModelled(f"GPU {gpu}: no hardware profile {name} shipped")
    raise NotModelled(f"GPU {gpu}: no hardware profile (give \"parasweep\": {{\"hardware\": ...}})")


def across_nodes(profile: Path, nodes: int, workdir: Path) -> tuple[Path, str]:
    """``profile`` spread over ``nodes`` nodes, written under ``workdir``; and the assumption made
    about the network, or "" when the profile states one."""
    data = yaml.safe_load(profile.read_text())
    if nodes <= int(data.get("nodes", 1)):
        return profile, ""
    note = ""
    if not data.get("internode_bw_gbs"):
        data["internode_bw_gbs"] = ASSUMED_INTERNODE_BW_GBS
        data["internode_latency_us"] = ASSUMED_INTERNODE_LATENCY_US
        note = (f"network between the {nodes} nodes not stated: 400 Gb/s InfiniBand per GPU assumed "
                f"({ASSUMED_INTERNODE_BW_GBS:g} GB/s, {ASSUMED_INTERNODE_LATENCY_US:g} µs)")
    data["nodes"] = nodes
    data["name"] = f"{data['name']}-{nodes}nodes"
    out = workdir / f"{data['name']}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out, note
