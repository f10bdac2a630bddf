"""pd.* -> a disaggregated trial's servers and router: each role's layout and knobs, where each server
sits, the one-line refusals of what cannot be run, each role's SGLang flags per recorded release, and the
router in PD mode in front of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf, role_config, server_nodes, worker_config, world_size
from orchestrator.engines.router import pd_launch
from orchestrator.engines.sglang_compat import build_args, check_args
from orchestrator.engines.sglang_compat.disagg import (
    FAKE_ON_PREFILL,
    PREFILL_REFUSES_FAKE_SINCE,
    TP_NOT_MULTIPLE,
)
from orchestrator.engines.sglang_compat.versions import RECORDED, ReleaseFacts, parse_version
from orchestrator.errors import ConfigError
from tests.conftest import refusal
from vocab.hardware import load_hardware

SUPPORTED = [v for v in RECORDED if parse_version(v) >= (0, 5, 9)]


def _cfg(prefill: int = 1, decode: int = 1, tp: int = 4, hardware: str = "h200-nvlink-x8") -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.model.name, cfg.model.path = "llama-3.1-70b", "models/llama-3.1-70b"
    cfg.hardware = load_hardware(hardware)
    cfg.ray.num_gpus = cfg.hardware.num_gpus
    cfg.tp.size = tp
    cfg.pd.enabled = True
    cfg.pd.prefill.workers, cfg.pd.decode.workers = prefill, decode
    cfg.workload.concurrency = [8]
    return cfg


def _argv(cfg: ParasweepConf, version: str = "0.5.23") -> list[str]:
    flags = ReleaseFacts.load(version).flags
    args = check_args(build_args(cfg, 30000, version, flags), flags, version)
    return [x for a in args for x in (a.flag, *a.values)]


def test_each_role_takes_the_trials_layout_unless_it_sets_its_own() -> None:
    cfg = _cfg(1, 2, tp=2)
    cfg.pd.decode.tp, cfg.pd.decode.max_running_requests = 1, 64
    cfg.server.extra_args = {"enable-mixed-chunk": True}
    cfg.pd.prefill.extra_args = {"max-prefill-tokens": 32768}
    prefill, decode = role_config(cfg, "prefill"), role_config(cfg, "decode")
    assert (prefill.tp.size, decode.tp.size) == (2, 1)
    assert decode.server.max_running_requests == 64 and prefill.server.max_running_requests is None
    assert prefill.server.extra_args == {"enable-mixed-chunk": True, "max-prefill-tokens": 32768}
    assert decode.server.extra_args == {"enable-mixed-chunk": True}
    # both servers know both layouts, written out
    assert (decode.pd.prefill.tp, decode.pd.decode.tp, prefill.pd.decode.tp) == (2, 1, 1)
    assert world_size(cfg) == 2 + 2 * 1 and world_size(prefill) == 2


def test_servers_fill_the_nodes_in_order_prefill_first() -> None:
    cfg = _cfg(1, 3, tp=4, hardware="h100-sxm-x8-2nodes-ib")
    assert server_nodes(cfg) == [0, 0, 1, 1]
    assert [worker_config(cfg, "decode", i).pd.node for i in range(3)] == [0, 1, 1]
    cfg.pd.bootstrap_port = 9000
    assert [worker_config(cfg, "prefill", 0).pd.bootstrap_port] == [9000]


def test_what_a_disaggregated_trial_cannot_run_is_refused_in_one_line() -> None:
    def refused(**changes: object) -> str:
        cfg = _cfg()
        for key, value in changes.items():
            obj = cfg
            *path, last = key.split("__")
            for part in path:
                obj = getattr(obj, part)
            setattr(obj, last, value)
        return refusal(cfg)

    assert "pd.transfer_backend" in refused(pd__transfer_backend="rdma")
    assert "pd.prefill.workers" in refused(pd__prefill__workers=0)  # only the fake backend runs decode alone
    assert "pd.prefill.workers" in refused(pd__transfer_backend="fake")
    assert "pd.decode.tp" in refused(pd__decode__tp=3)  # 64 heads: 3 does not divide them
    assert "pd.policy" in refused(pd__policy="cache_aware")
    assert "spec.algorithm" in refused(spec__algorithm="eagle3")
    assert "servers that fit one node" in refusal(_cfg(1, 3, tp=4))  # 16 GPUs of an 8-GPU profile
    wide = _cfg(1, 3, tp=4, hardware="h100-sxm-x8-2nodes-ib")  # two nodes: live, one node holds it all
    wide.ray.num_gpus = 16
    assert "pd.prefill.workers+pd.decode.workers" in refusal(wide)
    wide.predict = True  # a prediction models it
    from orchestrator.config.validate import validate

    assert validate(wide) == "sim"


def test_each_server_gets_its_role_and_the_prefill_servers_their_bootstrap_ports() -> None:
    cfg = _cfg(2, 1, tp=2)
    launch = pd_launch(cfg, lambda one, port: _argv(one), [101, 102, 103], lambda offset, _: 9100 + offset,
                       200, 201, "3,4,5,6,7,0")
    assert [(s.name, s.gpus, s.bootstrap_port) for s in launch.servers] == [
        ("prefill server 0", "3,4", 9100), ("prefill server 1", "5,6", 9101),
        ("decode server 0", "7,0", None)]
    p0, d0 = launch.servers[0].argv, launch.servers[2].argv
    assert p0[p0.index("--disaggregation-mode") + 1] == "prefill"
    assert p0[p0.index("--disaggregation-bootstrap-port") + 1] == "9100"
    assert d0[d0.index("--disaggregation-mode") + 1] == "decode"
    assert "--disaggregation-bootstrap-port" not in d0
    router = launch.router
    assert "--pd-disaggregation" in router
    i = router.index("--prefill")
    assert router[i:i + 6] == ["--prefill", "http://127.0.0.1:101", "9100", "--prefill", "http://127.0.0.1:102",
                               "9101"]
    assert router[router.index("--decode") + 1] == "http://127.0.0.1:103"


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_role_flag_is_a_flag_of_every_supported_release(version: str) -> None:
    cfg = _cfg(1, 1, tp=4)
    cfg.pd.reserved_decode_tokens = 256
    prefill = _argv(worker_config(cfg, "prefill", 0, 9000), version)
    decode = _argv(worker_config(cfg, "decode", 0), version)
    assert prefill[prefill.index("--disaggregation-transfer-backend") + 1] == "mooncake"
    assert decode[decode.index("--num-reserved-decode-tokens") + 1] == "256"


def test_sglang_0_5_9_is_told_the_other_sides_layout_and_refuses_tp_sizes_that_do_not_divide() -> None:
    cfg = _cfg(1, 1, tp=4)
    cfg.pd.decode.tp, cfg.pd.prefill.pp = 2, 2
    prefill = _argv(worker_config(cfg, "prefill", 0, 9000), "0.5.9")
    decode = _argv(worker_config(cfg, "decode", 0), "0.5.9")
    assert prefill[prefill.index("--disaggregation-decode-tp") + 1] == "2"
    assert decode[decode.index("--disaggregation-prefill-pp") + 1] == "2"
    assert "--disaggregation-decode-tp" not in _argv(worker_config(cfg, "prefill", 0, 9000), "0.5.10")
    odd = _cfg(1, 1, tp=4)
    odd.pd.prefill.tp, odd.pd.decode.tp = 3, 8
    with pytest.raises(ConfigError, match="Different tp size is supported only when one tp is multiple of"):
        _argv(worker_config(odd, "prefill", 0, 9000), "0.5.9")


def _checks(version: str) -> str:
    """The release's recorded checks as one text, implicitly joined string literals joined."""
    releases = Path(__file__).resolve().parent.parent / "orchestrator/engines/sglang_compat/releases"
    recorded = json.loads((releases / f"sglang-{version}.json").read_text())["checks"]
    return re.sub(r'"\s*"', "", " ".join(c["source"] for c in recorded))


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_pd_refusals_and_defaults_are_the_releases_own(version: str) -> None:
    """Each message parasweep refuses with is in the release's recorded source, from the release where
    the check appears; the backends and defaults the adapter and the simulated roles rely on are the
    release's."""
    v, checks, pd = parse_version(version), _checks(version), ReleaseFacts.load(version).pd
    assert (FAKE_ON_PREFILL in checks) == (v >= PREFILL_REFUSES_FAKE_SINCE)
    if v == (0, 5, 9):
        assert TP_NOT_MULTIPLE in checks
    backends = pd["transfer_backends"]
    assert {"mooncake", "nixl", "fake"} <= set(backends)
    assert ("mooncake_tcp" in backends) == (v >= (0, 5, 13))
    assert pd["defaults"]["disaggregation_bootstrap_port"] == 8998
    assert pd["defaults"]["num_reserved_decode_tokens"] == 512
    assert pd["defaults"]["disaggregation_transfer_backend"] == "mooncake"


def test_a_backend_the_release_lacks_is_refused_with_its_choices() -> None:
    cfg = _cfg()
    cfg.pd.transfer_backend = "mooncake_tcp"
    assert "--disaggregation-transfer-backend" in " ".join(_argv(worker_config(cfg, "decode", 0), "0.5.13"))
    with pytest.raises(ConfigError, match=r"pd\.transfer_backend=mooncake_tcp"):
        _argv(worker_config(cfg, "decode", 0), "0.5.12")
    cfg.pd.transfer_backend, cfg.pd.prefill.workers = "fake", 0
    with pytest.raises(ConfigError, match="Prefill server does not support 'fake'"):
        _argv(worker_config(cfg, "prefill", 0, 9000), "0.5.23")
    assert "--disaggregation-transfer-backend" in _argv(worker_config(cfg, "prefill", 0, 9000), "0.5.9")
