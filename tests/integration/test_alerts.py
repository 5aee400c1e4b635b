"""``tailguard alerts`` on the real broker: the webhook forwarder loses nothing and repeats
nothing across a SIGKILL and a restart; ``follow`` prints what arrives.

How deliveries are counted: the local receiver answers every POST itself. While
it is told to fail (the first attempts, and an "outage" later) it answers 503
and counts nothing. Otherwise it answers 200 and counts one *accepted
delivery* for the request's ``Idempotency-Key`` header, at the moment it
decides to answer 2xx — whether or not the forwarder lives to read the answer.
"None delivered twice" means: no key was accepted twice. The SIGKILL lands
while the forwarder is retrying against the outage (so it is not in the
milliseconds between a 2xx and the delivery log write, the one window the
forwarder cannot close; see ``tailguard/alerts/forward.py``).
"""

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from tailguard.schemas import ce_headers

from .conftest import Namespace, WorkerProcess

pytestmark = pytest.mark.integration

T0 = 1_717_243_200_000  # 2024-06-01 12:00 UTC
MIN = 60_000
BREACHES = "tailguard.breaches"
RELEASES = "tailguard.releases"


def breach(
    n: int, seq: int = 0, *, service: str = "chat", severity: str = "page"
) -> dict[str, Any]:
    breach_id = f"br{n:03d}"
    state = ("opened", "updated", "resolved")[seq]
    return {
        "schema": "tailguard.breach.v1",
        "event_id": f"{breach_id}:{seq}",
        "ts_ms": T0 + (n + seq) * MIN + 1_000,
        "breach_id": breach_id,
        "state": state,
        "seq": seq,
        "kind": "burn_rate",
        "severity": severity,
        "slo": "ttft-p99",
        "series": {"service": service, "model": f"m{n % 5}", "variant": "default", "tenant": "t"},
        "at_ms": T0 + (n + seq) * MIN,
        "burn_rates": {"1h": 15.0 + seq, "5m": 60.0},
        "sli": {"1h": 0.8},
        "budget_remaining": 0.5,
        "exemplars": [f"{n:032x}"],
        "attribution": [{"cause": "queue_wait", "share": 0.7}],
        "stages": [],
        "gpu": [],
        "opened_ms": T0 + n * MIN,
        "resolved_ms": T0 + (n + seq) * MIN if state == "resolved" else None,
    }


def release(n: int, decision: str) -> dict[str, Any]:
    return {
        "schema": "tailguard.release.v1",
        "event_id": f"exp-{n}:{decision}",
        "ts_ms": T0 + n * MIN,
        "experiment": f"exp-{n}",
        "decision": decision,
        "arm": "canary",
        "reasons": [f"{decision} because of test {n}"],
        "evidence": {},
        "weights": {"control": 0.9, "canary": 0.1},
    }


def key_of(record: dict[str, Any]) -> bytes:
    if "series" in record:
        s = record["series"]
        return f"{s['service']}|{s['model']}|{s['variant']}|{s['tenant']}".encode()
    return str(record["experiment"]).encode()


def publish(broker: str, topic: str, records: list[dict[str, Any]]) -> None:
    """As the worker does: JSON value, series/experiment key, CloudEvents headers."""
    producer = Producer({"bootstrap.servers": broker, "enable.idempotence": True})
    for r in records:
        headers = ce_headers(r["schema"], r["event_id"], r["ts_ms"], source="tailguard-test")
        producer.produce(topic, json.dumps(r).encode(), key_of(r), headers=headers)
    assert producer.flush(30) == 0


