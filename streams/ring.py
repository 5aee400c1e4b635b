"""Event-time bucket ring of one series: sliding windows as merges of buckets.

Two tiers of buckets, both aligned to the epoch::

    event time ─────────────────────────────────────────────────────────────▶
    coarse  │  h-71 │ … │  h-3  │  h-2  │                                      (1 h, kept 3 d + 1 h)
    fine                        │m│m│m│m│m│m│ … │m│m│m│m│m│m│m│m│m│▒│            (1 min, kept 2 h)
                                                              ▲   ▲ watermark
                                      closed (final) ◀────────┘   └ open: lateness

- An event lands in the 1-minute bucket of its ``ts_ms``. The *watermark* is
  the largest ``ts_ms`` seen (event time, never wall-clock time), so a replay of
  the same events yields the same state, snapshots and alerts.
- A bucket *closes* once ``watermark ≥ end + allowed_lateness``; an event for a
  closed bucket is *late*: it is counted (``late``), not merged.
- While open, a bucket remembers the 64-bit hashes of its event ids, so a
  duplicate ``event_id`` is counted once (``duplicates``). A duplicate always
  carries the same ``ts_ms``, so it lands in the same bucket: the dedup horizon
  is exactly the time a bucket stays open.
- When an hour has closed its 60 minute buckets are merged into one coarse
  bucket; minute buckets are pruned after 2 h, hour buckets after 3 d + 1 h.

A window of length ``W`` ending at ``end`` merges the hours lying wholly
inside ``[end − W, end)`` (coarse buckets, or their minutes while not yet
rolled up) and the minute buckets of the rest, up to 117 minutes old. Windows
up to 1 h are therefore exact to the minute; longer windows (6 h, 1 d, 3 d)
leave out the partial hour at their old edge — always, so that what a window
holds never depends on how far the watermark has run ahead.

State is split for storage: one small *meta* value per series plus one value
per bucket, so that a batch rewrites only the buckets it touched
(:meth:`SeriesWindows.take_changes`), not the whole 3-day history.
"""

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np
from tailguard.streams.bucket import Bucket, Counters
from tailguard.streams.columns import Columns
from tailguard.streams.digest import (
    COARSE_MAX_CENTROIDS,
    DEFAULT_MAX_CENTROIDS,
    READ_EXACT_LIMIT,
)
from tailguard.streams.errors import ConfigError, CorruptStateError
from tailguard.streams.sli import LatencyEvent, Thresholds

__all__ = [
    "COARSE",
    "FINE",
    "WINDOWS",
    "AddResult",
    "Changes",
    "RingConfig",
    "SeriesWindows",
]

FINE = "m"
COARSE = "h"
#: Input messages per series whose starting watermark is remembered (only
#: messages processed since the last consumer commit can be replayed).
_WM_HISTORY = 256
#: Stands for "no watermark yet" in int64 arrays.
_NO_WATERMARK = np.iinfo(np.int64).min
_STALE = object()
#: Watermark that never triggers housekeeping (nothing is held).
_NEVER = np.iinfo(np.int64).max

#: The sliding windows of SPEC.md §3.1, in milliseconds.
WINDOWS: dict[str, int] = {
    "1m": 60_000,
    "5m": 300_000,
    "30m": 1_800_000,
    "1h": 3_600_000,
    "6h": 21_600_000,
    "1d": 86_400_000,
    "3d": 259_200_000,
}


