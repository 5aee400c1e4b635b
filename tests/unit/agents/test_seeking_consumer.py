"""SeekingConsumer: partitions without a committed offset are read again after a
rebalance, and records reach the streams in offset order whatever the fetcher does."""

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.structs import TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from mode.utils.queues import FlowControlEvent
from tailguard.agents.app import SeekingConsumer, make_app
from tailguard.agents.offsets import InOrderGuard
from tailguard.agents.settings import Settings


class FakeThread:
    """The consumer thread: committed offsets as aiokafka reports them, seeks recorded."""

    def __init__(self, committed: dict[TP, int | None]) -> None:
        self.committed = committed
        #: Assigned partitions aiokafka reports no committed offset for at all.
        self.assigned_only: list[TP] = []
        self.seeks: list[tuple[TP, int]] = []
        self.to_beginning: list[TP] = []

    async def seek_to_committed(self) -> dict[TP, int | None]:
        return self.committed

    async def seek_to_beginning(self, *partitions: TP) -> None:
        # aiokafka refuses anything but its own TopicPartition here
        assert all(isinstance(tp, TopicPartition) for tp in partitions), partitions
        self.to_beginning.extend(partitions)

    def seek(self, partition: TP, offset: int) -> None:
        raise AssertionError("seeks must run in the consumer thread (seek_wait)")

    async def seek_wait(self, partitions: dict[TP, int]) -> None:
        assert all(isinstance(tp, TopicPartition) for tp in partitions), partitions
        self.seeks.extend(partitions.items())

    async def earliest_offsets(self, *partitions: TP) -> dict[TP, int]:
        assert all(isinstance(tp, TopicPartition) for tp in partitions), partitions
        return dict.fromkeys(partitions, 0)


@dataclass(eq=False)
class FakeMessage:
    tracked: bool
    acked: bool
    tp: TP
    offset: int
    topic: str


def consumer_over(thread: FakeThread, acking: set[str]) -> Any:
    consumer: Any = object.__new__(SeekingConsumer)
    consumer._thread = thread
    consumer._read_offset = {}
    consumer.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=acking.__contains__))
    consumer.log = SimpleNamespace(dev=lambda *args, **kwargs: None, info=lambda *a, **k: None)
    consumer.order_guard = InOrderGuard()
    consumer._resync_targets = {}
    consumer._seeks_after_resume = set()
    consumer.assignment = lambda: set(thread.committed) | set(thread.assigned_only)
    consumer.gaps = []

    async def add_gap(tp: TP, start: int, end: int) -> None:
        consumer.gaps.append((tp, start, end))

    consumer._add_gap = add_gap
    return consumer


def test_partitions_never_committed_seek_to_the_beginning_and_committed_zero_to_zero() -> None:
    never, zero, later = TP("in", 0), TP("in", 1), TP("in", 2)
    changelog = TP("tailguard-buckets-changelog", 0)
    unlisted = TP("in", 3)
    thread = FakeThread({never: None, zero: 0, later: 17, changelog: None})
    thread.assigned_only.append(unlisted)
    consumer = consumer_over(thread, acking={"in"})

    committed = asyncio.run(consumer.seek_to_committed())

    assert committed == thread.committed
    assert sorted(thread.to_beginning) == [never, unlisted]
    assert thread.seeks == [(zero, 0)]


def test_nothing_is_sought_again_when_every_partition_has_a_commit() -> None:
    thread = FakeThread({TP("in", 0): 4, TP("in", 1): 9})
    consumer = consumer_over(thread, acking={"in"})

    asyncio.run(consumer.seek_to_committed())

    assert thread.to_beginning == [] and thread.seeks == []


def test_the_app_builds_the_seeking_consumer(tmp_path: Any) -> None:
    app = make_app(Settings(data_dir=tmp_path))

    assert app.transport.Consumer is SeekingConsumer


def test_only_messages_a_stream_took_count_towards_the_commit() -> None:
    consumer = consumer_over(FakeThread({}), acking={"in"})
    consumer._committed_offset = defaultdict(lambda: None)
    consumer._acked, consumer._acked_index = defaultdict(list), defaultdict(set)
    consumer._unacked_messages, consumer._n_acked, consumer._waiting_for_ack = set(), 0, None
    tp = TP("in", 0)
    skipped = FakeMessage(tracked=False, acked=False, tp=tp, offset=5, topic="in")
    taken = FakeMessage(tracked=True, acked=False, tp=tp, offset=6, topic="in")

    assert consumer.ack(skipped) is False
    assert consumer.ack(taken) is True
    assert consumer._acked[tp] == [6]


