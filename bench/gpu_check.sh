#!/usr/bin/env bash
# One command for a CUDA machine (H100/H200): the engine serving a random-weight model end to end,
# the kernel correctness sweep (fp16, bf16, a pool over 4 GiB), then the decode bandwidth sweep;
# report in $OUT/gpu.md (or docs/gpu.md). < 8 minutes (the script's watchdog and `timeout` below).
# Uses the machine's python3 (its torch + triton); radixd is imported from this checkout.
# Extra arguments go to bench/gpu_check.py (e.g. --dry-run on a CPU-only machine).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"
exec timeout --signal=INT 470 "$PY" bench/gpu_check.py "$@"
