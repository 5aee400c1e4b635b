"""A checkpoint of the folder's partitions: taken at once, written while the folder goes on.

A checkpoint stores what the folder holds of its partitions and then
acknowledges the input that state covers. It waits on the broker three
times (the outputs, the bucket records, the metas), and while it waited it
held the folder: nothing was folded for those round trips (0.1–0.6 s each
on 2 cores; a sixth of a sustained run). Now it is done in two parts:

1. :meth:`Checkpointer.cut`, with the folder held: the outputs sent so far
   are marked (:meth:`~tailguard.agents.outputs.Outputs.mark`); the breach
   states and series records changed since the last checkpoint are taken
   as bytes (:meth:`~tailguard.agents.breaches.BreachEngine.take`,
   :meth:`~tailguard.agents.state.SeriesStore.take_many`); the input held
   for the partitions is taken with them. The cut is the state after that
   input and before anything folded later.
2. :meth:`Checkpointer.write`, the folder free: every output marked is
   delivered, then the breach states are written, then the series records in
   the store's three steps, then the input the cut holds is acknowledged.
   Each wait is for what was sent before it, not for what the agents send
   meanwhile (:meth:`~tailguard.agents.outputs.Outputs.flush` ``upto``).

The order that makes a crash safe is the one a checkpoint held before:
outputs before the state that records them, breach states before the series
metas, every record on the changelog before the input it covers is
acknowledged. What the folder does meanwhile is the next checkpoint's: a
series it changes is taken again then. A write that fails gives its cut
back (the series written whole next time, the breach states taken again,
the input held again) and the partition is tried again later; a partition
that moved meanwhile is written no further and its input is not
acknowledged. One checkpoint is written at a time.
"""

import time
import weakref
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from faust.streams import _current_event
from tailguard.agents.breaches import BreachEngine
from tailguard.agents.cadence import CheckpointCadence
from tailguard.agents.outputs import Mark, OutputError, Outputs
from tailguard.agents.state import SeriesStore
from tailguard.agents.stats import WorkerStats

__all__ = ["Checkpointer", "Cut", "newest_held"]

#: Input held for a partition: ``(stream, event)`` in the order it came.
Held = list[tuple[Any, Any]]


@dataclass(slots=True)
class Cut:
    """What one checkpoint writes, taken at once while the folder was held."""

    partitions: list[int]
    #: The outputs sent before the cut (delivered before any state is written).
    outputs: Mark
    #: Breach states per partition, as :meth:`BreachEngine.take` gave them.
    states: dict[int, list[tuple[bytes, bytes]]]
    #: Series records per partition, as :meth:`SeriesStore.take_many` gave them.
    taken: dict[int, Any]
    #: The input the state covers, acknowledged once it is stored.
    held: dict[int, Held]
    #: Seconds spent taking it.
    seconds: float


