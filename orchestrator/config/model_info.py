"""The few architecture facts the orchestrator needs from a model's HF ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.paths import model_dir


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    num_layers: int
    num_experts: int  # routed experts per MoE layer; 0 for a dense model
    vocab_size: int
    max_context: int | None
    num_heads: int  # attention heads (0 when the config does not say)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def read_model_info(path: str) -> ModelInfo:
    directory = model_dir(path)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ConfigError("model.path", path, "a directory holding an HF config.json",
                          why=f"no config.json in {directory}")
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError("model.path", path, "a directory holding a valid HF config.json",
                          why=f"{config_file} is not JSON: {exc.msg} at line {exc.lineno}") from None
    # multimodal/wrapper configs keep the language model's numbers under text_config
    text = raw.get("text_config", raw)
    experts = text.get("n_routed_experts") or text.get("num_experts") or text.get("num_local_experts") or 0
    return ModelInfo(
        path=directory,
        num_layers=int(text.get("num_hidden_layers", 0)),
        num_experts=int(experts),
        vocab_size=int(text.get("vocab_size", 32000)),
        max_context=text.get("max_position_embeddings"),
        num_heads=int(text.get("num_attention_heads", 0) or 0),
    )
