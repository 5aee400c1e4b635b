#!/usr/bin/env bash
# tailguard's Kafka broker: a real Apache Kafka 3.9 broker, KRaft single node
# (one JVM that is both broker and controller), run from the jars Maven Central
# serves. No Docker, no Apache download site.
#
# Usage: infra/kafka/kafka.sh {up|down|status|reset|logs [-f] [LINES]}
#
#   up      resolve the jars (first time only), format storage (first time
#           only), start the broker in the background, wait until it answers
#   down    stop it: SIGTERM (controlled shutdown), SIGKILL after 30 s
#   status  exit 0 if our broker runs and answers, 1 otherwise
#   reset   down, then delete the broker's data (next `up` formats anew)
#   logs    print the last LINES (default 100) of server.log; -f follows it
#
# Environment:
#   TAILGUARD_STATE_DIR               state root (default <repo>/.state)
#   TAILGUARD_KAFKA_PORT              client listener port (default 9092)
#   TAILGUARD_KAFKA_CONTROLLER_PORT   KRaft controller port (default 9093)
#   TAILGUARD_KAFKA_HEAP_OPTS         JVM heap (default "-Xms256m -Xmx512m")
#   TAILGUARD_KAFKA_AUTO_CREATE       auto.create.topics.enable (default true)
#   TAILGUARD_KAFKA_START_TIMEOUT     seconds `up` waits for the broker (60)
#   JAVA_HOME                         used if it is a Java 17
#
# Everything lives under $TAILGUARD_STATE_DIR/kafka/:
#   lib/               the jars (+ .resolved marker naming the version)
#   data/              log.dirs: topic data and KRaft metadata (meta.properties)
#   logs/              server.log, state-change.log, kafka.out (JVM stdout/err)
#   server.properties  written on every start from the settings above
#   kafka.pid          pid of the running broker
set -euo pipefail

# ---------------------------------------------------------------- settings --

# Keep in step with kafka.version in pom.xml: it keys the jar marker.
readonly KAFKA_VERSION="3.9.1"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/../.." && pwd)"
readonly SCRIPT_DIR REPO_ROOT

