#!/usr/bin/env bash
# GPU smoke test: one short TP1 trial of a small dummy-weight model on real SGLang, end to end through
# `python run.py` (preflight, launch, readiness, resolved config, load, log parsing, teardown, NVML
# release check). Skips with exit 0 where SGLang or a GPU is missing, so CI can call it anywhere.
#
#   scripts/gpu_smoke.sh [extra Hydra overrides...]
#   env: PARASWEEP_PYTHON (runs parasweep; default .venv/bin/python), SGLANG_PYTHON (has SGLang;
#        default the same), MODEL (default tiny-test), SMOKE_DIR (output; default a temp dir)
set -euo pipefail

# interpreters, model, GPU and SGLang (or a one-line skip): scripts/sglang_node.sh
# shellcheck source=scripts/sglang_node.sh
source "$(dirname "${BASH_SOURCE[0]}")/sglang_node.sh"
echo "gpu_smoke: SGLang $VERSION ($ENGINE_PY), $GPUS GPU(s), model=$MODEL"

WORK="${SMOKE_DIR:-$(mktemp -d -t parasweep-gpu-smoke.XXXXXX)}"
mkdir -p "$WORK"
cd "$WORK"  # run.py writes runs/ (MLflow store, trial directories) under the working directory
ARGS=(engine=sglang "model=$MODEL" parallelism=tp1 workload=tiny ray.num_gpus=1
      "engine.python=$ENGINE_PY" engine.startup_timeout_s=900 tracking.experiment=gpu-smoke "$@")

echo "gpu_smoke: 1/3 dry run (preflight against the installed SGLang's flags)"
"$PY" "$ROOT/run.py" dry_run=true "${ARGS[@]}"

echo "gpu_smoke: 2/3 one trial"
"$PY" "$ROOT/run.py" "${ARGS[@]}"

echo "gpu_smoke: 3/3 checks on the trial directory"
"$PY" - "$WORK" "$ROOT" <<'PYEOF'
import json
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[2])  # the parasweep checkout
from orchestrator.gpu_release import wait_gpus_free
from orchestrator.telemetry.server_log import resolved_config, server_log_frame

work = Path(sys.argv[1])
# trial directories (not MLflow's artifact copies): the server wrote its process group id there
infos = sorted((p for p in work.glob("runs/**/server/server_info.json") if (p.parent / "server.pgid").exists()),
               key=lambda p: p.stat().st_mtime)
assert infos, f"no server/server_info.json under {work}/runs: the trial did not reach readiness"
server = infos[-1].parent
trial = server.parent
info = json.loads(infos[-1].read_text())
resolved = resolved_config(info, (server / "server.log").read_text(errors="replace"))
for key in ("version", "max_running_requests", "max_total_num_tokens", "cuda_graph_max_bs_decode_captured",
            "attention_backend", "pp_max_micro_batch_size"):
    print(f"  resolved.{key} = {resolved.get(key)}")
frame = server_log_frame(server / "server.log")
print(f"  server.log: {len(frame)} batch lines ({(frame['kind'] == 'decode').sum() if len(frame) else 0} decode)")
records = trial / "records" / "requests.jsonl"
n = sum(1 for _ in records.open()) if records.exists() else 0
print(f"  records: {n} requests")
failed = (trial / "error.txt").exists()
assert not failed, (trial / "error.txt").read_text()[-2000:]
assert n > 0, "no request records"
assert len(frame) > 0, "no batch lines parsed from server.log"
warnings = wait_gpus_free(None, 60.0)
for w in warnings:
    print(f"  warning: {w}")
print(f"gpu_smoke: OK ({trial})")
PYEOF
