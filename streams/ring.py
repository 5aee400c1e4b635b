"""Event-time bucket ring of one series: sliding windows as merges of buckets.

Two tiers of buckets, both aligned to the epoch::

    event time ─────────────────────────────────────────────────────────────▶
    coarse  │  h-71 │ … │  h-3  │  h-2  │                                      (1 h, kept 3 d + 1 h)
    fine                        │m│m│m│m│m│m│ … │m│m│m│m│m│m│m│m│m│▒│            (1 min, kept 2 h)
                                                              ▲   ▲ watermark
                                      closed (final) ◀────────┘   └ open: lateness

- An event lands in the 1-minute bucket of its ``ts_ms``. Each input partition that feeds the
  series has its own watermark, the largest ``ts_ms`` it brought (event time, never wall-clock
  time); the series' *watermark* is the lowest of them (and never moves back). An event is
  judged late against its own partition's watermark (or the series', if higher), so a replay
  that interleaves the partitions differently judges every event alike and yields the same
  state, snapshots and alerts.
- A bucket *closes* once ``watermark ≥ end + allowed_lateness``; an event for a closed bucket is
  *late*: it is counted (``late``), not merged.
- While open, a bucket remembers the 64-bit hashes of its event ids, so a duplicate ``event_id``
  is counted once (``duplicates``). A duplicate always carries the same ``ts_ms``, so it lands
  in the same bucket: the dedup horizon is exactly the time a bucket stays open.
- When an hour has closed its 60 minute buckets are merged into one coarse bucket; minute
  buckets are pruned after 2 h, hour buckets after 3 d + 1 h.

A window of length ``W`` ending at ``end`` merges the hours lying wholly inside ``[end − W,
end)`` (coarse buckets, or their minutes while not yet rolled up) and the minute buckets of the
rest, up to 117 minutes old. Windows up to 1 h are therefore exact to the minute; longer windows
(6 h, 1 d, 3 d) leave out the partial hour at their old edge — always, so that what a window
holds never depends on how far the watermark has run ahead.

State is split for storage: one small *meta* value per series plus one value per bucket, so a
batch rewrites only the buckets it touched (:meth:`SeriesWindows.take_changes`).
"""

import heapq
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Self

import msgspec
import numpy as np
from tailguard.streams.bucket import Bucket, sum_counters
from tailguard.streams.columns import Columns
from tailguard.streams.counters import Counters
from tailguard.streams.digest import READ_EXACT_LIMIT
from tailguard.streams.fold_batch import Ledger
from tailguard.streams.ring_store import (
    Load,
    RingMeta,
    RingRecords,
    chains,
    decode_meta,
    restore_tiers,
)
from tailguard.streams.sli import Thresholds
from tailguard.streams.window_config import COARSE, FINE, WM_HISTORY, Changes, RingConfig
from tailguard.streams.window_span import window_starts, within_recent
from tailguard.streams.window_sums import nested_sums

__all__ = ["SeriesRing", "met_watermark"]

_STALE = object()
#: Watermark that never triggers housekeeping (nothing is held).
_NEVER = np.iinfo(np.int64).max


def met_watermark(current: int | None, feeders: dict[int, int]) -> int | None:
    """The series' watermark once its feeders stand at ``feeders``: the lowest of
    them, never below ``current`` (a watermark does not move back)."""
    if not feeders:
        return current
    low = min(feeders.values())
    return low if current is None or low > current else current