class Receiver:
    """A local webhook receiver that fails when told to, and counts accepted deliveries."""

    def __init__(self, fail_first: int, outage_after: int | None = None) -> None:
        self.fail_first = fail_first
        #: After this many accepted deliveries every POST fails until ``outage`` is cleared.
        self.outage_after = outage_after
        self.outage = False
        self.lock = threading.Lock()
        self.accepted: Counter[str] = Counter()
        self.order: list[str] = []
        self.failed = 0
        self.bodies: dict[str, dict[str, Any]] = {}
        self.problems: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                key = self.headers.get("Idempotency-Key", "")
                with receiver.lock:
                    if receiver.fail_first > 0 or receiver.outage:
                        receiver.fail_first = max(0, receiver.fail_first - 1)
                        receiver.failed += 1
                        status = 503
                    else:
                        status = 200
                        receiver.accepted[key] += 1
                        receiver.order.append(key)
                        receiver.check(key, body)
                        if len(receiver.order) == receiver.outage_after:
                            receiver.outage = True
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/alerts"

    def check(self, key: str, raw: bytes) -> None:
        try:
            body = json.loads(raw)
            [alert] = body["alerts"]
            assert body["version"] == "4"
            assert alert["annotations"]["event_id"] == key
            assert len(alert["fingerprint"]) == 16
            self.bodies[key] = body
        except (ValueError, KeyError, AssertionError) as exc:
            self.problems.append(f"{key}: {exc!r}")

    def snapshot(self) -> tuple[Counter[str], int]:
        with self.lock:
            return Counter(self.accepted), self.failed

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(fail_first: int = 0, outage_after: int | None = None) -> Receiver:
        r = Receiver(fail_first, outage_after)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def forwarder(
    ns: Namespace, tmp_path: Path, url: str, *, group: str, instance: str, name: str
) -> WorkerProcess:
    env = {
        **os.environ,
        "TAILGUARD_BROKER": ns.broker,
        "TAILGUARD_TOPIC_PREFIX": ns.prefix,
        "PYTHONUNBUFFERED": "1",
    }
    args = [
        sys.executable,
        "-m",
        "tailguard.cli",
        "alerts",
        "forward",
        "--webhook",
        url,
        "--group",
        group,
        "--instance-id",
        instance,
        "--state-file",
        str(tmp_path / "delivery.json"),
        "--from-beginning",
        "--backoff-base",
        "0.05",
        "--backoff-max",
        "0.4",
        "--timeout",
        "5",
    ]
    return WorkerProcess(args=args, env=env, log_path=tmp_path / f"forward-{name}.log")


