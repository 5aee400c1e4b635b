"""The forwarder loop against an in-memory consumer and webhook: commit only after delivery."""

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from tailguard.alerts.delivery import Backoff, DeliveryLog
from tailguard.alerts.events import AlertEvent, EventFilter
from tailguard.alerts.forward import Forwarder, ForwarderFailed
from tailguard.alerts.webhook import Attempt, RecordingWebhook

TOPIC = "tailguard.breaches"


@dataclass
class FakeError:
    code_: int
    fatal_: bool = False

    def code(self) -> int:
        return self.code_

    def fatal(self) -> bool:
        return self.fatal_

    def str(self) -> str:
        return f"error {self.code_}"


@dataclass
class FakeMessage:
    topic_: str
    partition_: int
    offset_: int
    value_: bytes | None
    error_: FakeError | None = None

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def value(self) -> bytes | None:
        return self.value_

    def error(self) -> FakeError | None:
        return self.error_


@dataclass
class FakeConsumer:
    """Hands out queued messages of unpaused partitions; records commits and pauses."""

    queue: list[FakeMessage] = field(default_factory=list)
    commits: list[tuple[str, int, int]] = field(default_factory=list)
    paused: set[tuple[str, int]] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    parts: tuple[int, ...] = (0, 1)
    on_poll: Any = None

    def poll(self, timeout: float) -> FakeMessage | None:
        if self.on_poll is not None:
            self.on_poll()
        for i, m in enumerate(self.queue):
            if (m.topic(), m.partition()) not in self.paused:
                return self.queue.pop(i)
        return None

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        assert asynchronous is False
        self.commits += [(tp.topic, tp.partition, tp.offset) for tp in offsets]
        self.calls.append("commit")
        return offsets

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, p) for p in self.parts]

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}
        self.calls.append("pause")

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}
        self.calls.append("resume")


def message(offset: int, record: dict[str, Any], partition: int = 0) -> FakeMessage:
    return FakeMessage(TOPIC, partition, offset, json.dumps(record).encode())


def render(event: AlertEvent) -> bytes:
    return json.dumps({"event_id": event.event_id}).encode()


def make_forwarder(
    consumer: FakeConsumer,
    webhook: Any,
    tmp_path: Path,
    *,
    event_filter: EventFilter | None = None,
    stop: threading.Event | None = None,
) -> Forwarder:
    return Forwarder(
        consumer,
        webhook,
        DeliveryLog.load(tmp_path / "log.json"),
        kinds={TOPIC: "breach"},
        render=render,
        event_filter=event_filter,
        backoff=Backoff(base_s=0.001, max_s=0.004),
        stop=stop,
    )


def drain(fw: Forwarder, consumer: FakeConsumer) -> None:
    while consumer.queue:
        fw.step(0)


def test_a_failing_receiver_is_retried_and_the_offset_committed_after_the_2xx(
    tmp_path: Path, make_breach: Any
) -> None:
    consumer = FakeConsumer([message(5, make_breach())])
    hook = RecordingWebhook(script=[503, 503, 500])
    fw = make_forwarder(consumer, hook, tmp_path)
    assert fw.step(0) is True
    assert len(hook.posts) == 4
    assert {h["Idempotency-Key"] for _b, h in hook.posts} == {"b1:0"}
    assert consumer.commits == [(TOPIC, 0, 6)]  # the next offset to read
    assert consumer.calls == ["pause", "resume", "commit"]
    assert DeliveryLog.load(tmp_path / "log.json").delivered(TOPIC, 0, "b1:0")
    assert (fw.stats.delivered, fw.stats.attempts, fw.stats.failed_attempts) == (1, 4, 3)


def test_events_go_out_in_partition_order_one_commit_each(tmp_path: Path, make_breach: Any) -> None:
    records = [make_breach(event_id=f"b1:{i}", seq=i) for i in range(3)]
    consumer = FakeConsumer([message(i, r) for i, r in enumerate(records)])
    hook = RecordingWebhook()
    drain(make_forwarder(consumer, hook, tmp_path), consumer)
    assert [json.loads(b)["event_id"] for b, _h in hook.posts] == ["b1:0", "b1:1", "b1:2"]
    assert consumer.commits == [(TOPIC, 0, 1), (TOPIC, 0, 2), (TOPIC, 0, 3)]


