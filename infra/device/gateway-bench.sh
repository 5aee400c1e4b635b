#!/usr/bin/env bash
# The gateway bench (bench/gateway.py) with a real Kafka broker, on a machine
# that can fetch nothing (the 16-core, one-H200 benchmark machine). Prepared
# here by infra/device/pack.sh; run there from the repo root, with .devkafka/
# and .devwheels/ copied beside the checkout:
#
#   bash infra/device/gateway-bench.sh
#
# It installs the carried wheels into /tmp/pp, lays tailguard out there as the
# installed package (tailguard.streams ← streams/, …; the repo root on
# sys.path would shadow it), unpacks the Java runtime and the jars, starts the
# broker with infra/kafka/kafka.sh on every CPU but the last (the bench gives
# the last one to the gateway alone), and runs the bench RUNS times. Results
# (bench/results/<name>.json), the bench logs and the broker's server.log go
# to $OUT. Environment: PY (python3), RUNS ("1 2"), WARM (15 s), BENCH_ARGS,
# SKIP_PIP=1 (wheels already importable), KPORT/KCPORT (19092/19093).
set -u
export PYTHONUNBUFFERED=1
REPO="$(pwd)"
PY="${PY:-python3}"
OUT="${OUT:-/tmp/tailguard-device-out}"
mkdir -p "$OUT"
t() { echo "[$(date +%T) +${SECONDS}s] $*"; }

t "start: $(nproc) CPUs, $($PY -V 2>&1)"
if [[ -z "${SKIP_PIP:-}" ]]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/pp .devwheels/*.whl || exit 1
fi
mkdir -p /tmp/pp/tailguard
cp -r tailguard/* /tmp/pp/tailguard/
for d in streams schemas agents; do rm -rf "/tmp/pp/tailguard/$d"; cp -r "$d" "/tmp/pp/tailguard/$d"; done
rm -rf /tmp/pp/bench && cp -r bench /tmp/pp/bench
rm -rf /tmp/pp/bench/results && mkdir -p /tmp/pp/bench/results  # no committed result passes as new

t unpack
rm -rf /tmp/jre /tmp/k0 /tmp/kst
tar -C /tmp -xJf .devkafka/jre.tar.xz && tar -C /tmp -xJf .devkafka/k0.tar.xz || exit 1
mkdir -p /tmp/kst/kafka && mv /tmp/k0 /tmp/kst/kafka/lib
export JAVA_HOME=/tmp/jre TAILGUARD_STATE_DIR=/tmp/kst
export TAILGUARD_KAFKA_PORT="${KPORT:-19092}" TAILGUARD_KAFKA_CONTROLLER_PORT="${KCPORT:-19093}"
export TAILGUARD_BROKER="127.0.0.1:$TAILGUARD_KAFKA_PORT"
# The bench gives the last CPU this process may use to the gateway alone.
broker_cpus="$($PY -c 'import os; c = sorted(os.sched_getaffinity(0)); print(",".join(map(str, c[:-1] or c)))')"

t "kafka up on CPUs $broker_cpus"
taskset -c "$broker_cpus" infra/kafka/kafka.sh up 2>&1 | grep -v '^\s*at ' | tail -5
infra/kafka/kafka.sh status >/dev/null || { t "broker did not start"; exit 1; }

cd /tmp/pp || exit 1
export PYTHONPATH=/tmp/pp
status=0
for n in ${RUNS:-1 2}; do
    t "bench run $n"
    timeout "${BENCH_TIMEOUT:-230}" "$PY" -m bench.gateway --name "gateway-kafka-device-$n" \
        --warm-s "${WARM:-15}" ${BENCH_ARGS:-} >"$OUT/bench-$n.log" 2>&1
    rc=$?
    echo "rc=$rc"
    if (( rc == 0 )); then
        grep -E '"added_p99_chunk_ms"|"added_p99_ttft_ms"|median_round|"kafka"|"published"|"dropped"|per_request_ms|target_met' "$OUT/bench-$n.log"
        cp "bench/results/gateway-kafka-device-$n.json" "$OUT/"
    else
        tail -n 20 "$OUT/bench-$n.log"
        status=$rc
    fi
done
cd "$REPO" && infra/kafka/kafka.sh down >/dev/null 2>&1
cp /tmp/kst/kafka/logs/server.log "$OUT/" 2>/dev/null
t end
exit "$status"
