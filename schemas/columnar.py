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

How (:func:`decode_columns`): one typed msgspec call decodes every column
into lists and checks each value's type and range in C; the rules a type
cannot express (a timestamp too far ahead, TTFT over E2E, durations over the
limit...) and trace ids' digits (checked for the whole column at once) are
screened on numpy arrays of the columns, and only the requests
the screen flags — plus the rare ones carrying ``queue_ms``, ``stages_ms``,
``cache`` or ``batch`` — are rebuilt as rows and judged by the row decoder,
which has the last word. A message the typed call refuses is taken apart
request by request the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Final, Literal, get_type_hints

import msgspec
import numpy as np
from msgspec import Meta
from tailguard.schemas.codec import decode
from tailguard.schemas.errors import DeadLetterReason
from tailguard.schemas.inputs import InferenceEvent
from tailguard.schemas.limits import (
    Limits,
    nesting_problem,
    size_or_encoding_problem,
)
from tailguard.schemas.rejects import Reject
from tailguard.schemas.scalars import Count, DurationMs, Name

__all__ = [
    "COLUMNS_SCHEMA_ID",
    "OPTIONAL",
    "REQUIRED",
    "ColumnsDecoded",
    "InferenceColumns",
    "Numbers",
    "Requests",
    "decode_columns",
    "encode_columns",
    "events_of",
    "is_columnar",
    "numbers",
    "rows_of",
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
#: Columns whose requests are always judged by the row decoder (their rules are rare).
_ALWAYS_JUDGED: Final = ("queue_ms", "stages_ms", "cache", "batch")

_hints = get_type_hints(InferenceEvent, include_extras=True)
#: A trace id as the decoder types it: its length is checked in C, its digits
#: for the whole column at once (:func:`_bad_trace_ids`). msgspec checks a
#: ``pattern`` with Python's ``re`` one string at a time, a third of the decode.
_TRACE_ID_LENGTH: Final = Annotated[str, Meta(min_length=32, max_length=32)]
_HEX_DIGITS: Final = b"0123456789abcdef"


def _message_struct(
    name: str, requests_name: str, hints: Mapping[str, Any], *, known_only: bool = False
) -> Any:
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
Requests, InferenceColumns = _message_struct("InferenceColumns", "Requests", _hints)
#: What the decoder reads: the contract but for trace ids' digits (see ``_TRACE_ID_LENGTH``).
_decoded_hints = {**_hints, "trace_id": _TRACE_ID_LENGTH}
_Decoded = _message_struct("DecodedColumns", "DecodedRequests", _decoded_hints)[1]
#: The same, refusing any field the contract does not name (see :func:`_known_only`).
_KnownOnly = _message_struct("KnownColumns", "KnownRequests", _decoded_hints, known_only=True)[1]
#: How deep a message of the contract's fields nests: the message, ``requests``, a
#: column, a list or object of one request, an experiment tag (a test checks it).
CONTRACT_DEPTH: Final = 5
#: Columns of objects whose unknown fields the decoder skips, however deep they nest.
_OPEN_COLUMNS: Final = ("experiments", "cache", "batch", "flow_control")


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


_DECODER: Final = msgspec.json.Decoder(_Decoded)
_KNOWN_ONLY_DECODER: Final = msgspec.json.Decoder(_KnownOnly)
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


def events_of(decoded: ColumnsDecoded, rows: list[int] | None = None) -> list[InferenceEvent]:
    """The valid requests of a decoded message (or those at ``rows``) as row records.

    Built without validating again: the decode has checked every value."""
    message = decoded.message
    if message is None:
        return []
    req = message.requests
    n = len(req.event_id)
    if rows is None:
        rows = list(range(n)) if decoded.keep is None else np.flatnonzero(decoded.keep).tolist()
    num = decoded.numbers
    if num is None:
        num = numbers(req, n)
    # The numeric columns are read from the arrays (a batch may have let the
    # lists go, see :func:`without_numbers`), the others from the lists.
    starts = np.r_[0, np.cumsum(num.itl_len)].tolist()
    ts, e2e = num.ts_ms.tolist(), num.e2e_ms.tolist()
    ttft, tokens, gaps = num.ttft_ms, num.output_tokens, num.itl_ms
    present = [
        (name, column)
        for name in OPTIONAL
        if name not in _NUMBERS and (column := getattr(req, name)) is not None
    ]
    out = []
    for i in rows:
        fields = dict(zip(SERIES_FIELDS, message.series[req.series[i]], strict=True))
        fields.update(event_id=req.event_id[i], ts_ms=ts[i], status=req.status[i], e2e_ms=e2e[i])
        fields.update((name, column[i]) for name, column in present if column[i] is not None)
        if not np.isnan(ttft[i]):
            fields["ttft_ms"] = float(ttft[i])
        if not np.isnan(tokens[i]):
            fields["output_tokens"] = int(tokens[i])
        if starts[i + 1] > starts[i]:
            fields["itl_ms"] = gaps[starts[i] : starts[i + 1]].tolist()
        out.append(InferenceEvent(**fields))
    return out


#: Columns :class:`Numbers` holds as arrays.
_NUMBERS: Final = ("ts_ms", "e2e_ms", "ttft_ms", "output_tokens", "itl_len", "itl_ms")


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


def rows_of(raw: bytes) -> list[dict[str, Any]]:
    """The requests of a message of either form as row objects, without checks (for
    readers of the topic: tools and tests). Raises ``msgspec.DecodeError`` for bytes
    that are not JSON, ``ValueError`` for a columnar message whose columns disagree."""
    doc = msgspec.json.decode(raw)
    if not (isinstance(doc, dict) and doc.get("schema") == COLUMNS_SCHEMA_ID):
        return doc if isinstance(doc, list) else [doc]
    try:
        n = len(doc["requests"]["event_id"])
        starts = _gap_starts(doc["requests"], n)
        return [_row(doc, i, starts) for i in range(n)]
    except (KeyError, IndexError, TypeError) as exc:
        msg = f"columns disagree: {exc}"
        raise ValueError(msg) from exc


# --- checks --------------------------------------------------------------------


def _whole(reason: DeadLetterReason, detail: str) -> ColumnsDecoded:
    return ColumnsDecoded(None, None, [Reject(reason, detail)])


def _inconsistent(detail: str) -> ColumnsDecoded:
    return _whole(DeadLetterReason.INCONSISTENT, detail)


def _structure(message: Any, limits: Limits) -> ColumnsDecoded | None:
    """A whole-message refusal if the columns disagree with each other."""
    req = message.requests
    n = len(req.event_id)
    if n > limits.max_batch_events:
        return _whole(
            DeadLetterReason.BATCH_TOO_LARGE,
            f"message holds {n} requests, more than max_batch_events = {limits.max_batch_events}",
        )
    for name in ("series", *REQUIRED[1:], *OPTIONAL, "itl_len"):
        column = getattr(req, name)
        if column is not None and len(column) != n:
            return _inconsistent(
                f"requests.{name} has {len(column)} entries, requests.event_id {n}; "
                "every column holds one entry per request"
            )
    if n and max(req.series) >= len(message.series):
        return _inconsistent(
            f"requests.series names series {max(req.series)}, but series holds "
            f"{len(message.series)} (indices start at 0)"
        )
    gaps = len(req.itl_ms) if req.itl_ms is not None else 0
    counted = sum(req.itl_len) if req.itl_len is not None else 0
    if gaps != counted:
        return _inconsistent(
            f"requests.itl_len adds up to {counted} gaps, requests.itl_ms holds {gaps}"
        )
    return None


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


def _suspects(req: Any, num: Numbers, now_ms: int, limits: Limits) -> np.ndarray:
    """Requests the row decoder must judge: it may flag valid ones, never miss a bad one."""
    n = num.ts_ms.size
    max_ms = limits.max_duration_ms
    ts, e2e, ttft = num.ts_ms, num.e2e_ms, num.ttft_ms
    out = (ts > now_ms + limits.max_future_skew_ms) | (e2e > max_ms)
    out |= (ttft > max_ms) | (ttft > e2e)
    out |= np.isnan(ttft) & (num.output_tokens >= 1)
    if num.itl_ms.size:
        lengths = num.itl_len
        owner = np.repeat(np.arange(n), lengths)
        sums = np.bincount(owner, weights=num.itl_ms, minlength=n)
        # The row form adds the gaps in Python; a margin covers the rounding.
        out |= (lengths > limits.max_itl_len) | (sums > max_ms * (1 - 1e-9))
    for name in _ALWAYS_JUDGED:
        column = getattr(req, name)
        if column is not None:
            out |= np.fromiter((v is not None for v in column), np.bool_, n)
    if req.trace_id is not None:
        out |= _bad_trace_ids(req.trace_id, n)
    return np.asarray(out, dtype=np.bool_)


def _bad_trace_ids(column: list[str | None], n: int) -> np.ndarray | bool:
    """Requests whose trace id (32 characters, as decoded) is not lower-case hex:
    one check of the whole column, then one per id only when it fails."""
    joined = "".join(filter(None, column))  # ids are 32 characters: none is empty
    if joined.isascii() and not joined.encode().translate(None, _HEX_DIGITS):
        return False
    return np.fromiter(
        (
            t is not None and not (t.isascii() and not t.encode().translate(None, _HEX_DIGITS))
            for t in column
        ),
        np.bool_,
        n,
    )


# --- rows ----------------------------------------------------------------------


def _row(doc: dict[str, Any], i: int, gap_starts: list[int]) -> dict[str, Any]:
    """Request ``i`` of a plain (decoded, untyped) columnar message as a row object."""
    req = doc["requests"]
    sid = req["series"][i]
    series = doc["series"]
    row: dict[str, Any] = {}
    if isinstance(sid, int) and not isinstance(sid, bool) and 0 <= sid < len(series):
        names = series[sid]
        if isinstance(names, list | tuple) and len(names) == len(SERIES_FIELDS):
            row.update(zip(SERIES_FIELDS, names, strict=True))
    for name, column in req.items():
        if name in ("series", "itl_len", "itl_ms"):
            continue
        value = column[i]
        if value is not None:
            row[name] = value
    gaps = req.get("itl_ms")
    if gaps and gap_starts[i + 1] > gap_starts[i]:  # a request without gaps has none, as a row
        row["itl_ms"] = gaps[gap_starts[i] : gap_starts[i + 1]]
    return row


def _gap_starts(req: dict[str, Any], n: int) -> list[int]:
    lengths = req.get("itl_len") or [0] * n
    starts = [0]
    for length in lengths:
        starts.append(starts[-1] + (length if isinstance(length, int) else 0))
    return starts


def _row_bytes(row: dict[str, Any]) -> bytes:
    return json.dumps(row, allow_nan=True, ensure_ascii=False, separators=(",", ":")).encode()


def _judge_rows(
    doc: dict[str, Any], rows: list[int], now_ms: int, limits: Limits
) -> tuple[list[Reject], list[Any]]:
    """The row decoder's verdict on the requests at ``rows``: rejects, and the valid
    ones as row objects."""
    starts = _gap_starts(doc["requests"], len(doc["requests"]["event_id"]))
    rejects: list[Reject] = []
    valid: list[Any] = []
    for i in rows:
        row = _row(doc, i, starts)
        element = _row_bytes(row)
        verdict = decode(element, "inference", now_ms=now_ms, limits=limits)
        if verdict.rejects:
            first = verdict.rejects[0]
            rejects.append(Reject(first.reason, first.detail, i, element))
        else:
            valid.append(row)
    return rejects, valid


def _taken_apart(raw: bytes, now_ms: int, limits: Limits) -> ColumnsDecoded:
    """A message the typed decode refused: each request judged as a row."""
    try:
        doc = json.loads(raw, parse_constant=float)
    except (ValueError, RecursionError) as exc:
        return _whole(DeadLetterReason.MALFORMED_JSON, f"JSON is malformed: {exc}")
    if not isinstance(doc, dict):
        return _whole(DeadLetterReason.NOT_AN_OBJECT, "a columnar message is one JSON object")
    if doc.get("schema") != COLUMNS_SCHEMA_ID:
        return _whole(
            DeadLetterReason.UNKNOWN_SCHEMA_VERSION,
            f"schema = {doc.get('schema')!r} is not {COLUMNS_SCHEMA_ID!r}",
        )
    req, series = doc.get("requests"), doc.get("series")
    if not isinstance(req, dict) or not isinstance(series, list):
        return _whole(
            DeadLetterReason.WRONG_TYPE,
            "a columnar message holds a list `series` and an object `requests`",
        )
    for name in ("series", "event_id"):
        if not isinstance(req.get(name), list):
            return _whole(
                DeadLetterReason.MISSING_FIELD, f"required column requests.{name} is missing"
            )
    n = len(req["event_id"])
    if n > limits.max_batch_events:
        return _whole(
            DeadLetterReason.BATCH_TOO_LARGE,
            f"message holds {n} requests, more than max_batch_events = {limits.max_batch_events}",
        )
    for name, column in req.items():
        if (
            name != "itl_ms"
            and column is not None
            and (not isinstance(column, list) or len(column) != n)
        ):
            return _inconsistent(f"requests.{name} is not a list of one entry per request")
    itl = req.get("itl_ms")
    if itl is not None and (not isinstance(itl, list) or len(itl) != _gap_starts(req, n)[-1]):
        return _inconsistent("requests.itl_len does not add up to the gaps in requests.itl_ms")
    rejects, valid = _judge_rows(doc, list(range(n)), now_ms, limits)
    if not valid:
        return ColumnsDecoded(None, None, rejects)
    events = msgspec.convert(valid, list[InferenceEvent])
    return ColumnsDecoded(_DECODER.decode(encode_columns(events)), None, rejects)


def _known_only(raw: bytes) -> Any | None:
    """``raw`` decoded if it holds only the contract's fields, else None."""
    try:
        return _KNOWN_ONLY_DECODER.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None


def _depth_known(message: Any, limits: Limits) -> bool:
    """Whether ``message`` (of the contract's fields only) is known to nest within
    ``limits``: it has no column of objects (whose unknown fields the decoder skips,
    however deep) and nests no deeper than :data:`CONTRACT_DEPTH`."""
    req = message.requests
    return limits.max_depth >= CONTRACT_DEPTH and all(
        getattr(req, name) is None for name in _OPEN_COLUMNS
    )


def decode_columns(raw: bytes, *, now_ms: int, limits: Limits) -> ColumnsDecoded:
    """Decode one columnar message; never raises for bad input (see the module docstring)."""
    problem = size_or_encoding_problem(raw, limits)
    if problem is not None:
        return ColumnsDecoded(None, None, [problem])
    # A message of the contract's fields alone nests no deeper than the contract:
    # the nesting scan, a pass over every byte, is then not needed.
    message: Any = _known_only(raw)
    if message is None or not _depth_known(message, limits):
        problem = nesting_problem(raw, limits)
        if problem is not None:
            return ColumnsDecoded(None, None, [problem])
    if message is None:
        try:
            message = _DECODER.decode(raw)
        except msgspec.DecodeError:  # ValidationError is a subclass
            return _taken_apart(raw, now_ms, limits)
        except RecursionError:
            return _whole(DeadLetterReason.TOO_DEEP, "arrays and objects nest too deep")
    refused = _structure(message, limits)
    if refused is not None:
        return refused
    req = message.requests
    n = len(req.event_id)
    num = numbers(req, n)
    suspects = np.flatnonzero(_suspects(req, num, now_ms, limits)).tolist()
    if not suspects:
        return ColumnsDecoded(message, None, [], num)
    doc = msgspec.to_builtins(message)
    rejects, _ = _judge_rows(doc, suspects, now_ms, limits)
    if not rejects:
        return ColumnsDecoded(message, None, [], num)
    keep = np.ones(n, dtype=np.bool_)
    keep[[r.index for r in rejects]] = False
    return ColumnsDecoded(message, keep, rejects, num)
