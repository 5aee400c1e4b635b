"""The Kafka producer loop, against an in-memory double (the real broker is integration)."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError
from tailguard.schemas.columnar import rows_of
from tailguard.schemas.placement import home_partition, series_key_of

from tailguard.simulator import SimConfig, SimulatorError, Stats, generate, run
from tailguard.simulator.producer import producer_config

MakeCfg = Callable[..., SimConfig]


@dataclass
class Sent:
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, Any]]
    wall_ms: int


@dataclass
class FakeProducer:
    """Delivers on poll/flush; fails every ``fail_every``-th message when > 0."""

    topics: tuple[str, ...] = ("tailguard.inference",)
    #: Partitions the metadata reports per topic (0: metadata without partitions).
    partitions: int = 4
    fail_every: int = 0
    missing_error: KafkaError | None = None
    sent: list[Sent] = field(default_factory=list)
    pending: list[Callable[[Any, Any], None]] = field(default_factory=list)
    flushed: bool = False

    def produce(
        self,
        topic: str,
        *,
        value: bytes,
        key: bytes,
        on_delivery: Callable[[Any, Any], None],
        headers: list[tuple[str, Any]],
    ) -> None:
        self.sent.append(Sent(topic, key, value, headers, time.time_ns() // 1_000_000))
        self.pending.append(on_delivery)

    def _deliver(self) -> int:
        n = len(self.pending)
        for cb in self.pending:
            fail = self.fail_every and (len(self.sent) - n + 1) % self.fail_every == 0
            cb("broker said no" if fail else None, None)
            n -= 1
        count = len(self.pending)
        self.pending.clear()
        return count

    def poll(self, timeout: float) -> int:
        return self._deliver()

    def flush(self, timeout: float) -> int:
        self.flushed = True
        self._deliver()
        return 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        parts = {p: None for p in range(self.partitions)}
        topics = {t: SimpleNamespace(error=None, partitions=parts) for t in self.topics}
        if topic is not None and topic not in topics:
            topics[topic] = SimpleNamespace(error=self.missing_error)
            if self.missing_error is None:
                del topics[topic]
        return SimpleNamespace(topics=topics)


def test_without_a_partition_count_a_message_holds_one_series(make_cfg: MakeCfg) -> None:
    fake = FakeProducer(partitions=0)
    run(make_cfg(rate=100.0, duration_s=5.0), broker="fake:9092", pace="max", producer=fake)
    assert fake.sent
    for s in fake.sent:
        assert {series_key_of(e) for e in rows_of(s.value)} == {s.key.decode()}


def _events(fake: FakeProducer) -> list[dict[str, Any]]:
    return [e for s in fake.sent for e in rows_of(s.value)]


def test_messages_hold_one_home_partition_keyed_by_a_series_of_it(make_cfg: MakeCfg) -> None:
    cfg = make_cfg(rate=100.0, duration_s=20.0)
    fake = FakeProducer(partitions=4)
    stats = run(cfg, broker="fake:9092", batch_size=50, pace="max", producer=fake)
    homes = set()
    for s in fake.sent:
        batch = rows_of(s.value)
        assert s.topic == "tailguard.inference"
        assert isinstance(batch, list) and 1 <= len(batch) <= 50
        home = home_partition(s.key.decode(), 4)
        assert s.key.decode() in {series_key_of(e) for e in batch}
        assert {home_partition(series_key_of(e), 4) for e in batch} == {home}
        homes.add(home)
        assert ("content-type", b"application/json") in s.headers
    assert len(homes) > 1, "the configuration spreads its series over partitions"
    sent = _events(fake)
    assert sorted(e["event_id"] for e in sent) == sorted(e["event_id"] for e in generate(cfg))
    assert stats.events == stats.delivered_events == len(sent)
    assert stats.messages == stats.delivered_messages == len(fake.sent)
    assert stats.failed_messages == 0 and not stats.interrupted and fake.flushed
    assert stats.first_ts_ms == cfg.start_ms


def test_a_batch_too_big_for_one_message_is_split(make_cfg: MakeCfg) -> None:
    fake = FakeProducer()
    stats = run(
        make_cfg(rate=50.0, duration_s=10.0),
        broker="fake:9092",
        batch_size=500,
        pace="max",
        max_message_bytes=20_000,
        producer=fake,
    )
    assert all(len(s.value) <= 20_000 for s in fake.sent)
    assert stats.delivered_events == len(_events(fake)) == stats.events


def test_delivery_failures_are_counted(make_cfg: MakeCfg) -> None:
    fake = FakeProducer(fail_every=2)
    stats = run(make_cfg(duration_s=10.0), broker="f", batch_size=20, pace="max", producer=fake)
    assert stats.failed_messages == len(fake.sent) // 2
    assert stats.delivered_messages + stats.failed_messages == stats.messages
    assert stats.delivered_events + stats.failed_events == stats.events
    assert stats.last_error == "broker said no"


def test_realtime_pace_sends_each_batch_once_its_events_have_happened(make_cfg: MakeCfg) -> None:
    fake = FakeProducer()
    before = time.time_ns() // 1_000_000
    stats = run(make_cfg(rate=40.0, duration_s=1.5), broker="f", batch_size=10, producer=fake)
    assert stats.first_ts_ms is not None and stats.first_ts_ms >= before  # event time = wall time
    assert 1.2 <= stats.elapsed_s <= 4.0
    for s in fake.sent:
        assert s.wall_ms >= rows_of(s.value)[-1]["ts_ms"]


def test_progress_is_reported_and_ctrl_c_flushes_and_returns(make_cfg: MakeCfg) -> None:
    seen: list[int] = []

    def progress(stats: Stats) -> None:
        seen.append(stats.events)
        if stats.events > 100 and not stats.interrupted:
            raise KeyboardInterrupt  # as Ctrl-C would, once

    fake = FakeProducer()
    stats = run(
        make_cfg(rate=200.0, duration_s=30.0),
        broker="f",
        batch_size=20,
        pace="max",
        on_progress=progress,
        progress_interval_s=0.0,
        producer=fake,
    )
    assert stats.interrupted and fake.flushed and seen
    assert 100 < stats.events < 6000


def test_missing_topic_is_a_clear_simulator_error(make_cfg: MakeCfg) -> None:
    fake = FakeProducer(missing_error=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    with pytest.raises(SimulatorError, match="topic 'elsewhere' does not exist"):
        run(make_cfg(), broker="f", topic="elsewhere", producer=fake)
    assert fake.sent == []


def test_unreachable_broker_is_a_clear_simulator_error_mentioning_make_kafka_up(
    make_cfg: MakeCfg,
) -> None:
    with pytest.raises(SimulatorError, match=r"127\.0\.0\.1:1 .*make kafka-up") as info:
        run(make_cfg(), broker="127.0.0.1:1", connect_timeout_s=1.0)
    assert isinstance(info.value, RuntimeError)


def test_producer_settings_are_idempotent_lingering_and_compressed() -> None:
    conf = producer_config("b:9092", {"linger.ms": 5})
    assert conf["bootstrap.servers"] == "b:9092"
    assert conf["acks"] == "all" and conf["enable.idempotence"] is True
    assert conf["compression.type"] == "lz4" and conf["linger.ms"] == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"pace": "warp"}, "pace must be one of"), ({"batch_size": 0}, "batch_size must be")],
)
def test_bad_run_arguments_are_refused(
    make_cfg: MakeCfg, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        run(make_cfg(), broker="f", producer=FakeProducer(), **kwargs)
