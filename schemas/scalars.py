"""The constrained scalar types the wire records are built from.

Each is an ``Annotated`` type whose ``Meta`` constraint is checked when a
message is decoded (a value outside it is a decode error) and also lands in
the generated JSON Schema. Durations are float milliseconds and never
negative (``DurationMs``); timestamps are integer Unix epoch milliseconds
(``TimestampMs``); counts are non-negative integers no larger than
``MAX_SAFE_INT`` (2**53 - 1), the largest integer every JSON reader
(JavaScript included) holds exactly.
"""

from typing import Annotated, Final

from msgspec import Meta

__all__ = [
    "MAX_SAFE_INT",
    "Count",
    "DurationMs",
    "Name",
    "NonNegative",
    "Percent",
    "PositiveCount",
    "Ratio",
    "TimestampMs",
    "TraceId",
]

#: Largest integer that every JSON reader holds exactly (2**53 - 1).
MAX_SAFE_INT: Final = 2**53 - 1

DurationMs = Annotated[
    float, Meta(ge=0, description="Duration in milliseconds, >= 0 (at most 1 h by default).")
]
TimestampMs = Annotated[
    int,
    Meta(
        ge=0,
        le=MAX_SAFE_INT,
        description="Unix epoch milliseconds (UTC); at most 5 minutes ahead of the "
        "consumer's clock by default.",
    ),
]
Count = Annotated[int, Meta(ge=0, le=MAX_SAFE_INT)]
PositiveCount = Annotated[int, Meta(ge=1, le=MAX_SAFE_INT)]
Name = Annotated[str, Meta(min_length=1)]
Percent = Annotated[float, Meta(ge=0, le=100)]
NonNegative = Annotated[float, Meta(ge=0)]
Ratio = Annotated[float, Meta(ge=0, le=1)]
# The length bounds matter: Python's "$" also matches before a final newline.
TraceId = Annotated[
    str,
    Meta(
        pattern="^[0-9a-f]{32}$",
        min_length=32,
        max_length=32,
        description="W3C trace id: 32 lower-case hex digits.",
    ),
]
