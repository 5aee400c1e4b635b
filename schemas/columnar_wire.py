"""The columnar form of ``tailguard.inference``: one array per field, not one object per request.

A row message (a JSON array of request objects) repeats every field name for
every request, and a consumer builds one object per request, with its lists,
before it can read a single column. The columnar form holds the same requests
as one JSON object::

    {"schema": "tailguard.inference.columns.v1",
     "series": [["chat", "llama-3-70b", "default", "default"], ...],
     "requests": {
       "series":   [0, 0, 1],             # each request's series: an index into "series"
       "event_id": ["a1", "a2", "b1"],
       "ts_ms":    [...], "status": [...], "e2e_ms": [...],
       "ttft_ms":  [181.2, null, 97.5],   # null: the request has no value (the field's default)
       "itl_len":  [2, 0, 1],             # gaps per request ...
       "itl_ms":   [30.1, 29.8, 41.0],    # ... and every request's gaps, concatenated in order
       "host": [...], "gpu_ids": [...], "experiments": [...], ...
     }}

Every field of ``tailguard.inference.v1`` but the series (``service``,
``model``, ``variant``, ``tenant``: named once in ``series``) and ``itl_ms``
(``itl_len`` + the concatenated ``itl_ms``) is a column of the same name with
one entry per request, ``null`` where the request has none. ``event_id``,
``ts_ms``, ``status`` and ``e2e_ms`` are required; any other column may be
left out (no request has it). Unknown columns are ignored, as unknown fields
of a row are.

Validation is the row form's, request by request: a request the row form
would refuse is dead-lettered alone, with the same reason and detail, as the
row object it stands for (``Reject.index`` is its position in the columns).
A message whose columns disagree (lengths, a series index past ``series``,
gap counts that do not add up) is refused whole (``inconsistent``).

This module holds the form itself: its fields, the message struct (the
contract and its JSON Schema), the decoded message and its numeric columns as
arrays, and the encoder producers use. Decoding and validating a message is
:mod:`~tailguard.schemas.columnar`; reading its requests back as rows,
:mod:`~tailguard.schemas.columnar_rows`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal, get_type_hints

import msgspec
import numpy as np
from tailguard.schemas.errors import DeadLetterReason
from tailguard.schemas.inputs import InferenceEvent
from tailguard.schemas.rejects import Reject
from tailguard.schemas.scalars import Count, DurationMs, Name

__all__ = [
    "COLUMNS_SCHEMA_ID",
    "HINTS",
    "NUMBER_COLUMNS",
    "OPTIONAL",
    "REQUIRED",
    "SERIES_FIELDS",
    "ColumnsDecoded",
    "InferenceColumns",
    "Numbers",
    "Requests",
    "encode_columns",
    "is_columnar",
    "message_struct",
    "numbers",
    "refused",
    "without_numbers",
]

COLUMNS_SCHEMA_ID: Final = "tailguard.inference.columns.v1"
SERIES_FIELDS: Final = ("service", "model", "variant", "tenant")
REQUIRED: Final = ("event_id", "ts_ms", "status", "e2e_ms")
#: The columns a request may leave out, in the row record's field order.
OPTIONAL: Final = tuple(
    f.name
    for f in msgspec.structs.fields(InferenceEvent)
    if f.name not in {"schema", "itl_ms", *SERIES_FIELDS, *REQUIRED}
)

#: The row record's field types, as a column's entries are typed.
HINTS: Final = get_type_hints(InferenceEvent, include_extras=True)


def message_struct(
    name: str, requests_name: str, hints: Mapping[str, Any], *, known_only: bool = False
) -> Any:
    """The requests struct and the message struct of the form, each column typed as
    ``hints`` types its field; ``known_only``: refuse fields the form does not name."""
    requests = msgspec.defstruct(
        requests_name,
        [
            ("series", list[Count]),
            *[(field, list[hints[field]]) for field in REQUIRED],  # type: ignore[valid-type]
            ("itl_len", list[Count] | None, None),
            ("itl_ms", list[DurationMs] | None, None),
            *[(field, list[hints[field] | None] | None, None) for field in OPTIONAL],  # type: ignore[valid-type]
        ],
        kw_only=True,
        forbid_unknown_fields=known_only,
        omit_defaults=True,
    )
    message = msgspec.defstruct(
        name,
        [
            ("schema", Literal["tailguard.inference.columns.v1"]),
            ("series", list[tuple[Name, Name, Name, Name]]),
            ("requests", requests),
        ],
        kw_only=True,
        forbid_unknown_fields=known_only,
    )
    return requests, message


#: One columnar message (see the module docstring): the contract, and its JSON Schema.
Requests, InferenceColumns = message_struct("InferenceColumns", "Requests", HINTS)


@dataclass(slots=True)
class ColumnsDecoded:
    """What :func:`decode_columns` made of one message.

    ``message`` holds every request of the message as sent (None when the
    message was refused whole); ``keep`` marks the valid ones (None: all are).
    """

    message: Any  # an InferenceColumns, or None
    keep: np.ndarray | None
    rejects: list[Reject]
    #: The numeric columns as arrays, every request of the message (the screen's
    #: :func:`numbers`; None when the message was taken apart): the batch
    #: concatenates them instead of converting the lists a second time.
    numbers: Numbers | None = None

    def __len__(self) -> int:
        if self.message is None:
            return 0
        n = len(self.message.requests.event_id)
        return n if self.keep is None else int(self.keep.sum())


def refused(reason: DeadLetterReason, detail: str) -> ColumnsDecoded:
    """A message refused whole."""
    return ColumnsDecoded(None, None, [Reject(reason, detail)])


_ENCODER: Final = msgspec.json.Encoder()
_SCHEMA_FIELD: Final = re.compile(
    rb'"schema"\s*:\s*"' + re.escape(COLUMNS_SCHEMA_ID.encode()) + rb'"'
)


def is_columnar(raw: bytes) -> bool:
    """Whether a message is a JSON object whose ``schema`` is the columnar one.

    Looked for near the start first (where producers put it), then anywhere: a
    row object never names this schema (its own is ``tailguard.inference.v1``),
    so one that does is judged, and refused, as columns."""
    if raw.lstrip(b" \t\r\n")[:1] != b"{":
        return False
    return _SCHEMA_FIELD.search(raw, 0, 512) is not None or _SCHEMA_FIELD.search(raw) is not None


_DEFAULTS: Final = InferenceEvent(
    event_id="x", ts_ms=0, service="s", model="m", status="ok", e2e_ms=0
)


def encode_columns(events: Sequence[InferenceEvent | Mapping[str, Any]]) -> bytes:
    """The columnar message holding ``events``: records, or row objects as a
    producer builds them (read as they are, unchecked: the worker judges each
    request as that row; keys that are not fields are left out)."""
    index: dict[tuple[Any, Any, Any, Any], int] = {}
    columns: dict[str, list[Any]] = {name: [] for name in ("series", *REQUIRED)}
    optional: dict[str, list[Any]] = {name: [] for name in OPTIONAL}
    itl_len: list[int] = []
    itl: list[Any] = []
    for ev in events:
        get = ev.get if isinstance(ev, Mapping) else partial(getattr, ev)
        key = (
            get("service"),
            get("model"),
            get("variant") or "default",
            get("tenant") or "default",
        )
        columns["series"].append(index.setdefault(key, len(index)))
        for name in REQUIRED:
            columns[name].append(get(name))
        for name, column in optional.items():
            column.append(get(name))
        gaps = get("itl_ms") or []
        itl_len.append(len(gaps))
        itl.extend(gaps)
    for name, column in optional.items():
        default = getattr(_DEFAULTS, name)
        if any(value is not None and value != default for value in column):
            columns[name] = [None if value == default else value for value in column]
    if any(itl_len):
        columns["itl_len"] = itl_len
        columns["itl_ms"] = itl
    return _ENCODER.encode(
        {"schema": COLUMNS_SCHEMA_ID, "series": list(index), "requests": columns}
    )


def _floats(column: list[Any] | None, n: int) -> np.ndarray:
    """A column as float64, NaN where a request has none."""
    if column is None:
        return np.full(n, np.nan)
    return np.asarray(column, dtype=np.float64)


@dataclass(slots=True)
class Numbers:
    """The numeric columns of a decoded message as arrays (every request)."""

    ts_ms: np.ndarray  # int64
    e2e_ms: np.ndarray  # float64
    ttft_ms: np.ndarray  # float64, NaN where a request has none
    output_tokens: np.ndarray  # float64, NaN where a request has none
    itl_len: np.ndarray  # int64, 0 where a request has no gaps
    itl_ms: np.ndarray  # float64, every request's gaps in order


def numbers(req: Any, n: int) -> Numbers:
    """The numeric columns of ``req`` (a typed-decoded ``requests``) as arrays."""
    with_gaps = req.itl_len is not None
    gaps = req.itl_ms or ()  # absent: no gaps (itl_len all zero, checked by _structure)
    return Numbers(
        ts_ms=np.array(req.ts_ms, dtype=np.int64),
        e2e_ms=np.array(req.e2e_ms, dtype=np.float64),
        ttft_ms=_floats(req.ttft_ms, n),
        output_tokens=_floats(req.output_tokens, n),
        itl_len=np.array(req.itl_len, dtype=np.int64) if with_gaps else np.zeros(n, np.int64),
        itl_ms=np.fromiter(gaps, np.float64, len(gaps)),
    )


#: Columns :class:`Numbers` holds as arrays.
NUMBER_COLUMNS: Final = ("ts_ms", "e2e_ms", "ttft_ms", "output_tokens", "itl_len", "itl_ms")


def without_numbers(decoded: ColumnsDecoded) -> ColumnsDecoded:
    """``decoded`` without the lists of its numeric columns, which its
    :attr:`~ColumnsDecoded.numbers` hold as arrays (worked out if need be).

    A list holds a Python object per value (the ITL gaps of a request are nine
    or more): a batch that keeps thousands of messages keeps the arrays alone.
    What reads the message still reads every column (:func:`events_of`)."""
    message = decoded.message
    if message is None:
        return decoded
    req = message.requests
    num = decoded.numbers or numbers(req, len(req.event_id))
    lean = msgspec.structs.replace(
        req, ts_ms=[], e2e_ms=[], ttft_ms=None, output_tokens=None, itl_len=None, itl_ms=None
    )
    return ColumnsDecoded(
        msgspec.structs.replace(message, requests=lean), decoded.keep, decoded.rejects, num
    )
