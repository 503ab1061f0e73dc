#!/usr/bin/env bash
# NVIDIA's perf_analyzer against a running server's streaming model, as an outside check of
# `make bench`'s figures.
#
#   make serve &                          # any running server (HTTP 8000, gRPC 8001)
#   make perf-analyzer                    # = scripts/perf_analyzer.sh: concurrency 1, 4, 8, 16
#   CONCURRENCY="1 2" GRPC_URL=host:8001 scripts/perf_analyzer.sh -p 10000   # extra args go to perf_analyzer
#   MODEL=chattts_ensemble scripts/perf_analyzer.sh   # the ensemble door (make perf-analyzer PA_MODEL=...)
#
# What it runs, per concurrency level C:
#   perf_analyzer -m chattts -i grpc -u $GRPC_URL --streaming \
#     --input-data loadtest/perf_analyzer_input.json --concurrency-range C:C \
#     -p $MEASUREMENT_INTERVAL_MS -s $STABILITY_PCT -H "triton-grpc-protocol-chattts-admin-token:$CHATTTS_ADMIN_TOKEN" \
#     -f results/perf_analyzer/c$C.csv --profile-export-file results/perf_analyzer/c$C.json
# and prints one row per level from its output and the exported per-request response
# timestamps: streams/s, responses/s, and the time to the first response (the first audio
# chunk) and to the last (the stream's end). perf_analyzer 2.41 says it measures a decoupled
# model's latency at the first response, but the latency it prints for `chattts` matches the
# last response (measured with the export), hence the export. It reads the
# server's statistics API, an admin API here: the token comes from $CHATTTS_ADMIN_TOKEN, else
# the token file chattts-serve keeps (chattts_serving/deploy/admin.py).
#
# The tool lives in its own virtual environment ($TOOLS_VENV, default build/perf-tools), not
# the project's: the current perf_analyzer package on PyPI is a placeholder; the binary ships
# in the tritonclient 2.41.0 manylinux wheel and needs Debian's libb64-0d and libcudart.so.12
# (PyPI nvidia-cuda-runtime-cu12, put on LD_LIBRARY_PATH); it then runs on CPU hosts too.
#
# Knobs (environment): GRPC_URL (127.0.0.1:8001), MODEL (chattts, or chattts_ensemble: the same
# inputs; its time to the last response includes the empty final one), INPUT_DATA
# (loadtest/perf_analyzer_input.json), CONCURRENCY ("1 4 8 16"), MEASUREMENT_INTERVAL_MS
# (10000), STABILITY_PCT (30: perf_analyzer's -s, the spread of 3 windows it accepts as
# stable; its default of 10 never settles on a busy 2-core host), OUT_DIR
# (results/perf_analyzer), TOOLS_VENV (build/perf-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
GRPC_URL=${GRPC_URL:-127.0.0.1:8001}
MODEL=${MODEL:-chattts}
INPUT_DATA=${INPUT_DATA:-loadtest/perf_analyzer_input.json}
CONCURRENCY=${CONCURRENCY:-1 4 8 16}
MEASUREMENT_INTERVAL_MS=${MEASUREMENT_INTERVAL_MS:-10000}
STABILITY_PCT=${STABILITY_PCT:-30}
OUT_DIR=${OUT_DIR:-results/perf_analyzer}
TOOLS_VENV=${TOOLS_VENV:-build/perf-tools}
PY=${PYTHON:-python3}

[ -f "$INPUT_DATA" ] || { echo "perf_analyzer.sh: no input data file $INPUT_DATA" >&2; exit 2; }
for c in $CONCURRENCY; do
  [[ "$c" =~ ^[1-9][0-9]*$ ]] || { echo "perf_analyzer.sh: CONCURRENCY must be positive integers, got '$c'" >&2; exit 2; }
done
for v in MEASUREMENT_INTERVAL_MS STABILITY_PCT; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "perf_analyzer.sh: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done

if ! ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
  echo "perf_analyzer.sh: installing Debian's libb64-0d (perf_analyzer links it)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends libb64-0d >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends libb64-0d >/dev/null; } \
    || { echo "perf_analyzer.sh: install libb64-0d (Debian/Ubuntu) by hand" >&2; exit 1; }
fi
if [ ! -x "$TOOLS_VENV/bin/perf_analyzer" ]; then
  echo "perf_analyzer.sh: creating the tools venv $TOOLS_VENV (tritonclient 2.41.0 carries perf_analyzer)"
  "$PY" -m venv "$TOOLS_VENV"
  "$TOOLS_VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "tritonclient==2.41.0" "nvidia-cuda-runtime-cu12==12.9.79"
fi
CUDART_DIR=$("$TOOLS_VENV/bin/python" -c \
  "import nvidia.cuda_runtime, os; print(os.path.join(nvidia.cuda_runtime.__path__[0], 'lib'))")
export LD_LIBRARY_PATH="$CUDART_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The admin token for the statistics API: the environment, else the token file.
HEADER_VALUE=$(.venv/bin/python -c "from chattts_serving.deploy.admin import GRPC_ADMIN_HEADER as h, token_from_env as t
print(f'{h}:{t()}' if t() else '')")
HEADER=()
if [ -n "$HEADER_VALUE" ]; then
  HEADER=(-H "$HEADER_VALUE")
else
  echo "perf_analyzer.sh: no admin token (CHATTTS_ADMIN_TOKEN): perf_analyzer's statistics calls will be refused" >&2
fi

mkdir -p "$OUT_DIR"
summarise() {  # summarise C LOG PROFILE_JSON: one table row from perf_analyzer's output and export
  "$TOOLS_VENV/bin/python" - "$@" <<'PY'
import json, re, sys
import numpy as np
c, log, export = sys.argv[1:4]
text = open(log).read()
streams = float(re.search(r"^\s*Throughput: ([\d.]+)", text, re.M).group(1))
responses = float(re.search(r"Response Throughput: ([\d.]+)", text).group(1))
reqs = [r for e in json.load(open(export))["experiments"] for r in e["requests"] if r["response_timestamps"]]
first = np.array([(r["response_timestamps"][0] - r["timestamp"]) / 1e6 for r in reqs])
last = np.array([(r["response_timestamps"][-1] - r["timestamp"]) / 1e6 for r in reqs])
q = lambda a, p: float(np.percentile(a, p))
print(f"{c:>11} {streams:>9.2f} {responses:>11.2f} {len(reqs):>8} {q(first, 50):>9.0f} {q(first, 90):>9.0f} "
      f"{q(first, 99):>9.0f} {q(last, 50):>9.0f} {q(last, 90):>9.0f} {q(last, 99):>9.0f}")
PY
}
printf '%11s %9s %11s %8s %9s %9s %9s %9s %9s %9s\n' concurrency streams/s responses/s requests \
  "first p50" "first p90" "first p99" "end p50" "end p90" "end p99"
for c in $CONCURRENCY; do
  log="$OUT_DIR/c$c.txt"
  "$TOOLS_VENV/bin/perf_analyzer" -m "$MODEL" -i grpc -u "$GRPC_URL" --streaming --input-data "$INPUT_DATA" \
    --concurrency-range "$c:$c" -p "$MEASUREMENT_INTERVAL_MS" -s "$STABILITY_PCT" "${HEADER[@]}" \
    -f "$OUT_DIR/c$c.csv" --profile-export-file "$OUT_DIR/c$c.json" "$@" > "$log" 2>&1 \
    || { echo "perf_analyzer failed at concurrency $c:" >&2; tail -20 "$log" >&2; exit 1; }
  summarise "$c" "$log" "$OUT_DIR/c$c.json"
done
echo "(latencies in ms from sending: first = first response, the first audio chunk; end = last response," \
     "the stream's end; perf_analyzer's own 'latency' lines match the end here, not the first response)"
echo "perf_analyzer.sh: reports in $OUT_DIR/c<N>.txt, CSV c<N>.csv, per-request timestamps c<N>.json"
