"""Integration fixtures: a real Kafka broker, real workers in subprocesses, real RocksDB.

The broker is the one ``make test`` starts (``TAILGUARD_BROKER``); when none
answers, the session starts one itself with ``infra/kafka/kafka.sh`` and the
test state directory, and stops it afterwards. Each test gets its own topic
namespace (``TAILGUARD_TOPIC_PREFIX``) and faust app id, so tests never see
each other's records or state.
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tailguard.catalogue import catalogue
from tailguard.kafka_admin import create_topics

REPO = Path(__file__).resolve().parents[2]
BROKER = os.environ.get("TAILGUARD_BROKER", "127.0.0.1:19092")
TEST_STATE = Path(os.environ.get("TAILGUARD_TEST_STATE", REPO / ".state" / "test"))


def _answers(broker: str) -> bool:
    try:
        AdminClient({"bootstrap.servers": broker}).list_topics(timeout=3)
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def broker() -> Iterator[str]:
    """Address of a running Kafka broker (started here when none answers)."""
    if _answers(BROKER):
        yield BROKER
        return
    _host, port = BROKER.rsplit(":", 1)
    env = {
        **os.environ,
        "TAILGUARD_STATE_DIR": str(TEST_STATE),
        "TAILGUARD_KAFKA_PORT": port,
        "TAILGUARD_KAFKA_CONTROLLER_PORT": str(int(port) + 1),
    }
    script = REPO / "infra" / "kafka" / "kafka.sh"
    subprocess.run([script, "reset"], env=env, check=True, capture_output=True)
    subprocess.run([script, "up"], env=env, check=True)
    try:
        yield BROKER
    finally:
        subprocess.run([script, "down"], env=env, check=False)


@dataclass
class Namespace:
    """One test's topics and app id on the shared broker."""

    broker: str
    prefix: str
    app_id: str
    partitions: int

    def topic(self, name: str) -> str:
        return self.prefix + name


def _new_namespace(broker: str) -> Namespace:
    tag = uuid.uuid4().hex[:8]
    ns = Namespace(broker=broker, prefix=f"t{tag}.", app_id=f"tg-test-{tag}", partitions=2)
    create_topics(broker, catalogue(ns.partitions, prefix=ns.prefix))
    return ns


@pytest.fixture
def namespace(broker: str) -> Namespace:
    return _new_namespace(broker)


@pytest.fixture
def second_namespace(broker: str) -> Namespace:
    """Another isolated namespace (e.g. to replay the same input into a fresh worker)."""
    return _new_namespace(broker)


@dataclass
class WorkerProcess:
    """A ``tailguard worker`` subprocess."""

    args: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def data_dir(self) -> Path:
        return Path(self.args[self.args.index("--data-dir") + 1])

    def start(self) -> "WorkerProcess":
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, no flush."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM and wait for a clean stop."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=30)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 60) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


