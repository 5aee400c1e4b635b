#!/usr/bin/env bash
# make demo: broker, topics, worker, a minute of realistic traffic with an
# incident, a live SLI table, then a report. Stops everything it started.
#
# The demo resets the local broker under $STATE (fresh broker + fresh worker
# state together: faust's recovery consistency check, SPEC.md §7).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE="${STATE:-$PWD/.state}"
BIN="${BIN:-$PWD/.venv/bin}"
DURATION="${DEMO_DURATION:-75}"
RATE="${DEMO_RATE:-40}"
DEMO_DIR="$STATE/demo"
export TAILGUARD_STATE_DIR="$STATE"
export TAILGUARD_BROKER="${TAILGUARD_BROKER:-127.0.0.1:9092}"

worker_pid=""
sim_pid=""
cleanup() {
  set +e
  [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null && wait "$sim_pid" 2>/dev/null
  if [ -n "$worker_pid" ] && kill -0 "$worker_pid" 2>/dev/null; then
    echo "· stopping the worker"
    kill -TERM "$worker_pid"; wait "$worker_pid" 2>/dev/null
  fi
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
"$BIN/tailguard" worker --data-dir "$DEMO_DIR/worker" --snapshot-interval 2 --loglevel warning \
  >"$DEMO_DIR/worker.log" 2>&1 &
worker_pid=$!

echo "· simulator: ${RATE} req/s for ${DURATION}s; silent collapse on service chat from 25s to 55s"
"$BIN/tailguard" simulate --rate "$RATE" --duration "$DURATION" --seed 42 --pace realtime \
  --incident "silent_collapse:25:55:service=chat" >"$DEMO_DIR/simulator.log" 2>&1 &
sim_pid=$!

"$BIN/tailguard" watch --window 1m --duration "$((DURATION + 10))" || true
wait "$sim_pid" || { echo "simulator failed:"; tail -20 "$DEMO_DIR/simulator.log"; exit 1; }
sim_pid=""
sleep 3
"$BIN/tailguard" report --idle 5
