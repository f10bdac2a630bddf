"""Record AIConfigurator's static step-time estimates as a test fixture.

Runs ``aiconfigurator cli estimate --estimate-mode static`` (AIConfigurator 0.12.0, SGLang 0.5.14
performance tables, database mode SILICON) for a fixed set of models, systems, parallel layouts and
batch sizes (isl=1024, osl=128), parses the summary it prints (TTFT, TPOT, throughput, memory, the
speed-of-light TTFT/TPOT of ``--detail time``, warnings), and writes
``tests/fixtures/aiconfigurator/static-<version>.json``.

The CLI prints only its twelve largest ops per phase, so the complete per-op breakdown comes from
the same estimate made through AIConfigurator's Python API (``aiconfigurator.cli.api.cli_estimate``
with the same arguments); the script checks that its TTFT and TPOT equal what the CLI printed.

``moonshotai/Kimi-K2-Instruct`` is not in AIConfigurator's list of offline models, although its
config.json ships with the package; the script copies that file to
``<models-dir>/moonshotai/Kimi-K2-Instruct/config.json`` and passes the directory as ``--model-path``.

Rerun (no GPU needed; about a minute on two cores)::

    python -m venv /tmp/aicvenv && /tmp/aicvenv/bin/pip install aiconfigurator==0.12.0
    /tmp/aicvenv/bin/python scripts/aiconfigurator_static.py

The interpreter must be the one AIConfigurator is installed in; the CLI is taken from its ``bin``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.resources
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOOL = "aiconfigurator"
BACKEND = "sglang"
BACKEND_VERSION = "0.5.14"
DATABASE_MODE = "SILICON"
ESTIMATE_MODE = "static"
ISL = 1024
OSL = 128
STRIDE = 32  # the CLI default: decode steps are sampled every 32 output tokens
BATCHES = (1, 8, 32)
BF16 = (("gemm", "bfloat16"), ("kvcache", "bfloat16"), ("fmha", "bfloat16"))
REPO = Path(__file__).resolve().parents[1]
MODELS_DIR = Path(tempfile.gettempdir()) / "aiconfigurator-models"


@dataclass(frozen=True)
class Config:
    name: str
    model: str  # Hugging Face id
    system: str
    tp: int
    pp: int
    moe_tp: int | None
    moe_ep: int | None
    quant: tuple[tuple[str, str], ...]  # (gemm|kvcache|fmha|moe, mode), passed as --<kind>-quant-mode
    local_config: bool = False  # not in AIConfigurator's offline list: pass a directory with its config


CONFIGS = (
    Config("kimi-k2 tp8 rtx_pro_6000_server", "moonshotai/Kimi-K2-Instruct", "rtx_pro_6000_server",
           tp=8, pp=1, moe_tp=8, moe_ep=1, quant=(*BF16, ("moe", "int4_wo")), local_config=True),
    Config("kimi-k2 pp8 rtx_pro_6000_server", "moonshotai/Kimi-K2-Instruct", "rtx_pro_6000_server",
           tp=1, pp=8, moe_tp=1, moe_ep=1, quant=(*BF16, ("moe", "int4_wo")), local_config=True),
    Config("llama-3.1-70b tp4 h200_sxm", "meta-llama/Meta-Llama-3.1-70B", "h200_sxm",
           tp=4, pp=1, moe_tp=None, moe_ep=None, quant=BF16),
    Config("llama-3.1-70b tp8 h200_sxm", "meta-llama/Meta-Llama-3.1-70B", "h200_sxm",
           tp=8, pp=1, moe_tp=None, moe_ep=None, quant=BF16),
    Config("qwen3-30b-a3b ep8 h100_sxm", "Qwen/Qwen3-30B-A3B", "h100_sxm",
           tp=8, pp=1, moe_tp=1, moe_ep=8, quant=(*BF16, ("moe", "bfloat16"))),
)

# Lines of the CLI's summary box and of its `--detail time` latency table.
SUMMARY_PATTERNS = {
    "backend_version": re.compile(r"^\s*Backend:\s+\S+ \(([^)]+)\)", re.M),
    "ttft_ms": re.compile(r"^\s*TTFT:\s+([\d.]+) ms", re.M),
    "tpot_ms": re.compile(r"^\s*TPOT:\s+([\d.]+) ms", re.M),
    "request_latency_ms": re.compile(r"^\s*Request Latency:\s+([\d.]+) ms", re.M),
    "tokens_per_s": re.compile(r"^\s*tokens/s:\s+([\d,.]+)", re.M),
    "tokens_per_s_per_gpu": re.compile(r"^\s*tokens/s/gpu:\s+([\d,.]+)", re.M),
    "tokens_per_s_per_user": re.compile(r"^\s*tokens/s/user:\s+([\d,.]+)", re.M),
    "seq_per_s": re.compile(r"^\s*seq/s:\s+([\d,.]+)", re.M),
    "memory_gb": re.compile(r"^\s*Memory \(GPU\):\s+([\d.]+) GB", re.M),
    "sol_ttft_ms": re.compile(r"^\s*ttft\s+[\d.]+ ms\s+([\d.]+) ms", re.M),
    "sol_tpot_ms": re.compile(r"^\s*tpot\s+[\d.]+ ms\s+([\d.]+) ms", re.M),
}
WARNING = re.compile(r"\[W\] \[[^\]]+\] (.*)")
DEPRECATION = "deprecated AIConfigurator distribution"


def model_path(cfg: Config, models_dir: Path) -> str:
    """The --model-path for a config: its Hugging Face id, or a directory holding the shipped config."""
    if not cfg.local_config:
        return cfg.model
    shipped = importlib.resources.files("aiconfigurator_core") / "model_configs"
    source = shipped / f"{cfg.model.replace('/', '--')}_config.json"
    target = models_dir / cfg.model
    target.mkdir(parents=True, exist_ok=True)
    with importlib.resources.as_file(source) as path:
        shutil.copyfile(path, target / "config.json")
    return str(target)


def estimate_kwargs(cfg: Config, path: str, batch: int) -> dict[str, Any]:
    """Keyword arguments of `cli_estimate`, the same estimate as `cli_argv`."""
    kwargs: dict[str, Any] = {
        "model_path": path,
        "system_name": cfg.system,
        "mode": ESTIMATE_MODE,
        "backend_name": BACKEND,
        "backend_version": BACKEND_VERSION,
        "database_mode": DATABASE_MODE,
        "isl": ISL,
        "osl": OSL,
        "stride": STRIDE,
        "batch_size": batch,
        "tp_size": cfg.tp,
        "pp_size": cfg.pp,
        "moe_tp_size": cfg.moe_tp,
        "moe_ep_size": cfg.moe_ep,
    }
    kwargs.update({f"{kind}_quant_mode": mode for kind, mode in cfg.quant})
    return kwargs


def cli_argv(kwargs: dict[str, Any]) -> list[str]:
    """`aiconfigurator cli estimate` arguments for `estimate_kwargs`."""
    flags = {"model_path": "--model-path", "system_name": "--system", "mode": "--estimate-mode",
             "backend_name": "--backend", "backend_version": "--perf-db-version"}
    argv = ["cli", "estimate"]
    for key, value in kwargs.items():
        if value is not None:
            argv += [flags.get(key, "--" + key.replace("_", "-")), str(value)]
    return [*argv, "--detail", "time", "--no-color"]


def parse_cli(output: str) -> dict[str, Any]:
    """Numbers and warnings from the CLI's output; a missing number is None."""
    parsed: dict[str, Any] = {}
    for key, pattern in SUMMARY_PATTERNS.items():
        match = pattern.search(output)
        value = match.group(1) if match else None
        parsed[key] = value if key == "backend_version" or value is None else float(value.replace(",", ""))
    warnings = [m.group(1).strip() for m in WARNING.finditer(output) if DEPRECATION not in m.group(1)]
    parsed["warnings"] = list(dict.fromkeys(warnings))
    parsed["oom"] = any(w.startswith("OOM:") for w in parsed["warnings"])
    return parsed


