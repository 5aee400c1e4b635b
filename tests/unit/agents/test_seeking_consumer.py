"""SeekingConsumer: partitions without a committed offset are read again after a rebalance."""

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from faust.types import TP
from tailguard.agents.app import SeekingConsumer, make_app
from tailguard.agents.settings import Settings


class FakeThread:
    """The consumer thread: committed offsets as aiokafka reports them, seeks recorded."""

    def __init__(self, committed: dict[TP, int | None]) -> None:
        self.committed = committed
        self.seeks: list[tuple[TP, int]] = []
        self.to_beginning: list[TP] = []

    async def seek_to_committed(self) -> dict[TP, int | None]:
        return self.committed

    async def seek_to_beginning(self, *partitions: TP) -> None:
        self.to_beginning.extend(partitions)

    def seek(self, partition: TP, offset: int) -> None:
        self.seeks.append((partition, offset))


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
    consumer.log = SimpleNamespace(dev=lambda *args, **kwargs: None)
    return consumer


def test_partitions_never_committed_seek_to_the_beginning_and_committed_zero_to_zero() -> None:
    never, zero, later = TP("in", 0), TP("in", 1), TP("in", 2)
    changelog = TP("tailguard-buckets-changelog", 0)
    thread = FakeThread({never: None, zero: 0, later: 17, changelog: None})
    consumer = consumer_over(thread, acking={"in"})

    committed = asyncio.run(consumer.seek_to_committed())

    assert committed == thread.committed
    assert thread.to_beginning == [never]
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
