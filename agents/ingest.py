"""Ingest agent: validate raw inference messages, dead-letter bad input, route by series.

::

    tailguard.inference ──take_events(N, within)──▶ decode + validate ──▶ columns, grouped
            │                                            │                 by series, packed
            │                                 rejects ───┴─▶ tailguard.deadletter   per partition
            │                                                                 ▼
            └──── commit after the batch is forwarded ◀── tailguard.internal.series
                                                   (one message per internal partition per batch)

Batching several input messages before forwarding keeps the forwarded
messages few and large (see :func:`~tailguard.agents.internal.route`), so the
SLI agent folds thousands of series per message in one numpy pass. Nothing
here writes a table, so ``take_events`` is safe (faust-streaming#497).
"""

import time
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from tailguard.agents.deadletters import send_rejects
from tailguard.agents.internal import route
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import Topics
from tailguard.schemas import InferenceEvent, Limits, decode

__all__ = ["register_ingest"]


def register_ingest(
    app: faust.App,
    topics: Topics,
    settings: Settings,
    stats: WorkerStats,
    forward_experiments: Callable[[list[InferenceEvent], list[tuple[int, int]]], Awaitable[None]]
    | None = None,
) -> Any:
    """Attach the ingest agent to ``app``. ``forward_experiments(events, positions)``
    also receives every batch's valid events (the A/B guard, agents/experiments.py)."""
    limits = Limits()

    @app.agent(topics.inference, name="tailguard.ingest")
    async def ingest(stream: faust.StreamT[bytes]) -> None:
        async for events in stream.take_events(settings.ingest_batch, settings.ingest_within_s):
            now = int(time.time() * 1000)
            valid: list[InferenceEvent] = []
            positions: list[tuple[int, int]] = []
            taken: set[tuple[int, int]] = set()
            for event in events:
                raw = event.value
                msg = event.message
                if (msg.partition, msg.offset) in taken:
                    # Delivered twice in one batch (seen right after a takeover's
                    # seek): forwarding both copies together would make the second
                    # look like duplicate requests instead of a replay.
                    stats.redelivered += 1
                    continue
                taken.add((msg.partition, msg.offset))
                stats.messages += 1
                decoded = decode(raw, "inference", now_ms=now, limits=limits)
                if decoded.rejects:
                    await send_rejects(
                        decoded.rejects,
                        raw,
                        msg,
                        topic=topics.deadletter,
                        stats=stats,
                        source=settings.source,
                        now_ms=now,
                    )
                if decoded.valid:
                    valid.extend(decoded.valid)
                    positions.extend([(msg.partition, msg.offset)] * len(decoded.valid))
            stats.events_valid += len(valid)
            for partition, value in route(valid, positions, settings.partitions):
                await topics.series.send(
                    key=str(partition).encode(), value=value, partition=partition
                )
            if forward_experiments is not None and valid:
                await forward_experiments(valid, positions)

    return ingest
