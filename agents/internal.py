"""Requests grouped by series: for a fold here, or on the wire of ``tailguard.internal.series``.

The ingest agent validates input once, groups the requests by series as
columns (raw numpy arrays, see :class:`~tailguard.streams.columns.Columns`),
each group in input order, with the input position of every request so a
fold applies every input message exactly once. Series at home on their input
partition are folded where they arrive (:func:`columns_by_partition`); the others are
forwarded, one message per internal partition holding many series
(:func:`route`), whose decoding is a handful of ``np.frombuffer`` calls
whatever the number of requests.
"""

from collections.abc import Sequence
from itertools import pairwise

import msgspec
import numpy as np
from tailguard.schemas import InferenceEvent
from tailguard.schemas.placement import home_partition, series_key
from tailguard.streams.columns import Columns, ColumnsWire
from tailguard.streams.served import ServedGpus

Series = tuple[str, str, str, str]

__all__ = [
    "PartitionBatch",
    "SeriesGroups",
    "columns_by_partition",
    "decode_groups",
    "encode_groups",
    "group_by_partition",
    "group_columns",
    "partition_for",
    "route",
    "route_columns",
    "series_index",
    "series_key",
    "served_by",
    "take_requests",
]


class PartitionBatch(msgspec.Struct, array_like=True):
    """Requests of several series bound for one internal partition."""

    series: list[tuple[str, str, str, str]]
    #: int64 offsets into the columns: group ``i`` is ``[bounds[i], bounds[i+1])``.
    bounds: bytes
    cols: ColumnsWire
    #: GPUs that served each group: ``(group, host, gpu index, newest ts_ms)``.
    gpus: list[tuple[int, str, int, int]] = []


class SeriesGroups(msgspec.Struct):
    """A decoded :class:`PartitionBatch`."""

    series: list[tuple[str, str, str, str]]
    bounds: np.ndarray
    cols: Columns
    gpus: list[tuple[int, str, int, int]]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(PartitionBatch)


#: The partition of a series' state: its home partition (:mod:`tailguard.schemas.placement`).
partition_for = home_partition


def encode_groups(
    series: list[tuple[str, str, str, str]],
    bounds: np.ndarray,
    cols: Columns,
    gpus: list[tuple[int, str, int, int]],
) -> bytes:
    batch = PartitionBatch(
        series=series,
        bounds=np.asarray(bounds, dtype=np.int64).tobytes(),
        cols=cols.to_wire(),
        gpus=gpus,
    )
    return _encoder.encode(batch)


def decode_groups(data: bytes) -> SeriesGroups:
    """Inverse of :func:`encode_groups`; raises ``ValueError`` on inconsistent data."""
    try:
        batch = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from exc
    cols = Columns.from_wire(batch.cols)
    bounds = np.frombuffer(batch.bounds, dtype=np.int64)
    if (
        bounds.size != len(batch.series) + 1
        or bounds[0] != 0
        or bounds[-1] != len(cols)
        or np.any(np.diff(bounds) < 0)
    ):
        msg = "group bounds disagree with the columns"
        raise ValueError(msg)
    return SeriesGroups(series=batch.series, bounds=bounds, cols=cols, gpus=batch.gpus)


def series_index(events: Sequence[InferenceEvent]) -> tuple[np.ndarray, list[Series]]:
    """Each event's series as an index into the series, first seen first."""
    index: dict[Series, int] = {}
    gid = np.fromiter(
        (
            index.setdefault((ev.service, ev.model, ev.variant, ev.tenant), len(index))
            for ev in events
        ),
        dtype=np.int64,
        count=len(events),
    )
    return gid, list(index)


def _served(events: Sequence[InferenceEvent], gid: np.ndarray) -> dict[tuple[int, str, int], int]:
    """The newest event time per ``(series index, host, gpu)`` that served them."""
    ts = np.fromiter((ev.ts_ms for ev in events), dtype=np.int64, count=len(events))
    return served_by(
        gid, ServedGpus.of([ev.host for ev in events], [ev.gpu_ids for ev in events]), ts
    )


def served_by(gid: np.ndarray, gpus: ServedGpus, ts: np.ndarray) -> dict[tuple[int, str, int], int]:
    """The newest request time per ``(series index, host, GPU)``, from each request's
    series index, the GPUs that served the requests and each one's time: one sort
    over every (request, GPU) pair instead of a dict lookup per request."""
    if not len(gpus):
        return {}
    t = ts[gpus.at]
    g, h, gpu = gid[gpus.at], gpus.host, gpus.gpu
    order = np.lexsort((t, gpu, h, g))  # by placement, newest last
    g, h, gpu, t = g[order], h[order], gpu[order], t[order]
    last = np.flatnonzero(
        np.r_[(g[1:] != g[:-1]) | (h[1:] != h[:-1]) | (gpu[1:] != gpu[:-1]), True]
    )
    listed = gpus.hosts
    return {
        (gi, listed[hi], gpu_i): newest
        for gi, hi, gpu_i, newest in zip(
            g[last].tolist(), h[last].tolist(), gpu[last].tolist(), t[last].tolist(), strict=True
        )
    }


