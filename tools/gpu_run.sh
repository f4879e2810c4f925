#!/usr/bin/env bash
# The GPU call: python -m attnbook gpu_run, run from the repository's root without installing it
# (a lent GPU machine has its own PyTorch and no package index). Its files go to $OUT (the device
# tool's folder; gpu-call-out/ by default). Before the call, once, here: `make gpu-data`, which
# copies Multi30k into .gpu_data/ (ignored by git; name it in the call's carry).
#   bash tools/gpu_run.sh              # on a GPU: at most nine minutes
#   bash tools/gpu_run.sh --dry-run    # the same parts at tiny sizes on the CPU (make test runs it)
# Other options go to the command (python -m attnbook gpu_run --help).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-call-out}"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
# The command keeps its own deadline (nine minutes); this one only stops a hung interpreter.
timeout 600 "$PY" -m attnbook gpu_run --out "$OUT" "$@"
