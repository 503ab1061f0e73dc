#!/usr/bin/env bash
# The gpu profile's checks on a CUDA host (fp16 export + parity on CUDA, IO binding on CUDA,
# step benchmark, server TTFA/RTF at concurrency 1 and 16) -> results/gpu_check.json.
# NOT RUN YET: prepared on a CPU-only host. See scripts/gpu_check.py for the steps.
# Usage: scripts/gpu_check.sh [--quick]    (target: under 5 minutes; --quick: small config only)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
exec timeout 600 "$PY" scripts/gpu_check.py "$@"
