#!/usr/bin/env bash
# make demo: broker, topics, worker, GPU telemetry, eight hours of replayed
# history with an incident (fast), then a live minute of traffic with a live
# SLI table, then a report of SLIs and breaches. Stops everything it started.
#
# The demo resets the local broker under $STATE (fresh broker + fresh worker
# state together: faust's recovery consistency check, SPEC.md §7).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE="${STATE:-$PWD/.state}"
BIN="${BIN:-$PWD/.venv/bin}"
LIVE_S="${DEMO_LIVE_S:-60}"
HISTORY_S="${DEMO_HISTORY_S:-28800}"
DEMO_DIR="$STATE/demo"
export TAILGUARD_STATE_DIR="$STATE"
export TAILGUARD_BROKER="${TAILGUARD_BROKER:-127.0.0.1:9092}"

pids=()
cleanup() {
  set +e
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  echo "· stopping the broker"
  infra/kafka/kafka.sh down
}
trap cleanup EXIT INT TERM

echo "· fresh local broker (state in $STATE/kafka)"
infra/kafka/kafka.sh reset >/dev/null
infra/kafka/kafka.sh up
"$BIN/tailguard" topics create

rm -rf "$DEMO_DIR"; mkdir -p "$DEMO_DIR"
echo "· worker (log: $DEMO_DIR/worker.log)"
"$BIN/tailguard" worker --data-dir "$DEMO_DIR/worker" --snapshot-interval 2 \
  --lateness-ms 10000 --loglevel warning >"$DEMO_DIR/worker.log" 2>&1 &
pids+=($!)

echo "· GPU telemetry (simulated NVML; gpu-node-01 under thermal/power pressure)"
"$BIN/tailguard" gpu-sampler --simulate --interval 2 --pressure "gpu-node-01:0:100000" --quiet \
  >"$DEMO_DIR/gpu.log" 2>&1 &
pids+=($!)

echo "· history: $((HISTORY_S / 3600)) h of traffic at full speed; TTFT collapse (cache-miss storm + batching + throttling) on model llama-3.1-8b-instruct (served by gpu-node-01) from 2:00 to 2:30"
"$BIN/tailguard" simulate --rate 3 --duration "$HISTORY_S" --seed 7 --pace max \
  --incident "silent_collapse:7200:9000:model=llama-3.1-8b-instruct" >"$DEMO_DIR/history.log" 2>&1 \
  || { echo "simulator failed:"; tail -20 "$DEMO_DIR/history.log"; exit 1; }
tail -1 "$DEMO_DIR/history.log"

echo "· live: 20 req/s for ${LIVE_S}s (watch the open minute move; Ctrl-C ends the demo)"
"$BIN/tailguard" simulate --rate 20 --duration "$LIVE_S" --seed 42 --pace realtime \
  >"$DEMO_DIR/live.log" 2>&1 &
pids+=($!)
"$BIN/tailguard" watch --window 5m --duration "$((LIVE_S + 5))" || true
sleep 3
"$BIN/tailguard" report --idle 5 --out "$DEMO_DIR/report"
echo "· heatmaps and the HTML report: $DEMO_DIR/report/index.html"
