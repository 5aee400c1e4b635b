"""Fold requests into the series windows of this worker's partitions, publish what closes.

Requests reach a series' partition by one of two paths, and both end here::

    tailguard.inference p ──ingest──┬─ series homed on p ──────────────────▶ fold(p, …)
                                    │                                        (one hop)
                                    └─ series homed on q ≠ p ─▶ tailguard.internal.series q
                                                                       ──sli──▶ fold(q, …)

A series' home is ``partition_for(series_key, partitions)``, the partition of
its state in the tables. For each batch of one partition the folder:

1. loads each series' :class:`~tailguard.streams.SeriesWindows` (cache, else tables);
2. folds every series in with one numpy pass (:func:`~tailguard.streams.fold.fold_many`),
   idempotent per bucket and input offset;
3. for every minute bucket the event-time watermark closed, publishes a *final*
   snapshot of each configured window ending there, evaluates the SLOs, and
   gathers the closed minute for its deployment's interference detector
   (``tailguard.internal.interference``, keyed by service|model: one record per
   deployment and fold, :meth:`SeriesFolder.point_records`);
4. once every partition of the batch is folded and its closes published
   (:meth:`SeriesFolder.checkpoint_due`), every ``checkpoint_interval_s`` per
   partition, or less often when that would take more than
   ``checkpoint_max_share`` of the agents' time
   (:class:`~tailguard.agents.cadence.CheckpointCadence`): takes the changed
   series and breach states of the partitions due and the input they hold,
   and writes them while the folder goes on
   (:mod:`~tailguard.agents.checkpoints`): what was published first, then the
   state (changelogged), then the acknowledgement of the input — on whichever
   stream it came (``tailguard.inference`` or ``tailguard.internal.series``).
   One partition is cut at a time, the one due longest: a cut holds the loop
   while it puts in what that partition's folds owe (each home partition has
   its own ledger) and encodes its records, so a batch waiting behind it — a
   minute's close — waits for one partition's share, not every partition's.
   One checkpoint is written at a time.

The input is consumed without automatic acks, so the committed offset never
runs ahead of the stored state: after a crash the input since the last
checkpoint is replayed, and the per-bucket input offsets make the replay add
nothing twice. Outputs are flushed before the state that records them, so a
crash can re-send an output (same ``event_id``) but never lose one.

Table reads and writes go to the partition of faust's *current event*; the
folder sets it to a held event of the partition it works on, so it is right
whichever agent calls and whatever event faust last delivered.
"""

import asyncio
import time
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import faust
import numpy as np
from tailguard.agents.breaches import BreachEngine
from tailguard.agents.checkpoints import Checkpointer, Cut, newest_held
from tailguard.agents.feeders import IdleFeeders
from tailguard.agents.interference_wire import PointMsg, point_of, points_records
from tailguard.agents.internal import series_key
from tailguard.agents.outputs import Outputs
from tailguard.agents.settings import Settings
from tailguard.agents.sli_payload import SnapshotFramer, windows_due
from tailguard.agents.state import CachedSeries, SeriesStore
from tailguard.agents.stats import WorkerStats
from tailguard.agents.telemetry import Telemetry
from tailguard.agents.topics import Topics
from tailguard.schemas.placement import series_of_key
from tailguard.streams import WINDOWS, SeriesWindows, WindowSummary, summarize_many
from tailguard.streams.bucket import Bucket
from tailguard.streams.columns import Columns
from tailguard.streams.fold import fold_many, tidy_after
from tailguard.streams.fold_batch import MAX_HELD_EVENTS, Ledger

__all__ = ["SeriesFolder"]

Series = tuple[str, str, str, str]
Outgoing = list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]]
#: One window of a series to publish: series, state, window name, end, merged bucket.
Read = tuple[Series, SeriesWindows, str, int, Bucket]
#: A minute of a series that closed: the series, its key, its state, its SLOs, the end.
Close = tuple[Series, str, CachedSeries, list[Any], int]
#: The windows a close read, for the silent detector (:data:`breaches.Summarised`).
Summarised = dict[tuple[int, int, int], tuple[Bucket, WindowSummary | None]]
#: Series remembered as fed through the forward path (forgotten all at once past it).
_MAX_FORWARDED_SERIES = 200_000
#: Closes summarised together at most (the percentile pass sorts sketches of one size
#: together: the more closes, the fewer sizes), and the values their merged windows
#: may hold (64 MB; memory until the chunk is done) before a chunk is cut.
_CLOSE_CHUNK = 1024
_CHUNK_VALUES = 8_000_000
#: The window whose final snapshots are also the interference detector's points.
_POINT_WINDOW = "1m"