STATE_DIR="${TAILGUARD_STATE_DIR:-$REPO_ROOT/.state}"
# Absolute: Maven resolves a relative output folder against the pom's folder.
[[ "$STATE_DIR" = /* ]] || STATE_DIR="$PWD/$STATE_DIR"
readonly KDIR="$STATE_DIR/kafka"
readonly LIB_DIR="$KDIR/lib"
readonly DATA_DIR="$KDIR/data"
readonly LOG_DIR="$KDIR/logs"
readonly PROPS="$KDIR/server.properties"
readonly PID_FILE="$KDIR/kafka.pid"
readonly MARKER="$LIB_DIR/.resolved"

readonly HOST="127.0.0.1"
readonly PORT="${TAILGUARD_KAFKA_PORT:-9092}"
readonly CONTROLLER_PORT="${TAILGUARD_KAFKA_CONTROLLER_PORT:-9093}"
readonly BOOTSTRAP="$HOST:$PORT"
readonly HEAP_OPTS="${TAILGUARD_KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"
readonly AUTO_CREATE="${TAILGUARD_KAFKA_AUTO_CREATE:-true}"
readonly START_TIMEOUT="${TAILGUARD_KAFKA_START_TIMEOUT:-60}"
readonly STOP_TIMEOUT=30

# ----------------------------------------------------------------- helpers --

say() { printf '%s\n' "$*"; }
die() { printf 'kafka.sh: %s\n' "$*" >&2; exit 1; }

# Major version of a java binary ("17" for 17.0.15, "1" never occurs here).
java_major() {
    "$1" -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -n 1
}

# Pick Java 17: $JAVA_HOME if it is 17, else the Debian JDK 17, else `java`
# on PATH (checked too). Sets JAVA and exports JAVA_HOME for mvn.
find_java() {
    local candidate
    for candidate in \
        "${JAVA_HOME:+$JAVA_HOME/bin/java}" \
        /usr/lib/jvm/java-17-openjdk-amd64/bin/java \
        "$(command -v java || true)"; do
        if [[ -n "$candidate" && -x "$candidate" && "$(java_major "$candidate")" == 17 ]]; then
            JAVA="$candidate"
            JAVA_HOME="$(cd "$(dirname "$candidate")/.." && pwd)"
            export JAVA_HOME
            return 0
        fi
    done
    die "no Java 17 found (tried \$JAVA_HOME, /usr/lib/jvm/java-17-openjdk-amd64, java on PATH); install openjdk-17-jre-headless or point JAVA_HOME at a JDK 17"
}

# Run a one-shot Kafka tool (main class + args) from the resolved jars.
kafka_tool() {
    "$JAVA" -Dlog4j.configuration="file:$SCRIPT_DIR/tools-log4j.properties" \
        -cp "$LIB_DIR/*" "$@"
}

# The pid in kafka.pid, if that process is alive and is our broker
# (guards against a stale pid file whose pid was reused).
running_pid() {
    local pid
    [[ -f "$PID_FILE" ]] || return 1
    pid="$(<"$PID_FILE")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'kafka\.Kafka' || return 1
    printf '%s\n' "$pid"
}

# Something listens on $1 (TCP connect succeeds)?
port_open() {
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

# Does a Kafka broker answer a metadata request on $BOOTSTRAP? Uses the
# repo venv's confluent_kafka when there is one (a real protocol answer);
# otherwise falls back to "the port accepts connections".
answers() {
    local py="$REPO_ROOT/.venv/bin/python"
    if [[ -x "$py" ]] && "$py" -c 'import confluent_kafka' 2>/dev/null; then
        "$py" - "$BOOTSTRAP" 2>/dev/null <<'PY'
import sys
from confluent_kafka.admin import AdminClient
client = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0})
sys.exit(0 if client.list_topics(timeout=3).brokers else 1)
PY
    else
        port_open "$PORT"
    fi
}

server_log() { printf '%s\n' "$LOG_DIR/server.log"; }

# Size of server.log before this start, so a failure shows only what this
# start wrote (the file is appended to across restarts).
LOG_OFFSET=0

# Show what the broker said before dying or hanging: JVM-level errors land in
# kafka.out (stdout/stderr), the broker's own account in server.log.
print_log_tail() {
    local out="$LOG_DIR/kafka.out" log
    log="$(server_log)"
    if [[ -s "$out" ]]; then
        say "---- last 30 lines of $out ----" >&2
        tail -n 30 "$out" >&2
    fi
    if [[ -s "$log" ]]; then
        say "---- last 30 lines of $log (this start) ----" >&2
        tail -c "+$((LOG_OFFSET + 1))" "$log" | tail -n 30 >&2
    fi
}

# Serialise up/down/reset between concurrent callers (e.g. parallel test
# workers each asking for a broker). The fd is closed for the broker itself.
take_lock() {
    mkdir -p "$KDIR"
    if command -v flock >/dev/null; then
        exec 9>"$KDIR/.lock"
        flock 9
    fi
}

# ------------------------------------------------------------------- steps --

# Copy kafka_2.13 and its runtime dependencies into lib/ with Maven, once per
# Kafka version. Resolves into a temporary folder and renames it, so an
# interrupted download never leaves a lib/ that looks complete.
resolve_jars() {
    if [[ -f "$MARKER" && "$(<"$MARKER")" == "kafka_2.13-$KAFKA_VERSION" ]] \
        && compgen -G "$LIB_DIR/kafka_2.13-$KAFKA_VERSION.jar" >/dev/null; then
        return 0
    fi
    command -v mvn >/dev/null \
        || die "Maven (mvn) is needed once to fetch the Kafka jars from Maven Central; install it (apt-get install maven)"
    say "resolving Kafka $KAFKA_VERSION jars from Maven Central into $LIB_DIR ..."
    local tmp="$LIB_DIR.tmp.$$" mvn_log="$LOG_DIR/mvn.log" started=$SECONDS
    rm -rf "$tmp"
    mkdir -p "$LOG_DIR"
    # Output goes to a file: even with -q, Debian's Maven 3.8 prints stray
    # ANSI resets, and on success there is nothing worth showing.
    if ! mvn -q -B -Dstyle.color=never -f "$SCRIPT_DIR/pom.xml" \
            dependency:copy-dependencies -DoutputDirectory="$tmp" >"$mvn_log" 2>&1; then
        rm -rf "$tmp"
        tail -n 30 "$mvn_log" >&2
        die "mvn could not resolve the Kafka jars (is Maven Central reachable? full output: $mvn_log)"
    fi
    printf 'kafka_2.13-%s\n' "$KAFKA_VERSION" >"$tmp/.resolved"
    rm -rf "$LIB_DIR"
    mv "$tmp" "$LIB_DIR"
    say "resolved $(find "$LIB_DIR" -name '*.jar' | wc -l) jars in $((SECONDS - started)) s"
}

# KRaft combined mode, one node, replication factor 1 everywhere.
write_properties() {
    cat >"$PROPS" <<EOF
# Written by infra/kafka/kafka.sh on every start; edit the script, not this.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT

log.dirs=$DATA_DIR
num.partitions=4
default.replication.factor=1
min.insync.replicas=1
# Faust declares its own topics through the admin API; auto-creation stays
# on by default so plain producers/consumers also work (TAILGUARD_KAFKA_AUTO_CREATE).
auto.create.topics.enable=$AUTO_CREATE
delete.topic.enable=true

# Single node: internal topics cannot have more than one replica.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
# Consumer groups (faust workers, tests) rebalance at once.
group.initial.rebalance.delay.ms=0

num.network.threads=3
num.io.threads=4
log.retention.hours=168
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
EOF
}

# Format data/ once: only when meta.properties is absent (first use or after
# reset). Re-formatting would wipe the cluster id the data belongs to.
format_storage_once() {
    [[ -f "$DATA_DIR/meta.properties" ]] && return 0
    mkdir -p "$DATA_DIR"
    local cluster_id output
    cluster_id="$(kafka_tool kafka.tools.StorageTool random-uuid | tail -n 1)"
    [[ -n "$cluster_id" ]] || die "kafka.tools.StorageTool random-uuid printed nothing"
    say "formatting $DATA_DIR (cluster id $cluster_id)"
    if ! output="$(kafka_tool kafka.tools.StorageTool format \
            -t "$cluster_id" -c "$PROPS" 2>&1)"; then
        printf '%s\n' "$output" >&2
        die "formatting $DATA_DIR failed (StorageTool output above)"
    fi
}

# ------------------------------------------------------------- subcommands --

cmd_up() {
    take_lock
    local pid
    if pid="$(running_pid)"; then
        if answers; then
            say "kafka already up on $BOOTSTRAP (pid $pid)"
            return 0
        fi
        say "kafka process $pid exists but does not answer yet; waiting"
    else
        rm -f "$PID_FILE"
        # A listener we do not own (another broker, a docker-compose Kafka)
        # would make our broker fail to bind; say so plainly.
        local p
        for p in "$PORT" "$CONTROLLER_PORT"; do
            if port_open "$p"; then
                die "port $p on $HOST is already in use by a process kafka.sh did not start (another Kafka? docker compose?); stop it or set TAILGUARD_KAFKA_PORT / TAILGUARD_KAFKA_CONTROLLER_PORT"
            fi
        done

        find_java
        resolve_jars
        mkdir -p "$DATA_DIR" "$LOG_DIR"
        write_properties
        format_storage_once
        LOG_OFFSET="$(stat -c %s "$(server_log)" 2>/dev/null || echo 0)"

        # setsid: the broker outlives this shell and the caller's Ctrl-C.
        # The inner bash records its own pid, then becomes java (exec), so
        # the pid file names the JVM whatever setsid does. 9>&- drops the lock.
        # shellcheck disable=SC2086  # HEAP_OPTS is a list of JVM flags
        setsid nohup bash -c 'echo $$ >"$0"; exec "$@"' "$PID_FILE" \
            "$JAVA" $HEAP_OPTS \
            -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
            -Djava.awt.headless=true \
            -Dlog4j.configuration="file:$SCRIPT_DIR/log4j.properties" \
            -Dkafka.logs.dir="$LOG_DIR" \
            -cp "$LIB_DIR/*" \
            kafka.Kafka "$PROPS" \
            >"$LOG_DIR/kafka.out" 2>&1 </dev/null 9>&- &
        # Give the inner bash a moment to write the pid file.
        local i
        for i in {1..50}; do [[ -s "$PID_FILE" ]] && break; sleep 0.1; done
    fi

    # Wait until the broker answers, failing early if the JVM dies.
    local deadline=$((SECONDS + START_TIMEOUT))
    while ((SECONDS < deadline)); do
        if ! pid="$(running_pid)"; then
            print_log_tail
            rm -f "$PID_FILE"
            die "the broker exited during startup (logs above; full log: $(server_log))"
        fi
        if answers; then
            say "kafka up on $BOOTSTRAP (pid $pid)"
            return 0
        fi
        sleep 0.5
    done
    print_log_tail
    die "the broker (pid ${pid:-?}) did not answer on $BOOTSTRAP within ${START_TIMEOUT} s; it is left running: see logs above, or run '$0 down'"
}

cmd_down() {
    take_lock
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PID_FILE"
        say "kafka is not running"
        return 0
    fi
    say "stopping kafka (pid $pid) ..."
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "no controlled shutdown within ${STOP_TIMEOUT} s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    rm -f "$PID_FILE"
    say "kafka stopped"
}

cmd_status() {
    local pid
    if pid="$(running_pid)"; then
        if answers; then
            say "kafka up on $BOOTSTRAP (pid $pid)"
            return 0
        fi
        say "kafka process $pid runs but does not answer on $BOOTSTRAP"
        return 1
    fi
    if port_open "$PORT"; then
        say "kafka (ours) is down, but something else listens on $BOOTSTRAP"
    else
        say "kafka is down"
    fi
    return 1
}

cmd_reset() {
    cmd_down
    # cmd_down already holds the lock (fd 9) for the rest of this process.
    rm -rf "$DATA_DIR"
    say "deleted $DATA_DIR; the next 'up' formats a new cluster"
    say "WARNING: wipe the faust workers' state dirs too (TAILGUARD_DATA_DIR," \
        "default .state/worker): their RocksDB tables and changelog offsets" \
        "belong to the old cluster, and recovery would be inconsistent"
}

cmd_logs() {
    local follow=() lines=100 arg
    for arg in "$@"; do
        case "$arg" in
            -f | --follow) follow=(-F) ;;
            *[!0-9]* | '') die "logs: expected [-f] [LINES], got '$arg'" ;;
            *) lines="$arg" ;;
        esac
    done
    local log
    log="$(server_log)"
    [[ -f "$log" ]] || die "no server log yet at $log (has the broker ever started?)"
    tail -n "$lines" "${follow[@]}" "$log"
}

usage() {
    sed -n '6,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

main() {
    local cmd="${1:-}"
    [[ $# -gt 0 ]] && shift
    case "$cmd" in
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status ;;
        reset) cmd_reset ;;
        logs) cmd_logs "$@" ;;
        -h | --help | help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

main "$@"