@dataclass(frozen=True, slots=True)
class RingConfig:
    """Bucket widths, retention and lateness. Validated on construction."""

    bucket_ms: int = 60_000
    rollup_ms: int = 3_600_000
    fine_retention_ms: int = 7_200_000
    retention_ms: int = 3 * 86_400_000 + 3_600_000
    allowed_lateness_ms: int = 120_000
    max_centroids: int = DEFAULT_MAX_CENTROIDS
    coarse_max_centroids: int = COARSE_MAX_CENTROIDS

    def __post_init__(self) -> None:
        if self.bucket_ms <= 0 or self.rollup_ms <= 0 or self.rollup_ms % self.bucket_ms:
            msg = (
                f"rollup_ms ({self.rollup_ms}) must be a positive multiple of "
                f"bucket_ms ({self.bucket_ms})"
            )
            raise ConfigError(msg)
        if self.allowed_lateness_ms < 0:
            msg = f"allowed_lateness_ms must be ≥ 0, got {self.allowed_lateness_ms}"
            raise ConfigError(msg)
        need = self.rollup_ms + self.bucket_ms + self.allowed_lateness_ms
        if self.fine_retention_ms < need:
            msg = (
                f"fine_retention_ms ({self.fine_retention_ms}) must cover a roll-up period plus "
                f"lateness (≥ {need}) or minute buckets vanish before they are rolled up"
            )
            raise ConfigError(msg)
        if self.retention_ms < self.fine_retention_ms:
            msg = (
                f"retention_ms ({self.retention_ms}) must be ≥ "
                f"fine_retention_ms ({self.fine_retention_ms})"
            )
            raise ConfigError(msg)
        for name in ("max_centroids", "coarse_max_centroids"):
            value = getattr(self, name)
            if not 20 <= value <= 10_000:
                msg = f"{name} must be in 20..10000, got {value}"
                raise ConfigError(msg)


@dataclass(slots=True)
class AddResult:
    """What one :meth:`SeriesWindows.add` did."""

    accepted: int = 0
    late: int = 0
    duplicates: int = 0
    #: Events skipped because their bucket already holds their input position.
    replayed: int = 0
    #: End times of the minute buckets that closed during this call, oldest first.
    closed_ends: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Changes:
    """What to write to the state store after a batch."""

    upserts: dict[tuple[str, int], bytes]
    deletes: list[tuple[str, int]]
    meta: bytes


class _Meta(msgspec.Struct, array_like=True):
    watermark_ms: int | None
    late: int
    duplicates: int
    rolled_through_ms: int | None
    fine: list[int]
    coarse: list[int]
    counted: dict[int, int] = {}
    wm_before: list[tuple[int, int, int | None]] = []


