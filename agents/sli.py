"""SLI agent: per-series sliding windows in RocksDB, snapshots on ``tailguard.sli``.

For each per-series batch from ``tailguard.internal.series``:

1. load the series' :class:`~tailguard.streams.SeriesWindows` (cache, else tables);
2. ``add`` the events with their input positions (idempotent per bucket);
3. write the touched buckets and the meta to the tables (changelogged);
4. for every minute bucket the event-time watermark closed, publish a *final*
   snapshot of each configured window ending there.

A timer additionally publishes *provisional* snapshots (``final: false``) of
series that changed, every ``snapshot_interval_s`` of wall-clock time, so a
quiet series' open minute is visible too. Final snapshots depend only on the
events, so a replay publishes the same ones (same ``event_id``).
"""

import hashlib
import time
from typing import Any

import faust
from faust.types import TP
from tailguard.agents.breaches import BreachEngine
from tailguard.agents.internal import decode_batch, series_key
from tailguard.agents.publish import frame
from tailguard.agents.settings import Settings
from tailguard.agents.state import CachedSeries, SeriesStore
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import Topics
from tailguard.streams import WINDOWS, SeriesWindows, summarize

__all__ = ["final_cadence_ms", "register_sli", "snapshot_payload"]

SLI_SCHEMA = "tailguard.sli.v1"


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


def snapshot_payload(
    series: tuple[str, str, str, str],
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
    s = summarize(merged, window_ms, state.thresholds, with_digests=with_digests)
    service, model, variant, tenant = series
    key = series_key(*series)
    ident = f"{key}|{window}|{end_ms}|{'final' if final else s.count}"
    payload: dict[str, Any] = {
        "schema": SLI_SCHEMA,
        "event_id": hashlib.blake2b(ident.encode(), digest_size=16).hexdigest(),
        "ts_ms": now_ms,
        "series": {"service": service, "model": model, "variant": variant, "tenant": tenant},
        "window": window,
        "window_s": window_ms // 1000,
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
    }
    if s.digests is not None:
        payload["digests"] = s.digests
    return payload


_MAX_GPUS_PER_SERIES = 64


def _series_of(key: str) -> tuple[str, str, str, str]:
    service, model, variant, tenant = key.split("|", 3)
    return service, model, variant, tenant


def _note_gpus(cached: CachedSeries, events: list[Any]) -> None:
    """Remember which GPUs served the series (for the breach GPU join)."""
    gpus = cached.gpus
    for ev in events:
        if ev.host and ev.gpu_ids:
            for index in ev.gpu_ids:
                gpus[(ev.host, index)] = max(ev.ts_ms, gpus.get((ev.host, index), 0))
    if len(gpus) > _MAX_GPUS_PER_SERIES:
        for gone in sorted(gpus, key=gpus.__getitem__)[: len(gpus) - _MAX_GPUS_PER_SERIES]:
            del gpus[gone]


def register_sli(
    app: faust.App,
    topics: Topics,
    settings: Settings,
    stats: WorkerStats,
    store: SeriesStore,
    engine: BreachEngine,
) -> Any:
    """Attach the SLI agent, its provisional-snapshot timer and the rebalance hook."""
    names: dict[str, tuple[str, str, str, str]] = {}
    specs: dict[str, list[Any]] = {}

    def snapshots(
        series: tuple[str, str, str, str], state: SeriesWindows, end_ms: int, *, final: bool
    ) -> list[tuple[Any, bytes, bytes, list[tuple[str, bytes]]]]:
        now = int(time.time() * 1000)
        key = series_key(*series).encode()
        out = []
        for window in settings.sli_windows:
            if final and end_ms % final_cadence_ms(window):
                continue
            payload = snapshot_payload(
                series,
                state,
                window,
                end_ms,
                final=final,
                now_ms=now,
                with_digests=settings.attach_digests,
            )
            value, headers = frame(payload, source=settings.source)
            out.append((topics.sli, key, value, headers))
        return out

    async def send_all(outgoing: list[tuple[Any, bytes, bytes, list[tuple[str, bytes]]]]) -> None:
        for topic, key, value, headers in outgoing:
            await topic.send(key=key, value=value, headers=headers)
            if topic is topics.sli:
                stats.snapshots += 1
            else:
                stats.breach_events += 1

    def _closer(
        series: tuple[str, str, str, str],
        key: str,
        cached: CachedSeries,
        slos: list[Any],
        outgoing: list[tuple[Any, bytes, bytes, list[tuple[str, bytes]]]],
    ) -> Any:
        def on_close(end_ms: int) -> None:
            # Runs inside add(), before roll-up and pruning: what it reads of
            # windows ending at end_ms is final and independent of batching.
            outgoing.extend(snapshots(series, cached.state, end_ms, final=True))
            transitions = engine.evaluate(series, key, cached, end_ms, slos)
            for value, headers in engine.payloads(transitions, series, cached, settings.source):
                outgoing.append((topics.breaches, key.encode(), value, headers))

        return on_close

    @app.agent(topics.series, name="tailguard.sli")
    async def sli(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            batch = decode_batch(event.value)
            series = batch.series
            key = series_key(*series)
            names[key] = series
            if key not in specs:
                specs[key] = engine.specs_for(series)
            cached = store.get(key, event.message.partition)
            _note_gpus(cached, batch.events)
            outgoing: list[tuple[Any, bytes, bytes, list[tuple[str, bytes]]]] = []

            on_close = _closer(series, key, cached, specs[key], outgoing)
            result = cached.state.add(batch.events, batch.positions, on_close)
            store.save(key, cached.state.take_changes())
            cached.dirty = cached.dirty or result.accepted > 0
            stats.events_applied += result.accepted
            stats.late += result.late
            stats.duplicates += result.duplicates
            stats.replayed += result.replayed
            await send_all(outgoing)

    if settings.snapshot_interval_s > 0:

        @app.timer(settings.snapshot_interval_s, name="tailguard.sli.provisional")
        async def provisional() -> None:
            if store.needs_warm and app.tables.recovery.completed.is_set():
                loaded = store.warm()
                app.log.info("tailguard: loaded %d series from the tables", loaded)
            for key, cached in store.items():
                if not cached.dirty:
                    continue
                end = cached.state.default_end()
                if end is None:
                    continue
                cached.dirty = False
                series = names.get(key) or _series_of(key)
                await send_all(snapshots(series, cached.state, end, final=False))

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        # Partitions may come back or go elsewhere: drop the cache and let the
        # next timer tick reload what this worker still owns from the tables.
        store.forget_all()

    return sli
