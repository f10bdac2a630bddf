"""Engine adapters by name."""

from __future__ import annotations

from orchestrator.engines.base import Engine
from orchestrator.engines.sglang import SGLangEngine
from orchestrator.engines.sim import SimEngine
from orchestrator.engines.sim_vllm import SimVLLMEngine
from orchestrator.engines.vllm import VLLMEngine

# by the engine tag: a real engine, or the simulated engine playing one
ENGINES: dict[str, type[Engine]] = {"sim": SimEngine, "sglang": SGLangEngine, "vllm": VLLMEngine,
                                     "sim-vllm": SimVLLMEngine}


def get_engine(name: str) -> Engine:
    return ENGINES[name]()
