"""The model facts validation and load planning need, with a bad model directory reported as a
one-line error on ``model.path``."""

from __future__ import annotations

from orchestrator.errors import ConfigError
from vocab.assets import model_dir
from vocab.model import ModelConfigError, ModelInfo, read_model_info


def model_info(path: str) -> ModelInfo:
    try:
        return read_model_info(model_dir(path))
    except ModelConfigError as exc:
        raise ConfigError("model.path", path, "a directory holding a valid HF config.json",
                          why=str(exc)) from None
