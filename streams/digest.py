"""t-digest helpers: the fast Rust digest on the hot path, the ``tdigest`` dict on the wire.

``fastdigest.TDigest`` (Rust) updates at millions of values per second and merges
two 256-centroid digests in ~10 µs; the pure-Python ``tdigest`` package manages
~57 k values/s. Both understand the same centroid list, so tailguard computes
with ``fastdigest`` and publishes the ``tdigest`` package's dict format::

    {"n": 1234, "delta": 0.01, "K": 25, "centroids": [{"m": 12.5, "c": 3.0}, ...]}

which any subscriber loads with ``tdigest.TDigest().update_from_dict(d)``.

Values are added per batch (``from_values``, then ``merge_inplace``) because
the cost of a fastdigest call is the merge it does, not the values it
receives; they are handed over as a list (:func:`digest_of`).
"""

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from fastdigest import TDigest

__all__ = [
    "CHUNK",
    "COARSE_MAX_CENTROIDS",
    "DEFAULT_MAX_CENTROIDS",
    "EXACT_LIMIT",
    "KEPT_SINCE_MARK",
    "READ_EXACT_LIMIT",
    "Sketch",
    "TDigest",
    "add_values",
    "counts_and_quantiles",
    "digest_from_bytes",
    "digest_of",
    "digest_to_bytes",
    "from_tdigest_dict",
    "new_digest",
    "to_tdigest_dict",
]

#: Minute buckets: 1,000 centroids keep P99.9 within 1 % of exact even for a
#: series of only ~10^4 requests (256 centroids gave up to 2 % there: the
#: tail centroids hold ~8 samples each), at ≤ 16 KB a digest — and a bucket
#: with fewer values than that stores them exactly.
DEFAULT_MAX_CENTROIDS = 1000
#: Hour buckets (6 h, 1 d and 3 d windows). 300 centroids missed the 0.5 %
#: target at P99/P99.9 of a rolled-up 6 h window (0.6–0.65 %), so hours keep
#: as many as minutes: up to 72 × 4 × 16 KB ≈ 4.6 MB for a series busy enough
#: to fill every hour's digests.
COARSE_MAX_CENTROIDS = 1000


def digest_of(values: np.ndarray, max_centroids: int) -> TDigest:
    """A digest of ``values`` (float64). fastdigest reads a list of floats about a
    third faster than a numpy array (it takes an array element by element), and
    builds the same digest from either: every digest here is built through this."""
    return TDigest.from_values(values.tolist(), max_centroids=max_centroids)


def new_digest(max_centroids: int = DEFAULT_MAX_CENTROIDS) -> TDigest:
    """An empty digest."""
    return TDigest(max_centroids=max_centroids)


def add_values(
    digest: TDigest | None, values: Sequence[float] | np.ndarray, max_centroids: int
) -> TDigest:
    """Merge ``values`` into ``digest`` (created when ``None``) with one Rust call."""
    batch = digest_of(np.asarray(values, dtype=np.float64), max_centroids)
    if digest is None or digest.is_empty():
        return batch
    digest.merge_inplace(batch)
    return digest


def digest_to_bytes(digest: TDigest) -> bytes:
    """Compact binary form for state stores (16 bytes a centroid)."""
    data: bytes = digest.to_bytes()
    return data


def digest_from_bytes(data: bytes) -> TDigest:
    """Inverse of :func:`digest_to_bytes`."""
    return TDigest.from_bytes(data)


def to_tdigest_dict(digest: "TDigest | Sketch") -> dict[str, Any]:
    """The ``tdigest`` package's dict format (``TDigest.to_dict()`` there)."""
    if isinstance(digest, Sketch):
        digest = digest.as_digest()
    raw = digest.to_dict()
    return {
        "n": int(raw.get("n_values", 0)),
        "delta": 0.01,
        "K": 25,
        "centroids": [{"m": float(c["m"]), "c": float(c["c"])} for c in raw["centroids"]],
    }


def from_tdigest_dict(data: dict[str, Any], max_centroids: int = DEFAULT_MAX_CENTROIDS) -> TDigest:
    """Load a digest published in the ``tdigest`` dict format."""
    centroids = data.get("centroids", [])
    if not centroids:
        return TDigest(max_centroids=max_centroids)
    means = [float(c["m"]) for c in centroids]
    weights = [float(c["c"]) for c in centroids]
    raw = {
        "max_centroids": max_centroids,
        "mass": float(sum(weights)),
        "sum": float(sum(m * w for m, w in zip(means, weights, strict=True))),
        "min": min(means),
        "max": max(means),
        "n_values": int(data.get("n", sum(weights))),
        "centroids": [{"m": m, "c": w} for m, w in zip(means, weights, strict=True)],
    }
    return TDigest.from_dict(raw)