def wait_until(
    what: str, predicate: Callable[[], bool], timeout: float, proc: WorkerProcess
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if not proc.alive():
            raise AssertionError(f"forwarder died while waiting for {what}:\n{proc.log_tail()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n{proc.log_tail()}")


def committed_to_end(broker: str, group: str, topics: list[str]) -> bool:
    """Whether ``group`` has committed every partition of ``topics`` up to its end."""
    c = Consumer({"bootstrap.servers": broker, "group.id": group, "enable.auto.commit": False})
    try:
        for topic in topics:
            parts = c.list_topics(topic, timeout=10).topics[topic].partitions
            tps = [TopicPartition(topic, p) for p in parts]
            for tp in c.committed(tps, timeout=10):
                _low, high = c.get_watermark_offsets(
                    TopicPartition(topic, tp.partition), timeout=10
                )
                if high > 0 and tp.offset < high:
                    return False
    finally:
        c.close()
    return True


def test_forwarder_delivers_every_breach_once_across_a_sigkill_and_restarts(
    namespace: Namespace, tmp_path: Path, receiver: Callable[..., Receiver]
) -> None:
    ns = namespace
    # 12 breaches × (opened, updated, resolved) = 36 events, then 4 more breaches later.
    first = [breach(n, seq) for n in range(12) for seq in range(3)]
    releases = [release(1, "rollback"), release(2, "hold"), release(3, "promote")]
    publish(ns.broker, ns.topic(BREACHES), first)
    publish(ns.broker, ns.topic(RELEASES), releases)
    # The first three POSTs get 503; after 12 accepted deliveries an outage begins.
    rx = receiver(fail_first=3, outage_after=12)
    group = f"{ns.app_id}-fwd"

    a = forwarder(ns, tmp_path, rx.url, group=group, instance="fwd-1", name="a").start()
    wait_until("retries during the outage", lambda: rx.snapshot()[1] >= 3 + 3, 60, a)
    a.kill()  # SIGKILL while it retries: no clean shutdown, no commit, no flush
    accepted_before, _ = rx.snapshot()
    assert sum(accepted_before.values()) == 12

    with rx.lock:
        rx.outage = False
    later = [breach(n, 0, service="search") for n in range(100, 104)]
    publish(ns.broker, ns.topic(BREACHES), later)
    b = forwarder(ns, tmp_path, rx.url, group=group, instance="fwd-1", name="b").start()
    expected = {r["event_id"] for r in first + later + releases}
    wait_until("every event", lambda: set(rx.snapshot()[0]) >= expected, 90, b)
    wait_until(
        "commits up to the end",
        lambda: committed_to_end(ns.broker, group, [ns.topic(BREACHES), ns.topic(RELEASES)]),
        30,
        b,
    )
    time.sleep(1.0)  # anything still to come would be a second delivery
    assert b.stop() == 0, b.log_tail()

    accepted, _ = rx.snapshot()
    assert set(accepted) == expected, "lost or unexpected events"
    twice = {k: n for k, n in accepted.items() if n > 1}
    assert not twice, f"delivered more than once: {twice}"
    assert rx.problems == []
    # Per breach, the transitions arrived in order (head-of-line blocking, partition order).
    for n in range(12):
        keys = [k for k in rx.order if k.startswith(f"br{n:03d}:")]
        assert keys == [f"br{n:03d}:0", f"br{n:03d}:1", f"br{n:03d}:2"]
    rollback = rx.bodies["exp-1:rollback"]["alerts"][0]["labels"]
    assert (rollback["alertname"], rollback["severity"]) == ("TailguardRelease", "page")
    resolved = rx.bodies["br000:2"]
    assert resolved["status"] == "resolved"
    assert resolved["alerts"][0]["fingerprint"] == rx.bodies["br000:0"]["alerts"][0]["fingerprint"]

    # The crash window after a 2xx, before the commit: a forwarder whose commits are all
    # missing (a new group) but which keeps the delivery log POSTs none of them again.
    publish(ns.broker, ns.topic(BREACHES), [breach(200, 0)])
    c = forwarder(ns, tmp_path, rx.url, group=f"{group}-2", instance="fwd-2", name="c").start()
    wait_until(
        "the new group's commits up to the end",
        lambda: committed_to_end(ns.broker, f"{group}-2", [ns.topic(BREACHES), ns.topic(RELEASES)]),
        60,
        c,
    )
    assert c.stop() == 0
    final, _ = rx.snapshot()
    assert final - accepted == Counter({"br200:0": 1})
    log = c.log_path.read_text()
    assert log.count("already delivered (delivery log)") == len(expected)
    assert "stopped: delivered 1 (1 POSTs, 0 failed)" in log


def test_follow_prints_matching_events_as_rich_lines_or_json(namespace: Namespace) -> None:
    ns = namespace
    publish(
        ns.broker,
        ns.topic(BREACHES),
        [breach(1), breach(2, severity="ticket"), breach(3, service="search")],
    )
    publish(ns.broker, ns.topic(RELEASES), [release(7, "rollback"), release(8, "continue")])
    env = {**os.environ, "TAILGUARD_BROKER": ns.broker, "TAILGUARD_TOPIC_PREFIX": ns.prefix}
    base = [sys.executable, "-m", "tailguard.cli", "alerts", "follow", "--from-beginning"]

    as_json = subprocess.run(
        [*base, "--output", "json", "--severity", "page", "--limit", "3", "--duration", "30"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    ids = sorted(json.loads(line)["event_id"] for line in as_json.stdout.splitlines())
    assert ids == ["br001:0", "br003:0", "exp-7:rollback"]

    rich = subprocess.run(
        [*base, "--topic", "breaches", "--service", "ch*", "--limit", "2", "--duration", "30"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert rich.returncode == 0, rich.stderr
    lines = rich.stdout.splitlines()
    assert len(lines) == 2
    assert all("OPENED" in line and "chat/" in line for line in lines)
    assert {"page", "ticket"} == {line.split()[3] for line in lines}
    assert "2 events shown" in rich.stderr


def test_follow_says_clearly_when_the_broker_is_absent() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "alerts", "follow", "--broker", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: no Kafka broker answers at 127.0.0.1:1")
    assert "Traceback" not in proc.stderr
