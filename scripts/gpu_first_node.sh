#!/usr/bin/env bash
# The first run on a GPU node with real SGLang: a two-trial sweep (TP and PP) of a small model with
# dummy weights through `python run.py -m`, then a check of everything parasweep reads from the engine
# (/server_info's resolved values, the start-up and batch log lines, the /metrics series per pipeline
# stage, the NVML samples) against what the adapter expects, and a bundle of the raw files to send back.
# Skips with exit 0 where SGLang or a GPU is missing; exits 1 when anything differs.
#
#   scripts/gpu_first_node.sh [extra Hydra overrides...]
#   env: PARASWEEP_PYTHON (runs parasweep; default .venv/bin/python), SGLANG_PYTHON (has SGLang;
#        default the same), MODEL (a conf/model name; default tiny-test), OUT_DIR (default a temp dir)
set -euo pipefail

# interpreters, model, GPU and SGLang (or a one-line skip): scripts/sglang_node.sh
# shellcheck source=scripts/sglang_node.sh
source "$(dirname "${BASH_SOURCE[0]}")/sglang_node.sh"

# TP and PP need two GPUs; with one, the TP1 trial alone (the PP checks are then not made)
if [ "$GPUS" -ge 2 ]; then LAYOUTS="parallelism=tp2,pp2"; NGPUS=2; else LAYOUTS="parallelism=tp1"; NGPUS=1; fi
echo "gpu_first_node: SGLang $VERSION ($ENGINE_PY), $GPUS GPU(s), model=$MODEL, $LAYOUTS"

WORK="${OUT_DIR:-$(mktemp -d -t parasweep-first-node.XXXXXX)}"
mkdir -p "$WORK"
cd "$WORK"  # run.py writes runs/ (MLflow store, trial directories) under the working directory
ARGS=(-m engine=sglang "model=$MODEL" "$LAYOUTS" workload=tiny "ray.num_gpus=$NGPUS"
      "engine.python=$ENGINE_PY" engine.startup_timeout_s=900 tracking.experiment=first-node "$@")

echo "gpu_first_node: 1/3 the sweep"
status=0
"$PY" "$ROOT/run.py" "${ARGS[@]}" || status=$?

echo "gpu_first_node: 2/3 what the engine produced against what parasweep reads"
check=0
(cd "$ROOT" && "$PY" -m orchestrator.engines.sglang_compat.trial_check "$WORK/runs") | tee "$WORK/trial_check.txt" \
    || check=$?

echo "gpu_first_node: 3/3 the bundle to send back"
BUNDLE="$WORK/first-node-sglang-$VERSION.tar.gz"
(cd "$WORK" && find runs/multirun -path '*/server/*' -o -path '*/telemetry/server_metrics.jsonl' \
     -o -path '*/telemetry/gpu.jsonl' -o -name error.txt | sort > bundle-files.txt
 echo trial_check.txt >> bundle-files.txt
 tar -czf "$BUNDLE" -T bundle-files.txt)
echo "gpu_first_node: sweep exit $status, check exit $check; bundle: $BUNDLE"
[ "$status" -eq 0 ] && [ "$check" -eq 0 ]