#: A sketch keeps its values exactly up to this many, then becomes a t-digest.
#: Up to as many values as a minute digest keeps centroids, a digest is each
#: value as a centroid of its own: its quantiles are the exact ones (to
#: 1e-14), it takes 16 bytes a value plus fastdigest's buffers (~18 KB,
#: sized by ``max_centroids``) against 8, and building one costs ~20-40 µs
#: (a minute's ITL gaps at its close, for every busy series). Exact values
#: merge by concatenation and read with one sort.
EXACT_LIMIT = DEFAULT_MAX_CENTROIDS
#: A merged window that is only read (a snapshot, an SLO evaluation) stays exact
#: up to this many values when no part is a digest: sorting them costs a third
#: of building a digest of them (540 values: 8 µs vs 33 µs), and the quantiles
#: are numpy's own. 64 KB a metric at most, about four digests' worth.
READ_EXACT_LIMIT = 8192

_TAG_EXACT = b"E"


def _exact_quantiles(values: np.ndarray, qs: Sequence[float]) -> list[float]:
    """numpy's default ("linear") quantiles, for several q at the cost of one sort.

    Plain Python after the sort: for a few hundred values and five q this is
    several times faster than numpy's fancy indexing, with the same result.
    """
    v = np.sort(values)
    last = v.size - 1
    out = []
    for q in qs:
        pos = q * last
        lo = math.floor(pos)
        hi = min(lo + 1, last)
        a, b = float(v[lo]), float(v[hi])
        out.append(a + (b - a) * (pos - lo))
    return out


_TAG_DIGEST = b"D"
_TAG_TAILED = b"T"
#: Values merged into a digest at a time (see :class:`Sketch`).
CHUNK = 1024
#: Values merged since :meth:`Sketch.mark` kept at most (see :meth:`Sketch.since`):
#: about the bytes of a full digest (16 a centroid), beyond which storing the
#: sketch whole is fewer bytes than its values.
KEPT_SINCE_MARK = 2 * DEFAULT_MAX_CENTROIDS
_EMPTY = np.empty(0, dtype=np.float64)
_EMPTY.flags.writeable = False


