"""SLI agent: per-series sliding windows in RocksDB, snapshots on ``tailguard.sli``.

For each message of ``tailguard.internal.series`` (the requests of many
series bound for one partition, as columns):

1. load each series' :class:`~tailguard.streams.SeriesWindows` (cache, else tables);
2. fold every series in with one numpy pass (:func:`~tailguard.streams.fold.fold_many`),
   idempotent per bucket and input offset;
3. for every minute bucket the event-time watermark closed, publish a *final*
   snapshot of each configured window ending there and evaluate the SLOs;
4. every ``checkpoint_interval_s`` per partition, or less often when that would
   take more than ``checkpoint_max_share`` of the agent's time
   (:class:`~tailguard.agents.cadence.CheckpointCadence`): flush what was
   published, write the changed series and breach states to the tables
   (changelogged), then acknowledge the input they hold.

The stream is consumed without automatic acks, so the committed offset
never runs ahead of the stored state: after a crash the input since the
last checkpoint is replayed, and the per-bucket input offsets make the
replay add nothing twice. Outputs are flushed before the state that
records them, so a crash can re-send an output (same ``event_id``) but never
lose one.

A timer additionally publishes *provisional* snapshots (``final: false``) of
series that changed, every ``snapshot_interval_s`` of wall-clock time, within
a time budget, so a quiet series' open minute is visible too. Final snapshots
depend only on the events, so a replay publishes the same ones (same
``event_id``).
"""

import asyncio
import hashlib
import time
import weakref
from typing import Any

import faust
from faust.streams import _current_event
from faust.types import TP
from tailguard.agents.breaches import BreachEngine
from tailguard.agents.internal import decode_groups, partition_for, series_key
from tailguard.agents.outputs import OutputError, Outputs
from tailguard.agents.publish import frame
from tailguard.agents.settings import Settings
from tailguard.agents.state import CachedSeries, CheckpointInterrupted, SeriesStore
from tailguard.agents.stats import WorkerStats
from tailguard.agents.telemetry import Telemetry
from tailguard.agents.topics import Topics
from tailguard.streams import WINDOWS, SeriesWindows, summarize
from tailguard.streams.fold import fold_many

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
        "stages_ms": s.stages,
    }
    if s.digests is not None:
        payload["digests"] = s.digests
    return payload


_MAX_GPUS_PER_SERIES = 64
#: Share of each provisional-snapshot period the timer may spend publishing.
_PROVISIONAL_SHARE = 0.1


def _series_of(key: str) -> tuple[str, str, str, str]:
    service, model, variant, tenant = key.split("|", 3)
    return service, model, variant, tenant


def _note_gpus(cached: CachedSeries, gpus: list[tuple[str, int, int]]) -> None:
    """Remember which GPUs served the series (for the breach GPU join)."""
    known = cached.gpus
    for host, index, ts in gpus:
        if ts > known.get((host, index), 0):
            known[(host, index)] = ts
    if len(known) > _MAX_GPUS_PER_SERIES:
        for gone in sorted(known, key=known.__getitem__)[: len(known) - _MAX_GPUS_PER_SERIES]:
            del known[gone]


