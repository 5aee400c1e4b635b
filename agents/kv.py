"""KV agent: ``tailguard.kv`` allocator snapshots → per-instance KV state in RocksDB.

::

    tailguard.kv ──▶ decode + validate ──▶ KvState per instance ──▶ table tailguard-kv
      (key: instance)      │                      │                   (changelogged)
                rejects ───┴─▶ tailguard.deadletter └─ closed minutes ──▶
                                              tailguard.internal.interference (every partition)

The input is keyed by instance, so one partition, and therefore one
table partition, owns each instance. Per message, every instance's state is
loaded once, all its snapshots are applied in event-time order
(:class:`~tailguard.streams.kv.KvState`: exact figures, idempotent for
replays) and the state is written once — one changelog record per instance
and message, not per snapshot.

The interference detector is partitioned by deployment and a snapshot does
not say which deployment an instance serves; every minute an instance closes
is therefore sent to *every* partition of the internal interference topic
(a few hundred bytes per instance and minute). A minute is forwarded when it
closes, before the state that closed it is written: a crash in between
forwards it again (the detector ignores a minute it holds), never loses it.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import faust
from tailguard.agents.deadletters import decode_or_dead_letter
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import Topics, precreate_topics
from tailguard.schemas import KvSnapshot
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.kv import KvMinute, KvState

__all__ = ["KV_TABLE", "KvStats", "apply_snapshots", "declare_kv_table", "register_kv"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class KvStats:
    """Counters of the KV agent (logged with the worker's stats line)."""

    snapshots: int = 0
    stale: int = 0
    minutes_forwarded: int = 0
    corrupt_states: int = 0

    def line(self) -> str:
        return (
            f"kv_snapshots={self.snapshots} kv_stale={self.stale} "
            f"kv_minutes_forwarded={self.minutes_forwarded} kv_corrupt={self.corrupt_states}"
        )


KV_TABLE = "tailguard-kv"


def declare_kv_table(app: faust.App, settings: Settings) -> Any:
    """Table ``tailguard-kv``: instance → :class:`~tailguard.streams.kv.KvState` bytes.

    Its changelog is created up front (:func:`~tailguard.agents.topics.precreate_topics`).
    """
    precreate_topics(settings, [], [KV_TABLE])
    return app.Table(
        KV_TABLE,
        default=None,
        partitions=settings.partitions,
        key_type=bytes,
        value_type=bytes,
        options=settings.rocksdb_options(),
        help="KV-cache state per serving instance (latest figures, minute history)",
    )


def apply_snapshots(
    table: Any,
    snapshots: list[KvSnapshot],
    stats: KvStats,
    on_corrupt: Callable[[str, Exception], None] | None = None,
) -> list[tuple[str, KvMinute]]:
    """Fold ``snapshots`` into the table, one read and one write per instance.

    Returns the minutes they closed as ``(instance, minute)``, oldest first per
    instance. ``table``: anything with ``get`` and item assignment (a faust
    table, a dict).
    """
    by_instance: dict[str, list[KvSnapshot]] = {}
    for snap in snapshots:
        by_instance.setdefault(snap.instance, []).append(snap)
    closed: list[tuple[str, KvMinute]] = []
    for instance, snaps in by_instance.items():
        key = instance.encode()
        raw = table.get(key)
        state = KvState(instance=instance)
        if raw is not None:
            try:
                state = KvState.from_bytes(raw)
            except CorruptStateError as exc:
                stats.corrupt_states += 1
                if on_corrupt is not None:
                    on_corrupt(instance, exc)
        accepted = 0
        for snap in sorted(snaps, key=lambda s: s.ts_ms):
            applied = state.apply(snap)
            if applied.accepted:
                accepted += 1
                closed.extend((instance, m) for m in applied.closed)
            else:
                stats.stale += 1
        stats.snapshots += accepted
        if accepted:
            table[key] = state.to_bytes()
    return closed


def register_kv(
    app: faust.App,
    topics: Topics,
    settings: Settings,
    stats: WorkerStats,
    table: Any,
    forward: Callable[[str, KvMinute], Any],
) -> Any:
    """Attach the KV agent. ``forward(instance, minute)`` is awaited for every closed minute."""
    kv_stats = KvStats()

    def corrupt(instance: str, exc: Exception) -> None:
        app.log.error("tailguard: KV state of %s discarded: %s", instance, exc)

    @app.agent(topics.kv, name="tailguard.kv")
    async def kv(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            valid = await decode_or_dead_letter(
                event, "kv", topic=topics.deadletter, stats=stats, source=settings.source
            )
            if not valid:
                continue
            # Forward first, then write the state (see the module docstring):
            # the table write happens in apply_snapshots, so collect against a
            # write buffer and commit it after the forwards.
            pending: dict[bytes, bytes] = {}
            view = _Overlay(table, pending)
            for instance, minute in apply_snapshots(view, valid, kv_stats, corrupt):
                await forward(instance, minute)
                kv_stats.minutes_forwarded += 1
            for key, value in pending.items():
                table[key] = value

    @app.timer(settings.stats_interval_s, name="tailguard.kv.stats")  # type: ignore[untyped-decorator]
    async def log_kv_stats() -> None:
        app.log.info("tailguard %s", kv_stats.line())

    return kv


class _Overlay:
    """Reads through to ``table``; writes go to ``pending`` until the caller commits them."""

    def __init__(self, table: Any, pending: dict[bytes, bytes]) -> None:
        self._table = table
        self._pending = pending

    def get(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        value: bytes | None = self._table.get(key)
        return value

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self._pending[key] = value