class SeriesFolder:
    """The series windows of the partitions this worker owns: fold, publish, checkpoint.

    Every method that touches state runs under :attr:`busy` (the agents and the
    timers share one event loop, and a checkpoint must not interleave a fold).
    """

    def __init__(
        self,
        app: faust.App,
        topics: Topics,
        settings: Settings,
        stats: WorkerStats,
        store: SeriesStore,
        engine: BreachEngine,
        outputs: Outputs,
        *,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.app = app
        self.settings = settings
        self.stats = stats
        self.store = store
        self.engine = engine
        self.outputs = outputs
        self.telemetry = telemetry
        self.names: dict[str, Series] = {}
        self.sli_topic = topics.sli.get_topic_name()
        self.breach_topic = topics.breaches.get_topic_name()
        self.interference_topic = topics.interference.get_topic_name()
        self.cadence = settings.checkpoint_cadence()
        #: What folds owe the series' buckets until one is read, per home partition:
        #: a checkpoint of one partition puts in only what its own folds owe.
        self.ledgers: dict[int, Ledger] = {}
        #: Input held per partition until its next checkpoint: ``(stream, event)``.
        self.pending: dict[int, list[tuple[Any, Any]]] = {}
        #: Partitions whose tables are assigned here and not revoked since (a
        #: rebalance revokes them all first).
        self.owned: set[int] = set()
        self.busy = asyncio.Lock()
        #: Series that have reached this worker through the forward path: the
        #: ingest agent forwards their home-partition requests too (see
        #: :meth:`note_forwarded`).
        self.forwarded: set[Series] = set()
        self.idle_feeders = IdleFeeders(settings.feeder_idle_s)
        #: Closed minutes for the interference detector, per deployment, until
        #: :meth:`send_points`.
        self.points: dict[str, list[PointMsg]] = {}
        self._specs: dict[str, list[Any]] = {}
        #: ``engine.slo_version`` the cached specs were resolved under (admin ``slo set``).
        self._specs_version = engine.slo_version
        self.checkpoints = Checkpointer(
            app, outputs, engine, store, stats, self.cadence, self.pending, self.owned
        )
        #: The checkpoint being written, if one is (:meth:`checkpoint`).
        self.writing: asyncio.Future[None] | None = None

    # -- input ----------------------------------------------------------------
    def hold(self, partition: int, stream: Any, event: Any) -> None:
        """Keep ``event`` unacknowledged until ``partition``'s next checkpoint."""
        self.pending.setdefault(partition, []).append((stream, event))

    def note_forwarded(self, series: list[Series]) -> None:
        """``series`` came (also) from input partitions other than their home.

        A series fed by several input partitions takes the forward path from all
        of them (the order of one ingest batch, as through one internal
        partition); only a series fed by its home partition alone is folded in
        place. Each partition has its own watermark in the series' state, so once
        a partition feeds a series the order of the partitions does not change
        what is late; but a partition that starts feeding a series meets the
        series' watermark, which the in-place path could run far ahead of the
        forward path's extra hop while a backlog is read.
        """
        known = self.forwarded
        if len(known) + len(series) > _MAX_FORWARDED_SERIES:
            known.clear()
        known.update(series)

    async def fold(
        self,
        partition: int,
        series: list[Series],
        cols: Columns,
        bounds: np.ndarray,
        gpus: list[tuple[int, str, int, int]],
    ) -> None:
        """Fold ``cols[bounds[i]:bounds[i+1]]`` into ``series[i]`` (all homed on
        ``partition``) and publish what closed; :meth:`checkpoint_due` next.

        The caller holds :attr:`busy` and has held (:meth:`hold`) at least one
        event of ``partition``: table access runs under the newest of them.
        """
        closes: list[Close] = []
        states = []
        closers = []
        gpus_of: dict[int, list[tuple[str, int, int]]] = {}
        for group, host, index, ts in gpus:
            gpus_of.setdefault(group, []).append((host, index, ts))
        if self._specs_version != self.engine.slo_version:
            self._specs.clear()  # the SLOs changed: re-resolve each series' SLOs
            self._specs_version = self.engine.slo_version
        store, specs = self.store, self._specs
        with self._on_partition(partition):
            for i, name in enumerate(series):
                key = series_key(*name)
                self.names[key] = name
                if key not in specs:
                    specs[key] = self.engine.specs_for(name)
                cached = store.get(key, partition)
                cached.partition = partition
                if i in gpus_of:
                    cached.note_gpus(gpus_of[i])
                states.append(cached.state)
                closers.append(self._closer(name, key, cached, specs[key], closes))
                store.mark_unsaved(key, partition)
        ledger = self.ledgers.get(partition)
        if ledger is None:  # (an empty ledger is falsy: not `or`)
            ledger = self.ledgers[partition] = Ledger()
        with tidy_after(states):
            results = fold_many(states, cols, bounds, closers, ledger)
            self.close_all(closes)
        self._bound_ledgers()
        stats = self.stats
        for result in results:
            stats.events_applied += result.accepted
            stats.late += result.late
            stats.duplicates += result.duplicates
            stats.replayed += result.replayed

    def owes(self) -> bool:
        """Whether folds owe buckets values not put in yet (:meth:`settle`)."""
        return any(self.ledgers.values())

    def settle(self) -> None:
        """Put into the buckets everything folds owe them."""
        for ledger in self.ledgers.values():
            ledger.settle()

    def _bound_ledgers(self) -> None:
        """Hold no more than :data:`MAX_HELD_EVENTS` owed events over all partitions
        (what a ledger holds is memory its buckets will hold too): settle the
        largest ledgers until under it."""
        by_size = sorted(self.ledgers.values(), key=lambda ledger: ledger.events)
        held = sum(ledger.events for ledger in by_size)
        while held > MAX_HELD_EVENTS and by_size:
            ledger = by_size.pop()
            held -= ledger.events
            ledger.settle()

    async def checkpoint_due(self, partitions: Iterable[int]) -> None:
        """Checkpoint the most overdue of ``partitions``, if one is due: after a
        batch's folds, so that no partition's closes wait for another's checkpoint.
        One partition a cut: a cut holds the loop while it puts in what the
        partition's folds owe and encodes its records, and the next batch (a
        minute's close, perhaps) waits behind it; the partitions still due go
        after the next batches. The caller holds :attr:`busy`; the checkpoint is
        written while the folder goes on."""
        if self.writing_now():
            return  # still due after it: the next batch, or the quiet timer
        due = self.cadence.most_overdue(partitions, time.monotonic())
        if due is not None:
            await self.checkpoint([due], background=True)

    async def forget_idle_feeders(self, now: float) -> int:
        """Stop waiting for input partitions that no longer feed a series
        (:mod:`tailguard.agents.feeders`); publish what that closes."""
        async with self.busy:
            found = self.idle_feeders.idle(self.store.items(), now)
            for key, cached, partition in found:
                closes: list[Close] = []
                name = self.names.get(key) or series_of_key(key)
                slos = self._specs.get(key) or self.engine.specs_for(name)
                with self._on_partition(cached.partition), tidy_after([cached.state]):
                    closer = self._closer(name, key, cached, slos, closes)
                    cached.state.forget_feeder(partition, closer)
                    self.store.mark_unsaved(key, cached.partition)
                    self.close_all(closes)
        return len(found)

    # -- outputs --------------------------------------------------------------
    def reads(
        self, series: Series, state: SeriesWindows, end_ms: int, *, final: bool
    ) -> list[Read]:
        """The windows of ``series`` to publish for ``end_ms``, merged now (what a
        final read sees must not depend on how far the watermark goes on);
        windows holding the same buckets share one merge, summarised once."""
        names, lengths = windows_due(tuple(self.settings.sli_windows), end_ms if final else None)
        merged = state.windows(lengths, end_ms)
        return [(series, state, w, end_ms, b) for w, b in zip(names, merged, strict=True)]

    def snapshots(
        self,
        reads: list[Read],
        *,
        final: bool,
        summarised: Summarised | None = None,
    ) -> Outgoing:
        """The snapshots of ``reads``, summarised together and framed; ``summarised``
        gains every window read, with its summary (see :data:`Summarised`)."""
        settings = self.settings
        now = int(time.time() * 1000)
        summaries = summarize_many(
            [(merged, WINDOWS[window], state.thresholds) for _, state, window, _, merged in reads],
            with_digests=settings.attach_digests,
        )
        out: Outgoing = []
        framer = SnapshotFramer(settings.source, final=final, now_ms=now)
        telemetry, topic = self.telemetry, self.sli_topic
        for (series, state, window, end_ms, merged), summary in zip(reads, summaries, strict=True):
            value, headers = framer.frame(series, state, window, end_ms, summary)
            if telemetry is not None:
                telemetry.observe_sli(series, window, value)
            out.append((topic, framer.record_key, value, headers))
            if summarised is not None:
                summarised[(id(state), summary.window_ms, end_ms)] = (merged, summary)
            if final and window == _POINT_WINDOW:
                # The closed minute, for the interference detector of its deployment.
                point = point_of(series, end_ms, summary)
                self.points.setdefault(point.deployment, []).append(point)
        return out

    def send_all(self, outgoing: Outgoing) -> None:
        for topic, key, value, headers in outgoing:
            self.outputs.send(topic, key, value, headers)
            if topic == self.sli_topic:
                self.stats.snapshots += 1
            else:
                self.stats.breach_events += 1

    def send_points(self) -> None:
        """Send the closed minutes gathered since the last call (:meth:`point_records`)."""
        for key, value in self.point_records():
            self.outputs.send(self.interference_topic, key, value, [])

    def point_records(self) -> list[tuple[bytes, bytes]]:
        """The closed minutes gathered since the last call as records
        (:func:`points_records`), and forget them."""
        out = points_records(self.points)
        self.points.clear()
        return out

    def _closer(
        self, series: Series, key: str, cached: CachedSeries, slos: list[Any], closes: list[Close]
    ) -> Any:
        """What the fold calls for each minute of ``series`` that closes: it only
        notes the minute; :meth:`close_all` closes them all once the fold is done."""

        def on_close(end_ms: int) -> None:
            closes.append((series, key, cached, slos, end_ms))

        return on_close

    def close_all(self, closes: list[Close]) -> None:
        """Close every minute of ``closes`` (in the order they closed) and publish
        what that gives: final snapshots, SLO and silent evaluations, breach
        events, the closed minutes for the interference detector.

        Runs before the folded series are tidied (:func:`tidy_after`): what it
        reads of windows ending at a closed minute is what a read at the moment
        the minute closed would have seen."""
        if not closes:
            return
        engine, source = self.engine, self.settings.source
        # A chunk at a time: final snapshots summarised together, all SLOs screened at
        # once (evaluate_many), then close by close the silent detector and breaches.
        # Each chunk is published once done: the broker and the subscribers take it
        # while the next chunk closes, instead of all of it after the last.
        lo = 0
        while lo < len(closes):
            started = time.perf_counter()
            hi, reads = self._chunk_reads(closes, lo)
            chunk, lo = closes[lo:hi], hi
            summarised: Summarised = {}
            outgoing = self.snapshots(reads, final=True, summarised=summarised)
            judged = engine.evaluate_many(chunk)
            for (series, key, cached, _, end_ms), transitions in zip(chunk, judged, strict=True):
                # The silent detector reads the windows the snapshots just summarised.
                transitions += engine.evaluate_silent(key, cached, end_ms, summarised)
                for value, headers in engine.payloads(transitions, series, cached, source):
                    outgoing.append((self.breach_topic, key.encode(), value, headers))
            for _, _, cached, _, _ in chunk:
                # Done with these ends: the merged windows kept for them are memory
                # only (with 10k series, a few hundred MiB at a minute's close).
                cached.state.release_window_cache()
            self.stats.close_seconds += time.perf_counter() - started
            self.send_all(outgoing)
        self.send_points()

    def _chunk_reads(self, closes: list[Close], lo: int) -> tuple[int, list[Read]]:
        """Where the chunk of closes from ``lo`` ends, and its final reads: up to
        :data:`_CLOSE_CHUNK` closes, fewer once their merged windows hold
        :data:`_CHUNK_VALUES` values."""
        reads: list[Read] = []
        held = 0
        hi = lo
        while hi < len(closes) and hi - lo < _CLOSE_CHUNK and held < _CHUNK_VALUES:
            series, _, cached, _, end = closes[hi]
            found = self.reads(series, cached.state, end, final=True)
            merged = {id(r[4]): r[4] for r in found}.values()  # windows may share one
            held += sum(sketch.n_values for b in merged for sketch in b.digests.values())
            reads += found
            hi += 1
        return hi, reads

    # -- checkpoints ----------------------------------------------------------
    def _on_partition(self, partition: int) -> AbstractContextManager[None]:
        """Make the newest held event of ``partition`` faust's current event."""
        return newest_held(self.pending.get(partition))

    async def checkpoint(self, partitions: Sequence[int], *, background: bool = False) -> None:
        """Checkpoint ``partitions`` (:mod:`tailguard.agents.checkpoints`): what they
        hold is taken now, under :attr:`busy`, which the caller holds; it is
        written, and the input it covers acknowledged, before this returns, or
        with ``background`` while the folder goes on (:attr:`writing`)."""
        cut = self.checkpoints.cut(partitions)
        if cut is None:
            return
        if background:
            self.writing = asyncio.ensure_future(self._write(cut))
        else:
            await self._write(cut)

    async def _write(self, cut: Cut) -> None:
        try:
            await self.checkpoints.write(cut)
        except Exception:  # a fault of this worker, not the broker's: its cut was given back
            self.app.log.exception("tailguard: checkpoint of partitions %s failed", cut.partitions)

    def writing_now(self) -> bool:
        """Whether a checkpoint is being written (one at a time: a partition due
        meanwhile is checkpointed after it)."""
        return self.writing is not None and not self.writing.done()

    async def flush(self) -> None:
        """Everything written so far is on the broker: faust's producer (breach
        states, forwarded input) and the outputs (snapshots, bulk table records)."""
        await self.app.producer.flush()
        await self.outputs.flush()
        if self.store.writer is not None:
            self.store.writer.delivered()

    async def checkpoint_quiet_partitions(self) -> None:
        """Checkpoint every partition that is due and holds input.

        A partition whose input stopped would otherwise hold its last batches
        unacknowledged (and show as lagging) until more input arrives.
        """
        for partition in list(self.pending):
            if not self.pending.get(partition) or not self.cadence.due(partition, time.monotonic()):
                continue
            async with self.busy:
                if self.pending.get(partition) and not self.writing_now():
                    await self.checkpoint([partition], background=True)

    async def checkpoint_all(self) -> None:
        """Checkpoint every owned partition that holds input, due or not (a clean stop)."""
        if self.writing is not None:
            await self.writing
        for partition in list(self.pending):
            async with self.busy:
                if self.pending.get(partition) and partition in self.owned:
                    await self.checkpoint([partition])

    # -- rebalances -----------------------------------------------------------
    def revoked(self, partitions: set[int]) -> None:
        self.owned.difference_update(partitions)
        for partition in partitions:
            ledger = self.ledgers.pop(partition, None)
            if ledger is not None:
                ledger.settle()  # a partition kept after the rebalance reads its buckets whole

    def assigned(self, mine: set[int]) -> None:
        """``mine``: the table partitions assigned here now.

        faust revokes every partition at a rebalance, then assigns. A partition
        this worker keeps goes on from where its consumer was (faust does not
        seek it back), so its in-memory state and held input must be kept: only
        what moved elsewhere is dropped (its new owner replays it from the last
        checkpoint). Then the next timer tick loads what is new to us.
        """
        self.owned.clear()
        self.owned.update(mine)
        gone = (set(self.pending) | self.cadence.partitions() | self.store.partitions()) - mine
        if gone:
            self.store.forget_partitions(gone)
            self.engine.forget_partitions(gone)
            if self.telemetry is not None:
                self.telemetry.forget_partitions(gone)
            self.cadence.forget(gone)
            for partition in gone:
                self.pending.pop(partition, None)
        self.store.needs_warm = True
