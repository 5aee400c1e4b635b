#!/usr/bin/env bash
# make demo: broker, topics, worker, GPU telemetry, eight hours of replayed
# history with an incident (fast), a canary rolled back, prompt versions and a
# prompt experiment rolled back on blind human feedback (hallucinations), the
# capacity scenarios (knee and scaling, expert breaker, RAG threshold), then a
# live minute of traffic with a live
# SLI table, then a report of SLIs, breaches and capacity decisions. Stops
# everything it started.
#
# The demo resets the local broker under $STATE (fresh broker + fresh worker
# state together: faust refuses a table store ahead of its changelog topic).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE="${STATE:-$PWD/.state}"
BIN="${BIN:-$PWD/.venv/bin}"
LIVE_S="${DEMO_LIVE_S:-60}"
HISTORY_S="${DEMO_HISTORY_S:-28800}"
NOISY_S="${DEMO_NOISY_S:-2700}"
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
WEB_PORT="${DEMO_WEB_PORT:-6066}"
echo "· worker (log: $DEMO_DIR/worker.log; live dashboard http://127.0.0.1:$WEB_PORT/dashboard, Prometheus http://127.0.0.1:$WEB_PORT/metrics)"
"$BIN/tailguard" worker --data-dir "$DEMO_DIR/worker" --snapshot-interval 2 \
  --lateness-ms 10000 --loglevel warning --web-port "$WEB_PORT" \
  --experiments-file infra/experiments/gateway-canary.yaml \
  --experiments-file infra/experiments/canary.yaml \
  --experiments-file infra/demo/prompt-experiments.yaml >"$DEMO_DIR/worker.log" 2>&1 &
pids+=($!)

echo "· GPU telemetry (simulated NVML; gpu-node-01 under thermal/power pressure)"
"$BIN/tailguard" gpu-sampler --simulate --interval 2 --pressure "gpu-node-01:0:100000" --quiet \
  >"$DEMO_DIR/gpu.log" 2>&1 &
pids+=($!)

# Scenario (b) first, so its event time lies before the history's (each series'
# watermark only moves forward): 45 minutes at 20 req/s with every instance's
# KV-cache snapshot (--kv), ending where the history begins.
NOISY_START_MS=$(( ($(date +%s) - HISTORY_S - NOISY_S - 120) * 1000 ))
echo "· noisy neighbour (scenario b): $((NOISY_S / 60)) min at 20 req/s with KV snapshots; tenant acme sends 4x its load to llama-3.1-8b-instruct from 0:20 to 0:32 (KV fragmentation of its instances 0.08 -> 0.37, the other tenants' P99 about 2x)"
"$BIN/tailguard" simulate --rate 20 --duration "$NOISY_S" --seed 11 --pace max --kv \
  --start-ms "$NOISY_START_MS" \
  --incident "noisy_neighbor:1200:1920:tenant=acme,model=llama-3.1-8b-instruct,intensity=4" \
  >"$DEMO_DIR/noisy.log" 2>&1 \
  || { echo "simulator failed:"; tail -20 "$DEMO_DIR/noisy.log"; exit 1; }
tail -1 "$DEMO_DIR/noisy.log"
echo "· waiting (up to 4 min) for the worker to judge it: an interference breach that opens and resolves"
"$BIN/python" - <<'PY' || echo "  (not judged yet; the worker may still be catching up)"
import json
import os
import sys
import time

from tailguard.catalogue import BREACHES, default_prefix
from tailguard.console import follow

deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    for _key, value, _headers in follow(
        os.environ["TAILGUARD_BROKER"], default_prefix() + BREACHES, from_beginning=True, idle_exit_s=2
    ):
        breach = json.loads(value or b"{}")
        if breach.get("kind") == "interference" and breach.get("state") == "resolved":
            sys.exit(0)
    time.sleep(3)
sys.exit(1)
PY

echo "· history: $((HISTORY_S / 3600)) h of traffic at full speed; TTFT collapse (cache-miss storm + batching + throttling) on model llama-3.1-8b-instruct (served by gpu-node-01) from 2:00 to 2:30"
"$BIN/tailguard" simulate --rate 3 --duration "$HISTORY_S" --seed 7 --pace max \
  --incident "silent_collapse:7200:9000:model=llama-3.1-8b-instruct" >"$DEMO_DIR/history.log" 2>&1 \
  || { echo "simulator failed:"; tail -20 "$DEMO_DIR/history.log"; exit 1; }