def test_an_event_in_the_delivery_log_is_committed_without_a_post(
    tmp_path: Path, make_breach: Any
) -> None:
    DeliveryLog.load(tmp_path / "log.json").record(TOPIC, 0, 5, "b1:0")  # POSTed, not committed
    consumer = FakeConsumer([message(5, make_breach())])
    hook = RecordingWebhook()
    fw = make_forwarder(consumer, hook, tmp_path)
    assert fw.step(0) is True
    assert hook.posts == []
    assert consumer.commits == [(TOPIC, 0, 6)]
    assert fw.stats.already_delivered == 1


def test_a_worker_resend_of_a_delivered_event_is_not_posted_again(
    tmp_path: Path, make_breach: Any
) -> None:
    consumer = FakeConsumer([message(5, make_breach()), message(9, make_breach())])
    hook = RecordingWebhook()
    drain(make_forwarder(consumer, hook, tmp_path), consumer)
    assert len(hook.posts) == 1
    assert consumer.commits == [(TOPIC, 0, 6), (TOPIC, 0, 10)]


def test_filtered_and_bad_records_are_committed_without_a_post(
    tmp_path: Path, make_breach: Any
) -> None:
    consumer = FakeConsumer(
        [
            message(0, make_breach(severity="ticket", event_id="t:0")),
            FakeMessage(TOPIC, 0, 1, b"{oops"),
            message(2, make_breach()),
        ]
    )
    hook = RecordingWebhook()
    fw = make_forwarder(consumer, hook, tmp_path, event_filter=EventFilter.of(severities=["page"]))
    drain(fw, consumer)
    assert [json.loads(b)["event_id"] for b, _h in hook.posts] == ["b1:0"]
    assert consumer.commits == [(TOPIC, 0, 1), (TOPIC, 0, 2), (TOPIC, 0, 3)]
    assert (fw.stats.filtered, fw.stats.bad, fw.stats.delivered) == (1, 1, 1)


def test_a_stop_during_retries_leaves_the_record_uncommitted_and_unlogged(
    tmp_path: Path, make_breach: Any
) -> None:
    stop = threading.Event()
    consumer = FakeConsumer([message(5, make_breach())])

    class StopAfterTwo(RecordingWebhook):
        def post(self, body: bytes, headers: Any) -> Attempt:
            if len(self.posts) == 1:
                stop.set()
            return super().post(body, headers)

    hook = StopAfterTwo(then=503)
    fw = make_forwarder(consumer, hook, tmp_path, stop=stop)
    assert fw.step(0) is False
    assert len(hook.posts) == 2
    assert consumer.commits == []
    assert not DeliveryLog.load(tmp_path / "log.json").delivered(TOPIC, 0, "b1:0")
    assert consumer.paused == set()  # resumed for whoever comes next


def test_a_partition_revoked_during_retries_is_abandoned(tmp_path: Path, make_breach: Any) -> None:
    consumer = FakeConsumer([message(5, make_breach())])
    hook = RecordingWebhook(then=503)
    fw = make_forwarder(consumer, hook, tmp_path)
    consumer.on_poll = lambda: fw.on_revoke(consumer, [TopicPartition(TOPIC, 0)])
    assert fw.handle(consumer.poll(0)) is False
    assert consumer.commits == []
    assert len(hook.posts) == 1


def test_other_partitions_wait_while_one_record_is_retried(
    tmp_path: Path, make_breach: Any
) -> None:
    consumer = FakeConsumer([message(0, make_breach()), message(0, make_breach(event_id="x:0"), 1)])
    seen_during_retry: list[Any] = []
    hook = RecordingWebhook(script=[503, 503])
    fw = make_forwarder(consumer, hook, tmp_path)
    consumer.on_poll = lambda: seen_during_retry.append(set(consumer.paused))
    fw.step(0)
    assert [json.loads(b)["event_id"] for b, _h in hook.posts] == ["b1:0"] * 3
    assert any(s == {(TOPIC, 0), (TOPIC, 1)} for s in seen_during_retry)
    fw.step(0)
    assert consumer.commits == [(TOPIC, 0, 1), (TOPIC, 1, 1)]


