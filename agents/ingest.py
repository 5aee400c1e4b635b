"""Ingest agent: validate raw inference messages, dead-letter bad input, re-key by series.

::

    tailguard.inference ──take_events(N, within)──▶ decode + validate ──▶ group by series
            │                                            │                    │
            │                                 rejects ───┴─▶ tailguard.deadletter
            │                                                                 ▼
            └──── commit after the batch is forwarded ◀── tailguard.internal.series
                                                            (one message per series per batch)

Batching several input messages before forwarding keeps the per-series
messages, and therefore the state writes downstream, few and large even when
producers spread a thousand series over every message. Nothing here writes a
table, so ``take_events`` is safe (faust-streaming#497).
"""

import time
from typing import Any

import faust
from tailguard.agents.deadletters import send_rejects
from tailguard.agents.internal import SeriesBatch, encode_batch, series_key
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import Topics
from tailguard.schemas import InferenceEvent, Limits, decode

__all__ = ["MAX_FORWARD_EVENTS", "register_ingest"]

#: Events per forwarded series message before it is cut (at an input-message
#: boundary): ~270 bytes an event keeps messages well under a megabyte.
MAX_FORWARD_EVENTS = 2_000


def _new_batch(ev: InferenceEvent) -> SeriesBatch:
    return SeriesBatch(
        series=(ev.service, ev.model, ev.variant, ev.tenant), events=[], positions=[]
    )


def register_ingest(app: faust.App, topics: Topics, settings: Settings, stats: WorkerStats) -> Any:
    """Attach the ingest agent to ``app``."""
    limits = Limits()

    @app.agent(topics.inference, name="tailguard.ingest")
    async def ingest(stream: faust.StreamT[bytes]) -> None:
        async for events in stream.take_events(settings.ingest_batch, settings.ingest_within_s):
            now = int(time.time() * 1000)
            groups: dict[str, SeriesBatch] = {}
            for event in events:
                raw = event.value
                msg = event.message
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
                position = (msg.partition, msg.offset)
                touched: set[str] = set()
                for ev in decoded.valid:
                    key = series_key(ev.service, ev.model, ev.variant, ev.tenant)
                    batch = groups.get(key)
                    if batch is None:
                        batch = groups[key] = _new_batch(ev)
                    elif key not in touched and len(batch.events) >= MAX_FORWARD_EVENTS:
                        # Cut only between input messages: all events of one input
                        # message for one series must travel together (per-bucket
                        # replay protection compares whole input offsets).
                        await topics.series.send(key=key.encode(), value=encode_batch(batch))
                        batch = groups[key] = _new_batch(ev)
                    touched.add(key)
                    batch.events.append(ev)
                    batch.positions.append(position)
                stats.events_valid += len(decoded.valid)
            for key, batch in groups.items():
                await topics.series.send(key=key.encode(), value=encode_batch(batch))

    return ingest
