"""What decoding makes of a message: the events that passed and one Reject per failure.

A :class:`Reject` carries the dead-letter reason, a detail for people and,
for one event of a batch, that event's position and bytes; the worker turns
each into a dead-letter record (:func:`tailguard.schemas.deadletter.dead_letter`)
and counts it. :class:`Decoded` pairs the valid records, in message order,
with the rejects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from tailguard.schemas.errors import DeadLetterReason
from tailguard.schemas.inputs import InputRecord

__all__ = ["Decoded", "Reject"]

R = TypeVar("R", bound=InputRecord)


@dataclass(frozen=True, slots=True)
class Reject:
    """One failure: the whole message (``index`` None) or one event of it.

    ``index`` is the event's position in the batch, or None when the message
    was not a batch (or failed as a whole). ``element`` holds the bad event's
    own bytes when the message was a batch, so the dead letter carries that
    event rather than the whole batch; it is None when the original message
    is the thing to keep. Events that came through the NaN-literal path are
    re-serialised by Python's ``json``, so their bytes are equivalent, not
    identical.
    """

    reason: DeadLetterReason
    detail: str
    index: int | None = None
    element: bytes | None = None


@dataclass(slots=True)
class Decoded(Generic[R]):
    """What :func:`decode` made of one message: valid events, in order, and rejects."""

    valid: list[R]
    rejects: list[Reject]