def register_sli(
    app: faust.App,
    topics: Topics,
    settings: Settings,
    stats: WorkerStats,
    store: SeriesStore,
    engine: BreachEngine,
    outputs: Outputs,
    *,
    telemetry: Telemetry | None = None,
) -> Any:
    """Attach the SLI agent, its provisional-snapshot timer and the rebalance hook.

    ``telemetry`` (optional) keeps the latest snapshot per series and window for
    /metrics and the dashboard: a dict write per published snapshot.
    """
    names: dict[str, tuple[str, str, str, str]] = {}
    sli_topic = topics.sli.get_topic_name()
    internal_topic = topics.series.get_topic_name()
    breach_topic = topics.breaches.get_topic_name()
    specs: dict[str, list[Any]] = {}
    #: ``engine.slo_version`` the cached ``specs`` were resolved under (admin ``slo set``).
    specs_version = [engine.slo_version]

    def snapshots(
        series: tuple[str, str, str, str], state: SeriesWindows, end_ms: int, *, final: bool
    ) -> list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]]:
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
            if telemetry is not None:
                telemetry.observe_sli(series, window, payload)
            value, headers = frame(payload, source=settings.source)
            out.append((sli_topic, key, value, headers))
        return out

    async def send_all(outgoing: list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]]) -> None:
        for topic, key, value, headers in outgoing:
            outputs.send(topic, key, value, headers)
            if topic == sli_topic:
                stats.snapshots += 1
            else:
                stats.breach_events += 1

    def _closer(
        series: tuple[str, str, str, str],
        key: str,
        cached: CachedSeries,
        slos: list[Any],
        outgoing: list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]],
    ) -> Any:
        def on_close(end_ms: int) -> None:
            # Runs inside add(), before roll-up and pruning: what it reads of
            # windows ending at end_ms is final and independent of batching.
            outgoing.extend(snapshots(series, cached.state, end_ms, final=True))
            transitions: list[Any] = engine.evaluate(series, key, cached, end_ms, slos)
            transitions += engine.evaluate_silent(key, cached, end_ms)
            for value, headers in engine.payloads(transitions, series, cached, settings.source):
                outgoing.append((breach_topic, key.encode(), value, headers))
            # Done with this end: the merged windows kept for it are memory only
            # (with 10k series, a few hundred MiB at a minute's close).
            cached.state.release_window_cache()

        return on_close

    cadence = settings.checkpoint_cadence()
    pending: dict[int, list[Any]] = {}
    #: Internal partitions assigned here and not revoked since (a rebalance
    #: revokes them all first).
    owned: set[int] = set()

    def _still_mine(partition: int) -> bool:
        return partition in owned

    # Serialises the agent's batches with timer-driven checkpoints.
    busy = asyncio.Lock()
    acking: list[Any] = []  # the agent's manual-ack stream, once it runs

    async def checkpoint(stream: Any, partition: int) -> None:
        # Outputs first (a crash may then re-send, never lose), then state, then acks.
        try:
            await outputs.flush()
        except OutputError as exc:
            # The broker is away or refusing: keep holding the input (it will be
            # replayed if this worker dies) and try again at the next checkpoint.
            app.log.warning("tailguard: checkpoint of partition %d deferred: %s", partition, exc)
            cadence.deferred(partition, time.monotonic())
            return
        started = time.monotonic()
        stats.checkpoints += 1
        # Breach states reach the changelog before the series metas (the store
        # flushes before writing those): a kill during the checkpoint leaves breach
        # states ahead of their series, never behind. Replaying then re-closes
        # minutes the breach state has already judged, and ``advance`` ignores an
        # evaluation point not after the last one. Otherwise a restored series
        # could skip a close its stale breach state had not seen, and the next
        # close re-sent the same transition (same ``event_id``) at a different
        # minute (found by the SIGKILL test; after a crash the worker restores
        # from the changelog, whose topics the producer delivers independently).
        breach_writes = engine.checkpoint(partition)
        stats.state_writes += breach_writes
        try:
            stats.state_writes += await store.checkpoint(
                partition, app.producer.flush, lambda: _still_mine(partition)
            )
        except CheckpointInterrupted as exc:
            app.log.info("tailguard: %s; nothing acknowledged", exc)
            return
        for held in pending.pop(partition, []):
            await stream.ack(held)
        ended = time.monotonic()
        cadence.done(partition, started, ended)
        stats.checkpoint_seconds += ended - started

    @app.agent(topics.series, name="tailguard.sli")
    async def sli(stream: faust.StreamT[bytes]) -> None:
        manual = stream.noack()
        acking[:] = [manual]
        async for event in manual.events():
            async with busy:
                await _process(manual, event)

    async def _process(manual: Any, event: Any) -> None:
        partition = event.message.partition
        pending.setdefault(partition, []).append(event)
        try:
            groups = decode_groups(event.value)
        except ValueError as exc:
            # Only this worker writes the topic: a bad record is a bug or a
            # foreign producer. Skip it loudly rather than stop the partition.
            app.log.error("tailguard: skipping undecodable internal record: %s", exc)
            stats.internal_errors += 1
            return
        outgoing: list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]] = []
        states = []
        closers = []
        gpus_of: dict[int, list[tuple[str, int, int]]] = {}
        for group, host, index, ts in groups.gpus:
            gpus_of.setdefault(group, []).append((host, index, ts))
        if specs_version[0] != engine.slo_version:
            specs.clear()  # the SLOs changed: re-resolve each series' SLOs
            specs_version[0] = engine.slo_version
        for i, series in enumerate(groups.series):
            key = series_key(*series)
            names[key] = series
            if key not in specs:
                specs[key] = engine.specs_for(series)
            cached = store.get(key, partition)
            cached.partition = partition
            if i in gpus_of:
                _note_gpus(cached, gpus_of[i])
            states.append(cached.state)
            closers.append(_closer(series, key, cached, specs[key], outgoing))
            store.mark_unsaved(key, partition)
            cached.dirty = True
        results = fold_many(states, groups.cols, groups.bounds, closers)
        for result in results:
            stats.events_applied += result.accepted
            stats.late += result.late
            stats.duplicates += result.duplicates
            stats.replayed += result.replayed
        await send_all(outgoing)
        if cadence.due(partition, time.monotonic()):
            await checkpoint(manual, partition)

    @app.timer(max(settings.checkpoint_interval_s / 2, 0.5), name="tailguard.sli.checkpoint")
    async def checkpoint_quiet_partitions() -> None:
        # A partition whose input stopped would otherwise hold its last batches
        # unacknowledged (and show as lagging) until more input arrives. Table
        # writes go to the partition of the *current event*: checkpoint under
        # the newest held event of that partition.
        for partition in list(pending):
            held = pending.get(partition)
            if not held or not acking or not cadence.due(partition, time.monotonic()):
                continue
            async with busy:
                held = pending.get(partition)
                if not held:
                    continue
                token = _current_event.set(weakref.ref(held[-1]))
                try:
                    await checkpoint(acking[0], partition)
                finally:
                    _current_event.reset(token)

    cursor = [0]

    if settings.snapshot_interval_s > 0:

        @app.timer(settings.snapshot_interval_s, name="tailguard.sli.provisional")
        async def provisional() -> None:
            # Only once this rebalance's changelog restore is done: during a
            # rebalance ``recovery.completed`` may still be set from the previous
            # one, and warming then would cache stale local state (found by the
            # takeover test).
            if (
                store.needs_warm
                and not app.rebalancing
                and not getattr(app, "in_recovery", False)
                and app.tables.recovery.completed.is_set()
            ):
                loaded = store.warm(lambda key: partition_for(key, settings.partitions))
                app.log.info("tailguard: loaded %d series from the tables", loaded)
            # Within a time budget, resuming next tick where this one stopped: with
            # thousands of busy series a full pass would starve the agents.
            began = time.monotonic()
            budget = settings.snapshot_interval_s * _PROVISIONAL_SHARE
            items = store.items()
            start = cursor[0] % max(len(items), 1)
            done = 0
            for key, cached in items[start:] + items[:start]:
                done += 1
                if not cached.dirty:
                    continue
                end = cached.state.default_end()
                if end is None:
                    continue
                cached.dirty = False
                series = names.get(key) or _series_of(key)
                await send_all(snapshots(series, cached.state, end, final=False))
                cached.state.release_window_cache()  # the next provisional end differs
                if time.monotonic() - began > budget:
                    break
            cursor[0] = start + done

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        owned.difference_update(tp.partition for tp in revoked if tp.topic == internal_topic)

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        # faust revokes every partition at a rebalance, then assigns. A partition
        # this worker keeps goes on from where its consumer was (faust does not
        # seek it back), so its in-memory state and held input must be kept: only
        # what moved elsewhere is dropped (its new owner replays it from the
        # last checkpoint). Then the next timer tick loads what is new to us.
        mine = {tp.partition for tp in assigned if tp.topic == internal_topic}
        owned.clear()
        owned.update(mine)
        gone = (set(pending) | cadence.partitions() | store.partitions()) - mine
        if gone:
            store.forget_partitions(gone)
            engine.forget_partitions(gone)
            if telemetry is not None:
                telemetry.forget_partitions(gone)
            cadence.forget(gone)
            for partition in gone:
                pending.pop(partition, None)
        store.needs_warm = True

    return sli
