#!/usr/bin/env bash
# Run the Locust load test (loadtest/locustfile.py) headless against an already-running server.
#
# Parameters (environment):
#   USERS        concurrent simulated users (default 8)
#   SPAWN_RATE   users started per second (default 2)
#   DURATION     run time, Locust syntax: 30s, 5m, 1h (default 60s)
#   USER_CLASSES space-separated classes to run (default: GrpcStreamUser SseStreamUser
#                HttpOfflineUser, and GatewaySpeechUser when CHATTTS_GATEWAY_PORT is set; users are
#                spread over them evenly)
#   OUT_DIR      where the reports go (default results/loadtest): locust_stats.csv,
#                locust_failures.csv, locust_exceptions.csv, locust_stats_history.csv,
#                report.html, audio_summary.json (chunks and audio seconds per request type)
#   STOP_TIMEOUT seconds to let in-flight requests finish at the end (default 0: stop at once)
#   LOCUST       the locust executable (default .venv/bin/locust, else locust on PATH)
# The server: CHATTTS_HOST (127.0.0.1), CHATTTS_HTTP_PORT (8000), CHATTTS_GRPC_PORT (8001),
# CHATTTS_GATEWAY_PORT (the OpenAI gateway's port; unset: no gateway user), and the
# request knobs CHATTTS_MAX_NEW_TOKENS, CHATTTS_MIN_NEW_TOKENS, CHATTTS_TEXT, CHATTTS_VOICE
# (see the locustfile's docstring).
# Exit status: Locust's (non-zero when any request failed).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"

USERS="${USERS:-8}"
SPAWN_RATE="${SPAWN_RATE:-2}"
DURATION="${DURATION:-60s}"
OUT_DIR="${OUT_DIR:-results/loadtest}"
STOP_TIMEOUT="${STOP_TIMEOUT:-0}"
export CHATTTS_HOST="${CHATTTS_HOST:-127.0.0.1}"
export CHATTTS_HTTP_PORT="${CHATTTS_HTTP_PORT:-8000}"
export CHATTTS_GRPC_PORT="${CHATTTS_GRPC_PORT:-8001}"
export CHATTTS_AUDIO_SUMMARY="$OUT_DIR/audio_summary.json"

if [[ -z "${LOCUST:-}" ]]; then
    if [[ -x "$root/.venv/bin/locust" ]]; then LOCUST="$root/.venv/bin/locust"; else LOCUST="locust"; fi
fi
default_classes="GrpcStreamUser SseStreamUser HttpOfflineUser${CHATTTS_GATEWAY_PORT:+ GatewaySpeechUser}"
read -r -a classes <<< "${USER_CLASSES:-$default_classes}"

if ! curl -sf "http://$CHATTTS_HOST:$CHATTTS_HTTP_PORT/v2/health/ready" > /dev/null; then
    echo "loadtest: no ready server at http://$CHATTTS_HOST:$CHATTTS_HTTP_PORT (start one: chattts-serve)" >&2
    exit 2
fi
mkdir -p "$OUT_DIR"
echo "loadtest: $USERS users (+$SPAWN_RATE/s) for $DURATION against $CHATTTS_HOST" \
     "(HTTP $CHATTTS_HTTP_PORT, gRPC $CHATTTS_GRPC_PORT); reports in $OUT_DIR" >&2
"$LOCUST" -f "$here/locustfile.py" --headless \
    --users "$USERS" --spawn-rate "$SPAWN_RATE" --run-time "$DURATION" --stop-timeout "$STOP_TIMEOUT" \
    --host "http://$CHATTTS_HOST:$CHATTTS_HTTP_PORT" \
    --csv "$OUT_DIR/locust" --html "$OUT_DIR/report.html" --only-summary \
    "${classes[@]}"
