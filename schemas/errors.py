"""Errors of the wire-contract layer, and the reasons bad input is dead-lettered.

Two different things live here:

- :class:`SchemaError` is *raised*, and only for programming errors: an
  unknown topic kind passed to :func:`~tailguard.schemas.codec.decode`, an
  impossible :class:`~tailguard.schemas.limits.Limits`, an object that is not
  an output record handed to ``encode``. Bad *input* never raises.
- :class:`DeadLetterReason` is what bad input gets instead of an exception:
  :func:`~tailguard.schemas.codec.decode` returns a ``Reject`` carrying one of
  these, and the worker turns it into a ``tailguard.deadletter.v1`` record.
  The values are part of the wire contract (they appear in
  dead-letter records and metric labels): add members, never rename them.

::

    TailguardError (Exception)                       tailguard.errors
    └── SchemaError (TailguardError, ValueError)     raised: a caller's mistake

    DeadLetterReason (StrEnum)                       returned: the input's mistake
    ├── whole message (Reject.index is None)
    │   ├── too_large              more than Limits.max_message_bytes
    │   ├── not_utf8               the bytes are not UTF-8
    │   ├── too_deep               arrays/objects nested deeper than Limits.max_depth
    │   ├── malformed_json         not JSON at all
    │   ├── not_an_object          top level is neither an object nor an array
    │   └── batch_too_large        an array of more than Limits.max_batch_events
    └── one event (Reject.index = its position in the batch, None if not a batch)
        ├── typed decode: the event does not fit its record type
        │   ├── not_an_object          a batch element that is not an object
        │   ├── missing_field          a required field is absent
        │   ├── wrong_type             wrong JSON type, enum value or string format
        │   ├── unknown_schema_version "schema" present but not this topic's id
        │   ├── nan_or_infinite        NaN / Infinity literal, or a number that overflows
        │   ├── negative_duration      a *_ms duration (or ITL gap, stage) below 0
        │   └── absurd_value           a count below 0, or above 2**53 - 1
        └── semantic checks after the decode
            ├── absurd_value           a duration above Limits.max_duration_ms, too many ITL gaps
            ├── future_timestamp       ts_ms beyond now + Limits.max_future_skew_ms
            └── inconsistent           fields that contradict each other
                                       (ttft_ms missing while output_tokens >= 1,
                                       ttft_ms > e2e_ms, prefix hits > queries, ...)

Duplicates are not dead-lettered: a repeated ``event_id`` is counted once by
the worker's dedup window, it is not bad input.
"""

from enum import StrEnum

from tailguard.errors import TailguardError

__all__ = ["DeadLetterReason", "SchemaError"]


class SchemaError(TailguardError, ValueError):
    """A caller used the schema layer wrongly (never raised for bad input)."""


class DeadLetterReason(StrEnum):
    """Why a message, or one event of a batch, went to ``tailguard.deadletter``."""

    TOO_LARGE = "too_large"
    NOT_UTF8 = "not_utf8"
    TOO_DEEP = "too_deep"
    MALFORMED_JSON = "malformed_json"
    NOT_AN_OBJECT = "not_an_object"
    BATCH_TOO_LARGE = "batch_too_large"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    NAN_OR_INFINITE = "nan_or_infinite"
    NEGATIVE_DURATION = "negative_duration"
    ABSURD_VALUE = "absurd_value"
    FUTURE_TIMESTAMP = "future_timestamp"
    INCONSISTENT = "inconsistent"
