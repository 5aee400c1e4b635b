"""Ingest agent: validate raw inference messages, dead-letter bad input, fold or forward.

::

    tailguard.inference p ──batch──▶ decode + validate ── rejects ──▶ tailguard.deadletter
          │                              │
          │                              ├─ series homed on p ──▶ SeriesFolder.fold(p)    one hop
          │                              ├─ series homed on q ≠ p ──▶ tailguard.internal.series q
          │                              └─ every valid event ──▶ A/B, prompt, capacity fan-out
          │
          └── acknowledged at p's next checkpoint (the folder holds it)

A series' home is the partition of its key ``service|model|variant|tenant``
under CRC-32 (zlib's, librdkafka's ``consistent_random``) modulo the partition
count — the partition its state lives on. A producer that places each event on
its series' home partition (every producer this project ships does) sends every
event through one broker hop; any other placement still works, through
``tailguard.internal.series`` (:func:`~tailguard.agents.internal.route`).
A series that also arrives on other partitions is forwarded whole, from every
partition, for as long as this worker remembers it
(:meth:`~tailguard.agents.folder.SeriesFolder.note_forwarded`). Each input
partition has its own watermark in the series' state, so once a partition
feeds a series, how partitions interleave does not change what is late; but a
partition that starts feeding a series meets the series' watermark, and the
in-place path would run far ahead of the forward path's extra hop while a
backlog is read. Folding in place needs the input topic to have as many
partitions as the tables; otherwise every event is forwarded, and the input is
acknowledged once forwarded.

Batching: the agent buffers events and processes the buffer at
``ingest_batch`` messages, or from a timer once the oldest buffered message is
``ingest_within_s`` old or no message has come for ``ingest_idle_s`` (the input
is caught up, and waiting on would only delay what the batch closes: a
minute's final snapshots waited up to 0.75 s for the timer so). Big batches
keep the forwarded messages few and large, and let a fold touch each series
once per batch; under load messages keep coming and batches still fill.
Decoding, forwarding and the fan-out run outside the folder's lock (the SLI
agent folds meanwhile); holding the input and folding it run under it, so a
checkpoint never acknowledges input it has not folded. At a clean stop
(``App.stopping_hooks``) it finishes the batch in hand and checkpoints what it
holds, so the next start does not feed the fan-out the same requests again.
"""

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import faust
import numpy as np
from faust.types import TP
from tailguard.agents.deadletters import send_rejects
from tailguard.agents.folder import SeriesFolder
from tailguard.agents.heap import release_free_heap
from tailguard.agents.internal import (
    SeriesGroups,
    columns_by_partition,
    partition_for,
    route_columns,
    series_key,
    take_requests,
)
from tailguard.agents.outputs import OutputError
from tailguard.agents.requests import RequestBatch
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import Topics
from tailguard.schemas import Limits, decode
from tailguard.schemas.columnar import decode_columns, is_columnar

__all__ = ["HomePartitions", "gc_paused", "partial_batch_due", "register_ingest"]

#: The longest a clean stop waits to store and acknowledge what is held.
_STOP_CHECKPOINT_S = 15

Forward = Callable[[RequestBatch], Awaitable[None]]


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while a batch is processed.

    A batch of 100,000 events holds ~500,000 fresh containers (each event's
    lists) from its decoding until its fold is done; every collection in
    between walks them for nothing (no cycles: reference counting frees them
    with the batch). Paused for the decoding alone, ~1 µs an event less
    (``bench.hotpath``, one core, 10,000 series); paused until the fold is done
    too, ~10 % more events/s through the broker (``bench.throughput``, 2 cores).
    Cyclic garbage made meanwhile waits for the next collection after the batch.

    Free the batch before leaving: resuming sets off a collection of the young
    generation at the next allocation, and a batch still alive then is walked
    whole (~200,000 containers for 100,000 columnar requests: 55–60 ms, against
    nothing once freed; measured in process, one core).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def partial_batch_due(settings: Settings, now: float, oldest: float, newest: float) -> bool:
    """Whether a batch short of ``ingest_batch`` messages is processed now: its oldest
    message arrived ``ingest_within_s`` ago, or none has come for ``ingest_idle_s``
    (monotonic seconds)."""
    return now - oldest >= settings.ingest_within_s or now - newest >= settings.ingest_idle_s


def settle_due(settings: Settings, now: float, moved: float, *, buffered: bool, owed: bool) -> bool:
    """Whether to put in now what folded batches still owe their buckets (the folder's
    :class:`~tailguard.streams.fold_batch.Ledger`): something is owed, and the input
    is caught up — no batch buffered or in hand, and nothing came for
    ``ingest_idle_s`` since it ``moved`` (a message came or a batch was done with).
    Otherwise the next read pays for it, and the next read is often a minute's
    close. Under load the ledger is left to gather batches: settling many at once
    costs less than settling each."""
    return owed and not buffered and now - moved >= settings.ingest_idle_s