def api_estimate(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Complete per-op breakdown and resolved settings of the same estimate, through the Python API."""
    from aiconfigurator.cli.api import cli_estimate

    result = cli_estimate(**kwargs)
    summary = result.summary
    context: dict[str, float] = summary.get_context_latency_dict()
    generation: dict[str, float] = summary.get_generation_latency_dict()
    sources = {**summary.get_context_source_dict(), **summary.get_generation_source_dict()}
    steps = OSL - 1  # TPOT = generation latency / (osl - 1)
    raw = result.raw
    return {
        "ttft_ms": result.ttft,
        "tpot_ms": result.tpot,
        "prefill_ms": round(sum(context.values()), 4),
        "decode_step_ms": round(sum(generation.values()) / steps, 4),
        "resolved": {key: raw[key] for key in ("parallel", "gemm", "kvcache", "fmha", "moe", "comm")},
        "breakdown": {
            "context_ms": {op: round(ms, 4) for op, ms in context.items()},
            "decode_step_ms": {op: round(ms / steps, 4) for op, ms in generation.items()},
            "source": sources,
        },
    }


def run_one(cfg: Config, batch: int, cli: Path, models_dir: Path) -> dict[str, Any]:
    kwargs = estimate_kwargs(cfg, model_path(cfg, models_dir), batch)
    argv = cli_argv(kwargs)
    entry: dict[str, Any] = {
        "name": cfg.name, "model": cfg.model, "system": cfg.system, "tp": cfg.tp, "pp": cfg.pp,
        "moe_tp": cfg.moe_tp, "moe_ep": cfg.moe_ep, "batch": batch, "command": [TOOL, *argv],
    }
    proc = subprocess.run([str(cli), *argv], capture_output=True, text=True, check=False)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        errors = [line.strip() for line in output.splitlines() if "error" in line.lower()
                  and DEPRECATION not in line]
        entry.update(ttft_ms=None, tpot_ms=None, prefill_ms=None, decode_step_ms=None, breakdown=None,
                     error="\n".join(errors) or output.strip()[-2000:])
        return entry
    cli_numbers = parse_cli(output)
    if cli_numbers.pop("backend_version") != BACKEND_VERSION:
        raise RuntimeError(f"{cfg.name} bs={batch}: the CLI did not use SGLang {BACKEND_VERSION} tables")
    api = api_estimate(kwargs)
    for key in ("ttft_ms", "tpot_ms"):
        if abs(api.pop(key) - cli_numbers[key]) > 6e-4:  # the CLI prints three decimals
            raise RuntimeError(f"{cfg.name} bs={batch}: API {key} differs from the CLI's")
    entry.update(cli_numbers)
    entry.update(api)
    entry["error"] = None
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description="Record AIConfigurator's static estimates as a fixture.")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: tests/fixtures/aiconfigurator/static-<version>.json")
    parser.add_argument("--models-dir", type=Path, default=MODELS_DIR,
                        help="where model configs missing from AIConfigurator's offline list are copied")
    args = parser.parse_args()

    version = importlib.metadata.version(TOOL)
    cli = Path(sys.executable).with_name(TOOL)
    if not cli.exists():
        sys.exit(f"{cli} not found: run this script with the Python that AIConfigurator is installed in")
    out = args.out or REPO / "tests" / "fixtures" / "aiconfigurator" / f"static-{version}.json"
    configs = []
    for cfg in CONFIGS:
        for batch in BATCHES:
            entry = run_one(cfg, batch, cli, args.models_dir)
            configs.append(entry)
            print(f"{cfg.name} bs={batch}: ttft={entry['ttft_ms']} tpot={entry['tpot_ms']} "
                  f"error={entry['error']}", file=sys.stderr)
    fixture = {
        "tool": TOOL,
        "version": version,
        "core_version": importlib.metadata.version("aiconfigurator-core"),
        "generated": datetime.date.today().isoformat(),
        "backend": BACKEND,
        "backend_version": BACKEND_VERSION,
        "database_mode": DATABASE_MODE,
        "estimate_mode": ESTIMATE_MODE,
        "stride": STRIDE,
        "isl": ISL,
        "osl": OSL,
        "configs": configs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
