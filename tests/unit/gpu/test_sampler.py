"""The sampling loop against an in-memory producer (the real broker is integration)."""

import io
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from tailguard.schemas import GpuSample

from tailguard.errors import TailguardError
from tailguard.gpu import (
    BrokerError,
    GpuConfigError,
    JsonLinesProducer,
    NvmlError,
    ReaderStats,
    SimulatedReader,
    default_topic,
    run,
)


@dataclass
class Sent:
    topic: str
    key: bytes
    value: bytes
    headers: dict[str, bytes]


@dataclass
class FakeProducer:
    """Delivers on poll/flush; ``fail`` makes deliveries fail; ``full`` raises BufferError."""

    fail: bool = False
    full: int = 0  # the next ``full`` produce calls raise BufferError
    sent: list[Sent] = field(default_factory=list)
    pending: list[Callable[[Any, Any], None]] = field(default_factory=list)
    flushes: int = 0

    def produce(
        self,
        topic: str,
        *,
        value: bytes,
        key: bytes,
        headers: list[tuple[str, bytes]],
        on_delivery: Callable[[Any, Any], None],
    ) -> None:
        if self.full:
            self.full -= 1
            raise BufferError("Local: Queue full")
        self.sent.append(Sent(topic, key, value, dict(headers)))
        self.pending.append(on_delivery)

    def _deliver(self) -> int:
        for cb in self.pending:
            cb("broker said no" if self.fail else None, None)
        n = len(self.pending)
        self.pending.clear()
        return n

    def poll(self, timeout: float) -> int:
        return self._deliver()

    def flush(self, timeout: float) -> int:
        self.flushes += 1
        self._deliver()
        return 0


def _reader(**kw: Any) -> SimulatedReader:
    kw.setdefault("hosts", 1)
    kw.setdefault("gpus_per_host", 2)
    return SimulatedReader(**kw)


def test_each_sample_is_one_message_keyed_host_gpu_with_cloudevents_headers() -> None:
    producer = FakeProducer()
    stats = run(
        _reader(), broker="unused:9092", count=3, interval_s=0.01, host="sampler-1",
        producer=producer,
    )  # fmt: skip
    assert (stats.rounds, stats.samples, stats.delivered, stats.failed) == (3, 6, 6, 0)
    assert [m.key for m in producer.sent] == [b"gpu-node-01:0", b"gpu-node-01:1"] * 3
    for m in producer.sent:
        sample = msgspec.json.decode(m.value, type=GpuSample)
        assert sample.schema == "tailguard.gpu.v1"
        assert m.headers["ce_specversion"] == b"1.0"
        assert m.headers["ce_type"] == b"tailguard.gpu.v1"
        assert m.headers["ce_id"] == f"{sample.host}:{sample.gpu}:{sample.ts_ms}".encode()
        assert m.headers["ce_source"] == b"tailguard-gpu-sampler/sampler-1"
        assert m.headers["ce_time"].endswith(b"Z")
        assert m.headers["content-type"] == b"application/json"
    assert len({m.headers["ce_id"] for m in producer.sent}) == 6
    assert producer.flushes == 1


def test_the_topic_honours_the_namespace_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILGUARD_TOPIC_PREFIX", "ns1.")
    assert default_topic() == "ns1.tailguard.gpu"
    producer = FakeProducer()
    run(_reader(), broker="x", count=1, producer=producer)
    assert {m.topic for m in producer.sent} == {"ns1.tailguard.gpu"}
    producer = FakeProducer()
    run(_reader(), broker="x", topic="elsewhere", count=1, producer=producer)
    assert {m.topic for m in producer.sent} == {"elsewhere"}


def test_without_a_prefix_the_topic_is_the_contracts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAILGUARD_TOPIC_PREFIX", raising=False)
    producer = FakeProducer()
    run(_reader(), broker="x", count=1, producer=producer)
    assert {m.topic for m in producer.sent} == {"tailguard.gpu"}


