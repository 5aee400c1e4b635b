"""Fold one batch of many series into their window states in a single numpy pass.

The SLI agent receives, per internal partition, one message holding the
requests of many series (grouped, each group in input order). Folding each
series on its own costs a few dozen numpy calls per series, which dominates
when a series has only a handful of requests per batch (10,000 series at
100,000 requests/s is ten per series per second). :func:`fold_many` does
the per-request work once for the whole batch — watermarks, lateness,
bucket assignment, counters, digest inputs, exemplar candidates — and
leaves Python loops only per touched bucket.

It gives exactly what :meth:`~tailguard.streams.windows.SeriesWindows.add_columns` gives series by
series (a property test compares the bytes): a series whose input might be a
replay, or that has restored buckets waiting to be refilled, is handed to
the request-by-request path (:func:`~tailguard.streams.replay.add_replay`) instead.
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from tailguard.streams.attribution import FACTORS, STAGE_PREFIX
from tailguard.streams.bucket import EXEMPLARS, Bucket, stage_order
from tailguard.streams.columns import ERROR_CODES, Columns
from tailguard.streams.fold_batch import FoldBatch, Ledger
from tailguard.streams.prompt_tally import prompt_rows
from tailguard.streams.replay import add_replay
from tailguard.streams.ring import SeriesRing, met_watermark
from tailguard.streams.window_config import FINE, AddResult

__all__ = ["fold_many", "tidy_after"]

_NO_WM = np.iinfo(np.int64).min
_NO_ROWS = np.empty(0, dtype=np.int64)
_NO_VALUES = np.empty(0, dtype=np.float64)
_NO_TRACES = np.empty(0, dtype=object)
_ERR_LO, _ERR_HI = min(ERROR_CODES), max(ERROR_CODES)
_SHIFT = 2**22  # groups per batch the segmented prefix max can separate
_PARTS = 2**20  # input partitions a (group, partition) key can tell apart


def _reduce_by(
    keys: np.ndarray, values: np.ndarray, ufunc: np.ufunc
) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``keys`` (sorted) and ``ufunc.reduce`` of their ``values``."""
    if keys.size == 0:
        return keys, values
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    cut = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
    return sk[cut], ufunc.reduceat(values[order], cut)