class SeriesRing:
    """Sliding-window state of one series (see the module docstring): its buckets,
    watermark and tallies, what closes and what a window reads. Events go in
    through :class:`~tailguard.streams.windows.SeriesWindows`."""

    def __init__(self, config: RingConfig | None = None, thresholds: Thresholds | None = None):
        self.config = config or RingConfig()
        self.thresholds = thresholds or Thresholds()
        self.fine: dict[int, Bucket] = {}
        self.coarse: dict[int, Bucket] = {}
        self.watermark_ms: int | None = None
        #: Newest event time per input partition feeding the series (−1: input
        #: without positions); :attr:`watermark_ms` is the lowest of them.
        self.feeders: dict[int, int] = {}
        self.late = 0
        self.duplicates = 0
        self._rolled_through_ms: int | None = None
        #: Highest input offset per input partition whose late and duplicate tallies are
        #: in ``late`` / ``duplicates`` (in the meta: tallies and marks stored together).
        self._counted: dict[int, int] = {}
        #: Watermark each recent input message met, for judging its replay alike.
        self._wm_before: dict[tuple[int, int], int | None] = {}
        #: Merged closed buckets per (end, hours, minutes): a window's closed part is merged
        #: once per minute, and a provisional snapshot only adds the open buckets to it.
        self._closed_cache: dict[tuple[int, tuple[int, ...], tuple[int, ...]], Bucket] = {}
        #: Counters of windows of closed buckets only, per (window, end).
        self._counter_cache: dict[tuple[int, int], Counters] = {}
        self._records = RingRecords()
        #: Highest input offset per partition any restored bucket had applied
        #: (a bucket record may reach the store after the meta did not).
        self._applied_floor: dict[int, int] = {}
        #: Cached :meth:`_ordered` (None: recompute).
        self._order: tuple[list[int], list[int]] | None = None
        #: :meth:`_tiers` per (window, end), while the held buckets stay the same
        #: and until :meth:`release_window_cache` (a close reads a dozen windows).
        self._tiers_memo: dict[tuple[int, int], tuple[list[Bucket], list[Bucket]]] = {}
        #: ``(end, span, tiers)``: every window of ``span`` or more ending at ``end``
        #: reads ``tiers`` (all held minutes before it, none old: a young series).
        self._recent: tuple[int, int, tuple[list[Bucket], list[Bucket]]] | None = None
        #: Cached :meth:`_due` (``_STALE``: recompute).
        self._due_ms: int | object | None = _STALE
        #: Whether a restore left buckets awaiting a refill (see :meth:`awaiting_refill`).
        self._refilling = False
        self.ledger: Ledger | None = None  # what folds owe the buckets (see settle)
        #: Roll-ups and pruning wait for :meth:`tidy` (see :meth:`_advance`).
        self.tidy_held = False

    def _is_fresh(self, cols: Columns) -> bool:
        """No request of ``cols`` can be a replay or comes from a partition not
        feeding the series yet, and no bucket awaits a refill."""
        if self.awaiting_refill():
            return False
        if cols.part[0] < 0:
            return -1 in self.feeders
        for p in np.unique(cols.part).tolist():
            if p not in self.feeders:
                return False
            if int(cols.offset[cols.part == p].min()) <= self.replay_floor(p):
                return False
        return True

    def replay_floor(self, partition: int) -> int:
        """Input offsets of ``partition`` at or below this may already be folded in."""
        return max(self._counted.get(partition, -1), self._applied_floor.get(partition, -1))

    def awaiting_refill(self) -> bool:
        """Some restored bucket lost its record and waits for its input to be replayed."""
        if not self._refilling:  # only a restore makes such buckets: most rings never scan
            return False
        if any(b.refill for b in self.fine.values()):
            return True
        self._refilling = False  # those buckets were pruned
        return False

    def forget_feeder(
        self, partition: int, on_close: Callable[[int], None] | None = None
    ) -> list[int]:
        """Stop waiting for ``partition`` (it feeds the series no more): the watermark may move
        on, closing what it passes (``on_close`` as in :meth:`_advance`)."""
        if self.feeders.pop(partition, None) is None:
            return []
        wm = met_watermark(self.watermark_ms, self.feeders)
        if wm is None or wm == self.watermark_ms:
            return []
        self.watermark_ms = wm
        return self._advance(wm, on_close)

    def _new_fine(self, start: int) -> Bucket:
        """Create the open minute bucket ``start`` (it closes, at the latest, first)."""
        bucket = self.fine[start] = Bucket.empty(start)
        self._order = None
        closes = start + self.config.bucket_ms + self.config.allowed_lateness_ms
        due = self._due_ms
        if due is not _STALE and (due is None or closes < due):  # type: ignore[operator]
            self._due_ms = closes
        return bucket

    def _due(self) -> int:
        """The lowest watermark at which :meth:`_advance` would close, roll up or
        prune anything: below it an ``_advance`` is a no-op, and may be skipped."""
        due = self._due_ms
        if due is _STALE:
            cfg = self.config
            found: list[int] = []
            opens = [s for s, b in self.fine.items() if b.ids is not None]
            if opens:
                found.append(min(opens) + cfg.bucket_ms + cfg.allowed_lateness_ms)
            done = self._rolled_through_ms
            hours = {
                s - s % cfg.rollup_ms
                for s in self.fine
                if (done is None or s - s % cfg.rollup_ms >= done)
                and s - s % cfg.rollup_ms not in self.coarse
            }
            if hours:
                found.append(min(hours) + cfg.rollup_ms + cfg.allowed_lateness_ms)
            if self.fine:
                found.append(min(self.fine) + cfg.fine_retention_ms + 1)
            if self.coarse:
                found.append(min(self.coarse) + cfg.retention_ms + 1)
            due = self._due_ms = min(found) if found else None
        return _NEVER if due is None else due  # type: ignore[return-value]

    def _trim_history(self) -> None:
        history = self._wm_before
        while len(history) > WM_HISTORY:
            del history[next(iter(history))]

    def _clear_refill(self) -> None:
        # New input has arrived: replay of what was lost is over.
        if self._refilling:
            for bucket in self.fine.values():
                bucket.refill = False
            self._refilling = False

    def settle(self) -> None:
        """Put in what folds owe the buckets; code reading :attr:`fine` itself settles first."""
        if self.ledger:
            self.ledger.settle()

    def _touch(self, tier: str, start: int) -> None:  # the bucket's next record is due
        self._records.touch(tier, start)

    def _advance(self, wm: int, on_close: Callable[[int], None] | None = None) -> list[int]:
        """Close, roll up and prune everything the watermark has passed.

        ``on_close(end)`` runs for every closed bucket, oldest first; an hour is
        rolled up right after its last minute's ``on_close`` and pruning comes
        last, so what ``on_close`` reads of windows ending at ``end`` is the same
        whether the watermark crept or jumped there. While :attr:`tidy_held`, roll-ups
        and pruning wait for :meth:`tidy`: windows ending at a closed end read the same
        events, and up to an hour the same minute buckets (an hour rolls up after its
        last minute's close)."""
        cfg = self.config
        lag = cfg.bucket_ms + cfg.allowed_lateness_ms
        due = {s: b for s, b in self.fine.items() if b.ids is not None and s + lag <= wm}
        if self.ledger:  # only if it owes a bucket that closes: newer minutes wait for a read
            self.ledger.settle_for(list(due.values()))
        closed: list[int] = []
        for start, bucket in due.items():
            bucket.close()
            self._touch(FINE, start)
            closed.append(start + cfg.bucket_ms)
        closed.sort()
        if self.tidy_held:
            if on_close is not None:
                for end in closed:
                    on_close(end)
            self._due_ms = _STALE
            return closed
        # Hours whose minute buckets are all closed: the last minute
        # [h + rollup − bucket, h + rollup) closes at h + rollup + lateness.
        pending = sorted(
            {
                s - s % cfg.rollup_ms
                for s in self.fine
                if s - s % cfg.rollup_ms + cfg.rollup_ms + cfg.allowed_lateness_ms <= wm
            }
        )
        # Interleave roll-ups with the closes in event-time order, as if the
        # watermark had crept there: an hour whose roll-up point comes before
        # a close is rolled up before that close is read.
        for end in closed:
            while pending and pending[0] + cfg.rollup_ms < end:
                self._roll_up(pending.pop(0))
            if on_close is not None:
                on_close(end)
            while pending and pending[0] + cfg.rollup_ms <= end:
                self._roll_up(pending.pop(0))
        for hour in pending:
            self._roll_up(hour)
        for start in [s for s in self.fine if s < wm - cfg.fine_retention_ms]:
            self._records.drop(FINE, start, self.fine.pop(start))
            self._order = None
        for start in [s for s in self.coarse if s < wm - cfg.retention_ms]:
            self._records.drop(COARSE, start, self.coarse.pop(start))
            self._order = None
        self._due_ms = _STALE
        return closed

    def tidy(self) -> None:
        """Roll up and prune what the watermark passed while :attr:`tidy_held`."""
        self.tidy_held = False
        wm = self.watermark_ms
        if wm is not None and wm >= self._due():
            self._advance(wm)

    def _roll_up(self, hour: int) -> None:
        """Merge the minute buckets of ``hour`` into its coarse bucket (once)."""
        cfg = self.config
        done = self._rolled_through_ms
        if (done is not None and hour < done) or hour in self.coarse:
            return
        members = [b for s, b in self.fine.items() if hour <= s < hour + cfg.rollup_ms]
        if not members:
            return
        coarse = Bucket.combine(members, cfg.coarse_max_centroids)
        coarse.start_ms = hour
        self.coarse[hour] = coarse
        self._order = None
        self._touch(COARSE, hour)
        self._rolled_through_ms = hour + cfg.rollup_ms

    # ----------------------------------------------------------------- queries
    def default_end(self) -> int | None:
        """End of the bucket holding the newest request any feeding partition
        brought (so windows include open data, even ahead of the watermark)."""
        newest = max(self.feeders.values(), default=self.watermark_ms)
        if newest is None:
            return None
        if self.watermark_ms is not None and self.watermark_ms > newest:
            newest = self.watermark_ms
        width = self.config.bucket_ms
        return newest - newest % width + width

    def _ordered(self) -> tuple[list[int], list[int]]:
        """Starts of the held minute and hour buckets, each in time order (remembered
        until a bucket is added or dropped)."""
        if self._order is None:
            self._order = (sorted(self.fine), sorted(self.coarse))
            self._tiers_memo.clear()
            self._recent = None
        return self._order

    def _tiers(self, window_ms: int, end_ms: int | None) -> tuple[list[Bucket], list[Bucket]]:
        """The hour and the minute buckets a window holds, in time order, settled for the read."""
        tiers = self._find_tiers(window_ms, end_ms)
        if self.ledger:
            self.ledger.settle_for(tiers[1])  # only if it owes one of them
        return tiers

    def _find_tiers(self, window_ms: int, end_ms: int | None) -> tuple[list[Bucket], list[Bucket]]:
        end = self.default_end() if end_ms is None else end_ms
        if end is None:
            return [], []
        minutes, hours = self._ordered()
        recent = self._recent
        if recent is not None and recent[0] == end and window_ms >= recent[1]:
            return recent[2]
        memo = self._tiers_memo.get((window_ms, end))
        if memo is not None:
            return memo
        used, fine = window_starts(minutes, hours, self.config, window_ms, end)
        tiers = [self.coarse[h] for h in used], [self.fine[m] for m in fine]
        self._tiers_memo[(window_ms, end)] = tiers
        if (
            not hours
            and fine
            and len(fine) == bisect_left(minutes, end)
            and within_recent(fine, self.config, window_ms, end)
        ):
            # Every held minute before the end, all recent: any window reaching
            # the oldest reads them all (window_starts' shortcut).
            self._recent = (end, end - fine[0], tiers)
        return tiers

    def window(self, window_ms: int, end_ms: int | None = None) -> Bucket:
        """Merged bucket (counters, digests, exemplars) of ``[end − W, end)``. Read it, do
        not change it: a window of closed buckets is the merge kept for that end (until
        :meth:`release_window_cache`), shared by every reader of the end."""
        end = self.default_end() if end_ms is None else end_ms
        return self._merged(*self._tiers(window_ms, end), end)

    def _merged(self, hours: list[Bucket], minutes: list[Bucket], end: int | None) -> Bucket:
        """:meth:`window` of the buckets ``_tiers`` gave for a window ending at ``end``."""
        parts = hours + minutes
        if len(parts) == 1 and parts[0].settled:
            return parts[0]  # a closed bucket alone is its own window (see below)
        closed = [p for p in parts if p.ids is None and not p.refill]
        live = [p for p in parts if p.ids is not None or p.refill]
        mc = self.config.max_centroids
        exact = READ_EXACT_LIMIT
        if not closed:
            return Bucket.combine(live, mc, exact)
        # Windows of one end holding the same closed buckets share one merge (a
        # young series' 1m, 5m and 1h windows often hold the same minutes).
        key = (
            end or 0,
            tuple(p.start_ms for p in hours if p.ids is None and not p.refill),
            tuple(p.start_ms for p in minutes if p.ids is None and not p.refill),
        )
        cached = self._closed_cache.get(key)
        if cached is None:
            if len(self._closed_cache) >= 32:
                self._closed_cache.clear()
            # A closed bucket no longer changes: alone and settled (its digests
            # hold their tails, see Bucket.close), it is its own window, read as
            # a merge of it alone would read.
            alone = len(closed) == 1 and closed[0].settled
            merged = closed[0] if alone else Bucket.combine(closed, mc, exact)
            cached = self._closed_cache[key] = merged
        return Bucket.combine([cached, *live], mc, exact) if live else cached

    def windows(self, windows_ms: Sequence[int], end_ms: int) -> list[Bucket]:
        """:meth:`window` of each of ``windows_ms``, all ending at ``end_ms``: windows holding
        the same buckets share one merged bucket (a young or sparse series' 1m, 5m and 1h
        windows often do, open minute included), so a reader summarising them does it once."""
        out: list[Bucket] = []
        seen: dict[tuple[int, ...], Bucket] = {}
        same: dict[int, Bucket] = {}  # by the tiers object, when _tiers gave one again
        for window_ms in windows_ms:
            tiers = self._tiers(window_ms, end_ms)
            merged = same.get(id(tiers))
            if merged is None:
                hours, minutes = tiers
                key = (*map(id, hours), -1, *map(id, minutes))
                merged = seen.get(key)
                if merged is None:
                    merged = seen[key] = self._merged(hours, minutes, end_ms)
                same[id(tiers)] = merged
            out.append(merged)
        return out

    def release_window_cache(self) -> None:
        """Forget the merges :meth:`window` keeps for an end (only memory once it is read)."""
        self._closed_cache.clear()
        self._counter_cache.clear()
        self._tiers_memo.clear()
        self._recent = None

    def exemplars(self, window_ms: int, end_ms: int | None = None, k: int = 5) -> list[str]:
        """Trace ids of the ``k`` slowest requests (by E2E) of a window, slowest first."""
        tiers = self._tiers(window_ms, end_ms)
        candidates = [e for tier in tiers for part in tier for e in part.exemplars]
        return [trace for _, trace in heapq.nlargest(k, candidates)]

    def counters(self, window_ms: int, end_ms: int | None = None) -> Counters:
        """Exact counters of a window, without merging digests (cheap: burn rates). Read
        them, do not change them: those of closed buckets are kept for that end like
        :meth:`window`'s merges (a minute's close reads the same few windows per SLO)."""
        end = self.default_end() if end_ms is None else end_ms
        hours, minutes = self._tiers(window_ms, end)
        parts = hours + minutes
        if len(parts) == 1:
            return parts[0].counters  # read only: no copy (a young series' windows)
        if any(p.ids is not None or p.refill for p in parts):
            return sum_counters(parts)
        key = (window_ms, end or 0)
        counters = self._counter_cache.get(key)
        if counters is None:
            if len(self._counter_cache) >= 32:
                self._counter_cache.clear()
            counters = self._counter_cache[key] = sum_counters(parts)
        return counters

    def counters_many(self, windows_ms: Sequence[int], end_ms: int) -> list[Counters]:
        """:meth:`counters` of ``windows_ms`` ending at ``end_ms``, added up once (read only)."""
        return nested_sums([self._tiers(w, end_ms) for w in windows_ms])

    # ----------------------------------------------------------------- storage
    def meta_bytes(self) -> bytes:
        meta = RingMeta(
            watermark_ms=self.watermark_ms,
            late=self.late,
            duplicates=self.duplicates,
            rolled_through_ms=self._rolled_through_ms,
            fine=sorted(self.fine),
            coarse=sorted(self.coarse),
            counted=dict(sorted(self._counted.items())),
            wm_before=[(p, o, w) for (p, o), w in self._wm_before.items()],
            feeders=dict(sorted(self.feeders.items())),
            segments=chains(self.fine),
        )
        return msgspec.msgpack.encode(meta)

    def rewrite_all(self) -> None:
        """Have the next :meth:`take_changes` write every bucket again (a checkpoint
        that took the changes was interrupted before storing all of them)."""
        self._records.rewrite(self.fine, self.coarse)

    def take_changes(self) -> Changes:
        """Records of the buckets changed since the last call (whole, or segments of
        what they gained: :mod:`~tailguard.streams.ring_store`), the records to
        delete, and the meta value."""
        self.settle()
        return self._records.take(self.fine, self.coarse, self.meta_bytes)

    @classmethod
    def restore(
        cls,
        meta: bytes,
        load: Load,
        config: RingConfig | None = None,
        thresholds: Thresholds | None = None,
    ) -> "Self":
        """Rebuild from :meth:`meta_bytes` and the stored bucket records
        (``load(key)``, ``key`` as in :attr:`Changes.upserts`).

        A bucket listed in the meta whose whole record is lost (a crash kept the
        meta's record and not its) restores as empty: its input will be
        replayed, and per-bucket ``applied`` offsets fill it exactly once.
        """
        m = decode_meta(meta)
        state = cls(config, thresholds)
        state.watermark_ms = m.watermark_ms
        state.late = m.late
        state.duplicates = m.duplicates
        state._counted = dict(m.counted)
        state._wm_before = {(p, o): w for p, o, w in m.wm_before}
        state.feeders = dict(m.feeders)
        tiers = restore_tiers(m, load)
        state.fine, state.coarse, state._refilling = tiers.fine, tiers.coarse, tiers.refilling
        state._rolled_through_ms, state._applied_floor = tiers.rolled_through_ms, tiers.applied
        state._order = None
        return state
