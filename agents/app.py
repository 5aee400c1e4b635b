"""The faust application object, configured from :class:`Settings`."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import faust
from aiokafka.structs import TopicPartition as _TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.producer import ProducerBuffer
from faust.types import TP, FutureMessage, Message
from tailguard.agents.offsets import InOrderGuard, VerdictKind
from tailguard.agents.settings import Settings

__all__ = [
    "METADATA_MAX_AGE_MS",
    "ChangelogWriteError",
    "DrainingBuffer",
    "DrainingProducer",
    "SeekingConsumer",
    "make_app",
]

#: How old the consumer's topic metadata may get before it asks again (see make_app).
METADATA_MAX_AGE_MS = 30_000


class _ReadOffsets(dict[Any, Any]):
    """faust's "last offset read" per partition, blind for acknowledged topics.

    faust drops a record below the last offset read and acknowledges any jump
    above it as a gap; around a seek that offset is stale and both lose input
    (see :mod:`.offsets`). For acknowledged topics :class:`InOrderGuard` has
    already put the records in order, so faust's check must see "unknown".
    """

    def __init__(self, acking: Callable[[str], bool]) -> None:
        super().__init__()
        self._acking = acking

    def __missing__(self, tp: Any) -> None:
        return None

    def __getitem__(self, tp: Any) -> Any:
        if self._acking(tp.topic):
            return None
        return super().__getitem__(tp)


def _kafka_tp(tp: Any) -> _TopicPartition:
    """aiokafka's own TopicPartition: its seeks refuse faust's TP tuples."""
    return _TopicPartition(tp.topic, tp.partition)


class SeekingConsumer(faust_aiokafka.Consumer):
    """faust's aiokafka consumer, made to deliver each input partition in order.

    - Every record of an acknowledged topic passes :class:`InOrderGuard`
      first (:meth:`getmany`): what reaches a stream is the partition's log
      from the committed offset on, in order, however the fetcher interleaves
      records fetched before and after a seek. faust's own drop-and-gap check
      is switched off for those topics (:class:`_ReadOffsets`).
    - The acknowledgement of a message a stream skipped (fetched while flow was
      suspended, or under the old generation) would count towards the commit
      although the message was never processed; :meth:`ack` ignores untracked
      messages, so the commit stops before it and it is read again.
    - aiokafka's ``seek_to_committed`` leaves a partition alone when its
      committed offset is missing or 0 (``if offset and offset > 0``);
      :meth:`seek_to_committed` seeks those itself, to 0 or to the beginning
      (``auto_offset_reset=earliest``). Changelog partitions belong to table
      recovery and are not touched.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order_guard = InOrderGuard()
        self._read_offset = _ReadOffsets(self._acking)
        #: Seek targets of the last :meth:`seek_to_committed`, held until the flow resumes.
        self._resync_targets: dict[Any, int | None] = {}
        self._seeks_after_resume: set[asyncio.Task[None]] = set()
        self._watch_flow(self.app.flow_control)

    def _watch_flow(self, flow: Any) -> None:
        """Call :meth:`_on_flow_resumed` each time faust resumes the flow."""
        resume = flow.resume

        def resumed() -> None:
            resume()  # empties every stream's queue
            self._on_flow_resumed()

        flow.resume = resumed

    def _acking(self, topic: str) -> bool:
        return bool(self.app.topics.acks_enabled_for(topic))

    def ack(self, message: Message) -> bool:
        if not message.tracked:
            return False
        return super().ack(message)

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Message]]:
        guard = self.order_guard
        discard: set[TP] = set()
        async for tp, message in super().getmany(timeout):
            if not self._acking(tp.topic):
                yield tp, message
                continue
            if tp in discard:
                continue
            verdict = guard.admit(tp, message.offset)
            kind = verdict.kind
            if kind is VerdictKind.DELIVER:
                yield tp, message
            elif kind is VerdictKind.DELIVER_AFTER_GAP:
                self.log.info(
                    "%s: offsets %d-%d hold no record", tp, verdict.gap_from, verdict.gap_to
                )
                await self._add_gap(tp, verdict.gap_from, verdict.gap_to)
                yield tp, message
            elif kind is VerdictKind.SEEK:
                # Records fetched before a seek: the rest of this batch is stale too.
                discard.add(tp)
                self.log.info(
                    "%s: offset %d arrived where %d was due; reading again from %d",
                    tp,
                    message.offset,
                    verdict.seek_to,
                    verdict.seek_to,
                )
                await self._seek_back(tp, verdict.seek_to)
            elif kind is VerdictKind.HOLD:
                discard.add(tp)

    async def seek(self, partition: TP, offset: int) -> None:
        if self._acking(partition.topic):
            self.order_guard.sought(partition, offset)
        await super().seek(partition, offset)

    async def _seek_back(self, tp: Any, offset: int) -> None:
        """Seek inside the consumer thread: faust's :meth:`seek` calls aiokafka from
        the event loop's thread, racing the fetcher that owns its buffers (seen
        as a ``KeyError`` in ``fetched_records``)."""
        self.order_guard.sought(tp, offset)
        await self._thread.seek_wait({_kafka_tp(tp): offset})

    async def seek_to_committed(self) -> Mapping[TP, int]:
        tps = [_kafka_tp(tp) for tp in self.assignment() if self._acking(tp.topic)]
        guard = self.order_guard
        guard.resync(list(tps))
        targets: dict[Any, int | None] = dict.fromkeys(tps)
        try:
            committed: Mapping[Any, Any] = await super().seek_to_committed()
            targets.update(
                {
                    _kafka_tp(tp): offset
                    for tp, offset in committed.items()
                    if self._acking(tp.topic)
                }
            )
            never = [tp for tp, offset in targets.items() if offset is None]
            if never:
                await self._thread.seek_to_beginning(*never)
                earliest = await self.earliest_offsets(*never)
                targets.update({tp: earliest.get(tp) for tp in never})
            for tp, offset in targets.items():
                if offset == 0 and committed.get(tp) == 0:
                    await self._thread.seek_wait({tp: 0})
        finally:
            # Records stay held until the flow resumes: faust resumes it right after
            # this seek, and resuming empties the streams' queues, so anything let
            # through before (during the awaits above or below) would be lost.
            self._resync_targets.update(targets)
        return committed

    def _on_flow_resumed(self) -> None:
        """The streams' queues were just emptied: release the held partitions at their
        seek targets, and read again those that discarded records meanwhile."""
        if not self._resync_targets:
            return
        guard = self.order_guard
        targets, self._resync_targets = self._resync_targets, {}
        again = {tp: targets[tp] for tp in guard.resynced(targets)}
        self.log.info(
            "in-order guard: %d stale records dropped, %d holes read again, %d gaps so far",
            guard.dropped,
            guard.holes,
            guard.gaps,
        )
        if again:
            task = asyncio.get_running_loop().create_task(self._seek_again(again))
            self._seeks_after_resume.add(task)
            task.add_done_callback(self._seeks_after_resume.discard)

    async def _seek_again(self, targets: dict[Any, int | None]) -> None:
        for tp, offset in targets.items():
            if offset is None:
                await self._thread.seek_to_beginning(tp)
            elif self.order_guard.expected(tp) == offset:  # nothing delivered since
                await self._seek_back(tp, offset)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        self.order_guard.forget(list(revoked))
        for tp in revoked:
            self._resync_targets.pop(_kafka_tp(tp), None)
        await super().on_partitions_revoked(revoked)