def test_rounds_follow_the_interval() -> None:
    producer = FakeProducer()
    stats = run(_reader(gpus_per_host=1), broker="x", count=3, interval_s=0.05, producer=producer)
    ts = [msgspec.json.decode(m.value, type=GpuSample).ts_ms for m in producer.sent]
    assert ts[2] - ts[0] >= 90
    assert stats.elapsed_s >= 0.09


def test_failed_deliveries_are_counted_not_raised() -> None:
    producer = FakeProducer(fail=True)
    stats = run(_reader(), broker="x", count=2, interval_s=0.01, producer=producer)
    assert (stats.samples, stats.delivered, stats.failed) == (4, 0, 4)
    assert stats.last_error == "broker said no"


def test_a_full_queue_is_retried_once_then_the_sample_dropped() -> None:
    producer = FakeProducer(full=3)
    stats = run(_reader(), broker="x", count=1, producer=producer)
    # sample 0: full, full → dropped; sample 1: full, then sent
    assert (stats.samples, stats.dropped) == (1, 1)
    assert [m.key for m in producer.sent] == [b"gpu-node-01:1"]


class _SignalsItself:
    """A reader that sends ``signum`` to this process on its ``at``-th round."""

    def __init__(self, signum: int, at: int) -> None:
        self.inner = _reader()
        self.stats = ReaderStats()
        self.signum, self.at, self.rounds = signum, at, 0

    def sample(self, now_ms: int) -> list[GpuSample]:
        self.rounds += 1
        if self.rounds == self.at:
            os.kill(os.getpid(), self.signum)
        return self.inner.sample(now_ms)

    def close(self) -> None: ...

    def __enter__(self) -> "_SignalsItself":
        return self

    def __exit__(self, *exc: object) -> None: ...


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_loop_cleanly_after_the_round(signum: signal.Signals) -> None:
    before = signal.getsignal(signum)
    producer = FakeProducer()
    stats = run(
        _SignalsItself(signum, at=2), broker="x", interval_s=0.01, producer=producer
    )  # count=None: only the signal ends it
    assert stats.stopped_by == signum.name
    assert stats.rounds == 2 and stats.samples == 4 and stats.delivered == 4
    assert producer.flushes == 1
    assert signal.getsignal(signum) is before


def test_a_reader_failure_propagates_after_the_flush() -> None:
    class Lost(SimulatedReader):
        def sample(self, now_ms: int) -> list[GpuSample]:
            if self.stats.rounds == 1:
                raise NvmlError("every GPU of h was lost")
            return super().sample(now_ms)

    producer = FakeProducer()
    with pytest.raises(NvmlError, match="every GPU"):
        run(Lost(hosts=1, gpus_per_host=2), broker="x", interval_s=0.01, producer=producer)
    assert len(producer.sent) == 2 and producer.flushes == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"interval_s": 0}, "interval_s"),
        ({"interval_s": float("nan")}, "interval_s"),
        ({"count": 0}, "count"),
        ({"count": True}, "count"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(GpuConfigError, match=match):
        run(_reader(), broker="x", producer=FakeProducer(), **kwargs)


def test_an_unreachable_broker_is_a_clear_error() -> None:
    with pytest.raises(BrokerError) as info:
        run(_reader(), broker="127.0.0.1:1", count=1, connect_timeout_s=0.5)
    message = str(info.value)
    assert message.startswith("cannot reach the Kafka broker at 127.0.0.1:1 (")
    assert "--broker" in message and "\n" not in message
    assert isinstance(info.value, TailguardError)


def test_json_lines_producer_writes_one_record_per_line() -> None:
    out = io.BytesIO()
    stats = run(_reader(), broker="x", count=2, interval_s=0.01, producer=JsonLinesProducer(out))
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 == stats.delivered
    assert all(msgspec.json.decode(line, type=GpuSample).host == "gpu-node-01" for line in lines)
