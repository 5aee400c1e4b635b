"""The ``tailguard.sli.v1`` event of one series and window, and how often a final one is due.

The folder publishes them at every closed minute (final) and between closes
(provisional); the admin plane's state query builds one on demand.
"""

import functools
import hashlib
from typing import Any

from tailguard.agents.internal import series_key
from tailguard.streams import WINDOWS, SeriesWindows, WindowSummary, summarize

__all__ = ["SLI_SCHEMA", "final_cadence_ms", "payload_of", "snapshot_payload", "windows_due"]

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
    key = series_key(*series)
    ident = f"{key}|{window}|{end_ms}|{'final' if final else s.count}"
    payload: dict[str, Any] = {
        "schema": SLI_SCHEMA,
        "event_id": hashlib.blake2b(ident.encode(), digest_size=16).hexdigest(),
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