tail -1 "$DEMO_DIR/history.log"

echo "· canary: chat's new prompt v2 on half the users defeats the prefix cache; the A/B guard rolls it back (evidence below)"
"$BIN/tailguard" simulate --rate 20 --duration 600 --seed 11 --pace max --experiment canary-prompt-v2 \
  --incident "prompt_cache_miss:0:600:variant=treatment" --quiet >"$DEMO_DIR/canary.log" 2>&1 \
  || { echo "simulator failed:"; tail -20 "$DEMO_DIR/canary.log"; exit 1; }
"$BIN/tailguard" alerts follow --topic releases --decision rollback --from-beginning -n 1 --duration 120 \
  --output json | tee "$DEMO_DIR/rollback.json" | "$BIN/python" -m json.tool \
  || echo "  (no rollback within 120 s; see $DEMO_DIR/worker.log)"

PROMPTS_S="${DEMO_PROMPTS_S:-120}"
if [ "$PROMPTS_S" -gt 0 ]; then
  echo "· prompts: support's system prompt in three versions (infra/demo/prompts/): v2 paraphrases v1, v3 tells the assistant never to admit it does not know; the registry groups near-identical versions"
  for v in 1 2 3; do
    parent=()
    [ "$v" -gt 1 ] && parent=(--parent "support-v$((v - 1))")
    "$BIN/tailguard" prompts add "infra/demo/prompts/support-v$v.txt" --owner cx "${parent[@]}" \
      | sed 's/^/  /' || echo "  (support-v$v not registered)"
  done
  "$BIN/tailguard" prompts list | sed 's/^/  /' || true
  echo "· prompt experiment support-prompt-v3 (infra/demo/prompt-experiments.yaml: v1 vs v3, 50/50, guardrail hallucination_rate max_diff 0.02): 3,000 requests, then blind ratings of them (no arm; 3 % hallucinations for v1, 8 % for v3); the guard's decisions as they arrive (up to ${PROMPTS_S}s, DEMO_PROMPTS_S=0 skips):"
  "$BIN/python" -m tailguard.simulator.feedback --broker "$TAILGUARD_BROKER" \
    --prefix "${TAILGUARD_TOPIC_PREFIX:-}" --timeout "$PROMPTS_S" >"$DEMO_DIR/prompts.log" 2>&1 &
  feedback_pid=$!
  pids+=("$feedback_pid")
  "$BIN/python" - "$PROMPTS_S" <<'PY' || echo "  (no rollback within ${PROMPTS_S}s; see $DEMO_DIR/prompts.log and $DEMO_DIR/worker.log)"
import os
import sys

from tailguard.console import watch_release

rollback = watch_release(
    os.environ["TAILGUARD_BROKER"], experiment="support-prompt-v3", timeout_s=float(sys.argv[1])
)
sys.exit(0 if rollback else 1)
PY
  kill -TERM "$feedback_pid" 2>/dev/null || true
  wait "$feedback_pid" 2>/dev/null || true
fi

CAPACITY_S="${DEMO_CAPACITY_S:-120}"
if [ "$CAPACITY_S" -gt 0 ]; then
  echo "· capacity: a load ramp across a knee at concurrency 8 (one scale_up, one scale_down), MoE expert 5 failing 40 % of its requests for a while (breaker open → half-open → closed), retrieval index kb drifting (its similarity threshold follows down); tailguard.capacity as it happens (up to ${CAPACITY_S}s, DEMO_CAPACITY_S=0 skips):"
  "$BIN/python" -m tailguard.simulator.capacity --broker "$TAILGUARD_BROKER" \
    --prefix "${TAILGUARD_TOPIC_PREFIX:-}" >"$DEMO_DIR/capacity.log" 2>&1 \
    || { echo "simulator failed:"; tail -20 "$DEMO_DIR/capacity.log"; exit 1; }
  "$BIN/python" - "$CAPACITY_S" <<'PY' || echo "  (not every capacity decision within ${CAPACITY_S}s; see $DEMO_DIR/worker.log)"
import os
import sys