def _sum_by(keys: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact integer sums of integer-valued ``values`` per key (float64 is exact below 2**53)."""
    return np.bincount(keys, weights=values, minlength=n).astype(np.int64)


def _group_ids(bounds: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(bounds.size - 1), np.diff(bounds))


def _segmented_prior_max(ts: np.ndarray, g: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Per request: max(floor[group], newest ts of earlier requests of its group)."""
    n = ts.size
    out = np.empty(n, dtype=np.int64)
    if n == 0:
        return out
    lo, hi = int(ts.min()), int(ts.max())
    if hi - lo < 2**40 and int(g[-1]) < _SHIFT:
        key = g.astype(np.int64) * 2**40 + (ts - lo)
        run = np.maximum.accumulate(key) - g.astype(np.int64) * 2**40 + lo
    else:  # absurd spans: per group (never on sane input)
        run = np.empty(n, dtype=np.int64)
        for gi in np.unique(g).tolist():
            sel = np.flatnonzero(g == gi)
            run[sel] = np.maximum.accumulate(ts[sel])
    out[1:] = run[:-1]
    first = np.ones(n, dtype=np.bool_)
    first[1:] = g[1:] != g[:-1]
    out[first] = _NO_WM
    return np.maximum(out, floor[g])


def _judged_against(
    ts: np.ndarray, feed: np.ndarray, feed_keys: np.ndarray, floor: np.ndarray
) -> np.ndarray:
    """Per request: the watermark its lateness is judged against — the newest
    earlier request of its series and input partition (``feed``: a key from
    ``feed_keys``), at least ``floor`` of that key (the partition's watermark or
    the series', whichever is higher)."""
    segment = np.searchsorted(feed_keys, feed)
    if segment.size < 2 or bool((segment[1:] >= segment[:-1]).all()):
        # One partition per series (the usual case): segments come in order.
        return _segmented_prior_max(ts, segment, floor)
    order = np.argsort(segment, kind="stable")
    out = np.empty_like(ts)
    out[order] = _segmented_prior_max(ts[order], segment[order], floor)
    return out


def _first_feeder(state: SeriesRing, feeds: int) -> bool:
    """Whether the one partition feeding a series in this batch is its first feeder
    ever: nothing to meet, so the batched path judges it exactly as the
    request-by-request path would (each request against the newest before it)."""
    return feeds == 1 and not state.feeders and state.watermark_ms is None and not state.fine


@contextmanager
def tidy_after(states: Sequence[SeriesRing]) -> Iterator[None]:
    """Hold the roll-ups and pruning of ``states`` until the block is done.

    A fold only notes the minutes that close; the block then reads every one
    of them, all series together, before any bucket rolls up or goes (see
    :meth:`SeriesRing._advance`)."""
    for state in states:
        state.tidy_held = True
    try:
        yield
    finally:
        for state in states:
            state.tidy()


def fold_many(
    states: Sequence[SeriesRing],
    cols: Columns,
    bounds: np.ndarray,
    on_close: Sequence[Callable[[int], None] | None] | None = None,
    ledger: Ledger | None = None,
) -> list[AddResult]:
    """Fold ``cols[bounds[i]:bounds[i+1]]`` into ``states[i]`` for every ``i``.

    Returns one :class:`AddResult` per state. All requests of one input
    message for one series must be in the same call (as for ``add_columns``).
    What the buckets gain is held in ``ledger`` (a new one if None) until a
    state is read (:mod:`~tailguard.streams.fold_batch`): pass the same ledger
    to every call, and many batches are put in at once.
    """
    n_groups = len(states)
    results = [AddResult() for _ in range(n_groups)]
    closers = list(on_close) if on_close is not None else [None] * n_groups
    if n_groups == 0 or len(cols) == 0:
        return results
    bounds = np.asarray(bounds, dtype=np.int64)
    g_all = _group_ids(bounds)

    # -- which groups may take the batched path ---------------------------------
    # Not those with input that may be a replay, or from a partition that does
    # not feed the series yet (it starts from the series' watermark, which the
    # request-by-request path moves as it goes).
    with_positions = bool(cols.part[0] >= 0)
    is_fresh = [not state.awaiting_refill() for state in states]
    feed_keys, lowest = _reduce_by(g_all * _PARTS + (cols.part + 1), cols.offset, np.minimum)
    floors = [_NO_WM] * feed_keys.size  # see _judged_against
    feeds_per_group = np.bincount(feed_keys // _PARTS, minlength=n_groups).tolist()
    for i, (key, low) in enumerate(zip(feed_keys.tolist(), lowest.tolist(), strict=True)):
        gi, p = divmod(key, _PARTS)
        p -= 1
        state = states[gi]
        own = state.feeders.get(p)
        if own is None and _first_feeder(state, feeds_per_group[gi]):
            state.feeders[p] = _NO_WM  # moved below by its first request that is not late
            continue
        if own is None or (p >= 0 and low <= state.replay_floor(p)):
            is_fresh[gi] = False
        elif is_fresh[gi]:
            wm = state.watermark_ms
            floors[i] = own if wm is None or own > wm else wm
    fresh = np.array(is_fresh, dtype=np.bool_)
    floor = np.array(floors, dtype=np.int64)
    for gi in np.flatnonzero(~fresh).tolist():
        a, b = int(bounds[gi]), int(bounds[gi + 1])
        if b > a:
            results[gi] = add_replay(states[gi], cols.slice(a, b), closers[gi])
    rows = np.flatnonzero(fresh[g_all])
    if rows.size == 0:
        return results

    # -- lateness: each request against the watermark it meets -------------------
    ts = cols.ts[rows]
    g = g_all[rows]
    judge = _judged_against(ts, g * _PARTS + (cols.part[rows] + 1), feed_keys, floor)
    cfg = states[0].config
    if any(s.config is not cfg and s.config != cfg for s in states):
        msg = "fold_many needs one RingConfig for the whole batch"
        raise ValueError(msg)
    width = cfg.bucket_ms
    starts = ts - ts % width
    late = starts + (width + cfg.allowed_lateness_ms) <= judge
    late_per_group = np.bincount(g[late], minlength=n_groups)

    # -- input positions: watermark met per message, newest offsets counted ------
    if with_positions:
        part = cols.part[rows]
        offset = cols.offset[rows]
        if late.any():
            # Watermark met by each message with a late request: a replay is
            # judged against it (replay.add_replay). Without a note a
            # replay is judged against its own requests only, which re-admits
            # exactly what was admitted unless one was late the first time.
            # Rare, so a Python loop.
            head = np.ones(rows.size, dtype=np.bool_)
            head[1:] = (g[1:] != g[:-1]) | (part[1:] != part[:-1]) | (offset[1:] != offset[:-1])
            run = np.cumsum(head) - 1
            heads = np.flatnonzero(head)[np.unique(run[late])]
            touched: set[int] = set()
            for gi, p, o, w in zip(
                g[heads].tolist(),
                part[heads].tolist(),
                offset[heads].tolist(),
                judge[heads].tolist(),
                strict=True,
            ):
                history = states[gi]._wm_before
                if (p, o) not in history:
                    history[(p, o)] = None if w == _NO_WM else w
                touched.add(gi)
            for gi in touched:
                states[gi]._trim_history()
        keys, tops = _reduce_by(g * _PARTS + part, offset, np.maximum)
        for key, top in zip(keys.tolist(), tops.tolist(), strict=True):
            gi, p = divmod(key, _PARTS)
            counted = states[gi]._counted
            if top > counted.get(p, -1):
                counted[p] = top

    # -- buckets: create in order of first appearance, drop duplicates -----------
    cand = np.flatnonzero(~late)
    cg = g[cand]
    cs = starts[cand]
    bkey = cg.astype(np.int64) * 2**44 + (cs - int(cs.min() if cs.size else 0)) // width
    ukeys, first, inverse = np.unique(bkey, return_index=True, return_inverse=True)
    n_b = ukeys.size
    border = np.argsort(inverse, kind="stable")  # candidates grouped by bucket, input order kept
    boff = np.r_[0, np.cumsum(np.bincount(inverse, minlength=n_b))].tolist()
    b_group = cg[first]
    b_start = cs[first]
    b_groups, b_starts = b_group.tolist(), b_start.tolist()
    buckets: list[Bucket] = [None] * n_b  # type: ignore[list-item]
    keep = np.ones(cand.size, dtype=np.bool_)
    dup_per_group = np.zeros(n_groups, dtype=np.int64)
    hashes_by_bucket = cols.ids[rows[cand[border]]].tolist()  # in border's order
    for b in np.argsort(first, kind="stable").tolist():
        gi = b_groups[b]
        state = states[gi]
        start = b_starts[b]
        bucket = state.fine.get(start)
        if bucket is None:
            bucket = state._new_fine(start)
        buckets[b] = bucket
        state._touch(FINE, start)  # its next record is due
        ids = bucket.ids
        if ids is None:
            state.release_window_cache()
            continue
        lo, hi = boff[b], boff[b + 1]
        hashes = hashes_by_bucket[lo:hi]
        fresh_ids = set(hashes)
        if len(fresh_ids) == len(hashes) and ids.isdisjoint(fresh_ids):
            ids |= fresh_ids
            bucket.note_ids(hashes)
            continue
        added = []
        for j, h in zip(border[lo:hi].tolist(), hashes, strict=True):
            if h in ids:
                keep[j] = False
                dup_per_group[gi] += 1
            else:
                ids.add(h)
                added.append(h)
        bucket.note_ids(added)

    if with_positions:
        cpart = cols.part[rows[cand]]
        coff = cols.offset[rows[cand]]
        keys, tops = _reduce_by(inverse.astype(np.int64) * _PARTS + cpart, coff, np.maximum)
        for key, top in zip(keys.tolist(), tops.tolist(), strict=True):
            b, p = divmod(key, _PARTS)
            applied = buckets[b].applied
            if top > applied.get(p, -1):
                applied[p] = top

    # -- counters and digest inputs, for every bucket at once --------------------
    acc_sorted = border[keep[border]]  # accepted candidates, by bucket, input order
    ab = inverse[acc_sorted]  # bucket of each
    src = rows[cand[acc_sorted]]  # row in cols
    batch = _absorb_all(states, buckets, cols, src, ab, g[cand[acc_sorted]], n_b, cfg.max_centroids)
    if batch.buckets:
        ledger = ledger if ledger is not None else Ledger()
        for gi in np.unique(b_group).tolist():
            held = states[gi].ledger
            if held is not ledger:
                if held:
                    held.settle()  # what it owes is older than this batch
                states[gi].ledger = ledger
        ledger.add(batch)

    # -- watermarks, tallies, closes ----------------------------------------------
    acc_groups = g[cand[acc_sorted]]
    # Every request that is not late moves its partition's watermark, duplicates
    # included: a replay cannot tell a request its bucket holds from a duplicate.
    keys, tops = _reduce_by(cg * _PARTS + (cols.part[rows[cand]] + 1), ts[cand], np.maximum)
    moved = [False] * n_groups
    for key, top in zip(keys.tolist(), tops.tolist(), strict=True):
        gi, p = divmod(key, _PARTS)
        feeders = states[gi].feeders
        if top > feeders[p - 1]:
            feeders[p - 1] = top
            moved[gi] = True
    accepted_per_group = np.bincount(acc_groups, minlength=n_groups).tolist()
    late_per_group, dup_per_group = late_per_group.tolist(), dup_per_group.tolist()
    for gi in np.flatnonzero(fresh).tolist():
        state = states[gi]
        res = results[gi]
        res.accepted = accepted_per_group[gi]
        res.late = late_per_group[gi]
        res.duplicates = dup_per_group[gi]
        state.late += res.late
        state.duplicates += res.duplicates
        if not moved[gi]:
            continue
        top = met_watermark(state.watermark_ms, state.feeders)
        if top is not None and top != state.watermark_ms:
            state.watermark_ms = top
            if top >= state._due():
                res.closed_ends.extend(state._advance(top, closers[gi]))
    return results


def _absorb_all(
    states: Sequence[SeriesRing],
    buckets: list[Bucket],
    cols: Columns,
    src: np.ndarray,
    ab: np.ndarray,
    ag: np.ndarray,
    n_b: int,
    max_centroids: int,
) -> FoldBatch:
    """What the accepted requests ``cols[src]`` (bucket ``ab``, group ``ag``) add to
    ``buckets``: same arithmetic as :meth:`Bucket.absorb`, batched over buckets,
    put in when a ledger settles (:mod:`~tailguard.streams.fold_batch`)."""
    thr_ttft = np.array([s.thresholds.ttft_ms for s in states], dtype=np.float64)[ag]
    thr_itl = np.array([s.thresholds.itl_ms for s in states], dtype=np.float64)[ag]
    e2e_set = np.array([s.thresholds.e2e_ms is not None for s in states], dtype=np.bool_)[ag]
    thr_e2e = np.array(
        [np.inf if s.thresholds.e2e_ms is None else s.thresholds.e2e_ms for s in states],
        dtype=np.float64,
    )[ag]

    def per_bucket(mask: np.ndarray) -> np.ndarray:
        return np.bincount(ab[mask], minlength=n_b)

    warm = cols.warmup[src]
    live = ~warm
    status = cols.status[src]
    ok = live & (status == 0)
    err = live & (status >= _ERR_LO) & (status <= _ERR_HI)
    e2e = cols.e2e[src]
    ttft = cols.ttft[src]
    has_ttft = ok & ~np.isnan(ttft)
    ttft_good = has_ttft & (ttft <= thr_ttft)
    tokens = cols.tokens[src]
    with_tpot = has_ttft & (tokens > 1)
    tpot = np.zeros(src.size, dtype=np.float64)
    tpot[with_tpot] = (e2e[with_tpot] - ttft[with_tpot]) / (tokens[with_tpot] - 1)
    e2e_in = ok & e2e_set
    e2e_good = e2e_in & (e2e <= thr_e2e)
    good = ok & ~(has_ttft & ~ttft_good) & ~(with_tpot & (tpot > thr_itl)) & ~(e2e_in & ~e2e_good)

    # Gaps of the accepted ok requests, in (bucket, input) order.
    lens = np.where(ok, cols.itl_len[src], 0)
    gap_bucket = np.repeat(ab, lens)
    if gap_bucket.size:
        ends = np.cumsum(cols.itl_len)
        begin = (ends - cols.itl_len)[src]
        within = np.arange(gap_bucket.size) - np.repeat(np.cumsum(lens) - lens, lens)
        gaps = cols.itl[np.repeat(begin, lens) + within]
        gap_ok = gaps <= np.repeat(thr_itl, lens)
        itl_total = np.bincount(gap_bucket, minlength=n_b)
        itl_good = np.bincount(gap_bucket[gap_ok], minlength=n_b)
    else:
        gaps = np.empty(0, dtype=np.float64)
        itl_total = itl_good = np.zeros(n_b, dtype=np.int64)

    ttft_us = np.zeros(src.size, dtype=np.float64)
    ttft_us[has_ttft] = np.rint(ttft[has_ttft] * 1000.0)
    bad = ok & ~good
    flags = cols.factors[src]
    # Most batches: no request flagged a cause, and every count of the causes is zero.
    factor_columns = [np.zeros(n_b, dtype=np.int64)] * (4 * len(FACTORS))
    if flags.any():
        factor_columns = []
        for i in range(len(FACTORS)):
            flagged = (flags & (1 << i)) != 0
            f_ok = ok & flagged
            f_ttft = has_ttft & flagged
            factor_columns += [
                per_bucket(f_ok),
                per_bucket(bad & flagged),
                per_bucket(f_ttft),
                _sum_by(ab[f_ttft], ttft_us[f_ttft], n_b),
            ]

    table = np.stack(
        [
            per_bucket(live),  # requests
            per_bucket(err),  # errors
            per_bucket(live & ~ok & ~err),  # cancelled
            per_bucket(warm),  # warmup
            per_bucket(has_ttft),
            per_bucket(ttft_good),
            itl_total,
            itl_good,
            per_bucket(e2e_in),
            per_bucket(e2e_good),
            per_bucket(good),
            _sum_by(ab[has_ttft], ttft_us[has_ttft], n_b),
            *factor_columns,
        ],
        axis=1,
    )

    # Only buckets that gained something are owed a row (all duplicates: nothing).
    owed = table.any(axis=1)
    row_of = np.cumsum(owed) - 1  # bucket -> its row in the batch
    metrics = []
    for name, mask, values in (
        ("ttft_ms", has_ttft, ttft),
        ("tpot_ms", with_tpot, tpot),
        ("e2e_ms", ok, e2e),
    ):
        if mask.any():
            metrics.append((name, values[mask], row_of[ab[mask]]))
    if gaps.size:
        metrics.append(("itl_ms", gaps, row_of[gap_bucket]))
    stages = []
    for j in stage_order(cols.stage_names):
        column = cols.stages[src, j]
        mask = ok & ~np.isnan(column)
        if mask.any():
            off = np.r_[0, np.cumsum(per_bucket(mask)[owed])].tolist()
            stages.append((STAGE_PREFIX + cols.stage_names[j], column[mask], off))

    # Exemplar candidates: per bucket the requests that can make its top EXEMPLARS.
    traced = ok & cols.has_trace[src]
    t_idx = np.flatnonzero(traced)
    ex_rows, ex_e2e, ex_traces = _NO_ROWS, _NO_VALUES, _NO_TRACES
    if t_idx.size:
        tb = ab[t_idx]
        te = e2e[t_idx]
        order = np.lexsort((-te, tb))
        tb, te, t_idx = tb[order], te[order], t_idx[order]
        start_of = np.r_[0, np.flatnonzero(tb[1:] != tb[:-1]) + 1]
        rank = np.arange(tb.size) - np.repeat(start_of, np.diff(np.r_[start_of, tb.size]))
        kth_pos = np.minimum(start_of + EXEMPLARS - 1, np.r_[start_of[1:], tb.size] - 1)
        kth = np.repeat(te[kth_pos], np.diff(np.r_[start_of, tb.size]))
        chosen = (rank < EXEMPLARS) | (te >= kth)
        # Nor slower than what a bucket already keeps (most requests of a busy
        # minute are not): its slowest EXEMPLARS, slowest first. A bucket still
        # owed earlier batches may keep slower ones: more candidates, same result.
        kept = [b.exemplars[-1][0] if len(b.exemplars) >= EXEMPLARS else -np.inf for b in buckets]
        chosen &= te >= np.array(kept, dtype=np.float64)[tb]
        ex_rows, ex_e2e = row_of[tb[chosen]], te[chosen]
        ex_traces = cols.traces[src[t_idx[chosen]]]

    prompts = prompt_rows(cols, src[live], ab[live], (err | bad)[live]) if cols.prompt_names else {}
    rows = np.flatnonzero(owed)
    return FoldBatch(
        buckets=[buckets[b] for b in rows.tolist()],
        counts=table[rows],
        metrics=metrics,
        stages=stages,
        exemplar_rows=ex_rows,
        exemplar_e2e=ex_e2e,
        exemplar_traces=ex_traces,
        prompts={int(row_of[b]): found for b, found in prompts.items()},
        events=int(src.size),
        max_centroids=max_centroids,
    )
