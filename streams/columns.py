"""Column-wise batches of requests: what the window state folds in, one array per field.

The hot path never touches one request at a time in Python when it can help
it: the ingest agent turns validated events into columns once, the columns
travel to the SLI agent as raw arrays (:meth:`Columns.to_wire`), and buckets
fold them in with numpy (:meth:`~tailguard.streams.bucket.Bucket.absorb`).

Missing values are encoded in-band: ``ttft`` is NaN and ``tokens`` is −1 when
absent, ``traces`` holds ``""`` for a request without a trace id, and
``prompt`` is −1 for a request without a ``prompt_version`` (else an index
into ``prompt_names``).
"""

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import msgspec
import numpy as np
from tailguard.streams.attribution import MAX_STAGE_NAME, MAX_STAGES, factor_flags
from tailguard.streams.sli import LatencyEvent

__all__ = [
    "ERROR_CODES",
    "STATUS_CODES",
    "Columns",
    "ColumnsWire",
    "event_hash",
    "event_hashes",
    "prompt_column",
    "trace_column",
]

#: Status → code. ``error``, ``timeout`` and ``rejected`` are errors; anything
#: else that is not ``ok`` counts as cancelled.
STATUS_CODES: dict[str, int] = {"ok": 0, "error": 1, "timeout": 2, "rejected": 3, "cancelled": 4}
ERROR_CODES = (1, 2, 3)
_OTHER = 4

_MAX_DIRECT = 64
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def trace_column(traces: Sequence[str | None]) -> np.ndarray:
    """Trace ids as an object array, "" where a request has none: taking some of
    them is one numpy step, not a Python one per request."""
    column = np.empty(len(traces), dtype=object)
    column[:] = traces
    column[column == None] = ""  # noqa: E711 (elementwise)
    return column


def event_hashes(event_ids: Sequence[str]) -> np.ndarray:
    """64-bit FNV-1a of each event id's UTF-8 bytes, vectorised over the batch.

    Stable across processes and releases (stored open buckets keep these
    hashes for duplicate suppression), so it must never change. An id longer
    than 64 bytes is hashed through its 16-byte BLAKE2b digest first, so one
    absurd id cannot widen the whole batch's byte matrix.
    """
    n = len(event_ids)
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    encoded = [s.encode() for s in event_ids]
    if max(map(len, encoded)) > _MAX_DIRECT:
        encoded = [
            b if len(b) <= _MAX_DIRECT else hashlib.blake2b(b, digest_size=16).digest()
            for b in encoded
        ]
    raw = np.array(encoded, dtype=np.bytes_)
    width = raw.dtype.itemsize
    mat = raw.view(np.uint8).reshape(n, width)
    lengths = np.char.str_len(raw)
    h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(width):
            live = lengths > j
            col = mat[:, j].astype(np.uint64)
            h = np.where(live, (h ^ col) * _FNV_PRIME, h)
    return h


def _stage_matrix(events: Sequence[LatencyEvent]) -> tuple[list[str], np.ndarray]:
    """Stage names (first seen first, at most MAX_STAGES) and the (n, k) latency matrix."""
    index: dict[str, int] = {}
    cells: list[tuple[int, int, float]] = []
    for i, ev in enumerate(events):
        stages = getattr(ev, "stages_ms", None)
        if not stages:
            continue
        for name, ms in stages.items():
            j = index.get(name)
            if j is None:
                if len(index) >= MAX_STAGES or len(name) > MAX_STAGE_NAME:
                    continue
                j = index[name] = len(index)
            cells.append((i, j, ms))
    out = np.full((len(events), len(index)), np.nan, dtype=np.float64)
    if cells:
        rows, cols, values = zip(*cells, strict=True)
        out[list(rows), list(cols)] = values
    return list(index), out


#: Longest prompt version name a column keeps (longer ones count as unnamed).
MAX_PROMPT_NAME = 128


def _prompt_column(events: Sequence[LatencyEvent]) -> tuple[list[str], np.ndarray]:
    """Prompt version names (first seen first) and each request's index (−1: none)."""
    return prompt_column([getattr(ev, "prompt_version", None) for ev in events])


