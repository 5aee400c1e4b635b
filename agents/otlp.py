"""OTLP ingest agent: trace spans on ``tailguard.otlp`` → events on ``tailguard.inference``.

::

    tailguard.otlp ──take_events(N, within)──▶ decode_spans (otlp_proto | otlp_json, sniffed)
        │ message neither ─▶ tailguard.deadletter (one record per *message*)
        ▼
    span_fields + contract validation ──▶ events, JSON arrays per home partition
        │ spans that are no inference (HTTP, DB spans of the same traces), lack a
        │ model or fail validation: *counted* by reason (OtlpStats), never dead-lettered
        ▼
    tailguard.inference ──▶ the ingest agent, like any producer's events
                            (each on its series' home partition: one hop from there)

The events go through ``tailguard.inference`` rather than straight into the
series topic so that there is one validated path, one dedup horizon
(``event_id`` = ``otlp-<trace>-<span>``: a re-delivered batch is a duplicate) and
one place to replay from. Nothing here writes a table, so ``take_events`` is safe
(faust-streaming#497).
"""

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import faust
from tailguard.agents.deadletters import send_rejects
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import Topics
from tailguard.schemas import DeadLetterReason, Limits, Reject
from tailguard.schemas.columnar import encode_columns
from tailguard.schemas.otlp import OtlpDecodeError, decode_spans, spans_to_events
from tailguard.schemas.placement import home_partition, series_key

from tailguard import catalogue as cat

__all__ = ["OtlpStats", "register_otlp"]

_MAX_EVENTS_PER_MESSAGE = 500


@dataclass(slots=True)
class OtlpStats:
    """What the OTLP agent has turned into events and what it could not use."""

    messages: int = 0
    spans: int = 0
    events: int = 0
    bad_messages: int = 0
    unusable: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        skipped = ",".join(f"{k}={v}" for k, v in sorted(self.unusable.items())) or "none"
        return (
            f"otlp messages={self.messages} spans={self.spans} events={self.events} "
            f"bad_messages={self.bad_messages} unusable[{skipped}]"
        )


def register_otlp(
    app: faust.App, topics: Topics, settings: Settings, stats: WorkerStats
) -> OtlpStats:
    """Attach the OTLP agent to ``app``; returns its counters."""
    ostats = OtlpStats()
    limits = Limits()
    source = app.topic(
        settings.topic_prefix + cat.OTLP,
        key_serializer="raw",
        value_serializer="raw",
        allow_empty=True,
    )

    inference = topics.inference.get_topic_name()

    @app.agent(source, name="tailguard.otlp")
    async def otlp(stream: faust.StreamT[bytes]) -> None:
        async for events in stream.take_events(settings.ingest_batch, settings.ingest_within_s):
            now = int(time.time() * 1000)
            out: dict[int, list[Any]] = {}
            for event in events:
                ostats.messages += 1
                raw = event.value
                if raw is None or len(raw) > limits.max_message_bytes * 8:
                    reject = Reject(
                        DeadLetterReason.TOO_LARGE if raw else DeadLetterReason.MALFORMED_JSON,
                        "OTLP message is empty (a tombstone)"
                        if not raw
                        else f"OTLP message of {len(raw)} bytes is larger than "
                        f"{limits.max_message_bytes * 8}",
                    )
                    await _dead_letter(reject, raw, event, topics, stats, settings, now)
                    ostats.bad_messages += 1
                    continue
                try:
                    spans = decode_spans(raw)
                except OtlpDecodeError as exc:
                    reason = (
                        DeadLetterReason.MALFORMED_JSON
                        if exc.encoding == "otlp_json"
                        else DeadLetterReason.WRONG_TYPE
                    )
                    await _dead_letter(
                        Reject(reason, str(exc)[:500]), raw, event, topics, stats, settings, now
                    )
                    ostats.bad_messages += 1
                    continue
                result = spans_to_events(spans, now_ms=now, limits=limits)
                ostats.spans += result.spans
                ostats.unusable.update(result.unusable)
                ostats.events += len(result.events)
                for e in result.events:
                    key = series_key(e.service, e.model, e.variant, e.tenant)
                    out.setdefault(home_partition(key, settings.partitions), []).append(e)
            # On the home partition when the topic is partitioned like the tables;
            # else keyed only (the worker then forwards what is not at home).
            placed = app.consumer.topic_partitions(inference) == settings.partitions
            for home, evs in out.items():
                first = evs[0]
                key = series_key(first.service, first.model, first.variant, first.tenant)
                for i in range(0, len(evs), _MAX_EVENTS_PER_MESSAGE):
                    value = encode_columns(evs[i : i + _MAX_EVENTS_PER_MESSAGE])
                    await topics.inference.send(
                        key=key.encode(), value=value, partition=home if placed else None
                    )

    @app.timer(settings.stats_interval_s, name="tailguard.otlp.stats")
    async def log_stats() -> None:
        if ostats.messages:
            app.log.info("tailguard %s", ostats.line())

    return ostats


async def _dead_letter(
    reject: Reject,
    raw: bytes | None,
    event: Any,
    topics: Topics,
    stats: WorkerStats,
    settings: Settings,
    now: int,
) -> None:
    await send_rejects(
        [reject],
        raw,
        event.message,
        topic=topics.deadletter,
        stats=stats,
        source=settings.source,
        now_ms=now,
    )