class ChangelogWriteError(RuntimeError):
    """A table write could not be put on its changelog: committing input past it
    would lose it for good, so the flush before the commit fails instead."""


class DrainingBuffer(ProducerBuffer):
    """faust's send-soon buffer (every table's changelog writes), with a real drain.

    faust's own ``flush()`` stops waiting as soon as 0.1 s pass without a message
    leaving the buffer, and does not see the message being handed to aiokafka.
    Under load one hand-over takes longer (aiokafka waits for a full batch to be
    sent), so faust committed input offsets while changelog writes made before
    them were still here. A SIGKILL then lost those writes, and the restart
    re-applied *older* changelog records over the local store, behind the
    commit: input that was never replayed went missing (found by the SIGKILL
    test, for the series written last in a checkpoint).

    :meth:`drain` waits for the messages put *before* it was called (others keep
    writing meanwhile), and fails if one of them could not be handed over or,
    later, delivered (faust only logs a failed changelog delivery).
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        #: Messages put so far, and handed to the producer so far (in put order).
        self.put_count = 0
        self.handed = 0
        #: Changelog writes whose delivery failed, and the last reason.
        self.failed = 0
        self.last_failure: BaseException | None = None

    def put(self, fut: FutureMessage) -> None:
        fut.add_done_callback(self._on_delivered)
        super().put(fut)
        self.put_count += 1

    def _on_delivered(self, fut: FutureMessage) -> None:
        failure = asyncio.CancelledError() if fut.cancelled() else fut.exception()
        if failure is not None:
            self.failed += 1
            self.last_failure = failure

    async def _send_pending(self, fut: FutureMessage) -> None:
        try:
            await super()._send_pending(fut)
        finally:
            self.handed += 1

    async def drain(self) -> None:
        """Return once every message put so far has been handed to the producer."""
        target = self.put_count
        while True:
            if self.state != "running":
                # Stopped, or crashed because a hand-over failed: what is left
                # here, or was lost on the way, is not on the changelog.
                msg = f"table changelog writes not sent: the producer buffer is {self.state}"
                raise ChangelogWriteError(msg)
            if self.handed >= target:
                return
            self.message_sent.clear()
            # On a time-out look again: a hand-over may have been missed between the checks.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.message_sent.wait(), timeout=0.1)


class DrainingProducer(faust_aiokafka.Producer):
    """faust's aiokafka producer whose :meth:`flush` really puts every table write
    made so far on the changelog (:class:`DrainingBuffer`), or fails. faust flushes
    before every offset commit, so a commit never overtakes a table write."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.app.conf.producer_threaded:
            msg = "tailguard's producer does not support faust's producer_threaded setting"
            raise ValueError(msg)
        self.draining = DrainingBuffer(loop=self.loop, beacon=self.beacon)
        self.draining.app = self.app
        self.buffer = self.draining
        self._failures_seen = 0

    async def flush(self) -> None:
        # Not faust's ``flush``: its buffer flush also waits for writes put
        # *during* the flush, and while other agents keep writing tables it chased
        # them for seconds (measured up to 2.6 s for a checkpoint of 100 series,
        # with every input partition's delivery stalled behind faust's commit,
        # which flushes too). The drain covers what was put before the call;
        # aiokafka's flush then waits for the batches it holds.
        buffer = self.draining
        await buffer.drain()
        if self._producer is not None:
            await self._producer.flush()
        for _ in range(3):  # let the delivery callbacks of what just completed run
            await asyncio.sleep(0)
        if buffer.failed > self._failures_seen:
            lost = buffer.failed - self._failures_seen
            self._failures_seen = buffer.failed
            msg = f"{lost} table changelog write(s) not delivered: {buffer.last_failure!r}"
            raise ChangelogWriteError(msg)