def prompt_column(names: Sequence[str | None]) -> tuple[list[str], np.ndarray]:
    """Each request's prompt version (None: none) as the distinct names, first seen
    first, and each request's index into them (−1: none, or a name too long)."""
    index: dict[str, int] = {}
    out = np.full(len(names), -1, dtype=np.int32)
    for i, name in enumerate(names):
        if not name or len(name) > MAX_PROMPT_NAME:
            continue
        out[i] = index.setdefault(name, len(index))
    return list(index), out


def _stages_from(raw: bytes, k: int) -> np.ndarray | None:
    """The (n, k) stage matrix of the wire; None (no stages) when ``k`` is 0."""
    values = np.frombuffer(raw, dtype=np.float64)
    if k == 0:
        if values.size:
            msg = "stage values without stage names"
            raise ValueError(msg)
        return None
    if values.size % k:
        msg = "stage values do not fill the stage columns"
        raise ValueError(msg)
    return values.reshape(-1, k)


def event_hash(event_id: str) -> int:
    """The hash of one event id (see :func:`event_hashes`)."""
    return int(event_hashes([event_id])[0])


class ColumnsWire(msgspec.Struct, array_like=True):
    """:class:`Columns` as sent between agents: each array as its bytes."""

    ts: bytes
    status: bytes
    e2e: bytes
    ttft: bytes
    tokens: bytes
    warmup: bytes
    itl: bytes
    itl_len: bytes
    ids: bytes
    traces: list[str]
    part: bytes
    offset: bytes
    factors: bytes = b""
    stage_names: list[str] = []
    stages: bytes = b""
    prompt_names: list[str] = []
    prompts: bytes = b""