@pytest.fixture
def worker_factory(namespace: Namespace, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    made: list[WorkerProcess] = []

    def make(name: str = "w1", *extra: str, ns: Namespace | None = None) -> WorkerProcess:
        namespace_ = ns or namespace
        data_dir = tmp_path / f"data-{name}"
        env = {
            **os.environ,
            "TAILGUARD_BROKER": namespace_.broker,
            "TAILGUARD_TOPIC_PREFIX": namespace_.prefix,
            "TAILGUARD_APP_ID": namespace_.app_id,
            "TAILGUARD_PARTITIONS": str(namespace_.partitions),
            "PYTHONUNBUFFERED": "1",
        }
        args = [
            sys.executable,
            "-m",
            "tailguard.cli",
            "worker",
            "--data-dir",
            str(data_dir),
            "--snapshot-interval",
            "1",
            "--loglevel",
            os.environ.get("TAILGUARD_TEST_LOGLEVEL", "warning"),
            *extra,
        ]
        wp = WorkerProcess(args=args, env=env, log_path=tmp_path / f"worker-{name}.log")
        made.append(wp)
        return wp

    yield make
    for wp in made:
        wp.stop()


@pytest.fixture
def produce() -> Callable[[str, str, list[tuple[bytes | None, bytes]]], list[tuple[int, int]]]:
    """The :func:`produce_messages` function, for tests."""
    return produce_messages


def produce_messages(
    broker: str, topic: str, messages: list[tuple[bytes | None, bytes]], compression: str = "none"
) -> list[tuple[int, int]]:
    """Send ``(key, value)`` messages; returns their ``(partition, offset)`` in order."""
    positions: list[tuple[int, int] | None] = [None] * len(messages)
    producer = Producer(
        {
            "bootstrap.servers": broker,
            "linger.ms": 10,
            "enable.idempotence": True,
            "message.max.bytes": 8_000_000,
            "compression.type": compression,
        }
    )

    def report(i: int) -> Callable[[Any, Any], None]:
        def cb(err: Any, msg: Any) -> None:
            assert err is None, err
            positions[i] = (msg.partition(), msg.offset())

        return cb

    for i, (key, value) in enumerate(messages):
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=report(i))
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0
    return [p for p in positions if p is not None]


@dataclass
class Collector:
    """Reads a topic from the beginning, keeps every JSON record."""

    broker: str
    topic: str
    records: list[dict[str, Any]] = field(default_factory=list)
    headers: list[list[tuple[str, bytes]]] = field(default_factory=list)
    _consumer: Any = None

    def __post_init__(self) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": self.broker,
                "group.id": f"c-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
            }
        )
        meta = AdminClient({"bootstrap.servers": self.broker}).list_topics(self.topic, timeout=10)
        parts = meta.topics[self.topic].partitions
        self._consumer.assign([TopicPartition(self.topic, p, 0) for p in parts])

    def poll(self, seconds: float = 0.5) -> int:
        got = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msgs = self._consumer.consume(1000, timeout=0.2)
            for m in msgs:
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(str(m.error()))
                self.records.append(json.loads(m.value()))
                self.headers.append(list(m.headers() or []))
                got += 1
        return got

    def wait_for(
        self,
        predicate: Callable[[list[dict[str, Any]]], bool],
        timeout: float,
        worker: WorkerProcess | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll(0.5)
            if predicate(self.records):
                return
            if worker is not None and not worker.alive():
                raise AssertionError(f"worker died:\n{worker.log_tail()}")
        detail = ""
        if worker is not None:
            if worker.alive() and worker.proc is not None:
                worker.proc.send_signal(signal.SIGUSR1)  # mode dumps every task's stack
                time.sleep(2)
            detail = worker.log_tail(400)
        raise AssertionError(
            f"timed out after {timeout}s waiting on {self.topic} "
            f"({len(self.records)} records)\n{detail}"
        )

    def close(self) -> None:
        self._consumer.close()


@pytest.fixture
def collector(namespace: Namespace) -> Iterator[Callable[[str], Collector]]:
    made: list[Collector] = []

    def make(name: str, ns: Namespace | None = None) -> Collector:
        space = ns or namespace
        c = Collector(space.broker, space.topic(name))
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def read_table(broker: str, topic: str) -> dict[bytes, bytes]:
    """The latest value of every key of a changelog topic."""
    meta = AdminClient({"bootstrap.servers": broker}).list_topics(topic, timeout=10)
    parts = list(meta.topics[topic].partitions) if topic in meta.topics else []
    if not parts:
        return {}
    consumer = Consumer(
        {
            "bootstrap.servers": broker,
            "group.id": f"c-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    latest: dict[bytes, bytes] = {}
    done: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(done) < len(parts) and time.monotonic() < deadline:
            for m in consumer.consume(1000, timeout=0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition() or 0)
                        continue
                    raise AssertionError(str(err))
                key, value = m.key() or b"", m.value()
                if value is None:
                    latest.pop(key, None)
                else:
                    latest[key] = value
    finally:
        consumer.close()
    return latest
