"""Turn a :class:`~tailguard.schemas.rejects.Reject` into a ``tailguard.deadletter.v1`` record.

The record keeps the origin (topic, partition, offset and, for one event of a
batch, its index) so an operator can find the message, plus the offending
bytes in base64 so it can be replayed after a fix.

Ids are deterministic: ``dead_letter_id`` is built from the origin alone, so
reprocessing the same offsets (a restart, a rebalance, a replay) produces the
same ``event_id`` and a subscriber can deduplicate on it. The record's
``ts_ms`` is when it was dead-lettered, so it differs between replays.
"""

import base64
from typing import Final

from tailguard.schemas.outputs import DeadLetter
from tailguard.schemas.rejects import Reject

__all__ = ["MAX_ORIGINAL_BYTES", "dead_letter", "dead_letter_id"]

#: Most original bytes a dead letter carries (base64 makes them 4/3 as large);
#: keeps the record well below Kafka's default 1 MB message limit.
MAX_ORIGINAL_BYTES: Final = 256 * 1024


def dead_letter_id(topic: str, partition: int, offset: int, index: int | None) -> str:
    """``topic:partition:offset:index`` (index ``-`` for a whole message)."""
    return f"{topic}:{partition}:{offset}:{'-' if index is None else index}"


def dead_letter(
    reject: Reject,
    raw: bytes | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    now_ms: int,
    max_original_bytes: int = MAX_ORIGINAL_BYTES,
) -> DeadLetter:
    """The dead-letter record of ``reject``, found in message ``raw`` at the origin given.

    The original is the rejected element's own bytes when there are some
    (one bad event of a batch), else the whole message; it is cut to
    ``max_original_bytes`` (``original_truncated``), which matters for
    ``too_large`` messages.
    """
    original = reject.element if reject.element is not None else (raw or b"")
    kept = original[:max_original_bytes]
    return DeadLetter(
        event_id=dead_letter_id(topic, partition, offset, reject.index),
        ts_ms=now_ms,
        topic=topic,
        partition=partition,
        offset=offset,
        reason=reject.reason,
        detail=reject.detail,
        original_b64=base64.b64encode(kept).decode("ascii"),
        original_size=len(original),
        original_truncated=len(kept) < len(original),
        index=reject.index,
    )