def test_a_fatal_consumer_error_stops_the_forwarder(tmp_path: Path) -> None:
    consumer = FakeConsumer([FakeMessage(TOPIC, 0, 0, None, FakeError(-150, fatal_=True))])
    fw = make_forwarder(consumer, RecordingWebhook(), tmp_path)
    with pytest.raises(ForwarderFailed, match="restart the forwarder"):
        fw.step(0)


def test_partition_eof_and_transient_errors_are_passed_over(tmp_path: Path) -> None:
    eof, transport = FakeError(-191), FakeError(-195)
    consumer = FakeConsumer(
        [FakeMessage(TOPIC, 0, 0, None, eof), FakeMessage(TOPIC, 0, 0, None, transport)]
    )
    fw = make_forwarder(consumer, RecordingWebhook(), tmp_path)
    assert fw.step(0) is False
    assert fw.step(0) is False
    assert consumer.commits == []


def test_a_record_of_a_partition_assigned_during_retries_waits_its_turn(
    tmp_path: Path, make_breach: Any
) -> None:
    consumer = FakeConsumer([message(0, make_breach())])
    hook = RecordingWebhook(script=[503, 503])
    fw = make_forwarder(consumer, hook, tmp_path)
    late = message(3, make_breach(event_id="late:0"), partition=2)

    def assign_partition_2() -> None:  # not covered by the pause of the old assignment
        if consumer.paused:
            consumer.queue.append(late)
            consumer.on_poll = None

    consumer.on_poll = assign_partition_2
    assert fw.step(0) is True
    assert (TOPIC, 2) in consumer.paused
    assert consumer.commits == [(TOPIC, 0, 1)]
    consumer.paused.clear()
    assert fw.step(0) is True
    assert [json.loads(b)["event_id"] for b, _h in hook.posts] == ["b1:0"] * 3 + ["late:0"]
    assert consumer.commits == [(TOPIC, 0, 1), (TOPIC, 2, 4)]


def test_a_revoked_partitions_pending_record_is_dropped(tmp_path: Path, make_breach: Any) -> None:
    consumer = FakeConsumer()
    fw = make_forwarder(consumer, RecordingWebhook(), tmp_path)
    fw._pending.append(message(3, make_breach(), partition=2))
    fw.on_revoke(consumer, [TopicPartition(TOPIC, 2)])
    assert fw.step(0) is False
    assert consumer.commits == []


def test_silenced_breaches_are_committed_without_a_post_unless_included(
    tmp_path: Path, make_breach: Any
) -> None:
    records = [
        make_breach(event_id="b1:0", silenced=True, silence_id="s1"),
        make_breach(event_id="b1:1", seq=1, state="updated", silenced=False),
        make_breach(event_id="b1:2", seq=2, state="resolved", silenced=True, silence_id="s1"),
    ]
    consumer = FakeConsumer([message(i, r) for i, r in enumerate(records)])
    hook = RecordingWebhook()
    fw = make_forwarder(consumer, hook, tmp_path)  # the default filter: silences do not page
    drain(fw, consumer)
    assert [json.loads(b)["event_id"] for b, _h in hook.posts] == ["b1:1", "b1:2"]
    assert consumer.commits == [(TOPIC, 0, 1), (TOPIC, 0, 2), (TOPIC, 0, 3)]
    assert (fw.stats.silenced, fw.stats.filtered, fw.stats.delivered) == (1, 0, 2)
    assert "silenced 1" in fw.stats.line()

    consumer = FakeConsumer([message(i, r) for i, r in enumerate(records)])
    hook = RecordingWebhook()
    included = EventFilter.of(include_silenced=True)
    drain(make_forwarder(consumer, hook, tmp_path / "other", event_filter=included), consumer)
    assert [json.loads(b)["event_id"] for b, _h in hook.posts] == ["b1:0", "b1:1", "b1:2"]
