"""What a message may be before it is bad input, and the checks of a whole message.

:class:`Limits` bounds a message value (its size, the events of a batch, its
nesting) and its events (how far ``ts_ms`` may be ahead, any duration, the
entries of ``itl_ms``). :func:`message_problem` refuses a message whole
before any decoding: too large, not UTF-8, or nested too deep. The other
limits are applied once the message is decoded: ``max_batch_events`` by
:func:`tailguard.schemas.codec.decode`, the per-event ones by the checks in
:mod:`tailguard.schemas.checks`.

Nesting depth is counted without building anything: keep only the bracket
bytes (``bytes.translate``) and strip innermost ``[]`` pairs, one pass per
level, at most ``max_depth`` passes (about 0.3 µs per event of a batch).
Brackets inside strings can add levels to that count (a positive count is
redone with strings removed, so a valid message is never refused) or hide
them (a crafted message with a ``"]"`` string in every level gets past the
count). The latter is harmless: the typed decode never builds unknown
fields, and a ``RecursionError`` from any decoder is caught and reported as
``too_deep``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

from tailguard.schemas.errors import DeadLetterReason, SchemaError
from tailguard.schemas.rejects import Reject

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_DEPTH_LIMIT",
    "Limits",
    "message_problem",
    "nesting_problem",
    "size_or_encoding_problem",
    "too_deep_detail",
]

_Reason = DeadLetterReason


#: The largest ``Limits.max_depth`` allowed.
MAX_DEPTH_LIMIT: Final = 256


@dataclass(frozen=True, slots=True)
class Limits:
    """What a message may be before it is bad input.

    - ``max_message_bytes``: message value size (1 MiB, Kafka's usual
      ``message.max.bytes``);
    - ``max_batch_events``: events in one JSON array;
    - ``max_depth``: nesting of arrays and objects (a batch of events with a
      nested ``cache`` object is 3 deep); at most ``MAX_DEPTH_LIMIT``;
    - ``max_future_skew_ms``: how far ``ts_ms`` may be ahead of ``now_ms``;
    - ``max_duration_ms``: any duration (TTFT, E2E, one ITL gap, a stage,
      queueing, batch wait); 1 h;
    - ``max_itl_len``: entries in ``itl_ms``.
    """

    max_message_bytes: int = 1 << 20
    max_batch_events: int = 10_000
    max_depth: int = 16
    max_future_skew_ms: int = 5 * 60 * 1000
    max_duration_ms: float = 3_600_000.0
    max_itl_len: int = 100_000

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_batch_events", "max_depth", "max_itl_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                msg = f"Limits.{name} must be an integer >= 1, got {value!r}"
                raise SchemaError(msg)
        if self.max_depth > MAX_DEPTH_LIMIT:
            msg = (
                f"Limits.max_depth must be at most {MAX_DEPTH_LIMIT}, got {self.max_depth}: "
                "no decoder goes deeper than Python's recursion limit, and the depth "
                "pre-check costs one scan of the message per level"
            )
            raise SchemaError(msg)
        skew = self.max_future_skew_ms
        if not isinstance(skew, int) or isinstance(skew, bool) or skew < 0:
            msg = f"Limits.max_future_skew_ms must be an integer >= 0, got {skew!r}"
            raise SchemaError(msg)
        longest = self.max_duration_ms
        if not 0 < longest < math.inf:
            msg = f"Limits.max_duration_ms must be a finite number > 0, got {longest!r}"
            raise SchemaError(msg)


DEFAULT_LIMITS: Final = Limits()


# --- whole-message checks --------------------------------------------------------

_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_CURLY_TO_SQUARE: Final = bytes.maketrans(b"{}", b"[]")
# A JSON string, written as an "unrolled loop" so the regex engine never backtracks.
_JSON_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def _deeper_than(brackets: bytes, max_depth: int) -> bool:
    """Whether a string of ``[`` / ``]`` nests more than ``max_depth`` levels.

    Each pass deletes every innermost ``[]``; a balanced string of depth d
    empties in exactly d passes. Stops after ``max_depth`` passes, so a deep
    message costs at most ``max_depth`` C-speed scans.
    """
    for _ in range(max_depth):
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            return False  # empty, or unbalanced: the JSON decoder will say so
        brackets = shorter
    return b"[]" in brackets


def _too_deep(raw: bytes, max_depth: int) -> bool:
    if not _deeper_than(raw.translate(_CURLY_TO_SQUARE, _NOT_BRACKETS), max_depth):
        return False
    # Brackets inside strings may have inflated the count: recount without strings.
    stripped = _JSON_STRING.sub(b"", raw)
    return _deeper_than(stripped.translate(_CURLY_TO_SQUARE, _NOT_BRACKETS), max_depth)


def message_problem(raw: bytes, limits: Limits) -> Reject | None:
    """Why a message is refused whole before any decoding (size, UTF-8, nesting), if it is."""
    return size_or_encoding_problem(raw, limits) or nesting_problem(raw, limits)


def nesting_problem(raw: bytes, limits: Limits) -> Reject | None:
    """Why a message is refused for nesting deeper than ``limits.max_depth``, if it is."""
    if _too_deep(raw, limits.max_depth):
        return Reject(_Reason.TOO_DEEP, too_deep_detail(limits))
    return None


def size_or_encoding_problem(raw: bytes, limits: Limits) -> Reject | None:
    """Why a message is refused for its size or for bytes that are not UTF-8, if it is."""
    size = len(raw)
    if size > limits.max_message_bytes:
        return Reject(
            _Reason.TOO_LARGE,
            f"message is {size} bytes, more than max_message_bytes = "
            f"{limits.max_message_bytes}; split it into smaller batches",
        )
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Reject(
                _Reason.NOT_UTF8,
                f"byte {exc.start} (0x{raw[exc.start]:02x}) is not valid UTF-8 ({exc.reason}); "
                "payloads must be UTF-8 JSON",
            )
    return None


def too_deep_detail(limits: Limits) -> str:
    """The detail of a ``too_deep`` reject under ``limits``."""
    return f"arrays and objects nest more than max_depth = {limits.max_depth} levels"
