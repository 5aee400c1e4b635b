#!/usr/bin/env bash
# Pack what a gateway bench with a real Kafka broker needs on a machine that
# can fetch nothing (the GPU benchmark machine: 16 cores, one H200, Python 3.12,
# no Java): a jlink'd Java 17 runtime, the broker's jars, and cp312 wheels of
# the Python packages that machine lacks. Run here, once, from the repo root:
#
#   infra/kafka/kafka.sh up          # resolves the jars (first time)
#   infra/device/pack.sh             # → .devkafka/, .devwheels/ (git-ignored)
#
# then, on the benchmark machine: `bash infra/device/gateway-bench.sh`, with
# .devkafka/ and .devwheels/ copied beside the checkout. Everything together stays
# under the 64 MiB that may be copied there (~50 MiB): the runtime is trimmed to the
# modules the broker loads (java.desktop only for log4j's java.beans), the jars
# to their linux/amd64 natives, and both are xz-compressed with the jars stored
# uncompressed first (xz over class files beats zip's deflate by 2.3×).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE_DIR="${TAILGUARD_STATE_DIR:-$REPO_ROOT/.state}"
LIB="$STATE_DIR/kafka/lib"
JDK="${JDK17:-/usr/lib/jvm/java-17-openjdk-amd64}"
KAFKA_OUT="$REPO_ROOT/.devkafka"
WHEELS_OUT="$REPO_ROOT/.devwheels"
PY_VERSION="${DEVICE_PYTHON:-3.12}"

die() { printf 'pack.sh: %s\n' "$*" >&2; exit 1; }
[[ -f "$LIB/.resolved" ]] || die "no Kafka jars under $LIB: run infra/kafka/kafka.sh up first (or set TAILGUARD_STATE_DIR)"
[[ -d "$JDK/jmods" ]] || die "no jmods under $JDK: jlink needs a full JDK 17 (set JDK17)"

exclude="$(git -C "$REPO_ROOT" rev-parse --path-format=absolute --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
for d in /.devkafka/ /.devwheels/; do
    grep -qxF "$d" "$exclude" 2>/dev/null || printf '%s\n' "$d" >>"$exclude"
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$KAFKA_OUT" "$WHEELS_OUT"

# 1. Java runtime: the broker's modules only, stripped.
"$JDK/bin/jlink" --output "$work/jre" --compress=2 --strip-debug --no-man-pages --no-header-files \
    --add-modules java.base,java.desktop,java.instrument,java.logging,java.management,java.naming,java.net.http,java.security.jgss,java.security.sasl,java.sql,java.xml,jdk.crypto.ec,jdk.management,jdk.unsupported,jdk.zipfs,jdk.naming.dns,jdk.security.auth
strip --strip-unneeded "$work/jre/lib/server/libjvm.so"
rm -f "$work"/jre/lib/{libawt_xawt,libsplashscreen,libfontmanager,libjsound}.so
tar -C "$work" -cf - jre | xz -9 -T0 >"$KAFKA_OUT/jre.tar.xz"

# 2. The broker's jars: natives for linux/amd64 only (this also drops netty's
#    epoll library under META-INF/native, which the broker does not load), entries stored.
mkdir -p "$work/k0" "$work/x"
for jar in "$LIB"/*.jar; do
    rm -rf "$work/x" && mkdir "$work/x"
    (cd "$work/x" && unzip -q -o "$jar")
    find "$work/x" -type f \( -name '*.so' -o -name '*.dll' -o -name '*.dylib' -o -name '*.jnilib' \) \
        | { grep -vE '/(linux/amd64|Linux/x86_64)/' || true; } | xargs -r rm -f
    (cd "$work/x" && zip -q -0 -r -X "$work/k0/$(basename "$jar")" .)
done
cp "$LIB/.resolved" "$work/k0/"
tar -C "$work" -cf - k0 | xz -9 -T0 >"$KAFKA_OUT/k0.tar.xz"

# 3. Wheels the device's Python lacks (it has aiohttp, uvloop, numpy, yaml, click,
#    prometheus-client, nvidia-ml-py).
rm -f "$WHEELS_OUT"/*.whl
for pkg in msgspec confluent-kafka rfc8785; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELS_OUT" "$pkg"
done
du -sh "$KAFKA_OUT" "$WHEELS_OUT"
