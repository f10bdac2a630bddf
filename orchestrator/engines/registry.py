"""Engine adapters by name."""

from __future__ import annotations

from orchestrator.engines.base import Engine
from orchestrator.engines.sglang import SGLangEngine
from orchestrator.engines.sim import SimEngine
from orchestrator.engines.vllm import VLLMEngine

ENGINES: dict[str, type[Engine]] = {"sim": SimEngine, "sglang": SGLangEngine, "vllm": VLLMEngine}


def get_engine(name: str) -> Engine:
    return ENGINES[name]()
