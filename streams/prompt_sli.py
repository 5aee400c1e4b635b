"""Per-prompt-group SLIs: requests, SLO violations and TTFT quantiles per (service, model, group).

A group of near-identical prompt versions (:mod:`tailguard.streams.prompt_groups`)
gathers the traffic of all its versions, so it can be judged long before any
single version could. One :class:`GroupSli` holds the state of one
(service, model, prompt group): event-time tumbling windows of ``window_ms``
and totals since the state began::

    event time ──▶  [w0 ──────)[w1 ──────)[w2 ──────)
                                  ▲ watermark = newest ts_ms seen
    a window closes when watermark ≥ its end + lateness_ms; an event of a
    closed window is counted ``late`` (and in the totals), never merged into it.

The watermark is the newest event time of the whole deployment
(:meth:`GroupSli.advance`), so the last window of a group that went quiet
closes as the deployment's traffic moves on.

Per request the caller supplies an :data:`Outcome`:

- ``GOOD``: status ok and every latency threshold of its series met (the
  goodput definition of :mod:`tailguard.streams.sli`);
- ``SLOW``: status ok but a latency SLO violated;
- ``ERROR``: ``error``, ``timeout`` or ``rejected``;
- ``CANCELLED``: left out of compliance (the client gave up).

``bad`` = SLOW + ERROR, and ``slo_compliance`` = 1 − bad / (requests − cancelled).
TTFT quantiles come from an exact log-bucket histogram
(:class:`~tailguard.streams.loghist.LogHist`, relative error ≤ 0.5 %), so a
state does not depend on how its requests were batched and replays give the
same bytes. Each window also counts requests and bad requests per prompt
version, so the versions that contribute most of a group's bad requests can be
named.

Replays are idempotent when the caller passes each request's input position
(the ``(partition, offset)`` of the input message it came from, as the series
buckets of :mod:`tailguard.streams.bucket` do): the state keeps ``applied``,
the highest input offset folded per input partition, and a request at or
below its partition's mark is skipped. Marks move only once a whole call is
in, so the requests of one input message in one call are all counted::

    applied {0: 41}   rows (p0, o40) (p0, o42) (p1, o7)
                        skipped ─┘   counted ─┘ counted ─┘   → applied {0: 42, 1: 7}

A request without a position (offset < 0: rows of an older forwarder) is
always counted and marks nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec
from tailguard.streams.errors import ConfigError, CorruptStateError
from tailguard.streams.loghist import LogHist

__all__ = [
    "CANCELLED",
    "ERROR",
    "GOOD",
    "QUANTILES",
    "SLOW",
    "GroupSli",
    "Outcome",
    "Tally",
    "WindowTally",
]

Outcome = int
GOOD: Final = 0
SLOW: Final = 1
ERROR: Final = 2
CANCELLED: Final = 3
QUANTILES: Final = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))


@dataclass(slots=True)
class Tally:
    """Exact counts of a set of requests and their TTFT histogram."""

    requests: int = 0
    bad: int = 0
    errors: int = 0
    cancelled: int = 0
    ttft: LogHist = field(default_factory=LogHist)
    #: version → [requests, bad]
    versions: dict[str, list[int]] = field(default_factory=dict)

    def count(self, version: str, outcome: Outcome) -> bool:
        """Count one request (not its TTFT); returns whether its TTFT belongs in ``ttft``."""
        self.requests += 1
        per = self.versions.get(version)
        if per is None:
            per = self.versions[version] = [0, 0]
        per[0] += 1
        if outcome == CANCELLED:
            self.cancelled += 1
            return False
        if outcome != GOOD:
            self.bad += 1
            per[1] += 1
            if outcome == ERROR:
                self.errors += 1
        return True

    def add(self, version: str, outcome: Outcome, ttft_ms: float | None) -> None:
        """Count one request and its TTFT (histogram updates are cheaper in batches:
        :meth:`GroupSli.add_rows`)."""
        if self.count(version, outcome) and ttft_ms is not None:
            self.ttft.add([ttft_ms])

    @property
    def slo_compliance(self) -> float | None:
        judged = self.requests - self.cancelled
        return None if judged <= 0 else round(1.0 - self.bad / judged, 6)

    def ttft_summary(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {
            name: (None if (v := self.ttft.quantile(q)) is None else round(v, 3))
            for name, q in QUANTILES
        }
        out["count"] = self.ttft.n
        return out

    def summary(self) -> dict[str, object]:
        """The figures a snapshot publishes."""
        return {
            "count": self.requests,
            "bad": self.bad,
            "errors": self.errors,
            "cancelled": self.cancelled,
            "slo_compliance": self.slo_compliance,
            "ttft_ms": self.ttft_summary(),
            "versions": {v: {"count": n, "bad": b} for v, (n, b) in sorted(self.versions.items())},
        }


@dataclass(slots=True)
class WindowTally:
    """One event-time window: ``[start_ms, start_ms + window_ms)``."""

    start_ms: int
    tally: Tally = field(default_factory=Tally)


class _TallyWire(msgspec.Struct, array_like=True):
    requests: int
    bad: int
    errors: int
    cancelled: int
    ttft: tuple[int, bytes]
    versions: dict[str, tuple[int, int]]


class _Wire(msgspec.Struct, array_like=True):
    v: int
    window_ms: int
    lateness_ms: int
    watermark_ms: int
    late: int
    total: _TallyWire
    open: list[tuple[int, _TallyWire]]
    applied: dict[int, int] = {}  # absent in state written before replay marks


_VERSION: Final = 1
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Wire)


def _tally_wire(t: Tally) -> _TallyWire:
    return _TallyWire(
        t.requests,
        t.bad,
        t.errors,
        t.cancelled,
        t.ttft.to_wire(),
        {v: (n, b) for v, (n, b) in t.versions.items()},
    )


def _tally_from(w: _TallyWire) -> Tally:
    return Tally(
        w.requests,
        w.bad,
        w.errors,
        w.cancelled,
        LogHist.from_wire(w.ttft),
        {v: [n, b] for v, (n, b) in w.versions.items()},
    )


class GroupSli:
    """SLI state of one (service, model, prompt group); see the module docstring."""

    __slots__ = ("applied", "late", "lateness_ms", "open", "total", "watermark_ms", "window_ms")

    def __init__(self, window_ms: int = 60_000, lateness_ms: int = 0) -> None:
        if window_ms <= 0 or lateness_ms < 0:
            msg = (
                f"prompt SLI window must be > 0 ms and lateness ≥ 0 ms, got {window_ms} "
                f"and {lateness_ms}"
            )
            raise ConfigError(msg)
        self.window_ms = int(window_ms)
        self.lateness_ms = int(lateness_ms)
        self.watermark_ms = -1
        self.late = 0
        self.total = Tally()
        #: Open windows by start, oldest first.
        self.open: dict[int, WindowTally] = {}
        #: Highest input offset folded in, per input partition (module docstring).
        self.applied: dict[int, int] = {}

    def add(
        self, ts_ms: int, version: str, outcome: Outcome, ttft_ms: float | None
    ) -> list[WindowTally]:
        """Count one request; returns the windows it closed (oldest first)."""
        return self.add_rows([(ts_ms, version, outcome, ttft_ms)])

    def add_rows(
        self,
        rows: Sequence[tuple[int, str, Outcome, float | None]],
        positions: Sequence[tuple[int, int]] | None = None,
    ) -> list[WindowTally]:
        """Count the requests of one message ``(ts_ms, version, outcome, ttft_ms)``;
        returns the windows that closed (oldest first).

        A request is late when its window had closed *before* this call; windows
        close after the whole batch is counted. TTFTs go into the histograms
        once per window and batch (one numpy pass, not one per request).
        ``positions``, one ``(input partition, input offset)`` per row, skips
        the rows this state has already applied (module docstring).
        """
        if positions is not None:
            rows = self._unapplied(rows, positions)
        closed_before = self.watermark_ms - self.window_ms - self.lateness_ms
        total_ttft: list[float] = []
        window_ttft: dict[int, list[float]] = {}
        opened = False
        for ts_ms, version, outcome, ttft_ms in rows:
            if self.total.count(version, outcome) and ttft_ms is not None:
                total_ttft.append(ttft_ms)
            start = ts_ms - ts_ms % self.window_ms
            if start <= closed_before:
                self.late += 1  # its window has closed
            else:
                window = self.open.get(start)
                if window is None:
                    window = self.open[start] = WindowTally(start)
                    opened = True
                if window.tally.count(version, outcome) and ttft_ms is not None:
                    window_ttft.setdefault(start, []).append(ttft_ms)
            if ts_ms > self.watermark_ms:
                self.watermark_ms = ts_ms
        if opened:
            self.open = dict(sorted(self.open.items()))
        if total_ttft:
            self.total.ttft.add(total_ttft)
        for start, values in window_ttft.items():
            self.open[start].tally.ttft.add(values)
        return self._close()

    def _unapplied(
        self,
        rows: Sequence[tuple[int, str, Outcome, float | None]],
        positions: Sequence[tuple[int, int]],
    ) -> list[tuple[int, str, Outcome, float | None]]:
        """The rows above their partition's mark; the marks move past them afterwards."""
        if len(positions) != len(rows):
            msg = f"{len(rows)} prompt rows but {len(positions)} input positions: one per row"
            raise ValueError(msg)
        applied = self.applied
        fresh: list[tuple[int, str, Outcome, float | None]] = []
        newest: dict[int, int] = {}
        for row, (part, offset) in zip(rows, positions, strict=True):
            if offset < 0:
                fresh.append(row)  # no position: cannot tell a replay, so count it
                continue
            if offset <= applied.get(part, -1):
                continue  # a replay of an input message this state already holds
            fresh.append(row)
            if offset > newest.get(part, -1):
                newest[part] = offset
        applied.update(newest)  # after the loop: the rest of a message is not a replay
        return fresh

    def advance(self, watermark_ms: int) -> list[WindowTally]:
        """Move event time to ``watermark_ms`` (the deployment's, which a quiet group does
        not see in its own requests); returns the windows that closed."""
        if watermark_ms > self.watermark_ms:
            self.watermark_ms = watermark_ms
        return self._close()

    def _close(self) -> list[WindowTally]:
        closed = [
            w
            for s, w in self.open.items()
            if s + self.window_ms + self.lateness_ms <= self.watermark_ms
        ]
        for w in closed:
            del self.open[w.start_ms]
        return closed

    def to_bytes(self) -> bytes:
        return _encoder.encode(
            _Wire(
                _VERSION,
                self.window_ms,
                self.lateness_ms,
                self.watermark_ms,
                self.late,
                _tally_wire(self.total),
                [(s, _tally_wire(w.tally)) for s, w in self.open.items()],
                dict(sorted(self.applied.items())),
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> GroupSli:
        try:
            wire = _decoder.decode(data)
        except msgspec.DecodeError as exc:
            msg = f"prompt group SLI bytes do not decode: {exc}"
            raise CorruptStateError(msg) from exc
        if wire.v != _VERSION:
            msg = f"prompt group SLI bytes of version {wire.v}; this tailguard reads {_VERSION}"
            raise CorruptStateError(msg)
        state = cls(wire.window_ms, wire.lateness_ms)
        state.watermark_ms = wire.watermark_ms
        state.late = wire.late
        state.total = _tally_from(wire.total)
        state.open = {s: WindowTally(s, _tally_from(t)) for s, t in wire.open}
        state.applied = dict(wire.applied)
        return state