class HomePartitions:
    """Home partition of a series, remembered (a CRC-32 and a key string per event
    would cost more than the rest of the routing). Forgets everything past
    ``limit`` series, so a flood of one-off series cannot grow it for ever."""

    def __init__(self, partitions: int, limit: int = 200_000) -> None:
        self.partitions = partitions
        self._limit = limit
        self._known: dict[tuple[str, str, str, str], int] = {}

    def __call__(self, series: tuple[str, str, str, str]) -> int:
        home = self._known.get(series)
        if home is None:
            if len(self._known) >= self._limit:
                self._known.clear()
            home = self._known[series] = partition_for(series_key(*series), self.partitions)
        return home


def register_ingest(
    app: faust.App,
    topics: Topics,
    settings: Settings,
    stats: WorkerStats,
    folder: SeriesFolder,
    forward_requests: Forward | None = None,
) -> Any:
    """Attach the ingest agent to ``app``. ``forward_requests(batch)`` also receives
    every batch's valid requests (the A/B, prompt and capacity agents' forwarders)."""
    limits = Limits()
    home_of = HomePartitions(settings.partitions)
    input_topic = topics.inference.get_topic_name()
    internal_topic = topics.series.get_topic_name()
    buffer: list[Any] = []
    started = [0.0]  # monotonic time the oldest buffered message arrived
    arrived = [0.0]  # monotonic time the newest buffered message arrived
    finished = [0.0]  # monotonic time the last batch was done with
    streams: list[Any] = []  # the agent's manual-ack stream, once it runs
    #: Input partitions whose events may be folded here (see ``on_assigned``).
    in_place: set[int] = set()
    draining = asyncio.Lock()
    stopping: list[bool] = []  # non-empty once the worker stops

    async def process(stream: Any, events: list[Any]) -> None:
        placed = set(in_place)
        with gc_paused():
            await take(stream, events, placed)
        # Input of which nothing is folded here: acknowledged once forwarded (faust
        # flushes its producer before it commits) and once what the batch wrote
        # beside it (the capacity state applied in place) is delivered too.
        unplaced = [event for event in events if event.message.partition not in placed]
        while unplaced:
            try:
                await folder.flush()
                break
            except OutputError as exc:  # the broker is away: acknowledge nothing yet
                app.log.warning("tailguard: outputs not delivered yet: %s", exc)
                await asyncio.sleep(1.0)
        for event in unplaced:
            await stream.ack(event)

    async def take(stream: Any, events: list[Any], placed: set[int]) -> None:
        """Decode ``events``, forward what is not at home here, fold the rest.

        The batch lives and dies in here, inside :func:`gc_paused`: freed before
        the collector resumes, it is not walked by the collection that resuming
        sets off."""
        now = int(time.time() * 1000)
        batch = RequestBatch()
        taken: set[tuple[int, int]] = set()
        started = time.perf_counter()
        await decode_all(events, now, batch, taken)
        decoded = time.perf_counter()
        stats.decode_seconds += decoded - started
        stats.events_valid += len(batch)
        stats.batches += 1
        # Forwarding and the fan-out need no state: they run before the folder's
        # lock is taken, so the SLI agent folds meanwhile.
        here = await dispatch(batch, placed) if len(batch) else {}
        stats.dispatch_seconds += time.perf_counter() - decoded
        async with folder.busy:
            for event in events:
                partition = event.message.partition
                if partition in placed and partition in in_place:
                    folder.hold(partition, stream, event)
            folded = [partition for partition in here if partition in in_place]
            started = time.perf_counter()
            for partition in folded:  # others moved meanwhile: their new owner replays them
                groups = here[partition]
                await folder.fold(partition, groups.series, groups.cols, groups.bounds, groups.gpus)
            stats.fold_seconds += time.perf_counter() - started
            await folder.checkpoint_due(folded)

    async def decode_all(
        events: list[Any], now: int, batch: RequestBatch, taken: set[tuple[int, int]]
    ) -> None:
        """Decode and validate ``events`` (rows or columns) into ``batch``; dead-letter the rest."""
        for event in events:
            msg = event.message
            if (msg.partition, msg.offset) in taken:
                # Delivered twice in one batch (seen right after a takeover's
                # seek): folding or forwarding both copies together would make the
                # second look like duplicate requests instead of a replay.
                stats.redelivered += 1
                continue
            taken.add((msg.partition, msg.offset))
            stats.messages += 1
            raw = event.value
            if raw is not None and is_columnar(raw):
                stats.messages_columnar += 1
                columns = decode_columns(raw, now_ms=now, limits=limits)
                rejects = columns.rejects
                if len(columns):
                    batch.add_columns(msg.partition, msg.offset, columns)
            else:
                rows = decode(raw, "inference", now_ms=now, limits=limits)
                rejects = rows.rejects
                if rows.valid:
                    batch.add_rows(msg.partition, msg.offset, rows.valid)
            if rejects:
                await send_rejects(
                    rejects,
                    raw,
                    msg,
                    topic=topics.deadletter,
                    stats=stats,
                    source=settings.source,
                    now_ms=now,
                )

    async def dispatch(batch: RequestBatch, placed: set[int]) -> dict[int, SeriesGroups]:
        """Forward what is not folded here, feed the fan-out; the groups to fold here."""
        gid, series, cols = batch.gid, batch.series, batch.columns()
        home = np.fromiter(map(home_of, series), dtype=np.int64, count=len(series))
        at_home = np.isin(cols.part, list(placed)) & (cols.part == home[gid])
        # A series fed from another partition too (now or before) is forwarded whole.
        spread = np.zeros(len(series), dtype=np.bool_)
        spread[gid[~at_home]] = True
        folder.note_forwarded([series[i] for i in np.flatnonzero(spread).tolist()])
        forwarded = folder.forwarded
        spread |= np.fromiter((s in forwarded for s in series), dtype=np.bool_, count=len(series))
        local = at_home & ~spread[gid]
        n_local = int(local.sum())
        stats.events_local += n_local
        stats.events_forwarded += len(batch) - n_local
        served = batch.served()
        if n_local < len(batch):
            away = take_requests(cols, gid, series, served, np.flatnonzero(~local))
            for partition, value in route_columns(*away, settings.partitions):
                await topics.series.send(
                    key=str(partition).encode(), value=value, partition=partition
                )
        if forward_requests is not None:
            await forward_requests(batch)
        return columns_by_partition(cols, gid, series, served, np.flatnonzero(local))

    async def drain(stream: Any) -> None:
        async with draining:  # batches are processed one at a time, in order
            if stopping:
                return  # left unacknowledged: the next start consumes it (once)
            batch = buffer[:]
            buffer.clear()
            if batch:
                await process(stream, batch)
                del batch
                release_free_heap()  # what the batch's events held
                finished[0] = time.monotonic()

    @app.agent(topics.inference, name="tailguard.ingest")
    async def ingest(stream: faust.StreamT[bytes]) -> None:
        manual = stream.noack()
        streams[:] = [manual]
        async for event in manual.events():
            arrived[0] = time.monotonic()
            if not buffer:
                started[0] = arrived[0]
            buffer.append(event)
            if len(buffer) >= settings.ingest_batch:
                await drain(manual)

    @app.timer(
        min(settings.ingest_within_s / 2, settings.ingest_idle_s), name="tailguard.ingest.flush"
    )
    async def flush_partial_batch() -> None:
        now = time.monotonic()
        if buffer and streams and partial_batch_due(settings, now, started[0], arrived[0]):
            await drain(streams[0])
        elif settle_due(
            settings,
            now,
            max(arrived[0], finished[0]),  # under load a batch's end is followed by input
            buffered=bool(buffer) or draining.locked(),
            owed=folder.owes(),
        ):
            async with folder.busy:  # idle: the ledger's work, done before a close needs it
                settling = time.perf_counter()
                folder.settle()
                stats.fold_seconds += time.perf_counter() - settling

    async def settle() -> None:
        """At a clean stop: finish the batch in hand, take no other, then store and
        acknowledge everything held. Otherwise the next start would consume it again
        and feed the A/B, prompt and capacity agents the same requests twice."""
        stopping.append(True)
        async with draining:
            pass
        try:
            await asyncio.wait_for(folder.checkpoint_all(), timeout=_STOP_CHECKPOINT_S)
        except TimeoutError:
            # The broker is away: what is held is consumed again at the next start,
            # as after a crash (a checkpoint cut short restores consistently).
            app.log.warning(
                "tailguard: held input not stored at stop within %d s", _STOP_CHECKPOINT_S
            )

    hooks = getattr(app, "stopping_hooks", None)
    if hooks is not None:
        hooks.append(settle)

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        # Buffered events of partitions that moved are dropped unacknowledged
        # (their new owner reads them again from the committed offset).
        in_place.clear()
        mine = {tp.partition for tp in assigned if tp.topic == input_topic}
        tables = {tp.partition for tp in assigned if tp.topic == internal_topic}
        buffer[:] = [e for e in buffer if e.message.partition in mine]
        # Table writes under an input event go to the changelog partition of that
        # event's number: only right when the input is partitioned like the tables.
        if app.consumer.topic_partitions(input_topic) == settings.partitions:
            in_place.update(mine & tables)

    return ingest