def group_columns(
    cols: Columns, gid: np.ndarray, series: list[Series], served: dict[tuple[int, str, int], int]
) -> SeriesGroups:
    """Requests in columns grouped by series (``gid``: each one's index into
    ``series``), each group in input order; ``served``: the newest time per
    ``(series index, host, GPU)``."""
    grouped = gid.size < 2 or bool((gid[1:] >= gid[:-1]).all())
    counts = np.bincount(gid, minlength=len(series))
    bounds = np.r_[0, np.cumsum(counts)].astype(np.int64)
    return SeriesGroups(
        series=series,
        bounds=bounds,
        cols=cols if grouped else cols.take(np.argsort(gid, kind="stable")),
        gpus=[(g, host, gpu, ts) for (g, host, gpu), ts in served.items()],
    )


def group_by_partition(
    events: Sequence[InferenceEvent],
    positions: list[tuple[int, int]],
    index: tuple[np.ndarray, list[Series]],
    rows: np.ndarray,
) -> dict[int, SeriesGroups]:
    """The events at ``rows``, per input partition, grouped by series (:func:`group_columns`).

    ``index``: every event's series index and the series (:func:`series_index`)."""
    gid, series = index
    cols = Columns.from_events(events, positions)
    return columns_by_partition(cols, gid, series, _served(events, gid), rows)


def columns_by_partition(
    cols: Columns,
    gid: np.ndarray,
    series: list[Series],
    served: dict[tuple[int, str, int], int],
    rows: np.ndarray,
) -> dict[int, SeriesGroups]:
    """The requests at ``rows`` of ``cols``, per input partition, grouped by series
    (:func:`group_columns`; ``gid``, ``series``, ``served`` as there, for all of ``cols``).

    One stable sort by (partition, series index) and one take for every
    partition: each partition's groups are a slice of the taken columns (a
    view), its series in the order of their index, each one's requests in input
    order."""
    if rows.size == 0:
        return {}
    part = cols.part[rows]
    order = np.lexsort((gid[rows], part))
    picked = rows[order]
    taken = cols.take(picked)
    g, p = gid[picked], part[order]
    edges = np.flatnonzero(np.r_[True, p[1:] != p[:-1], True]).tolist()
    placed = list(served.items())
    owner = np.fromiter((i for (i, _, _), _ in placed), dtype=np.int64, count=len(placed))
    out = {}
    for lo, hi in pairwise(edges):
        mine = g[lo:hi]
        firsts = np.flatnonzero(np.r_[True, mine[1:] != mine[:-1]])
        ids = mine[firsts]
        local = np.full(len(series), -1, dtype=np.int64)
        local[ids] = np.arange(ids.size)
        # The GPUs that served the partition's series (a series fed from two
        # partitions is in both).
        gpus = []
        for k in np.flatnonzero(local[owner] >= 0).tolist():
            (i, host, gpu), ts = placed[k]
            gpus.append((int(local[i]), host, gpu, ts))
        out[int(p[lo])] = SeriesGroups(
            series=[series[i] for i in ids.tolist()],
            bounds=np.r_[firsts, hi - lo].astype(np.int64),
            cols=taken.slice(lo, hi),
            gpus=gpus,
        )
    return out


def take_requests(
    cols: Columns,
    gid: np.ndarray,
    series: list[Series],
    served: dict[tuple[int, str, int], int],
    rows: np.ndarray,
) -> tuple[Columns, np.ndarray, list[Series], dict[tuple[int, str, int], int]]:
    """The requests at ``rows``, their series renumbered among themselves (the
    arguments :func:`group_columns` and :func:`route_columns` take)."""
    ids, local = np.unique(gid[rows], return_inverse=True)
    renumber = dict(zip(ids.tolist(), range(ids.size), strict=True))
    return (
        cols.take(rows),
        local.reshape(-1),
        [series[i] for i in ids.tolist()],
        {(renumber[g], host, gpu): ts for (g, host, gpu), ts in served.items() if g in renumber},
    )


#: Budget of one forwarded message: well under the producer's request limit.
MAX_MESSAGE_BYTES = 900_000


