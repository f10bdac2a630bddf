"""A configuration on the simulated engine's model in virtual time, whichever engine it plays: the
flags a prediction parses (``engine=vllm`` configurations play vLLM, every other one SGLang), and fresh
engines to run load points on (one engine with its DP replicas, or a disaggregated deployment)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.config.schema import ParasweepConf, plays_vllm, role_config
from orchestrator.engines.sim import SimEngine
from orchestrator.engines.sim_vllm import SimVLLMEngine

if TYPE_CHECKING:
    from simulator.predict import VirtualTrial
    from simulator.predict_disagg import PDLayout


def prediction_argv(cfg: ParasweepConf, workdir: Path) -> list[str]:
    """The simulator's flags for ``cfg``, its files (hardware, calibration, model overrides) written
    under ``workdir``: what a prediction in virtual time parses. Its port is never listened on."""
    return (SimVLLMEngine() if plays_vllm(cfg) else SimEngine()).prepared_flags(cfg, workdir)


def virtual_trials(cfg: ParasweepConf, workdir: Path) -> Callable[[], VirtualTrial]:
    """A maker of fresh engines configured as ``cfg`` (its files written under ``workdir``), each to run
    load points on in virtual time: one engine with its DP replicas, or a disaggregated deployment's
    prefill and decode servers. Raises ``ValueError`` as the engine would refuse to start."""
    from simulator.predict import VirtualTrial, load_config

    if cfg.pd.enabled:
        return pd_layout(cfg, workdir).fresh
    engine = load_config(prediction_argv(cfg, workdir))
    return lambda: VirtualTrial(engine)


def pd_layout(cfg: ParasweepConf, workdir: Path) -> PDLayout:
    """A disaggregated deployment's servers, each role's flags resolved once."""
    from simulator.predict_disagg import load_layout

    decode = prediction_argv(role_config(cfg, "decode"), workdir)
    prefill = prediction_argv(role_config(cfg, "prefill"), workdir) if cfg.pd.prefill.workers else []
    return load_layout(prefill, decode, cfg.pd.prefill.workers, cfg.pd.decode.workers, cfg.pd.policy)
