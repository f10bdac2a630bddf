"""FP8-weight GEMMs priced at the GPU's FP8 tensor peak where the roofline prices them (a GPU without
kernel tables): twice the BF16 rate on Hopper, none on Ampere (FP8 weights widened to BF16)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.costs import prefill_shape
from simulator.predict import load_config
from vocab.assets import hardware_dir


def _roofline(model: str, profile: Path, *flags: str):  # type: ignore[no-untyped-def]
    return load_config(["--model-path", f"models/{model}", "--sim-hardware", str(profile),
                        "--sim-step-costs", "roofline", *flags]).cost


def _without_fp8(tmp_path: Path) -> Path:
    data = yaml.safe_load((hardware_dir() / "h20-x8.yaml").read_text()) | {"peak_tflops_fp8": 0.0}
    out = tmp_path / "h20-no-fp8.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def test_fp8_weights_run_at_the_fp8_peak_and_bf16_weights_do_not(tmp_path: Path) -> None:
    h20 = hardware_dir() / "h20-x8.yaml"
    plain = _without_fp8(tmp_path)
    shape = prefill_shape([(8192, 0)])  # compute-bound: the GEMMs' FLOPs set the time
    fp8, widened = (_roofline("qwen3-235b-a22b-fp8", p, "--tp-size", "8") for p in (h20, plain))
    st = fp8.stages[0]
    attn = shape.attn_ctx * st.attn_flops(False)  # BF16 in both
    gemm = fp8.roofline_gpu_time(0, shape) * fp8.p.eta_compute * 148e12 - attn
    gemm_widened = widened.roofline_gpu_time(0, shape) * widened.p.eta_compute * 148e12 - attn
    assert gemm == pytest.approx(gemm_widened / 2, rel=0.02)  # 296 against 148 TFLOP/s
    bf16, bf16_plain = (_roofline("llama-3.1-8b", p) for p in (h20, plain))
    assert bf16.roofline_gpu_time(0, shape) == bf16_plain.roofline_gpu_time(0, shape)
