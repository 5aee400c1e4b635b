"""Publishing rejected input to ``tailguard.deadletter`` (shared by every input agent)."""

import time
from typing import Any

import msgspec
from faust.types import EventT, TopicT
from faust.types.tuples import Message
from tailguard.agents.publish import frame
from tailguard.agents.stats import WorkerStats
from tailguard.schemas import Reject, dead_letter, decode

__all__ = ["decode_or_dead_letter", "send_rejects"]


async def send_rejects(
    rejects: list[Reject],
    raw: bytes | None,
    msg: Message,
    *,
    topic: TopicT,
    stats: WorkerStats,
    source: str,
    now_ms: int,
) -> None:
    """One dead-letter record per reject, keyed like the input message."""
    for reject in rejects:
        record = dead_letter(
            reject,
            raw or b"",
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            now_ms=now_ms,
        )
        stats.deadletters[str(reject.reason)] += 1
        value, headers = frame(msgspec.to_builtins(record), source=source)
        await topic.send(key=msg.key, value=value, headers=headers)


async def decode_or_dead_letter(
    event: EventT, kind: str, *, topic: TopicT, stats: WorkerStats, source: str
) -> list[Any]:
    """The valid records of one input message; its bad ones go to the dead-letter topic."""
    now = int(time.time() * 1000)
    decoded = decode(event.value, kind, now_ms=now)
    if decoded.rejects:
        await send_rejects(
            decoded.rejects,
            event.value,
            event.message,
            topic=topic,
            stats=stats,
            source=source,
            now_ms=now,
        )
    return list(decoded.valid)