from tailguard.console import watch_capacity


def done(records):
    def of(model, kind):
        return [r for r in records if r["deployment"]["model"] == model and r["kind"] == kind]

    scale = [r["decision"] for r in of("ramp", "scale") if r["decision"] != "hold"]
    return (
        "scale_up" in scale
        and scale[-1:] == ["scale_down"]
        and any(r["decision"] == "closed" for r in of("moe", "breaker"))
        and len(of("rag", "rag_threshold")) >= 2
    )


seen = watch_capacity(
    os.environ["TAILGUARD_BROKER"],
    timeout_s=float(sys.argv[1]),
    done=done,
    match=lambda r: r["deployment"]["model"] in {"ramp", "moe", "rag"},
)
sys.exit(0 if done(seen) else 1)
PY
fi

echo "· live: 20 req/s for ${LIVE_S}s (watch the open minute move; Ctrl-C ends the demo)"
"$BIN/tailguard" simulate --rate 20 --duration "$LIVE_S" --seed 42 --pace realtime \
  >"$DEMO_DIR/live.log" 2>&1 &
pids+=($!)
"$BIN/tailguard" watch --window 5m --duration "$((LIVE_S + 5))" || true
sleep 3
"$BIN/tailguard" report --idle 5 --out "$DEMO_DIR/report"
echo "· heatmaps and the HTML report: $DEMO_DIR/report/index.html"
echo "· interference breaches explained (victim, noisy neighbour, evidence):"
"$BIN/python" - <<'PY'
import json
import os

from tailguard.catalogue import BREACHES, default_prefix
from tailguard.console import follow

for _key, value, _headers in follow(
    os.environ["TAILGUARD_BROKER"], default_prefix() + BREACHES, from_beginning=True, idle_exit_s=3
):
    breach = json.loads(value or b"{}")
    if breach.get("kind") == "interference":
        print(f"  {breach['state']:>8}  {breach['summary']}")
PY

GW_PORT="${DEMO_GATEWAY_PORT:-8080}"
echo "· gateway: OpenAI-compatible proxy on http://127.0.0.1:$GW_PORT/v1 in front of a simulated upstream and a slower canary upstream (30 % of the users; log: $DEMO_DIR/gateway.log)"
"$BIN/tailguard" simulate-upstream --listen 127.0.0.1:9101 --name primary --ttft-ms 120 --itl-ms 15 \
  --tokens 12 --jitter 0.2 --seed 1 >"$DEMO_DIR/upstream-primary.log" 2>&1 &
pids+=($!)
"$BIN/tailguard" simulate-upstream --listen 127.0.0.1:9102 --name canary --ttft-ms 400 --itl-ms 15 \
  --tokens 12 --jitter 0.2 --seed 2 >"$DEMO_DIR/upstream-canary.log" 2>&1 &
pids+=($!)
"$BIN/tailguard" gateway --upstream http://127.0.0.1:9101 --upstream-canary http://127.0.0.1:9102 \
  --routes infra/experiments/gateway-canary.yaml --listen "127.0.0.1:$GW_PORT" --service chat \
  --state-file "$DEMO_DIR/gateway-state.json" >"$DEMO_DIR/gateway.log" 2>&1 &
pids+=($!)
sleep 5
echo "· the official openai client streams through the gateway; the A/B guard holds the canary to TTFT P95 ≤ 1.10 × control and rolls it back"
"$BIN/python" -m tailguard.gateway.demo --base-url "http://127.0.0.1:$GW_PORT/v1" --concurrency 8 \
  --duration "${DEMO_GATEWAY_S:-180}" \
  || echo "  (no rollback within ${DEMO_GATEWAY_S:-180}s; see $DEMO_DIR/worker.log and $DEMO_DIR/gateway.log)"
echo "· what the gateway did (tailguard.audit):"
"$BIN/python" - <<'PY'
import json
import os

from tailguard.catalogue import AUDIT, default_prefix
from tailguard.console import follow

for _key, value, _headers in follow(
    os.environ["TAILGUARD_BROKER"], default_prefix() + AUDIT, from_beginning=True, idle_exit_s=3
):
    note = json.loads(value or b"{}")
    if note.get("action") == "gateway.route":
        print(f"  {note['outcome']:>17}  {note['summary']}")
PY
