"""Simulated GPU telemetry: the rows an NVML sampler would read, computed from the replica model.

``GET /parasweep_sim/gpus`` (``server.py``) serves ``gpu_rows`` at request time; predictions
(``predict.py``) integrate the same power model over a point's window. One row per simulated GPU, in
SGLang's placement (``vocab.telemetry.engine_layout``), with the ``GPU_COLUMNS`` except ``ts`` (the
sampler stamps it). Every number is the simulator's model, not a measurement (docs/simulator.md,
"GPU telemetry"):

* power: idle + busy fraction x (limit - idle); the busy fraction is the stage's over the last
  simulated second (NVML averages board power over about one second too);
* energy: the exact integral of that power over simulated time since the server started,
  idle x t + (limit - idle) x busy seconds (J of simulated time: at ``--sim-time-scale`` F a wall
  second holds F simulated seconds of energy);
* utilisation: the busy fraction x 100, for the GPU and for memory alike (every modelled forward
  streams the stage's weights, so the memory is treated as busy whenever the stage is);
* memory: what NVML shows of an SGLang server, which allocates its KV pool and CUDA graphs once at
  startup: weights + the whole KV pool + graph memory + a CUDA context; constant while serving.

Nothing else is modelled: clocks, temperature and PCIe traffic are NaN, and nothing throttles.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vocab.telemetry import engine_layout

if TYPE_CHECKING:
    from simulator.replica import ReplicaModel
    from simulator.sim_config import SimConfig
    from vocab.hardware import HardwareConf

GPUS_PATH = "/parasweep_sim/gpus"
# what a server playing another engine than SGLang is and on which clock it runs (it has no /server_info)
SIM_INFO_PATH = "/parasweep_sim/info"

# Device memory a process holds besides its tensors: the CUDA context, cuBLAS/NCCL workspaces. Taken
# as the constant term (512 MiB) of SGLang's reserve arithmetic (resolve.py, mem_fraction_static); an
# assumption, not a measurement.
CONTEXT_BYTES = 512 * 2**20

NAN = float("nan")


def power_w(hw: HardwareConf, busy_fraction: float) -> float:
    """The power model: linear in the busy fraction between the profile's idle and limit."""
    return hw.idle_power_w + busy_fraction * (hw.power_limit_w - hw.idle_power_w)


def energy_j(hw: HardwareConf, seconds: float, busy_s: float) -> float:
    """The power model integrated over ``seconds`` of which ``busy_s`` were busy (exact: it is linear)."""
    return hw.idle_power_w * seconds + (hw.power_limit_w - hw.idle_power_w) * busy_s


def mem_used_bytes(cfg: SimConfig, stage: int) -> float:
    """Device memory in use on a GPU of PP stage ``stage`` (see the module doc), at most the GPU's."""
    st = cfg.stages[stage]
    used = st.weight_bytes + st.kv_bytes + st.graph_bytes + CONTEXT_BYTES
    return min(used, cfg.hw.memory_gb * 1e9)


def gpu_rows(cfg: SimConfig, replicas: Sequence[ReplicaModel], now: float) -> list[dict[str, Any]]:
    """One row per simulated GPU at simulated time ``now`` (columns: ``GPU_COLUMNS`` without ``ts``)."""
    hw = cfg.hw
    total = hw.memory_gb * 1e9
    per_stage: dict[tuple[int, int], tuple[float, float]] = {}  # (dp, pp) -> (busy fraction, busy s)
    rows = []
    for place in engine_layout(cfg.rank_tp, cfg.pp, cfg.schedulers):
        key = (place.dp, place.pp)
        if key not in per_stage:  # every TP rank of a stage has the stage's busy time
            busy = replicas[place.dp].busy[place.pp]
            per_stage[key] = (busy.busy_fraction(now), busy.busy_total(now))
        frac, busy_s = per_stage[key]
        rows.append({
            "gpu": place.gpu,
            "uuid": f"sim-{place.gpu}",
            "power_w": power_w(hw, frac),
            "power_limit_w": hw.power_limit_w,
            "util_gpu_pct": 100.0 * frac,
            "util_mem_pct": 100.0 * frac,
            "sm_clock_mhz": NAN,
            "mem_used_bytes": mem_used_bytes(cfg, place.pp),
            "mem_total_bytes": total,
            "pcie_tx_bytes_s": NAN,
            "pcie_rx_bytes_s": NAN,
            "temp_c": NAN,
            "throttle_reasons": 0,
            "energy_j": energy_j(hw, now, busy_s),
        })
    return rows
