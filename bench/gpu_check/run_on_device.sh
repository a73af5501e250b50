#!/usr/bin/env bash
# The one prepared command of a lent GPU machine (torch + transformers, no DeepSpeed, no Ray,
# no vLLM, no network): install the carried wheels it lacks, then run the device check.
#
#   bash bench/gpu_check/run_on_device.sh [ARGS of python -m bench.gpu_check]
#
# ARGS default to --real-model (SmolLM2-135M's architecture, ~3 minutes on one H200 with a
# 300 s deadline for starting runs); `--deadline-s 420` (no --real-model) runs the Qwen3-4B
# checks instead. WHEELS (default .wheels, an ignored folder that the run tool carries:
# carry [".wheels"]) holds the wheels, filled as bench/gpu_check/wheels.py says. The JSON goes
# to bench/results/ and, when the run tool's $OUT is set, is copied there (with the log).
# Exit status: the check's (1 when a part failed), 2 when a needed module does not import.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 0 ] && set -- --real-model
log="${OUT:-/tmp}/gpu_check_device.log"
stamp=$(mktemp)
{
    echo "[run_on_device] $(date -u +%FT%TZ) $(python --version 2>&1) in $(pwd)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
    python -m bench.gpu_check.wheels "${WHEELS:-.wheels}" || exit 2
    python -m bench.gpu_check "$@"
} 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
    find bench/results -maxdepth 1 -name 'gpu_check*.json' -newer "$stamp" -exec cp {} "$OUT"/ \;
fi
echo "[run_on_device] exit status $rc (log: $log)"
exit "$rc"