class Sketch:
    """Exact values while few, a t-digest once many: one distribution estimate.

    The t-digest-like surface (``n_values``, ``quantile``, ``merge_inplace``,
    ``to_bytes``…) lets windows treat both forms alike. Exact quantiles use
    numpy's default (linear) interpolation, the same definition the accuracy
    tests compare against.

    In digest form, values are merged in fixed chunks of :data:`CHUNK` (a
    t-digest merge costs the same for 10 values as for 1,000): the digest
    holds every whole chunk, ``_tail`` the values since. Chunk boundaries
    depend only on how many values came before, so the digest is the same
    however the values were batched; reads fold the tail into a copy.

    Since :meth:`mark`, the chunks merged are kept too (``_merged``), while they
    are fewer than :data:`KEPT_SINCE_MARK` values: :meth:`since` then still
    gives every value added since the mark, and a checkpoint stores those
    values rather than the digest whole (see
    :mod:`~tailguard.streams.bucket_log`).
    """

    __slots__ = ("_digest", "_mark", "_merged", "_tail", "_values", "_view", "max_centroids")

    def __init__(self, max_centroids: int = DEFAULT_MAX_CENTROIDS) -> None:
        self.max_centroids = max_centroids
        self._values: np.ndarray | None = np.empty(0, dtype=np.float64)
        self._digest: TDigest | None = None
        self._tail: np.ndarray = _EMPTY
        self._view: TDigest | None = None
        #: Chunks merged into the digest since :meth:`mark` gave ``_mark`` (None: not kept).
        self._merged: list[np.ndarray] | None = None
        self._mark: tuple[int, int] | None = None

    # -- building ---------------------------------------------------------
    def add(self, values: Sequence[float] | np.ndarray) -> None:
        arr = np.asarray(values, dtype=np.float64)
        if not arr.size:
            return
        if self._values is not None:
            if self._values.size + arr.size <= EXACT_LIMIT:
                self._values = (
                    np.concatenate((self._values, arr)) if self._values.size else arr.copy()
                )
                return
            self._promote()
        self._push(arr)

    def _promote(self) -> None:
        """Switch to digest form; the exact values become the start of the tail."""
        if self._values is not None:
            values = self._values
            self._values = None
            self._digest = TDigest(max_centroids=self.max_centroids)
            self._tail = _EMPTY
            self._push(values)

    def _push(self, arr: np.ndarray) -> None:
        assert self._digest is not None
        self._view = None
        tail = np.concatenate((self._tail, arr)) if self._tail.size else arr
        whole = tail.size - tail.size % CHUNK
        if whole and self._merged is not None:
            self._keep_merged(tail[:whole].copy() if tail is arr else tail[:whole])
        for lo in range(0, whole, CHUNK):
            chunk = digest_of(tail[lo : lo + CHUNK], self.max_centroids)
            if self._digest.is_empty():
                self._digest = chunk
            else:
                self._digest.merge_inplace(chunk)
        self._tail = tail[whole:].copy() if whole else tail.copy()

    def _keep_merged(self, chunks: np.ndarray) -> None:
        """Keep ``chunks``, merged now, for :meth:`since`; or stop keeping once
        they would be more than :data:`KEPT_SINCE_MARK` values."""
        assert self._merged is not None
        if sum(c.size for c in self._merged) + chunks.size > KEPT_SINCE_MARK:
            self._merged = None  # the sketch whole is then fewer bytes
        else:
            self._merged.append(chunks)

    def merge_inplace(self, other: "Sketch") -> None:
        if other._values is not None:
            if other._values.size:
                self.add(other._values)
            return
        assert other._digest is not None
        self._promote()
        assert self._digest is not None
        self._view = None
        self._merged = None  # a digest merged in: the values since the mark are not at hand
        if not other._digest.is_empty():
            if self._digest.is_empty():
                self._digest = other._digest.copy()
            else:
                self._digest.merge_inplace(other._digest)
        if other._tail.size:
            self._push(other._tail)

    def compact(self) -> None:
        """Fold the tail into the digest, for good: a sketch that takes no more
        values (a closed bucket's) is then read with no copy (see
        :meth:`_digest_view`). Exact sketches are left as they are."""
        if self._digest is None or not self._tail.size:
            return
        self._digest = self._digest_view()  # the same fold a read makes, kept
        self._tail = _EMPTY
        self._view = None
        self._merged = None

    def copy(self) -> "Sketch":
        out = Sketch(self.max_centroids)
        out._values = None if self._values is None else self._values.copy()
        out._digest = None if self._digest is None else self._digest.copy()
        out._tail = self._tail.copy()
        return out

    def _digest_view(self) -> TDigest:
        """The digest with the tail folded in (cached until the next change)."""
        assert self._digest is not None
        if not self._tail.size:
            return self._digest
        if self._view is None:
            tail = digest_of(self._tail, self.max_centroids)
            if self._digest.is_empty():
                self._view = tail
            else:
                view = self._digest.copy()
                view.merge_inplace(tail)
                self._view = view
        return self._view

    # -- reading ----------------------------------------------------------
    @property
    def exact(self) -> bool:
        return self._values is not None

    @property
    def settled(self) -> bool:
        """Exact, or a digest with no tail: read as it is, with no merge or copy."""
        return self._values is not None or not self._tail.size

    @property
    def n_values(self) -> int:
        if self._values is not None:
            return self._values.size  # an int already (a close asks 100,000s of times)
        assert self._digest is not None
        return int(self._digest.n_values) + int(self._tail.size)

    def is_empty(self) -> bool:
        return self.n_values == 0

    def quantile(self, q: float) -> float:
        return self.quantiles([q])[0]

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        if self._values is not None:
            return _exact_quantiles(self._values, qs)
        # One call for all of them: the same numbers as ``quantile`` one by one.
        return [float(v) for v in self._digest_view().quantile_vec(list(qs))]

    @classmethod
    def combine(
        cls, sketches: Sequence["Sketch"], max_centroids: int, exact_up_to: int = EXACT_LIMIT
    ) -> "Sketch":
        """One sketch of many: exact values concatenated once, digests merged once each.

        Without digests among them, up to ``exact_up_to`` values stay exact.
        """
        exact = [s._values for s in sketches if s._values is not None and s._values.size]
        exact += [s._tail for s in sketches if s._values is None and s._tail.size]
        digests = [
            s._digest for s in sketches if s._digest is not None and not s._digest.is_empty()
        ]
        out = cls(max_centroids)
        values = np.concatenate(exact) if exact else np.empty(0, dtype=np.float64)
        if not digests and values.size <= exact_up_to:
            out._values = values
            return out
        digest = (
            digest_of(values, max_centroids)
            if values.size
            else TDigest(max_centroids=max_centroids)
        )
        for d in digests:
            if digest.is_empty():
                digest = d.copy()
            else:
                digest.merge_inplace(d)
        out._values = None
        out._digest = digest
        return out

    def min(self) -> float:
        if self._values is not None:
            return float(self._values.min())
        return float(self._digest_view().min())

    def max(self) -> float:
        if self._values is not None:
            return float(self._values.max())
        return float(self._digest_view().max())

    def as_digest(self) -> TDigest:
        """A t-digest view (exact values become unit centroids)."""
        if self._values is not None:
            if not self._values.size:
                return TDigest(max_centroids=self.max_centroids)
            return digest_of(self._values, max(self.max_centroids, EXACT_LIMIT))
        return self._digest_view()

    # -- storage ----------------------------------------------------------
    def mark(self) -> tuple[int, int]:
        """Where the sketch stands, for :meth:`since`: the values its digest holds
        (−1 while exact) and the exact values or the tail after them. From here
        the chunks the digest merges are kept (the last mark's are let go)."""
        self._merged = []
        if self._values is not None:
            self._mark = (-1, int(self._values.size))
        else:
            assert self._digest is not None
            self._mark = (int(self._digest.n_values), int(self._tail.size))
        return self._mark

    def since(self, mark: tuple[int, int]) -> np.ndarray | None:
        """The values added since the last :meth:`mark`, which gave ``mark``, when
        they are at hand: the sketch is exact and was then, or every chunk its
        digest merged since was kept (they and the tail are then the values from
        the mark's own: the tail it had, or all exact values it had, then the rest).
        Adding them to the sketch as it was then gives this one, bytes for bytes
        (chunk boundaries depend only on how many values came before). None:
        they are merged away (store the sketch whole)."""
        held, size = mark
        if self._values is not None:
            return self._values[size:] if held == -1 else None
        merged = self._merged
        if merged is None or mark != self._mark:
            return None
        if not merged:
            return self._tail[size:]  # nothing merged since: the end of the tail
        return np.concatenate([*merged, self._tail])[size:]

    def to_bytes(self) -> bytes:
        if self._values is not None:
            return _TAG_EXACT + self._values.tobytes()
        assert self._digest is not None
        if not self._tail.size:
            return _TAG_DIGEST + digest_to_bytes(self._digest)
        body = digest_to_bytes(self._digest)
        return _TAG_TAILED + len(body).to_bytes(4, "little") + body + self._tail.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, max_centroids: int = DEFAULT_MAX_CENTROIDS) -> "Sketch":
        out = cls(max_centroids)
        tag, body = data[:1], data[1:]
        if tag == _TAG_EXACT:
            if len(body) % 8:
                msg = f"exact sketch of {len(body)} bytes is not a whole number of float64"
                raise ValueError(msg)
            out._values = np.frombuffer(body, dtype=np.float64).copy()
        elif tag == _TAG_DIGEST:
            out._values = None
            out._digest = digest_from_bytes(body)
        elif tag == _TAG_TAILED:
            size = int.from_bytes(body[:4], "little")
            rest = body[4 + size :]
            if len(body) < 4 + size or len(rest) % 8:
                msg = "tailed sketch is truncated"
                raise ValueError(msg)
            out._values = None
            out._digest = digest_from_bytes(body[4 : 4 + size])
            out._tail = np.frombuffer(rest, dtype=np.float64).copy()
        else:
            msg = f"unknown sketch tag {tag!r}"
            raise ValueError(msg)
        return out

    @classmethod
    def from_digest(cls, digest: TDigest) -> "Sketch":
        out = cls(int(digest.max_centroids))
        out._values = None
        out._digest = digest
        return out

    @classmethod
    def of(
        cls, values: Sequence[float] | np.ndarray, max_centroids: int = DEFAULT_MAX_CENTROIDS
    ) -> "Sketch":
        out = cls(max_centroids)
        out.add(values)
        return out


