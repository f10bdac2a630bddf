#!/usr/bin/env bash
# NVML GPU telemetry check on a machine with an NVIDIA GPU and PyTorch: samples GPU 0 (the first entry
# of CUDA_VISIBLE_DEVICES when set) idle, under a bf16 matmul load, and idle again, and checks that
# power, utilisation and the energy counter follow the load (python -m orchestrator.telemetry.gpu_check).
#
#   scripts/gpu_telemetry_check.sh [--seconds 8] [--hz 10] [--out DIR]
#   env: PARASWEEP_PYTHON (default: the repository's .venv/bin/python, else python3)
#
# Exit codes are the module's: 0 pass, 1 telemetry did not follow the load, 2 no NVML / no PyTorch+CUDA.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PARASWEEP_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"

# the output directory: the one given, else a fresh one under runs/ (so we can say where it went)
OUT=""
prev=""
for arg in "$@"; do
    case "$arg" in
        --out=*) OUT="${arg#--out=}" ;;
        *) [ "$prev" = "--out" ] && OUT="$arg" ;;
    esac
    prev="$arg"
done
ARGS=("$@")
if [ -z "$OUT" ]; then
    OUT="$ROOT/runs/gpu-check/$(date +%Y%m%d-%H%M%S)"
    ARGS+=(--out "$OUT")
fi

# the checkout on the module path, without changing directory (a relative --out stays relative to here)
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m orchestrator.telemetry.gpu_check "${ARGS[@]}"
rc=$?
if [ -f "$OUT/gpu.parquet" ]; then
    echo "gpu_telemetry_check: samples in $OUT/gpu.parquet (and gpu.jsonl)"
fi
exit $rc