class Checkpointer:
    """Cuts and writes checkpoints of the partitions of one folder (see the module)."""

    def __init__(
        self,
        app: Any,
        outputs: Outputs,
        engine: BreachEngine,
        store: SeriesStore,
        stats: WorkerStats,
        cadence: CheckpointCadence,
        pending: dict[int, Held],
        owned: set[int],
    ) -> None:
        self.app = app
        self.outputs = outputs
        self.engine = engine
        self.store = store
        self.stats = stats
        self.cadence = cadence
        #: The folder's input held per partition, and the partitions it owns (shared).
        self.pending = pending
        self.owned = owned

    def cut(self, partitions: Sequence[int]) -> Cut | None:
        """Take what a checkpoint of ``partitions`` writes (the caller holds the
        folder); None when none of them holds input."""
        partitions = [p for p in partitions if self.pending.get(p)]
        if not partitions:
            return None
        started = time.monotonic()
        mark = self.outputs.mark()
        states = {p: self.engine.take(p) for p in partitions}
        taken = self.store.take_many(partitions)
        held = {p: self.pending.pop(p) for p in partitions}
        seconds = time.monotonic() - started
        self.stats.checkpoints += len(partitions)
        self.stats.checkpoint_seconds += seconds
        return Cut(partitions, mark, states, taken, held, seconds)

    async def write(self, cut: Cut) -> None:
        """Deliver, store and acknowledge ``cut`` (see the module for the order)."""
        waited = [0.0]
        started = time.monotonic()
        try:
            await self._waiting(waited, self.outputs.flush(upto=cut.outputs))
            stored = await self._store(cut, waited)
        except OutputError as exc:
            # The outputs' flush: the broker is away or refusing before anything was
            # written (the store's flushes are handled per partition): all given back.
            self._give_back(cut, cut.partitions, exc, states=True, series=True)
            return
        except Exception as exc:
            # A fault of this worker: the cut is given back, the fault reported.
            self._give_back(cut, cut.partitions, exc, states=True, series=True)
            raise
        ended = time.monotonic()
        # The time the checkpoint held the worker: taking it, and its writes
        # (not the broker's round trips, during which the folder went on).
        writes_s = (ended - started) - waited[0]
        self.stats.checkpoint_seconds += writes_s  # the cut's own time counted when taken
        share = (cut.seconds + writes_s) / len(cut.partitions)
        for partition in stored:
            self.cadence.done(partition, ended - share, ended)

    async def _store(self, cut: Cut, waited: list[float]) -> list[int]:
        """Write ``cut`` and acknowledge its input; the partitions stored."""
        mine = [p for p in cut.partitions if p in self.owned]
        # Moved before anything was written: given back if it is here again.
        gone = [p for p in cut.partitions if p not in mine]
        for partition in mine:
            with self._on_partition(cut, partition):
                # Breach states reach the changelog before the series metas: a
                # kill during the checkpoint leaves breach states ahead of their
                # series, never behind (replaying re-closes minutes a breach
                # state has judged, and ``advance`` ignores an evaluation point
                # not after its last one).
                self.stats.state_writes += self.engine.write(partition, cut.states[partition])

        async def flush() -> None:
            await self._waiting(waited, self.flush_sent())

        taken = {p: t for p, t in cut.taken.items() if p in mine}
        done = await self.store.write_taken(
            taken, flush, lambda p: p in self.owned, lambda p: self._on_partition(cut, p)
        )
        self.stats.state_writes += sum(done.written.values())
        for partition in sorted(done.moved):
            self.app.log.info(
                "tailguard: partition %d moved during its checkpoint; nothing acknowledged",
                partition,
            )
        stored = [p for p in mine if done.stored(p) and p in self.owned]
        try:
            await flush()  # the last records (metas) before the acks
        except OutputError as exc:
            self._give_back(cut, stored, exc, states=False, series=True)
            stored = []
        # Written in part (the store redid their series): the input held again.
        for partition, why in sorted(done.refused.items()):
            self._give_back(cut, [partition], why, states=False, series=False)
        for partition in sorted(done.moved):
            self._give_back(cut, [partition], "moved meanwhile", states=False, series=False)
        self._give_back(cut, gone, "moved meanwhile", states=True, series=True)
        for partition in stored:
            for stream, event in cut.held[partition]:
                await stream.ack(event)
        return stored

    async def flush_sent(self) -> None:
        """Everything written so far is on the broker: faust's producer's records
        (forwarded input, table writes), and what the outputs sent before now."""
        mark = self.outputs.mark()
        await self.app.producer.flush()
        await self.outputs.flush(upto=mark)
        if self.store.writer is not None:
            self.store.writer.delivered()

    @staticmethod
    async def _waiting(waited: list[float], step: Awaitable[None]) -> None:
        started = time.monotonic()
        try:
            await step
        finally:
            waited[0] += time.monotonic() - started

    def _give_back(
        self, cut: Cut, partitions: Sequence[int], why: object, *, states: bool, series: bool
    ) -> None:
        """``partitions`` of ``cut`` were not stored: their input is held again (if
        still here), their states taken again next time (``states``), their series
        written whole next time (``series``), and the checkpoint tried again later."""
        now = time.monotonic()
        for partition in partitions:
            if partition not in self.owned:
                continue  # moved: its next owner replays the input
            if states:
                self.engine.untake(partition, cut.states[partition])
            if series and partition in cut.taken:
                self.store.untake({partition: cut.taken[partition]})
            self.pending[partition] = cut.held[partition] + self.pending.get(partition, [])
            self.app.log.warning(
                "tailguard: checkpoint of partition %d deferred: %s", partition, why
            )
            self.cadence.deferred(partition, now)

    @staticmethod
    def _on_partition(cut: Cut, partition: int) -> AbstractContextManager[None]:
        return newest_held(cut.held.get(partition))


@contextmanager
def newest_held(held: Held | None) -> Iterator[None]:
    """Make the newest event of ``held`` faust's current event: faust writes a
    table key by key to the partition of the current event."""
    if not held:
        yield
        return
    token = _current_event.set(weakref.ref(held[-1][1]))
    try:
        yield
    finally:
        _current_event.reset(token)
