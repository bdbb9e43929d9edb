#!/usr/bin/env bash
# The one GPU-machine call of the GPU checks (issues 31-33): install the carried wheels (.whl: what the
# machine lacks, e.g. pydantic), then bench/gpu/gpu_checks.py on the carried inputs (.gpudata, made by
# bench/gpu/gpu_prepare.py). Output: $OUT/gpu_checks.json, $OUT/gpu_checks.log. Extra arguments go to
# gpu_checks.py (e.g. --budget 300).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-checks-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
export DATAPIPE_CACHE_DIR=${DATAPIPE_CACHE_DIR:-/tmp/datapipe-cache}
python -m bench.gpu.gpu_checks --data .gpudata --json "$OUT/gpu_checks.json" "$@" 2>&1 | tee "$OUT/gpu_checks.log"