@dataclass
class Record:
    tp: TP
    offset: int


def fetch_script(
    monkeypatch: pytest.MonkeyPatch, batches: list[list[tuple[TP, int]]], consumer: Any
) -> list[tuple[TP, int]]:
    """Make faust's getmany return ``batches`` in turn; returns what the consumer yields
    over that many calls. A batch item ``("seek_to_committed",)`` runs the rebalance
    seek between two records, as faust's recovery does concurrently with the fetch loop;
    ``("resume",)`` is faust resuming the flow after it (emptying the streams' queues)."""
    pending = list(batches)

    async def scripted(self: Any, timeout: float) -> Any:
        for item in pending.pop(0):
            if item[0] == "seek_to_committed":
                await self.seek_to_committed()
                continue
            if item[0] == "resume":
                self._on_flow_resumed()
                await asyncio.sleep(0)  # the seeks it schedules
                await asyncio.sleep(0)
                continue
            tp, offset = item
            yield tp, Record(tp, offset)

    monkeypatch.setattr(faust_aiokafka.Consumer, "getmany", scripted)

    async def drain() -> list[tuple[TP, int]]:
        out = []
        for _ in range(len(batches)):
            async for tp, message in consumer.getmany(1.0):
                out.append((tp, message.offset))
        return out

    return asyncio.run(drain())


def test_records_fetched_before_the_rebalance_seek_do_not_overtake_the_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The restart seen in test_recovery: the fetcher had read up to 120 before the
    # seek to the committed offset 77; faust then dropped 77-87 and acknowledged
    # 78-88 as a gap. Here every offset from 77 on reaches the stream, in order.
    tp = TP("in", 1)
    thread = FakeThread({tp: 77})
    consumer = consumer_over(thread, acking={"in"})
    before = [(tp, o) for o in range(77, 121)]
    batches = [
        # stale records after the seek, and post-seek ones before the flow resumes
        [*before[:5], ("seek_to_committed",), *before[5:], (tp, 77), (tp, 78), ("resume",)],
        [(tp, o) for o in range(77, 90)],  # what reading again from 77 reads
    ]

    got = fetch_script(monkeypatch, batches, consumer)

    offsets = [o for _, o in got]
    assert offsets == [77, 78, 79, 80, 81, *range(77, 90)]
    # nothing in between: everything until the resume was held back (resuming empties
    # the queues) and the partition sought again to its committed offset
    assert thread.seeks == [(tp, 77)] and consumer.gaps == []


def test_a_hole_is_read_again_and_a_real_gap_is_acknowledged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tp = TP("in", 0)
    thread = FakeThread({tp: 10})
    consumer = consumer_over(thread, acking={"in"})
    consumer.order_guard.sought(tp, 10)
    batches = [
        [(tp, 10), (tp, 11), (tp, 14), (tp, 15)],  # 12 and 13 missing: seek back to 12
        [(tp, 14), (tp, 15), (tp, 16)],  # again 14 first: 12-13 hold no record
    ]

    got = fetch_script(monkeypatch, batches, consumer)

    assert [o for _, o in got] == [10, 11, 14, 15, 16]
    assert thread.seeks == [(tp, 12)]
    assert consumer.gaps == [(tp, 12, 13)]


def test_topics_without_acks_pass_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    changelog = TP("tailguard-buckets-changelog", 0)
    consumer = consumer_over(FakeThread({}), acking={"in"})

    got = fetch_script(monkeypatch, [[(changelog, 9), (changelog, 3), (changelog, 40)]], consumer)

    assert [o for _, o in got] == [9, 3, 40]


def test_faust_resuming_the_flow_releases_the_held_partitions() -> None:
    thread = FakeThread({})
    consumer = consumer_over(thread, acking={"in"})
    flow = FlowControlEvent()
    consumer._watch_flow(flow)
    tp = TopicPartition("in", 0)
    consumer.order_guard.resync([tp])
    consumer._resync_targets = {tp: 5}
    held = consumer.order_guard.admit(tp, 9)

    async def resume() -> None:
        flow.resume()
        await asyncio.gather(*consumer._seeks_after_resume)

    asyncio.run(resume())

    assert held.kind.value == "hold"
    assert consumer._resync_targets == {}
    assert thread.seeks == [(tp, 5)], "it discarded a record while held: read again from 5"
    assert consumer.order_guard.admit(tp, 5).kind.value == "deliver"
