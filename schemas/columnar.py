"""Decoding a columnar ``tailguard.inference`` message, and judging its requests.

The form (:mod:`~tailguard.schemas.columnar_wire`): one JSON object holding one
array per field; its requests read as rows: :mod:`~tailguard.schemas.columnar_rows`.
This module's public names include both modules' (one import for producers and
readers).

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
from typing import Annotated, Any, Final

import msgspec
import numpy as np
from msgspec import Meta
from tailguard.schemas.columnar_rows import events_of, gap_starts, judge_rows, rows_of
from tailguard.schemas.columnar_wire import (
    COLUMNS_SCHEMA_ID,
    HINTS,
    OPTIONAL,
    REQUIRED,
    ColumnsDecoded,
    InferenceColumns,
    Numbers,
    Requests,
    encode_columns,
    is_columnar,
    message_struct,
    numbers,
    refused,
    without_numbers,
)
from tailguard.schemas.errors import DeadLetterReason
from tailguard.schemas.inputs import InferenceEvent
from tailguard.schemas.limits import (
    Limits,
    nesting_problem,
    size_or_encoding_problem,
)

__all__ = [
    "COLUMNS_SCHEMA_ID",
    "CONTRACT_DEPTH",
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

#: Columns whose requests are always judged by the row decoder (their rules are rare).
_ALWAYS_JUDGED: Final = ("queue_ms", "stages_ms", "cache", "batch")

#: A trace id as the decoder types it: its length is checked in C, its digits
#: for the whole column at once (:func:`_bad_trace_ids`). msgspec checks a
#: ``pattern`` with Python's ``re`` one string at a time, a third of the decode.
_TRACE_ID_LENGTH: Final = Annotated[str, Meta(min_length=32, max_length=32)]
_HEX_DIGITS: Final = b"0123456789abcdef"
#: What the decoder reads: the contract but for trace ids' digits (see ``_TRACE_ID_LENGTH``).
_decoded_hints = {**HINTS, "trace_id": _TRACE_ID_LENGTH}
_Decoded = message_struct("DecodedColumns", "DecodedRequests", _decoded_hints)[1]
#: The same, refusing any field the contract does not name (see :func:`_known_only`).
_KnownOnly = message_struct("KnownColumns", "KnownRequests", _decoded_hints, known_only=True)[1]
#: How deep a message of the contract's fields nests: the message, ``requests``, a
#: column, a list or object of one request, an experiment tag (a test checks it).
CONTRACT_DEPTH: Final = 5
#: Columns of objects whose unknown fields the decoder skips, however deep they nest.
_OPEN_COLUMNS: Final = ("experiments", "cache", "batch", "flow_control")

_DECODER: Final = msgspec.json.Decoder(_Decoded)
_KNOWN_ONLY_DECODER: Final = msgspec.json.Decoder(_KnownOnly)


def _inconsistent(detail: str) -> ColumnsDecoded:
    return refused(DeadLetterReason.INCONSISTENT, detail)


def _structure(message: Any, limits: Limits) -> ColumnsDecoded | None:
    """A whole-message refusal if the columns disagree with each other."""
    req = message.requests
    n = len(req.event_id)
    if n > limits.max_batch_events:
        return refused(
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


def _taken_apart(raw: bytes, now_ms: int, limits: Limits) -> ColumnsDecoded:
    """A message the typed decode refused: each request judged as a row."""
    try:
        doc = json.loads(raw, parse_constant=float)
    except (ValueError, RecursionError) as exc:
        return refused(DeadLetterReason.MALFORMED_JSON, f"JSON is malformed: {exc}")
    if not isinstance(doc, dict):
        return refused(DeadLetterReason.NOT_AN_OBJECT, "a columnar message is one JSON object")
    if doc.get("schema") != COLUMNS_SCHEMA_ID:
        return refused(
            DeadLetterReason.UNKNOWN_SCHEMA_VERSION,
            f"schema = {doc.get('schema')!r} is not {COLUMNS_SCHEMA_ID!r}",
        )
    req, series = doc.get("requests"), doc.get("series")
    if not isinstance(req, dict) or not isinstance(series, list):
        return refused(
            DeadLetterReason.WRONG_TYPE,
            "a columnar message holds a list `series` and an object `requests`",
        )
    for name in ("series", "event_id"):
        if not isinstance(req.get(name), list):
            return refused(
                DeadLetterReason.MISSING_FIELD, f"required column requests.{name} is missing"
            )
    n = len(req["event_id"])
    if n > limits.max_batch_events:
        return refused(
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
    if itl is not None and (not isinstance(itl, list) or len(itl) != gap_starts(req, n)[-1]):
        return _inconsistent("requests.itl_len does not add up to the gaps in requests.itl_ms")
    rejects, valid = judge_rows(doc, list(range(n)), now_ms, limits)
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
            return refused(DeadLetterReason.TOO_DEEP, "arrays and objects nest too deep")
    whole = _structure(message, limits)
    if whole is not None:
        return whole
    req = message.requests
    n = len(req.event_id)
    num = numbers(req, n)
    suspects = np.flatnonzero(_suspects(req, num, now_ms, limits)).tolist()
    if not suspects:
        return ColumnsDecoded(message, None, [], num)
    doc = msgspec.to_builtins(message)
    rejects, _ = judge_rows(doc, suspects, now_ms, limits)
    if not rejects:
        return ColumnsDecoded(message, None, [], num)
    keep = np.ones(n, dtype=np.bool_)
    keep[[r.index for r in rejects]] = False
    return ColumnsDecoded(message, keep, rejects, num)
