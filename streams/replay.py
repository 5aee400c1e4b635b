"""The request-by-request fold: input that may be a replay after a crash.

:func:`~tailguard.streams.fold.fold_many` folds fresh input in one vectorised
pass; a series whose input might repeat what it already holds (an input
position at or below what its buckets or tallies have applied), or whose
restored buckets wait to be refilled, comes here instead. Each request is
judged against the watermark its input message met the first time it was
folded (remembered per message), so a replay re-admits exactly what the
first pass admitted, and a bucket that already holds a position skips it.
Both paths give the same state for the same input.
"""

from collections.abc import Callable

import numpy as np
from tailguard.streams.columns import Columns
from tailguard.streams.ring import SeriesRing, met_watermark
from tailguard.streams.window_config import FINE, WM_HISTORY, AddResult

__all__ = ["add_replay"]


def _next_close(state: SeriesRing) -> int | None:
    """Watermark at which the oldest open bucket of ``state`` closes."""
    cfg = state.config
    opens = [s for s, b in state.fine.items() if b.ids is not None]
    return min(opens) + cfg.bucket_ms + cfg.allowed_lateness_ms if opens else None


def add_replay(
    state: SeriesRing, cols: Columns, on_close: Callable[[int], None] | None
) -> AddResult:
    """Request by request: replays judged against the watermark they first met."""
    state.settle()  # buckets change request by request here, after what batches owe them
    cfg = state.config
    width = cfg.bucket_ms
    lateness = cfg.allowed_lateness_ms
    result = AddResult()
    accs: dict[int, list[int]] = {}
    feeders = state.feeders
    wm = state.watermark_ms  # what the series' watermark becomes
    seen: dict[int, dict[int, int]] = {}
    counted = state._counted
    history = state._wm_before
    newest: dict[int, int] = {}
    current: tuple[int, int] | None = None
    with_positions = bool(cols.part[0] >= 0)
    tally = True  # count late/duplicate, unless this position was counted before
    part = offset = -1
    # What the current request's lateness is judged against: its partition's
    # watermark, or the series' if higher (a partition that joins late, or
    # input without positions, starts from the series').
    judge = _floor(feeders.get(part), wm)
    met: int | None = judge  # watermark the current input message met
    next_close = _next_close(state)
    parts = cols.part.tolist()
    offsets = cols.offset.tolist()
    hashes = cols.ids.tolist()
    for i, ts in enumerate(cols.ts.tolist()):
        start = ts - ts % width
        bucket = state.fine.get(start)
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
                    met = judge = _floor(feeders.get(part), wm)
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
                bucket = state._new_fine(start)
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
                    bucket.note_ids([h])
                accs.setdefault(start, []).append(i)
                result.accepted += 1
        own = feeders.get(part)
        if own is None or ts > own:
            feeders[part] = ts
            moved = met_watermark(wm, feeders)
            if moved != wm:
                wm = moved
                if next_close is not None and wm is not None and wm >= next_close:
                    _fold(state, cols, accs, None)
                    state.watermark_ms = wm
                    result.closed_ends.extend(state._advance(wm, on_close))
                    state._clear_refill()
                    next_close = _next_close(state)
        if judge is None or ts > judge:
            judge = ts
    for p, o in newest.items():
        if o > counted.get(p, -1):
            counted[p] = o
    while len(history) > WM_HISTORY:
        del history[next(iter(history))]
    _fold(state, cols, accs, seen)
    state.late += result.late
    state.duplicates += result.duplicates
    if wm is not None and wm != state.watermark_ms:
        state.watermark_ms = wm
        result.closed_ends.extend(state._advance(wm, on_close))
        state._clear_refill()
    elif wm is not None and result.accepted:
        # A replay may recreate buckets the watermark has already closed or
        # pruned: settle them exactly as the first pass did.
        result.closed_ends.extend(state._advance(wm, on_close))
    return result


def _floor(own: int | None, series: int | None) -> int | None:
    """The higher of a partition's watermark and the series' (None: none yet)."""
    if own is None:
        return series
    return own if series is None or own > series else series


def _fold(
    state: SeriesRing,
    cols: Columns,
    accs: dict[int, list[int]],
    seen: dict[int, dict[int, int]] | None,
) -> None:
    """Fold gathered requests (and, at the end of a call, input positions) into buckets.

    Positions are marked only once the whole call is in: marking a bucket
    mid-call would make the rest of the same input message look replayed.
    """
    cfg = state.config
    for start, marks in (seen or {}).items():
        bucket = state.fine.get(start)
        if bucket is not None:  # pruned meanwhile: nothing left to protect
            bucket.applied.update(marks)
            state._touch(FINE, start)
    for start, index in accs.items():
        bucket = state.fine[start]
        if bucket.ids is None:
            # A replay refilling a closed bucket: merged closed parts are stale.
            state.release_window_cache()
        bucket.absorb(cols, np.asarray(index, dtype=np.int64), cfg.max_centroids, state.thresholds)
        state._touch(FINE, start)
    accs.clear()
    if seen is not None:
        seen.clear()