def _cost(cols: Columns) -> np.ndarray:
    """Approximate wire bytes per request."""
    trace_len = np.fromiter(map(len, cols.traces), dtype=np.int64, count=len(cols.traces))
    return 64 + 8 * cols.itl_len + trace_len


def route(
    events: Sequence[InferenceEvent],
    positions: list[tuple[int, int]],
    partitions: int,
    max_bytes: int = MAX_MESSAGE_BYTES,
    index: tuple[np.ndarray, list[Series]] | None = None,
) -> list[tuple[int, bytes]]:
    """Group validated events by series and pack them per internal partition.

    ``index``: each event's series index and the series (:func:`series_index`),
    when the caller has it.

    Returns ``(partition, message)`` pairs. A message holds whole series
    groups up to ``max_bytes``; a series group larger than that is cut, but
    only between input messages (all requests of one input message for one
    series travel together: replay protection compares whole input offsets).
    """
    if not events:
        return []
    gid, series = index if index is not None else series_index(events)
    cols = Columns.from_events(events, positions)
    return route_columns(cols, gid, series, _served(events, gid), partitions, max_bytes)


def route_columns(
    cols: Columns,
    gid: np.ndarray,
    series: list[Series],
    gpus: dict[tuple[int, str, int], int],
    partitions: int,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> list[tuple[int, bytes]]:
    """:func:`route` of requests in columns (``gid``, ``series`` and ``gpus`` as
    :func:`group_columns` takes them)."""
    if len(cols) == 0:
        return []
    group_part = np.array(
        [partition_for(series_key(*s), partitions) for s in series], dtype=np.int64
    )
    order = np.argsort(gid, kind="stable")
    sg = gid[order]
    heads = np.flatnonzero(np.r_[True, sg[1:] != sg[:-1]])
    ends = np.r_[heads[1:], sg.size]
    cost = np.r_[0, np.cumsum(_cost(cols)[order])]
    out: list[tuple[int, bytes]] = []
    per_part: dict[int, list[tuple[int, int, int]]] = {}  # partition → [(group, lo, hi)] in `order`
    for h, e in zip(heads.tolist(), ends.tolist(), strict=True):
        g = int(sg[h])
        per_part.setdefault(int(group_part[g]), []).append((g, h, e))
    gpus_of: dict[int, list[tuple[int, str, int, int]]] = {}
    for (g, host, gpu), ts in gpus.items():
        gpus_of.setdefault(g, []).append((g, host, gpu, ts))

    def pieces(g: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """Cut one group at input-message boundaries into pieces under the budget."""
        if cost[hi] - cost[lo] <= max_bytes:
            return [(g, lo, hi)]
        rows = order[lo:hi]
        part, off = cols.part[rows], cols.offset[rows]
        bounds = [
            lo + i for i in np.flatnonzero((part[1:] != part[:-1]) | (off[1:] != off[:-1])) + 1
        ]
        # Greedy: extend a piece message by message while it fits (a lone
        # oversized input message stays whole).
        out_: list[tuple[int, int, int]] = []
        start = last_fit = lo
        for b in [*bounds, hi]:
            if cost[b] - cost[start] > max_bytes and last_fit > start:
                out_.append((g, start, last_fit))
                start = last_fit
            last_fit = b
        out_.append((g, start, hi))
        return out_

    for p in sorted(per_part):
        message: list[tuple[int, int, int]] = []
        size = 0
        for g, lo, hi in per_part[p]:
            for piece in pieces(g, lo, hi):
                piece_size = int(cost[piece[2]] - cost[piece[1]])
                if message and size + piece_size > max_bytes:
                    out.append((p, _pack(message, order, cols, series, gpus_of)))
                    message, size = [], 0
                message.append(piece)
                size += piece_size
        if message:
            out.append((p, _pack(message, order, cols, series, gpus_of)))
    return out


def _pack(
    pieces: list[tuple[int, int, int]],
    order: np.ndarray,
    cols: Columns,
    series: list[tuple[str, str, str, str]],
    gpus_of: dict[int, list[tuple[int, str, int, int]]],
) -> bytes:
    rows = np.concatenate([order[lo:hi] for _, lo, hi in pieces])
    bounds = np.r_[0, np.cumsum([hi - lo for _, lo, hi in pieces])]
    names = [series[g] for g, _, _ in pieces]
    gpus = [
        (i, host, gpu, ts)
        for i, (g, _, _) in enumerate(pieces)
        for _, host, gpu, ts in gpus_of.get(g, [])
    ]
    return encode_groups(names, bounds, cols.take(rows), gpus)
