"""The cost model's view of a trial for the diagnosis: decode steps per load point, per DP replica."""

from __future__ import annotations

from orchestrator.config.schema import ParasweepConf
from orchestrator.prediction.modelled import modelled_steps
from vocab.hardware import load_hardware


def cfg(dp: int) -> ParasweepConf:
    c = ParasweepConf()
    c.engine.name = "sim"
    c.model.name, c.model.path = "llama-3.1-8b", "models/llama-3.1-8b"
    c.hardware = load_hardware("h100-sxm-x8")
    c.tp.size, c.dp.size = 2, dp
    c.workload.concurrency = [64]
    return c


def test_requests_are_spread_over_the_dp_replicas() -> None:
    # the resolved caps are per replica, and so is the decode batch each replica forms
    for dp, batch in ((1, 64), (2, 32), (4, 16)):
        steps, layers = modelled_steps(cfg(dp), {"c64": 64}, {})
        assert steps["c64"].batch == batch, (dp, steps)
        assert layers == (32,)
    one = modelled_steps(cfg(1), {"c64": 64}, {})[0]["c64"]
    four = modelled_steps(cfg(4), {"c64": 64}, {})[0]["c64"]
    assert four.step_s < one.step_s and four.memory_bound_s < one.memory_bound_s
