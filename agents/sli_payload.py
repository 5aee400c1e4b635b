"""The ``tailguard.sli.v1`` event of one series and window, and how often a final one is due.

The folder publishes them at every closed minute (final) and between closes
(provisional); the admin plane's state query builds one on demand.
"""

import functools
import hashlib
from typing import Any

import msgspec
from tailguard.agents.internal import series_key
from tailguard.schemas import ce_headers
from tailguard.streams import WINDOWS, SeriesWindows, WindowSummary, summarize

__all__ = [
    "SLI_SCHEMA",
    "SnapshotFramer",
    "final_cadence_ms",
    "payload_of",
    "snapshot_payload",
    "windows_due",
]

SLI_SCHEMA = "tailguard.sli.v1"

Series = tuple[str, str, str, str]


def final_cadence_ms(window: str) -> int:
    """How often (event time) a final snapshot of ``window`` is published.

    Every minute for windows up to 5 m, every 5 minutes up to 1 h, hourly
    beyond: a 1 h window barely moves in a minute, and merging its 60 buckets
    for every series every minute would dominate the worker when it catches up.
    """
    ms = WINDOWS[window]
    if ms <= 300_000:
        return 60_000
    if ms <= 3_600_000:
        return 300_000
    return 3_600_000


@functools.lru_cache(maxsize=64)
def windows_due(
    windows: tuple[str, ...], end_ms: int | None
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Names and lengths of the windows of a read ending at ``end_ms``: those whose
    final snapshot is due then (None: all, a provisional read). Read them, do not
    change them: every close of a minute asks for the same."""
    names = (
        windows if end_ms is None else tuple(w for w in windows if not end_ms % final_cadence_ms(w))
    )
    return names, tuple(WINDOWS[w] for w in names)


def snapshot_payload(
    series: Series,
    state: SeriesWindows,
    window: str,
    end_ms: int,
    *,
    final: bool,
    now_ms: int,
    with_digests: bool = False,
) -> dict[str, Any]:
    """The ``tailguard.sli.v1`` event of one series and window."""
    window_ms = WINDOWS[window]
    merged = state.window(window_ms, end_ms)
    summary = summarize(merged, window_ms, state.thresholds, with_digests=with_digests)
    return payload_of(series, state, window, end_ms, summary, final=final, now_ms=now_ms)


def payload_of(
    series: Series,
    state: SeriesWindows,
    window: str,
    end_ms: int,
    s: WindowSummary,
    *,
    final: bool,
    now_ms: int,
) -> dict[str, Any]:
    """The event of ``series``' ``window`` ending at ``end_ms``, from its summary ``s``."""
    service, model, variant, tenant = series
    payload: dict[str, Any] = {
        "schema": SLI_SCHEMA,
        "event_id": _event_id(series_key(*series), window, end_ms, final, s.count),
        "ts_ms": now_ms,
        "series": {"service": service, "model": model, "variant": variant, "tenant": tenant},
        "window": window,
        "window_s": WINDOWS[window] // 1000,
        "window_end_ms": end_ms,
        "final": final,
        "count": s.count,
        "errors": s.errors,
        "cancelled": s.cancelled,
        "success_rate": s.success_rate,
        "ttft_compliance": s.ttft_compliance,
        "itl_compliance": s.itl_compliance,
        "slo_compliance": s.slo_compliance,
        "goodput_rps": s.goodput_rps,
        "late": state.late,
        "duplicates": state.duplicates,
        "exemplars": s.exemplars,
        **s.latency,
        "stages_ms": s.stages,
    }
    if s.digests is not None:
        payload["digests"] = s.digests
    return payload


def _event_id(key: str, window: str, end_ms: int, final: bool, count: int) -> str:
    """A snapshot's id: a final one is the same however often it is re-sent, a
    provisional one changes with what the window holds."""
    ident = f"{key}|{window}|{end_ms}|{'final' if final else count}"
    return hashlib.blake2b(ident.encode(), digest_size=16).hexdigest()


class _Head(msgspec.Struct):
    """The fields of a snapshot that belong to its window (the rest, its
    bucket's, are :class:`SnapshotFramer`'s tail), in the order of
    :func:`payload_of`."""

    schema: str
    event_id: str
    ts_ms: int
    series: msgspec.Raw
    window: str
    window_s: int
    window_end_ms: int
    final: bool
    count: int
    errors: int
    cancelled: int
    success_rate: float
    ttft_compliance: float
    itl_compliance: float
    slo_compliance: float
    goodput_rps: float
    late: int
    duplicates: int


_encode = msgspec.json.Encoder().encode


class SnapshotFramer:
    """Frames snapshots as :func:`payload_of` and :func:`~tailguard.agents.publish.frame`
    would, the same bytes, with less done per snapshot.

    A close frames a few windows of every series that closed, and windows that
    held the same buckets share their summary's parts (percentile rows, stages,
    exemplars: a young series' 1m, 5m and 1h all do). Those parts, the larger
    half of a snapshot, are encoded once per summary and joined to each
    window's own fields; a series' names are encoded once per series. No
    payload dict is built. One framer serves one pass (a chunk of closes, a
    provisional read): it keeps what it encoded until it goes.
    """

    def __init__(self, source: str, *, final: bool, now_ms: int) -> None:
        self._source = source
        self._final = final
        self._now_ms = now_ms
        self._tails: dict[int, tuple[object, bytes]] = {}
        self._series: Series | None = None
        self._key = ""
        self._names = msgspec.Raw(b"")
        #: The record key of the series last framed (its series key).
        self.record_key = b""

    def frame(
        self, series: Series, state: SeriesWindows, window: str, end_ms: int, s: WindowSummary
    ) -> tuple[bytes, list[tuple[str, bytes]]]:
        """The value and CloudEvents headers of ``series``' ``window`` ending at
        ``end_ms``, from its summary ``s``."""
        if series != self._series:
            service, model, variant, tenant = self._series = series
            self._key = series_key(*series)
            self.record_key = self._key.encode()
            names = {"service": service, "model": model, "variant": variant, "tenant": tenant}
            self._names = msgspec.Raw(_encode(names))
        event_id = _event_id(self._key, window, end_ms, self._final, s.count)
        head = _Head(
            SLI_SCHEMA,
            event_id,
            self._now_ms,
            self._names,
            window,
            WINDOWS[window] // 1000,
            end_ms,
            self._final,
            s.count,
            s.errors,
            s.cancelled,
            s.success_rate,
            s.ttft_compliance,
            s.itl_compliance,
            s.slo_compliance,
            s.goodput_rps,
            state.late,
            state.duplicates,
        )
        value = _encode(head)[:-1] + b"," + self._tail(s)[1:]
        return value, ce_headers(SLI_SCHEMA, event_id, self._now_ms, source=self._source)

    def _tail(self, s: WindowSummary) -> bytes:
        """The summary's shared parts as one JSON object: the same for every window
        summarised from the same merged bucket (digests, where attached, too)."""
        found = self._tails.get(id(s.latency))
        if found is not None and found[0] is s.latency:
            return found[1]
        parts: dict[str, Any] = {"exemplars": s.exemplars, **s.latency, "stages_ms": s.stages}
        if s.digests is not None:
            parts["digests"] = s.digests
        tail = _encode(parts)
        self._tails[id(s.latency)] = (s.latency, tail)  # kept alive: its id stays its own
        return tail
