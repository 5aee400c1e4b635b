"""The gateway against the real broker: the official openai client streaming through it,
rollbacks from tailguard.releases, restarts, and a broker outage (on a throwaway broker)."""

import asyncio
import itertools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from confluent_kafka import Producer
from tailguard.schemas import ce_headers
from tailguard.schemas.columnar import rows_of

from tailguard.catalogue import catalogue
from tailguard.kafka_admin import create_topics

REPO = Path(__file__).resolve().parents[2]
TEST_STATE = Path(os.environ.get("TAILGUARD_TEST_STATE", REPO / ".state" / "test"))

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_below_ephemeral(avoid: int = 0) -> int:
    """A free port under Linux's ephemeral range (32768+), for a listener that must
    get the same port back after a restart: a fixed port up there (39092 once) can
    be taken meanwhile by any outgoing connection's local end."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 32_000)
        if port == avoid:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError("no free port in 20000-32000")


class Proc:
    """A ``tailguard …`` subprocess with its log."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "Proc":
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tailguard.cli", *self.args],
                env=self.env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


def wait_http(url: str, proc: Proc, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.proc is not None and proc.proc.poll() is None, proc.tail()
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout}s\n{proc.tail()}")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    made: list[Proc] = []

    def make(name: str, *args: str, env: dict[str, str] | None = None) -> Proc:
        p = Proc(list(args), {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                 tmp_path / f"{name}.log")  # fmt: skip
        made.append(p)
        return p

    yield make
    for p in reversed(made):
        p.stop()


def upstream(procs: Callable[..., Proc], name: str, *args: str) -> str:
    port = free_port()
    p = procs(name, "simulate-upstream", "--listen", f"127.0.0.1:{port}", "--name", name, *args)
    p.start()
    wait_http(f"http://127.0.0.1:{port}/v1/models", p)
    return f"http://127.0.0.1:{port}"


def gateway(
    procs: Callable[..., Proc], broker: str, prefix: str, state: Path, *args: str,
    name: str = "gateway", port: int | None = None,
) -> tuple[Proc, str]:  # fmt: skip
    port = port or free_port()
    env = {"TAILGUARD_TOPIC_PREFIX": prefix, "TAILGUARD_BROKER": broker}
    p = procs(name, "gateway", "--listen", f"127.0.0.1:{port}", "--broker", broker,
              "--state-file", str(state), "--linger-ms", "20", *args, env=env)  # fmt: skip
    p.start()
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/gateway/healthz", p)
    return p, base


def events_of(records: list[Any]) -> list[dict[str, Any]]:
    """Inference messages (columns, or JSON arrays) as one list of request objects."""
    out: list[dict[str, Any]] = []
    for r in records:
        out.extend(rows_of(json.dumps(r).encode()))
    return out


# --------------------------------------------------------------------- timing


#: Streamed requests in the timing test; the first two warm up. A median over 14 holds
#: on a loaded 2-core CI machine where one over 6 could be carried by a noisy second.
REQUESTS = 16


def test_openai_client_streaming_through_the_gateway_is_measured_within_5ms(
    namespace: Any, collector: Callable[..., Any], procs: Callable[..., Proc], tmp_path: Path
) -> None:
    gaps = (20.0, 45.0, 10.0, 30.0, 60.0, 15.0, 25.0)
    up = upstream(procs, "primary", "--ttft-ms", "120", "--itl-ms", ",".join(map(str, gaps)),
                  "--tokens", "8")  # fmt: skip
    gw, base = gateway(procs, namespace.broker, namespace.prefix, tmp_path / "gw.json",
                       "--upstream", up, "--service", "chat")  # fmt: skip
    client = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
    sent: dict[str, list[int]] = {}
    for i in range(REQUESTS):
        unit = f"user-{i}"
        stream = client.chat.completions.create(
            model="llama-3.1-8b-instruct",
            messages=[{"role": "user", "content": "Say eight tokens."}],
            stream=True,
            stream_options={"include_usage": True},
            user=unit,
        )
        stamps = []
        received = 0
        for chunk in stream:
            extra = chunk.model_extra or {}
            if chunk.choices and chunk.choices[0].delta.content:
                stamps.append(int(extra["tg_sent_ns"]))
            received = int(extra.get("tg_received_ns", received))
        sent[unit] = [received, *stamps]  # request arrival at the upstream, the 8 tokens
    # The other two shapes through the same relay: a whole JSON answer, and the legacy
    # completions endpoint streamed.
    whole = client.chat.completions.create(
        model="llama-3.1-8b-instruct",
        messages=[{"role": "user", "content": "Say eight tokens."}],
        user="plain-0",
    )
    assert whole.usage is not None and whole.usage.completion_tokens == 8
    assert whole.choices[0].message.content == "".join(f"tok{i} " for i in range(8))
    legacy = client.completions.create(
        model="llama-3.1-8b-instruct", prompt="Say eight tokens.", stream=True, user="legacy-0"
    )
    assert "".join(c.choices[0].text for c in legacy if c.choices) == "".join(
        f"tok{i} " for i in range(8)
    )
    inference = collector("tailguard.inference")
    inference.wait_for(lambda r: len(events_of(r)) >= REQUESTS + 2, timeout=30)
    events = {e["unit_id"]: e for e in events_of(inference.records)}
    plain, streamed = events["plain-0"], events["legacy-0"]
    assert plain["status"] == "ok" and plain["output_tokens"] == 8 and "itl_ms" not in plain
    assert plain["ttft_ms"] == plain["e2e_ms"] >= 119.0 + sum(gaps)
    assert streamed["status"] == "ok" and streamed["output_tokens"] == 8
    assert len(streamed["itl_ms"]) == 7
    ttft_diffs: list[float] = []
    gap_diffs: list[float] = []
    for i in range(2, REQUESTS):  # the first two requests pay for connections and imports
        e = events[f"user-{i}"]
        received, *tokens = sent[f"user-{i}"]
        assert e["status"] == "ok" and e["service"] == "chat"
        assert (e["output_tokens"], e["model"]) == (8, "llama-3.1-8b-instruct")
        assert e["input_tokens"] > 0 and len(e["trace_id"]) == 32
        # The upstream's own TTFT and gaps, as they happened (its sleeps overshoot a little).
        upstream_ttft = (tokens[0] - received) / 1e6
        upstream_gaps = [(y - x) / 1e6 for x, y in itertools.pairwise(tokens)]
        assert len(e["itl_ms"]) == 7
        ttft_diffs.append(abs(e["ttft_ms"] - upstream_ttft))
        gap_diffs += [abs(g - u) for g, u in zip(e["itl_ms"], upstream_gaps, strict=True)]
        # at least the upstream's 120 ms (its sleep may overshoot on a loaded machine;
        # how closely the gateway measured it is checked against the upstream's stamps)
        assert e["ttft_ms"] >= 119.0
    print(f"gateway vs upstream: TTFT diff median {statistics.median(ttft_diffs):.2f} ms, "
          f"worst {max(ttft_diffs):.2f} ms; gap diff median {statistics.median(gap_diffs):.2f} "
          f"ms, worst {max(gap_diffs):.2f} ms", flush=True)  # fmt: skip
    # The median, not the worst: on a shared 2-core machine one descheduled sample
    # of the gateway or the upstream process says nothing about the measurement.
    assert statistics.median(ttft_diffs) <= 5.0, sorted(ttft_diffs)
    assert statistics.median(gap_diffs) <= 5.0, sorted(gap_diffs)
    state = get_json(base + "/gateway/state")
    assert state["publisher"]["published"] >= 8 and state["publisher"]["dropped"] == 0
    gw.stop()


# -------------------------------------------------------------------- routing

ROUTES = """
apiVersion: tailguard/v1
kind: Experiments
experiments:
  - id: gw-canary
    arms: [{name: control, weight: 0.5}, {name: treatment, weight: 0.5}]
routing:
  experiments:
    gw-canary:
      layer: release
      arms:
        control: {upstream: primary, prompt_version: v1}
        treatment: {upstream: canary, prompt_version: v2}
"""


def release(experiment: str, decision: str, arm: str | None, seq: int = 1) -> dict[str, Any]:
    now = int(time.time() * 1000)
    return {
        "schema": "tailguard.release.v1", "event_id": uuid.uuid4().hex, "ts_ms": now,
        "experiment": experiment, "generation": 1, "seq": seq, "decision": decision, "arm": arm,
        "control": "control", "reasons": ["ttft_p95 treatment/control > 1.10"],
        "reason_codes": ["guardrail_breached"], "evidence": {},
        "weights": {"control": 1.0, "treatment": 0.0},
        "planned_weights": {"control": 0.5, "treatment": 0.5},
        "actor": "tailguard", "decided_at_ms": now, "method": "test",
    }  # fmt: skip


async def _serve(base: str, units: list[str]) -> dict[str, tuple[str, str]]:
    """unit → (arm header, upstream that answered) for one request per unit."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    out: dict[str, tuple[str, str]] = {}
    sem = asyncio.Semaphore(32)
    async with aiohttp.ClientSession() as http:

        async def one(unit: str) -> None:
            async with (
                sem,
                http.post(
                    base + "/v1/chat/completions", json=body, headers={"x-tailguard-unit": unit}
                ) as r,
            ):
                await r.read()
                assert r.status == 200
                out[unit] = (r.headers["x-tailguard-arm"], r.headers["x-upstream"])

        await asyncio.gather(*(one(u) for u in units))
    return out


def test_rollback_moves_treatment_to_control_within_5s_and_restarts_keep_routing(
    namespace: Any, collector: Callable[..., Any], procs: Callable[..., Proc], tmp_path: Path
) -> None:
    fast = ("--ttft-ms", "1", "--itl-ms", "1", "--tokens", "2")
    primary = upstream(procs, "primary", *fast)
    canary = upstream(procs, "canary", *fast)
    routes = tmp_path / "routes.yaml"
    routes.write_text(ROUTES)
    state = tmp_path / "gw-state.json"
    args = ("--upstream", primary, "--upstream-canary", canary, "--routes", str(routes))
    port = free_port()
    gw, base = gateway(procs, namespace.broker, namespace.prefix, state, *args, port=port)
    units = [f"unit-{i}" for i in range(300)]
    before = asyncio.run(_serve(base, units))
    treated = [u for u, (arm, _) in before.items() if arm == "treatment"]
    assert 100 < len(treated) < 200  # 50/50 by hashing
    assert all(up == ("canary" if arm == "treatment" else "primary")
               for arm, up in before.values())  # fmt: skip
    # A restart without any decision: every unit keeps its arm.
    gw.stop()
    gw, base = gateway(procs, namespace.broker, namespace.prefix, state, *args, port=port,
                       name="gateway-2")  # fmt: skip
    assert asyncio.run(_serve(base, units)) == before

    producer = Producer({"bootstrap.servers": namespace.broker})
    payload = release("gw-canary", "rollback", "treatment")
    producer.produce(
        namespace.topic("tailguard.releases"), key=b"gw-canary", value=json.dumps(payload).encode(),
        headers=ce_headers("tailguard.release.v1", payload["event_id"], payload["ts_ms"]),
    )  # fmt: skip
    assert producer.flush(10) == 0
    published = time.monotonic()
    moved_after = None
    while time.monotonic() - published < 10:
        got = asyncio.run(_serve(base, treated))
        on_control = sum(1 for u in treated if got[u] == ("control", "primary"))
        if on_control >= 0.99 * len(treated):
            moved_after = time.monotonic() - published
            break
        time.sleep(0.05)
    print(f"rollback: {len(treated)} treatment units on control {moved_after} s after "
          "the decision was published", flush=True)  # fmt: skip
    assert moved_after is not None and moved_after <= 5.0
    control_units = [u for u in units if u not in treated]
    assert asyncio.run(_serve(base, control_units)) == {u: before[u] for u in control_units}

    audit = collector("tailguard.audit")
    audit.wait_for(lambda r: any(a.get("action") == "gateway.route" for a in r), timeout=20)
    (note,) = [a for a in audit.records if a.get("action") == "gateway.route"]
    assert note["args"]["experiment"] == "gw-canary" and note["outcome"] == "applied:rollback"
    assert note["args"]["routes"] == {"control": "control", "treatment": "control"}
    assert note["args"]["release_event_id"] == payload["event_id"]

    # Restart without reading tailguard.releases: the state file alone keeps the rollback.
    gw.stop()
    assert json.loads(state.read_text())["overrides"]["gw-canary"]["decision"] == "rollback"
    gw, base = gateway(procs, namespace.broker, namespace.prefix, state, *args,
                       "--no-follow-releases", port=port, name="gateway-3")  # fmt: skip
    after = asyncio.run(_serve(base, units))
    assert all(after[u] == ("control", "primary") for u in units)
    # … and a restart that re-reads the topic does not audit the same decision again.
    gw.stop()
    gw, base = gateway(procs, namespace.broker, namespace.prefix, state, *args, port=port,
                       name="gateway-4")  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not get_json(base + "/gateway/state")["releases"]["seen"]:
        time.sleep(0.2)
    assert get_json(base + "/gateway/state")["releases"]["applied"] == 0
    audit.poll(2)
    assert len([a for a in audit.records if a.get("action") == "gateway.route"]) == 1
    gw.stop()


# --------------------------------------------------------------------- outage


def _kafka(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "infra" / "kafka" / "kafka.sh"), command],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


@pytest.fixture
def throwaway_broker(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A broker of its own on free ports (never the shared test broker), torn down after.
    Reuses the test broker's resolved jars when there are some (no Maven run)."""
    state = tmp_path / "kafka-state"
    (state / "kafka").mkdir(parents=True)
    jars = TEST_STATE / "kafka" / "lib"
    if jars.is_dir():
        (state / "kafka" / "lib").symlink_to(jars)
    port = int(os.environ.get("TAILGUARD_OUTAGE_KAFKA_PORT") or free_port_below_ephemeral())
    cport = int(os.environ.get("TAILGUARD_OUTAGE_KAFKA_CPORT") or free_port_below_ephemeral(port))
    env = {
        **os.environ,
        "TAILGUARD_STATE_DIR": str(state),
        "TAILGUARD_KAFKA_PORT": str(port),
        "TAILGUARD_KAFKA_CONTROLLER_PORT": str(cport),
        "TAILGUARD_KAFKA_HEAP_OPTS": "-Xms128m -Xmx256m",
    }
    up = _kafka("up", env)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield f"127.0.0.1:{env['TAILGUARD_KAFKA_PORT']}", env
    finally:
        _kafka("down", env)


async def _requests(base: str, n: int, tag: str) -> list[int]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with aiohttp.ClientSession() as http:

        async def one(i: int) -> int:
            hdr = {"x-tailguard-unit": f"{tag}-{i}"}
            async with http.post(base + "/v1/chat/completions", json=body, headers=hdr) as r:
                await r.read()
                return r.status

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def test_broker_outage_never_fails_a_request_and_buffered_events_arrive(
    throwaway_broker: tuple[str, dict[str, str]], procs: Callable[..., Proc], tmp_path: Path
) -> None:
    broker, env = throwaway_broker
    prefix = f"o{uuid.uuid4().hex[:6]}."
    create_topics(broker, catalogue(1, prefix=prefix))
    up = upstream(procs, "primary", "--ttft-ms", "5", "--itl-ms", "2", "--tokens", "3")
    gw, base = gateway(procs, broker, prefix, tmp_path / "gw.json", "--upstream", up,
                       "--buffer-events", "25", "--no-follow-releases")  # fmt: skip
    assert asyncio.run(_requests(base, 20, "before")) == [200] * 20
    deadline = time.monotonic() + 30
    while get_json(base + "/gateway/state")["publisher"]["published"] < 20:
        assert time.monotonic() < deadline, gw.tail()
        time.sleep(0.2)

    down = _kafka("down", env)
    assert down.returncode == 0, down.stdout + down.stderr
    try:
        t0 = time.monotonic()
        statuses = asyncio.run(_requests(base, 30, "during"))
        during_s = time.monotonic() - t0
        assert statuses == [200] * 30  # the broker being away fails no request
        time.sleep(1)
        st = get_json(base + "/gateway/state")["publisher"]
        metrics = urllib.request.urlopen(base + "/gateway/metrics", timeout=5).read().decode()
        print(f"broker down: 30 requests in {during_s:.2f}s, publisher {st}", flush=True)
        assert st["buffered"] == 25 and st["dropped"] == 5  # bounded; the excess counted
        assert "tailguard_gateway_events_dropped_total 5.0" in metrics
        assert "tailguard_gateway_events_buffered 25.0" in metrics
    finally:
        again = _kafka("up", env)
    assert again.returncode == 0, again.stdout + again.stderr
    deadline = time.monotonic() + 90
    while get_json(base + "/gateway/state")["publisher"]["published"] < 45:
        assert time.monotonic() < deadline, get_json(base + "/gateway/state")
        time.sleep(0.5)

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker, "group.id": uuid.uuid4().hex})
    consumer.assign([TopicPartition(prefix + "tailguard.inference", 0, 0)])
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while len(events) < 45 and time.monotonic() < deadline:
        for m in consumer.consume(100, timeout=1):
            if not m.error():
                events.extend(rows_of(m.value()))
    consumer.close()
    units = [e["unit_id"] for e in events]
    assert len(units) == len(set(units)) == 45
    assert sum(u.startswith("during-") for u in units) == 25  # 5 of the outage's dropped
    gw.stop()
