# Sourced by the scripts that run real SGLang on a GPU node (gpu_smoke.sh, gpu_first_node.sh): picks
# the interpreters and the model, and skips (exit 0, one line naming the script) where the node has no
# GPU or no SGLang. Sets ROOT, PY, ENGINE_PY, MODEL, GPUS and VERSION.
#   env: PARASWEEP_PYTHON (runs parasweep; default .venv/bin/python, else python3), SGLANG_PYTHON (has
#        SGLang; default the same), MODEL (a conf/model name; default tiny-test)
# shellcheck shell=bash
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PARASWEEP_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
ENGINE_PY="${SGLANG_PYTHON:-$PY}"
MODEL="${MODEL:-tiny-test}"
SCRIPT_NAME="$(basename "$0" .sh)"

skip() { echo "$SCRIPT_NAME: SKIP: $*"; exit 0; }

# a GPU, as NVML sees it (the same check parasweep's engine=auto uses)
GPUS="$(cd "$ROOT" && "$PY" -c 'from orchestrator.gpus import local_gpu_count; print(local_gpu_count())' \
        2>/dev/null || echo 0)"
[ "${GPUS:-0}" -gt 0 ] || skip "no GPU visible to NVML on this machine"
# SGLang in the engine interpreter (a broken install is a failure, not a skip)
if ! "$ENGINE_PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("sglang") is None)'; then
    skip "SGLang is not installed for $ENGINE_PY (set SGLANG_PYTHON to an interpreter that has it)"
fi
VERSION="$("$ENGINE_PY" -c 'import sglang; print(sglang.__version__)' 2>/dev/null | tail -n 1)"
export ROOT PY ENGINE_PY MODEL GPUS VERSION