def counts_and_quantiles(
    sketches: Sequence[Sketch], qs: Sequence[float]
) -> list[tuple[int, list[float]] | None]:
    """Each sketch's value count and its quantiles ``qs``, what ``s.quantiles(qs)``
    gives to the bit (None for an empty sketch).

    Exact sketches of the same size are sorted together, as the rows of one
    array, and interpolated all at once (the arithmetic of
    :func:`_exact_quantiles`): a minute's close reads thousands of small windows,
    and sorting them one call at a time cost more in calls than in sorting. The
    counts come with the pass that gathers the values, not from a call a sketch."""
    out: list[tuple[int, list[float]] | None] = [None] * len(sketches)
    by_size: dict[int, list[int]] = {}
    for i, sketch in enumerate(sketches):
        values = sketch._values
        if values is None:
            out[i] = (sketch.n_values, sketch.quantiles(qs))  # a digest: read as it is
        elif values.size:
            by_size.setdefault(values.size, []).append(i)
    q = np.asarray(qs, dtype=np.float64)
    for size, at in by_size.items():
        rows = np.concatenate([sketches[i]._values for i in at]).reshape(len(at), size)
        rows.sort(axis=1)
        last = size - 1
        pos = q * last
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, last)
        a, b = rows[:, lo], rows[:, hi]
        for i, row in zip(at, (a + (b - a) * (pos - lo)).tolist(), strict=True):
            out[i] = (size, row)
    return out
