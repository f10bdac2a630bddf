"""Calibration profiles: the file format, what a profile changes in the model, and the one-line errors
for a profile that cannot be used (from the simulator's flag and from the config group)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.config.schema import ParasweepConf
from orchestrator.config.validate import validate
from orchestrator.engines.sim import SimEngine
from orchestrator.errors import ConfigError
from simulator.calibration import Calibration, CalibrationError, load_calibration, save_calibration
from simulator.predict import load_config, predict_point
from vocab.hardware import load_hardware
from vocab.load import LoadPoint, RequestSpec


def cfg(tmp_path: Path, **params: float) -> tuple[ParasweepConf, list[str]]:
    c = ParasweepConf()
    c.engine.name = "sim"
    c.model.name, c.model.path = "llama-3.1-8b", "models/llama-3.1-8b"
    c.hardware = load_hardware("h100-sxm-x8")
    c.workload.concurrency = [1]
    c.simulator.step_costs = "roofline"  # eta_mem is a roofline constant
    if params:
        c.calibration.name, c.calibration.hardware = "mine", "h100-sxm-x8"
        c.calibration.params = {k: {"value": v, "source": "test"} for k, v in params.items()}
    sim = SimEngine()
    sim.prepare(c, tmp_path)
    return c, sim.simulator_flags(c, 30000, tmp_path)


def test_a_profile_changes_the_model_through_the_simulator_flag(tmp_path: Path) -> None:
    _, plain = cfg(tmp_path / "a")
    c, calibrated = cfg(tmp_path / "b", eta_mem=0.375)  # half the default memory efficiency
    assert "--sim-calibration" in calibrated and "--sim-calibration" not in plain
    assert load_config(calibrated).cost.p.eta_mem == 0.375
    spec = RequestSpec(input_len=64, output_len=32, vocab_size=128256)
    point = LoadPoint(concurrency=1, num_requests=2, warmup_requests=0)
    slow = predict_point(calibrated, point, spec).metrics["itl_p50_ms"]
    fast = predict_point(plain, point, spec).metrics["itl_p50_ms"]
    assert slow > 1.6 * fast  # decode of an 8B model at batch 1 is memory-bound
    validate(c)


def test_round_trip_and_sources(tmp_path: Path) -> None:
    cal = Calibration("x", "h100-sxm-x8", "a test",
                      params={"eta_mem": {"value": 0.7, "source": "fit"}},
                      hardware_overrides={"allreduce_latency_us": {"value": 12.0, "source": "fit"}})
    loaded = load_calibration(save_calibration(cal, tmp_path / "x.yaml"))
    assert loaded == Calibration("x", "h100-sxm-x8", "a test", params=cal.params,
                                 hardware_overrides=cal.hardware_overrides)


@pytest.mark.parametrize(("data", "message"), [
    ({"hardware": "h"}, "expected a mapping with at least 'name' and 'hardware'"),
    ({"name": "x", "hardware": "h", "params": {"eta_nope": {"value": 1}}}, "unknown params field 'eta_nope'"),
    ({"name": "x", "hardware": "h", "params": {"eta_mem": 0.5}}, "params.eta_mem must be {value"),
    ({"name": "x", "hardware": "h", "hardware_overrides": {"name": {"value": 1}}},
     "unknown hardware_overrides field 'name'"),
    ({"name": "x", "hardware": "h", "params": {"eta_mem": {"value": "high"}}}, "must be a number"),
])
def test_bad_profiles_get_one_line(tmp_path: Path, data: dict, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(CalibrationError) as err:
        load_calibration(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_config_group_refuses_a_profile_of_other_hardware(tmp_path: Path) -> None:
    c, _ = cfg(tmp_path, eta_mem=0.5)
    c.calibration.hardware = "rtx-pro-6000-pcie-x8"
    with pytest.raises(ConfigError) as err:
        validate(c)
    assert str(err.value) == ("calibration=mine: invalid (it was fitted for hardware=rtx-pro-6000-pcie-x8); "
                              "valid: a profile fitted for hardware=h100-sxm-x8")
    c.calibration.hardware = "h100-sxm-x8"
    c.calibration.params = {"eta_mem": {"value": "x"}}
    with pytest.raises(ConfigError, match="calibration=mine: invalid"):
        validate(c)