@dataclass(slots=True)
class Columns:
    """``n`` requests of one series, in input order.

    ``part``/``offset`` are the input position (partition, offset) of the
    message each request came in (−1 when unknown: no replay protection).
    ``factors`` holds each request's cause flags and ``stages`` its stage
    latencies, one column per name of ``stage_names`` (NaN: not reported);
    see :mod:`~tailguard.streams.attribution`. ``prompt`` indexes
    ``prompt_names`` (−1: the request named no prompt version).
    """

    ts: np.ndarray  # int64
    status: np.ndarray  # uint8, STATUS_CODES
    e2e: np.ndarray  # float64
    ttft: np.ndarray  # float64, NaN = absent
    tokens: np.ndarray  # int64, -1 = absent
    warmup: np.ndarray  # bool
    itl: np.ndarray  # float64, every gap of every request, concatenated
    itl_len: np.ndarray  # int64, gaps per request
    ids: np.ndarray  # uint64, event_hashes
    #: Trace ids, an object array ("": none); a sequence given is made one.
    traces: np.ndarray
    part: np.ndarray  # int64
    offset: np.ndarray  # int64
    factors: np.ndarray = None  # type: ignore[assignment]  # uint8; None → no flags
    stage_names: list[str] = None  # type: ignore[assignment]
    stages: np.ndarray = None  # type: ignore[assignment]  # float64 (n, len(stage_names))
    prompt_names: list[str] = None  # type: ignore[assignment]
    prompt: np.ndarray = None  # type: ignore[assignment]  # int32, -1 = none
    _itl_owner: np.ndarray | None = None
    _has_trace: np.ndarray | None = None
    _itl_ends: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.ts.size
        if not isinstance(self.traces, np.ndarray):
            self.traces = trace_column(self.traces)
        if self.factors is None:
            self.factors = np.zeros(n, dtype=np.uint8)
        if self.stage_names is None:
            self.stage_names = []
        if self.stages is None:
            self.stages = np.empty((n, len(self.stage_names)), dtype=np.float64)
        if self.prompt_names is None:
            self.prompt_names = []
        if self.prompt is None:
            self.prompt = np.full(n, -1, dtype=np.int32)

    def __len__(self) -> int:
        return int(self.ts.size)

    @property
    def itl_owner(self) -> np.ndarray:
        """Index of the request each gap of :attr:`itl` belongs to."""
        if self._itl_owner is None:
            self._itl_owner = np.repeat(np.arange(self.ts.size), self.itl_len)
        return self._itl_owner

    @property
    def has_trace(self) -> np.ndarray:
        if self._has_trace is None:
            self._has_trace = self.traces.astype(np.bool_)
        return self._has_trace

    @classmethod
    def from_events(
        cls,
        events: Sequence[LatencyEvent],
        positions: Sequence[tuple[int, int]] | None = None,
    ) -> "Columns":
        """Columns of event objects (``InferenceEvent`` or anything alike)."""
        n = len(events)
        itl_lists = [ev.itl_ms or () for ev in events]
        itl_len = np.fromiter(map(len, itl_lists), dtype=np.int64, count=n)
        itl = np.fromiter(
            chain.from_iterable(itl_lists), dtype=np.float64, count=int(itl_len.sum())
        )
        if positions is None:
            part = np.full(n, -1, dtype=np.int64)
            offset = np.full(n, -1, dtype=np.int64)
        else:
            part = np.fromiter((p for p, _ in positions), dtype=np.int64, count=n)
            offset = np.fromiter((o for _, o in positions), dtype=np.int64, count=n)
        codes = STATUS_CODES
        stage_names, stages = _stage_matrix(events)
        prompt_names, prompt = _prompt_column(events)
        return cls(
            ts=np.fromiter((ev.ts_ms for ev in events), dtype=np.int64, count=n),
            status=np.fromiter(
                (codes.get(ev.status, _OTHER) for ev in events), dtype=np.uint8, count=n
            ),
            e2e=np.fromiter((ev.e2e_ms for ev in events), dtype=np.float64, count=n),
            ttft=np.fromiter(
                (np.nan if ev.ttft_ms is None else ev.ttft_ms for ev in events),
                dtype=np.float64,
                count=n,
            ),
            tokens=np.fromiter(
                (-1 if ev.output_tokens is None else ev.output_tokens for ev in events),
                dtype=np.int64,
                count=n,
            ),
            warmup=np.fromiter((bool(ev.warmup) for ev in events), dtype=np.bool_, count=n),
            itl=itl,
            itl_len=itl_len,
            ids=event_hashes([ev.event_id for ev in events]),
            traces=[ev.trace_id or "" for ev in events],
            part=part,
            offset=offset,
            factors=factor_flags(events),
            stage_names=stage_names,
            stages=stages,
            prompt_names=prompt_names,
            prompt=prompt,
        )

    def slice(self, lo: int, hi: int) -> "Columns":
        """Requests ``lo`` to ``hi`` (a cheap view: no copy of the gaps)."""
        if self._itl_ends is None:
            self._itl_ends = np.r_[0, np.cumsum(self.itl_len)]
        g_lo, g_hi = int(self._itl_ends[lo]), int(self._itl_ends[hi])
        return Columns(
            ts=self.ts[lo:hi],
            status=self.status[lo:hi],
            e2e=self.e2e[lo:hi],
            ttft=self.ttft[lo:hi],
            tokens=self.tokens[lo:hi],
            warmup=self.warmup[lo:hi],
            itl=self.itl[g_lo:g_hi],
            itl_len=self.itl_len[lo:hi],
            ids=self.ids[lo:hi],
            traces=self.traces[lo:hi],
            part=self.part[lo:hi],
            offset=self.offset[lo:hi],
            factors=self.factors[lo:hi],
            stage_names=self.stage_names,
            stages=self.stages[lo:hi],
            prompt_names=self.prompt_names,
            prompt=self.prompt[lo:hi],
            _has_trace=None if self._has_trace is None else self._has_trace[lo:hi],
        )

    def take(self, index: np.ndarray) -> "Columns":
        """The requests at ``index`` (in that order)."""
        index = np.asarray(index, dtype=np.int64)
        if self._itl_ends is None:
            self._itl_ends = np.r_[0, np.cumsum(self.itl_len)]
        lens = self.itl_len[index]
        total = int(lens.sum())
        if total:
            # Gap positions of each chosen request, concatenated, without a Python loop.
            firsts = self._itl_ends[index]
            shift = np.repeat(firsts - (np.cumsum(lens) - lens), lens)
            itl = self.itl[shift + np.arange(total)]
        else:
            itl = np.empty(0, dtype=np.float64)
        return Columns(
            ts=self.ts[index],
            status=self.status[index],
            e2e=self.e2e[index],
            ttft=self.ttft[index],
            tokens=self.tokens[index],
            warmup=self.warmup[index],
            itl=itl,
            itl_len=self.itl_len[index],
            ids=self.ids[index],
            traces=self.traces[index],
            part=self.part[index],
            offset=self.offset[index],
            factors=self.factors[index],
            stage_names=self.stage_names,
            stages=self.stages[index],
            prompt_names=self.prompt_names,
            prompt=self.prompt[index],
            # Worked out once for the columns taken from, not again for each take.
            _has_trace=self.has_trace[index],
        )

    # ------------------------------------------------------------------ wire
    def to_wire(self) -> "ColumnsWire":
        return ColumnsWire(
            ts=self.ts.astype(np.int64, copy=False).tobytes(),
            status=self.status.astype(np.uint8, copy=False).tobytes(),
            e2e=self.e2e.astype(np.float64, copy=False).tobytes(),
            ttft=self.ttft.astype(np.float64, copy=False).tobytes(),
            tokens=self.tokens.astype(np.int32, copy=False).tobytes(),
            warmup=self.warmup.astype(np.bool_, copy=False).tobytes(),
            itl=self.itl.astype(np.float64, copy=False).tobytes(),
            itl_len=self.itl_len.astype(np.int32, copy=False).tobytes(),
            ids=self.ids.astype(np.uint64, copy=False).tobytes(),
            traces=self.traces.tolist(),
            part=self.part.astype(np.int32, copy=False).tobytes(),
            offset=self.offset.astype(np.int64, copy=False).tobytes(),
            factors=self.factors.astype(np.uint8, copy=False).tobytes(),
            stage_names=self.stage_names,
            stages=np.ascontiguousarray(self.stages, dtype=np.float64).tobytes(),
            prompt_names=self.prompt_names,
            prompts=self.prompt.astype(np.int32, copy=False).tobytes()
            if self.prompt_names
            else b"",
        )

    @classmethod
    def from_wire(cls, w: "ColumnsWire") -> "Columns":
        """Inverse of :meth:`to_wire`; raises ``ValueError`` when the arrays disagree."""
        c = cls(
            ts=np.frombuffer(w.ts, dtype=np.int64),
            status=np.frombuffer(w.status, dtype=np.uint8),
            e2e=np.frombuffer(w.e2e, dtype=np.float64),
            ttft=np.frombuffer(w.ttft, dtype=np.float64),
            tokens=np.frombuffer(w.tokens, dtype=np.int32).astype(np.int64),
            warmup=np.frombuffer(w.warmup, dtype=np.bool_),
            itl=np.frombuffer(w.itl, dtype=np.float64),
            itl_len=np.frombuffer(w.itl_len, dtype=np.int32).astype(np.int64),
            ids=np.frombuffer(w.ids, dtype=np.uint64),
            traces=w.traces,
            part=np.frombuffer(w.part, dtype=np.int32).astype(np.int64),
            offset=np.frombuffer(w.offset, dtype=np.int64),
            factors=np.frombuffer(w.factors, dtype=np.uint8) if w.factors else None,  # type: ignore[arg-type]
            stage_names=list(w.stage_names),
            stages=_stages_from(w.stages, len(w.stage_names)),  # type: ignore[arg-type]
            prompt_names=list(w.prompt_names),
            prompt=np.frombuffer(w.prompts, dtype=np.int32) if w.prompt_names else None,  # type: ignore[arg-type]
        )
        n = c.ts.size
        sizes = [
            a.size for a in (c.status, c.e2e, c.ttft, c.tokens, c.warmup, c.itl_len, c.ids, c.part)
        ]
        if c.factors.size != n or c.stages.shape != (n, len(c.stage_names)) or c.prompt.size != n:
            msg = "column lengths disagree"
            raise ValueError(msg)
        if any(s != n for s in sizes) or len(c.traces) != n or c.offset.size != n:
            msg = "column lengths disagree"
            raise ValueError(msg)
        if c.prompt.size and int(c.prompt.max()) >= len(c.prompt_names):
            msg = "prompt index past the prompt names"
            raise ValueError(msg)
        if int(c.itl_len.sum()) != c.itl.size:
            msg = "itl gap counts disagree with the gaps"
            raise ValueError(msg)
        return c