class SeriesWindows:
    """Sliding-window state of one series (see the module docstring)."""

    def __init__(self, config: RingConfig | None = None, thresholds: Thresholds | None = None):
        self.config = config or RingConfig()
        self.thresholds = thresholds or Thresholds()
        self.fine: dict[int, Bucket] = {}
        self.coarse: dict[int, Bucket] = {}
        self.watermark_ms: int | None = None
        self.late = 0
        self.duplicates = 0
        self._rolled_through_ms: int | None = None
        #: Highest input offset per input partition whose late and duplicate
        #: tallies are already in ``late`` / ``duplicates`` (kept in the meta, so
        #: the tallies and their marks are always stored together).
        self._counted: dict[int, int] = {}
        #: Watermark each recent input message met, for judging its replay alike.
        self._wm_before: dict[tuple[int, int], int | None] = {}
        #: Merged closed buckets per (window, end, first, last, n): closed buckets
        #: never change, so a window's closed part is merged once per minute,
        #: and a provisional snapshot only adds the open buckets to it.
        self._closed_cache: dict[tuple[int, int, int, int, int], Bucket] = {}
        self._dirty: set[tuple[str, int]] = set()
        self._deleted: set[tuple[str, int]] = set()
        #: Highest input offset per partition any restored bucket had applied
        #: (a bucket record may reach the store after the meta did not).
        self._applied_floor: dict[int, int] = {}
        #: Cached :meth:`_due` (``_STALE``: recompute).
        self._due_ms: int | object | None = _STALE

    # ------------------------------------------------------------------ ingest
    def add(
        self,
        events: Sequence[LatencyEvent],
        positions: Sequence[tuple[int, int]] | None = None,
        on_close: Callable[[int], None] | None = None,
    ) -> AddResult:
        """Fold a batch of event objects in; see :meth:`add_columns`."""
        return self.add_columns(Columns.from_events(events, positions), on_close)

    def add_columns(
        self, cols: Columns, on_close: Callable[[int], None] | None = None
    ) -> AddResult:
        """Fold a batch of requests in, in order; returns counts and closed buckets.

        Each request is judged against the watermark as it stands when it
        arrives, so the outcome does not depend on how the input was batched.

        ``cols.part`` / ``cols.offset`` are the input position of the message
        each request came in (−1: unknown, no replay protection). All requests
        of one input message must arrive in the same call. A bucket that
        already holds an input position skips that position's requests
        (``replayed``): re-delivering input after a crash never counts a
        request twice.

        Buckets close as the watermark passes them; ``on_close(end)`` runs for
        each, oldest first, before roll-up and pruning (see :meth:`_advance`).

        Fresh input (the common case) takes a vectorised path; a replay after
        a crash, or restored buckets waiting to be refilled, take the
        request-by-request path. Both give the same result.
        """
        if len(cols) == 0:
            return AddResult()
        from tailguard.streams.fold import fold_many  # fold imports this module

        return fold_many([self], cols, [0, len(cols)], [on_close])[0]

    def _is_fresh(self, cols: Columns) -> bool:
        """No request of ``cols`` can be a replay, and no bucket awaits a refill."""
        if self.awaiting_refill():
            return False
        if cols.part[0] < 0:
            return True
        for p in np.unique(cols.part).tolist():
            if int(cols.offset[cols.part == p].min()) <= self.replay_floor(p):
                return False
        return True

    def replay_floor(self, partition: int) -> int:
        """Input offsets of ``partition`` at or below this may already be folded in."""
        return max(self._counted.get(partition, -1), self._applied_floor.get(partition, -1))

    def awaiting_refill(self) -> bool:
        """Some restored bucket lost its record and waits for its input to be replayed."""
        return any(b.refill for b in self.fine.values())

    def _new_fine(self, start: int) -> Bucket:
        """Create the open minute bucket ``start`` (it closes, at the latest, first)."""
        bucket = self.fine[start] = Bucket.empty(start)
        closes = start + self.config.bucket_ms + self.config.allowed_lateness_ms
        due = self._due_ms
        if due is not _STALE and (due is None or closes < due):  # type: ignore[operator]
            self._due_ms = closes
        return bucket

    def _due(self) -> int:
        """The lowest watermark at which :meth:`_advance` would change anything.

        Closing a bucket, rolling up an hour or pruning: below this watermark
        an ``_advance`` is a no-op, so the batched paths may skip it.
        """
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
        while len(history) > _WM_HISTORY:
            del history[next(iter(history))]

    def _add_replay(self, cols: Columns, on_close: Callable[[int], None] | None) -> AddResult:
        """Request by request: replays judged against the watermark they first met."""
        cfg = self.config
        width = cfg.bucket_ms
        lateness = cfg.allowed_lateness_ms
        result = AddResult()
        accs: dict[int, list[int]] = {}
        wm = self.watermark_ms  # what the watermark becomes
        judge = wm  # what the current request's lateness is judged against
        seen: dict[int, dict[int, int]] = {}
        counted = self._counted
        history = self._wm_before
        newest: dict[int, int] = {}
        current: tuple[int, int] | None = None
        with_positions = bool(cols.part[0] >= 0)
        tally = True  # count late/duplicate, unless this position was counted before
        met: int | None = wm  # watermark the current input message met
        part = offset = -1
        next_close = self._next_close()
        parts = cols.part.tolist()
        offsets = cols.offset.tolist()
        hashes = cols.ids.tolist()
        for i, ts in enumerate(cols.ts.tolist()):
            start = ts - ts % width
            bucket = self.fine.get(start)
            folded_before = False
            if with_positions:
                if (parts[i], offsets[i]) != current:
                    current = (parts[i], offsets[i])
                    part, offset = current
                    if offset > newest.get(part, -1):
                        newest[part] = offset
                    tally = offset > counted.get(part, -1)
                    if tally:
                        # Remembered only if one of its requests turns out late: a
                        # replay judged without it re-admits exactly what was admitted.
                        met = wm
                        judge = wm
                    else:
                        # A replay: judge it against the watermark it first met, not
                        # one its own later requests (or later messages) advanced. Older
                        # than the remembered history: no lateness check at all —
                        # dropping a replayed request silently would lose it for good,
                        # while re-admitting one that was late the first time is rare.
                        judge = history.get(current)
                if bucket is not None and offset <= bucket.applied.get(part, -1):
                    # Folded in before (accepted or a duplicate), so it moved the
                    # watermark then: it must move it now too (a meta restored
                    # older than this bucket has a watermark from before it).
                    result.replayed += 1
                    folded_before = True
            if not folded_before:
                # No exemption for a bucket awaiting a refill: a replay is judged against
                # the watermark its message first met, so it re-admits exactly what the
                # first pass admitted, and a request late the first time stays late.
                if judge is not None and start + width + lateness <= judge:
                    if tally:
                        result.late += 1
                        if with_positions and current not in history:
                            history[current] = met
                    continue
                if bucket is None:
                    bucket = self._new_fine(start)
                    closes = start + width + lateness
                    if next_close is None or closes < next_close:
                        next_close = closes
                if with_positions:
                    marks = seen.setdefault(start, {})
                    if offset > marks.get(part, -1):
                        marks[part] = offset
                ids = bucket.ids
                h = hashes[i]
                if ids is not None and h in ids:
                    # A duplicate is not counted, but like every request that is
                    # not late it moves the watermark (as in the vectorised path).
                    if tally:
                        result.duplicates += 1
                else:
                    if ids is not None:
                        ids.add(h)
                    accs.setdefault(start, []).append(i)
                    result.accepted += 1
            if wm is None or ts > wm:
                wm = ts
                if next_close is not None and wm >= next_close:
                    self._fold(cols, accs, None)
                    self.watermark_ms = wm
                    result.closed_ends.extend(self._advance(wm, on_close))
                    self._clear_refill()
                    next_close = self._next_close()
            if judge is None or ts > judge:
                judge = ts
        for p, o in newest.items():
            if o > counted.get(p, -1):
                counted[p] = o
        while len(history) > _WM_HISTORY:
            del history[next(iter(history))]
        self._fold(cols, accs, seen)
        self.late += result.late
        self.duplicates += result.duplicates
        if wm is not None and wm != self.watermark_ms:
            self.watermark_ms = wm
            result.closed_ends.extend(self._advance(wm, on_close))
            self._clear_refill()
        elif wm is not None and result.accepted:
            # A replay may recreate buckets the watermark has already closed or
            # pruned: settle them exactly as the first pass did.
            result.closed_ends.extend(self._advance(wm, on_close))
        return result

    def _fold(
        self,
        cols: Columns,
        accs: dict[int, list[int]],
        seen: dict[int, dict[int, int]] | None,
    ) -> None:
        """Fold gathered requests (and, at the end of a call, input positions) into buckets.

        Positions are marked only once the whole call is in: marking a bucket
        mid-call would make the rest of the same input message look replayed.
        """
        cfg = self.config
        for start, marks in (seen or {}).items():
            bucket = self.fine.get(start)
            if bucket is not None:  # pruned meanwhile: nothing left to protect
                bucket.applied.update(marks)
                self._touch(FINE, start)
        for start, index in accs.items():
            bucket = self.fine[start]
            if bucket.ids is None:
                # A replay refilling a closed bucket: merged closed parts are stale.
                self._closed_cache.clear()
            bucket.absorb(
                cols, np.asarray(index, dtype=np.int64), cfg.max_centroids, self.thresholds
            )
            self._touch(FINE, start)
        accs.clear()
        if seen is not None:
            seen.clear()

    def _clear_refill(self) -> None:
        # New input has arrived: replay of what was lost is over.
        for bucket in self.fine.values():
            bucket.refill = False

    def _touch(self, tier: str, start: int) -> None:
        self._dirty.add((tier, start))
        self._deleted.discard((tier, start))

    def _drop(self, tier: str, start: int) -> None:
        self._dirty.discard((tier, start))
        self._deleted.add((tier, start))

    def _next_close(self) -> int | None:
        """Watermark at which the oldest open bucket closes."""
        cfg = self.config
        opens = [s for s, b in self.fine.items() if b.ids is not None]
        return min(opens) + cfg.bucket_ms + cfg.allowed_lateness_ms if opens else None

    def _advance(self, wm: int, on_close: Callable[[int], None] | None = None) -> list[int]:
        """Close, roll up and prune everything the watermark has passed.

        ``on_close(end)`` runs for every closed bucket, oldest first; an hour is
        rolled up right after its last minute's ``on_close`` and pruning comes
        last, so what ``on_close`` reads of windows ending at ``end`` is the same
        whether the watermark crept or jumped there.
        """
        cfg = self.config
        closed: list[int] = []
        for start, bucket in self.fine.items():
            if bucket.ids is not None and start + cfg.bucket_ms + cfg.allowed_lateness_ms <= wm:
                bucket.close()
                self._touch(FINE, start)
                closed.append(start + cfg.bucket_ms)
        closed.sort()
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
            del self.fine[start]
            self._drop(FINE, start)
        for start in [s for s in self.coarse if s < wm - cfg.retention_ms]:
            del self.coarse[start]
            self._drop(COARSE, start)
        self._due_ms = _STALE
        return closed

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
        self._touch(COARSE, hour)
        self._rolled_through_ms = hour + cfg.rollup_ms

    # ----------------------------------------------------------------- queries
    def default_end(self) -> int | None:
        """End of the bucket holding the watermark (so windows include open data)."""
        if self.watermark_ms is None:
            return None
        width = self.config.bucket_ms
        return self.watermark_ms - self.watermark_ms % width + width

    def _parts(self, window_ms: int, end_ms: int | None) -> list[Bucket]:
        end = self.default_end() if end_ms is None else end_ms
        if end is None:
            return []
        cfg = self.config
        start = end - window_ms
        rollup = cfg.rollup_ms
        # Minute buckets this recent are always still held when a window ending
        # at ``end`` is read; older ones may or may not be, depending on how far
        # the watermark ran ahead (batching). Using only these keeps every
        # window a function of the events alone.
        horizon = end - (cfg.fine_retention_ms - cfg.allowed_lateness_ms - cfg.bucket_ms)
        parts: list[Bucket] = []
        used: set[int] = set()
        for hour, bucket in self.coarse.items():
            if hour >= start and hour + rollup <= end:
                parts.append(bucket)
                used.add(hour)
        for s, bucket in self.fine.items():
            if not start <= s < end:
                continue
            hour = s - s % rollup
            if hour in used:
                continue
            whole_hour_inside = hour >= start and hour + rollup <= end
            # A whole hour not rolled up yet still has all its minutes (pruning
            # only follows roll-up); a partial hour counts only its recent minutes.
            if whole_hour_inside or s >= horizon:
                parts.append(bucket)
        return parts

    def window(self, window_ms: int, end_ms: int | None = None) -> Bucket:
        """Merged bucket (counters, digests, exemplars) of ``[end − W, end)``.

        Read it, do not change it: a window of closed buckets only is the merged
        bucket kept for that end (until :meth:`release_window_cache`), shared by
        every reader of the end (a minute's close reads some windows three times).
        """
        end = self.default_end() if end_ms is None else end_ms
        parts = self._parts(window_ms, end)
        closed = [p for p in parts if p.ids is None and not p.refill]
        live = [p for p in parts if p.ids is not None or p.refill]
        mc = self.config.max_centroids
        exact = READ_EXACT_LIMIT
        if not closed:
            return Bucket.combine(live, mc, exact)
        starts = [p.start_ms for p in closed]
        key = (window_ms, end or 0, min(starts), max(starts), len(closed))
        cached = self._closed_cache.get(key)
        if cached is None:
            if len(self._closed_cache) >= 32:
                self._closed_cache.clear()
            # A closed bucket no longer changes: alone, it is its own window.
            merged = closed[0] if len(closed) == 1 else Bucket.combine(closed, mc, exact)
            cached = self._closed_cache[key] = merged
        return Bucket.combine([cached, *live], mc, exact) if live else cached

    def release_window_cache(self) -> None:
        """Forget the merged closed parts :meth:`window` keeps.

        They pay off while one end is read several times (a closed minute's final
        snapshots, then its SLO evaluation and breach evidence); once that is
        done they are only memory — about a merged digest per window per series.
        """
        self._closed_cache.clear()

    def exemplars(self, window_ms: int, end_ms: int | None = None, k: int = 5) -> list[str]:
        """Trace ids of the ``k`` slowest requests (by E2E) of a window, slowest first."""
        candidates = [e for part in self._parts(window_ms, end_ms) for e in part.exemplars]
        return [trace for _, trace in heapq.nlargest(k, candidates)]

    def counters(self, window_ms: int, end_ms: int | None = None) -> Counters:
        """Exact counters of a window, without merging digests (cheap: burn rates)."""
        total = Counters()
        for part in self._parts(window_ms, end_ms):
            total.add(part.counters)
        return total

    # ----------------------------------------------------------------- storage
    def meta_bytes(self) -> bytes:
        meta = _Meta(
            watermark_ms=self.watermark_ms,
            late=self.late,
            duplicates=self.duplicates,
            rolled_through_ms=self._rolled_through_ms,
            fine=sorted(self.fine),
            coarse=sorted(self.coarse),
            counted=self._counted,
            wm_before=[(p, o, w) for (p, o), w in self._wm_before.items()],
        )
        return msgspec.msgpack.encode(meta)

    def rewrite_all(self) -> None:
        """Have the next :meth:`take_changes` write every bucket again (a checkpoint
        that took the changes was interrupted before storing all of them)."""
        self._dirty.update((FINE, start) for start in self.fine)
        self._dirty.update((COARSE, start) for start in self.coarse)

    def take_changes(self) -> Changes:
        """Buckets written or deleted since the last call, plus the meta value."""
        upserts = {}
        for tier, start in sorted(self._dirty):
            store = self.fine if tier == FINE else self.coarse
            upserts[(tier, start)] = store[start].to_bytes()
        changes = Changes(upserts=upserts, deletes=sorted(self._deleted), meta=self.meta_bytes())
        self._dirty.clear()
        self._deleted.clear()
        return changes

    @classmethod
    def restore(
        cls,
        meta: bytes,
        load: Callable[[str, int], bytes | None],
        config: RingConfig | None = None,
        thresholds: Thresholds | None = None,
    ) -> "SeriesWindows":
        """Rebuild from :meth:`meta_bytes` and the stored buckets (``load(tier, start)``).

        A bucket listed in the meta but absent from the store (its record was
        lost in a crash while the meta's was not) restores as empty: its input
        will be replayed, and per-bucket ``applied`` offsets fill it exactly once.
        """
        try:
            m = msgspec.msgpack.decode(meta, type=_Meta)
        except msgspec.DecodeError as exc:
            msg = f"series meta state does not decode ({exc})"
            raise CorruptStateError(msg) from exc
        state = cls(config, thresholds)
        state.watermark_ms = m.watermark_ms
        state.late = m.late
        state.duplicates = m.duplicates
        state._rolled_through_ms = m.rolled_through_ms
        state._counted = dict(m.counted)
        state._wm_before = {(p, o): w for p, o, w in m.wm_before}
        for tier, starts, store in ((FINE, m.fine, state.fine), (COARSE, m.coarse, state.coarse)):
            for start in starts:
                data = load(tier, start)
                if data is None:
                    if tier == FINE:
                        store[start] = Bucket(start_ms=start, refill=True)
                    elif state._rolled_through_ms is not None:
                        # Let the hour be rolled up again from its minute buckets.
                        state._rolled_through_ms = min(state._rolled_through_ms, start)
                    continue
                bucket = store[start] = Bucket.from_bytes(data, key=(tier, start))
                for p, o in bucket.applied.items():
                    if o > state._applied_floor.get(p, -1):
                        state._applied_floor[p] = o
        return state
