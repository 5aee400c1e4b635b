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
import msgspec

from tailguard.agents.internal import SeriesBatch, encode_batch, series_key
from tailguard.agents.publish import frame
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import Topics
from tailguard.schemas import Limits, decode, dead_letter

__all__ = ["register_ingest"]


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
                for reject in decoded.rejects:
                    record = dead_letter(
                        reject,
                        raw,
                        topic=msg.topic,
                        partition=msg.partition,
                        offset=msg.offset,
                        now_ms=now,
                    )
                    stats.deadletters[str(reject.reason)] += 1
                    value, headers = frame(msgspec.to_builtins(record), source=settings.source)
                    await topics.deadletter.send(key=msg.key, value=value, headers=headers)
                position = (msg.partition, msg.offset)
                for ev in decoded.valid:
                    key = series_key(ev.service, ev.model, ev.variant, ev.tenant)
                    batch = groups.get(key)
                    if batch is None:
                        batch = groups[key] = SeriesBatch(
                            series=(ev.service, ev.model, ev.variant, ev.tenant),
                            events=[],
                            positions=[],
                        )
                    batch.events.append(ev)
                    batch.positions.append(position)
                stats.events_valid += len(decoded.valid)
            for key, batch in groups.items():
                await topics.series.send(key=key.encode(), value=encode_batch(batch))

    return ingest