class PlainTable(faust.Table):
    """faust's Table without its key-expiry task (``_clean_data``), which only windowed
    tables with ``expires`` use; tailguard's windows are explicit event-time buckets.

    After heavy use, SIGTERM left that task pending and never stepped, and the
    table's stop waited for it without a time-out: the worker never stopped.
    """

    def _get_tasks(self) -> Any:
        return (task for task in super()._get_tasks() if task.fun.__name__ != "_clean_data")


class Transport(faust_aiokafka.Transport):
    """faust's aiokafka transport, building :class:`SeekingConsumer` and
    :class:`DrainingProducer`."""

    Consumer = SeekingConsumer
    Producer = DrainingProducer


class App(faust.App):
    """faust.App on :class:`Transport` (``kafka://`` brokers only), with
    :attr:`stopping_hooks` run at a clean stop while the consumer still runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Awaited in order when the app stops, before its consumer does: what an
        #: agent still holds can be stored and acknowledged, so a clean stop does
        #: not make the next start consume it again.
        self.stopping_hooks: list[Callable[[], Awaitable[None]]] = []

    def _new_transport(self) -> Any:
        return Transport(self.conf.broker_consumer, self)

    async def on_stop(self) -> None:
        for hook in self.stopping_hooks:
            try:
                await hook()
            except Exception as exc:  # a failed hook must not block the stop
                self.log.warning("tailguard: at stop, %s failed: %s", hook.__qualname__, exc)
        await super().on_stop()


def make_app(settings: Settings) -> faust.App:
    """A faust app with RocksDB (rocksdict) tables and raw-bytes topics.

    Payload codecs are tailguard's own (msgspec), so faust moves bytes only.
    """
    return App(
        settings.app_id,
        broker=f"kafka://{settings.broker}",
        store="rocksdb://",
        Table=PlainTable,
        datadir=str(settings.data_dir),
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=settings.web_enabled,
        web_port=settings.web_port,
        web_bind=settings.web_bind,
        producer_acks=-1,
        producer_linger_ms=5,
        producer_max_request_size=8 * 1024 * 1024,
        consumer_max_fetch_size=8 * 1024 * 1024,
        consumer_auto_offset_reset="earliest",
        # A worker that joins its group before the broker shows it the topics (a
        # broker just started, topics just created) is assigned nothing, and the
        # consumer asks again only when its metadata is this old: 5 minutes by
        # default, 5 minutes of input unread (seen on a broker started seconds
        # before the worker).
        consumer_metadata_max_age_ms=METADATA_MAX_AGE_MS,
        broker_commit_every=2_000,
        broker_commit_interval=1.0,
        stream_buffer_maxsize=8_192,
        # The SLI agent holds its input unacknowledged until a checkpoint has
        # stored what it folded in; waiting for those acks at a rebalance or
        # shutdown would wait forever. Unacknowledged input is simply consumed
        # again by whoever owns the partition next (idempotent per bucket).
        stream_wait_empty=False,
        table_standby_replicas=0,
        # RocksDB is the source of truth on disk; faust's in-memory key index
        # only needs to remember which partition a key lives in.
        table_key_index_size=100_000,
        logging_config=None,
    )
