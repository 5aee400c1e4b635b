"""Decode Kafka message values into records, and sort out bad input.

A message value is one JSON object or a JSON array of objects (a batch).
:func:`decode` never raises for bad input: it returns the events that passed
and one :class:`Reject` per failure, which the worker dead-letters
(:func:`tailguard.schemas.deadletter.dead_letter`) and counts.

The path a message takes::

    raw bytes
      │ size > max_message_bytes ─────────────────────▶ too_large       ┐
      │ not UTF-8 ────────────────────────────────────▶ not_utf8        │ whole message,
      │ nesting > max_depth ──────────────────────────▶ too_deep        │ index None
      ▼                                                                 ┘
    fast path: ONE typed msgspec call, ``Record | list[Record]``
      │ ok ─▶ more than max_batch_events ─────────────▶ batch_too_large
      │       semantic check per event (cheap comparisons) ─▶ valid, or a Reject
      │
      │ ValidationError / DecodeError (rare: only bad messages pay for this)
      ▼
    slow path: split the batch into ``msgspec.Raw`` elements (no values built)
      │ JSON syntax error ─▶ NaN / Infinity literals? (Python's json reads them)
      │                        no ─────────────────────▶ malformed_json
      │                        yes ─▶ per element: non-finite ─▶ nan_or_infinite,
      │                               the rest re-encoded and decoded as below
      │ top level neither object nor array ───────────▶ not_an_object
      ▼
    per element: typed decode ─▶ error classified (missing_field, wrong_type,
      unknown_schema_version, negative_duration, absurd_value, nan_or_infinite,
      not_an_object) ─▶ else semantic check ─▶ valid, or a Reject with its index

NaN and infinity: JSON has no literal for them and msgspec refuses ``NaN`` /
``Infinity`` as malformed JSON, and a number that overflows a float
(``1e400``) with "Number out of range". So every float a typed decode yields is
finite, and the semantic checks need no ``isfinite`` calls. The two ways a
non-finite number can be *sent* are both reported as ``nan_or_infinite``: the
literals that Python's ``json.dumps`` writes by default (found on the slow
path, per element), and overflowing numbers (from the typed decode error).

Speed: the fast path is one C call for the whole batch, plus a Python loop of
a few comparisons per event (:mod:`tailguard.schemas.checks`).

The parts: :mod:`tailguard.schemas.limits` (the limits, and the checks of a
whole message), :mod:`tailguard.schemas.checks` (the per-kind decoders and
the checks after a typed decode), :mod:`tailguard.schemas.reasons` (typed
decode errors as dead-letter reasons) and :mod:`tailguard.schemas.rejects`
(what :func:`decode` returns); this module runs the path above.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Final, Literal, overload

import msgspec
from tailguard.schemas.checks import SPECS, Ctx, Kind, KindSpec
from tailguard.schemas.errors import DeadLetterReason, SchemaError
from tailguard.schemas.inputs import (
    AdminCommand,
    EvalScore,
    GpuSample,
    InferenceEvent,
    Interaction,
    KvSnapshot,
)
from tailguard.schemas.limits import DEFAULT_LIMITS, Limits, message_problem, too_deep_detail
from tailguard.schemas.reasons import classify, short_repr
from tailguard.schemas.rejects import Decoded, Reject

__all__ = ["MessageValue", "decode", "encode"]

#: A Kafka message value: bytes-like, or None for a tombstone.
MessageValue = bytes | bytearray | memoryview | None
_Reason = DeadLetterReason


_RAW: Final = msgspec.json.Decoder(msgspec.Raw)
_RAW_LIST: Final = msgspec.json.Decoder(list[msgspec.Raw])
_ANY: Final = msgspec.json.Decoder()


# --- the slow path ---------------------------------------------------------------


def _judge(
    element: bytes, index: int | None, keep: bytes | None, spec: KindSpec, ctx: Ctx
) -> Any | Reject:
    """Decode and check one element; a record, or a Reject at ``index``."""
    try:
        record = spec.one.decode(element)
    except msgspec.ValidationError as exc:
        reason, detail = classify(exc, element, spec.schema_id)
        return Reject(reason, detail, index, keep)
    except msgspec.DecodeError as exc:  # not expected: the syntax was checked already
        return Reject(_Reason.MALFORMED_JSON, f"JSON is malformed: {exc}", index, keep)
    except RecursionError:
        return Reject(_Reason.TOO_DEEP, too_deep_detail(ctx.limits), index, keep)
    problem = spec.check(record, ctx)
    if problem is None:
        return record
    return Reject(problem[0], problem[1], index, keep)


def _sort(parts: Sequence[bytes], batch: bool, spec: KindSpec, ctx: Ctx) -> Decoded[Any]:
    if len(parts) > ctx.limits.max_batch_events:
        return _batch_too_large(len(parts), ctx.limits)
    valid: list[Any] = []
    rejects: list[Reject] = []
    for i, part in enumerate(parts):
        index, keep = (i, part) if batch else (None, None)
        outcome = _judge(part, index, keep, spec, ctx)
        if isinstance(outcome, Reject):
            rejects.append(outcome)
        else:
            valid.append(outcome)
    return Decoded(valid, rejects)


def _batch_too_large(count: int, limits: Limits) -> Decoded[Any]:
    return Decoded(
        [],
        [
            Reject(
                _Reason.BATCH_TOO_LARGE,
                f"batch holds {count} events, more than max_batch_events = "
                f"{limits.max_batch_events}",
            )
        ],
    )


def _whole(reason: DeadLetterReason, detail: str) -> Decoded[Any]:
    return Decoded([], [Reject(reason, detail)])


def _first_byte(raw: bytes) -> bytes:
    return raw.lstrip(b" \t\r\n")[:1]


def _slow_path(raw: bytes, spec: KindSpec, ctx: Ctx) -> Decoded[Any]:
    """Find the culprits of a message the one-call typed decode refused."""
    first = _first_byte(raw)
    try:
        if first == b"[":
            parts = [bytes(part) for part in _RAW_LIST.decode(raw)]
        else:
            _RAW.decode(raw)  # syntax check only: builds nothing
            if first != b"{":
                return _whole(
                    _Reason.NOT_AN_OBJECT,
                    "a message must be a JSON object or an array of objects, "
                    f"got {short_repr(_ANY.decode(raw), 40)}",
                )
            parts = [raw]
    except msgspec.DecodeError as exc:
        return _nonstandard_json(raw, str(exc), spec, ctx)
    except RecursionError:
        return _whole(_Reason.TOO_DEEP, too_deep_detail(ctx.limits))
    return _sort(parts, first == b"[", spec, ctx)


def _nonfinite(value: Any, path: str) -> tuple[str, float] | None:
    """The path and value of the first NaN or infinity in a plain JSON value."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if isinstance(value, dict):
        for key, item in value.items():
            found = _nonfinite(item, f"{path}.{key}")
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _nonfinite(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _nonstandard_json(raw: bytes, error: str, spec: KindSpec, ctx: Ctx) -> Decoded[Any]:
    """Malformed JSON, unless the only fault is NaN / Infinity literals.

    Python's ``json.dumps`` writes ``NaN``, ``Infinity`` and ``-Infinity`` by
    default, so producers do send them. Python's ``json.loads`` reads them
    back; with that, each element is judged on its own: one holding a
    non-finite number is ``nan_or_infinite``, the others are re-encoded as
    standard JSON and decoded like any element.
    """
    literals: list[str] = []

    def constant(name: str) -> float:
        literals.append(name)
        return float(name)

    malformed = _whole(_Reason.MALFORMED_JSON, f"JSON is malformed: {error}")
    try:
        document = json.loads(raw, parse_constant=constant)
    except RecursionError:
        return _whole(_Reason.TOO_DEEP, too_deep_detail(ctx.limits))
    except ValueError:  # JSONDecodeError, and integers too long to convert
        return malformed
    if not literals:
        return malformed  # something else msgspec refuses (e.g. a lone surrogate escape)
    batch = isinstance(document, list)
    elements = document if batch else [document]
    if not batch and not isinstance(document, dict):
        return _whole(
            _Reason.NOT_AN_OBJECT,
            "a message must be a JSON object or an array of objects, "
            f"got {short_repr(document, 40)}",
        )
    if len(elements) > ctx.limits.max_batch_events:
        return _batch_too_large(len(elements), ctx.limits)
    valid: list[Any] = []
    rejects: list[Reject] = []
    for i, element in enumerate(elements):
        index = i if batch else None
        keep = (
            json.dumps(element, allow_nan=True, ensure_ascii=False, separators=(",", ":")).encode()
            if batch
            else None
        )
        found = _nonfinite(element, "")
        if found is not None:
            where, number = found
            rejects.append(
                Reject(
                    _Reason.NAN_OR_INFINITE,
                    f"{where.lstrip('.') or 'the value'} is {number!r}; JSON numbers must be "
                    "finite (NaN / Infinity are not JSON)",
                    index,
                    keep,
                )
            )
            continue
        outcome = _judge(msgspec.json.encode(element), index, keep, spec, ctx)
        if isinstance(outcome, Reject):
            rejects.append(outcome)
        else:
            valid.append(outcome)
    return Decoded(valid, rejects)


# --- the entry points ------------------------------------------------------------


@overload
def decode(
    raw: MessageValue, kind: Literal["inference"], *, now_ms: int, limits: Limits = ...
) -> Decoded[InferenceEvent]: ...
@overload
def decode(
    raw: MessageValue, kind: Literal["interaction"], *, now_ms: int, limits: Limits = ...
) -> Decoded[Interaction]: ...
@overload
def decode(
    raw: MessageValue, kind: Literal["gpu"], *, now_ms: int, limits: Limits = ...
) -> Decoded[GpuSample]: ...
@overload
def decode(
    raw: MessageValue, kind: Literal["kv"], *, now_ms: int, limits: Limits = ...
) -> Decoded[KvSnapshot]: ...
@overload
def decode(
    raw: MessageValue, kind: Literal["eval"], *, now_ms: int, limits: Limits = ...
) -> Decoded[EvalScore]: ...
@overload
def decode(
    raw: MessageValue, kind: Literal["admin"], *, now_ms: int, limits: Limits = ...
) -> Decoded[AdminCommand]: ...
def decode(
    raw: MessageValue, kind: Kind, *, now_ms: int, limits: Limits = DEFAULT_LIMITS
) -> Decoded[Any]:
    """Decode one Kafka message value of topic ``kind``; never raises for bad input.

    ``raw`` is the message value: one JSON object or an array of them (None, a
    tombstone, is malformed input). ``now_ms`` is the consumer's clock in epoch
    milliseconds, used only to refuse timestamps more than
    ``limits.max_future_skew_ms`` ahead. Returns the valid records in message
    order and one :class:`Reject` per failure; a whole-message failure is a
    single Reject with ``index`` None and no valid records.

    Raises :class:`SchemaError` only for a ``kind`` that is not an input topic.
    """
    spec = SPECS.get(kind)
    if spec is None:
        msg = f"unknown input kind {kind!r}; expected one of {sorted(SPECS)}"
        raise SchemaError(msg)
    if raw is None:
        return _whole(_Reason.MALFORMED_JSON, "message value is null (a tombstone), not JSON")
    if not isinstance(raw, bytes):
        raw = bytes(raw)  # bytearray / memoryview: one copy, then the bytes fast paths
    whole = message_problem(raw, limits)
    if whole is not None:
        return Decoded([], [whole])
    ctx = Ctx(now_ms, limits)
    try:
        decoded = spec.fast.decode(raw)
    except msgspec.DecodeError:  # ValidationError is a subclass
        return _slow_path(raw, spec, ctx)
    except RecursionError:
        return _whole(_Reason.TOO_DEEP, too_deep_detail(limits))
    batch = type(decoded) is list
    records: list[Any] = decoded if batch else [decoded]
    if len(records) > limits.max_batch_events:
        return _batch_too_large(len(records), limits)
    if spec.all_ok(records, ctx):
        return Decoded(records, [])
    check = spec.check
    # Some event failed a semantic check: judge each, keeping the bad ones' bytes.
    parts: list[bytes | None] = [bytes(part) for part in _RAW_LIST.decode(raw)] if batch else [None]
    valid: list[Any] = []
    rejects: list[Reject] = []
    for i, record in enumerate(records):
        problem = check(record, ctx)
        if problem is None:
            valid.append(record)
        else:
            rejects.append(Reject(problem[0], problem[1], i if batch else None, parts[i]))
    return Decoded(valid, rejects)


_ENCODER: Final = msgspec.json.Encoder(order="deterministic")


def encode(obj: msgspec.Struct | Sequence[msgspec.Struct]) -> bytes:
    """JSON bytes of a record, or of a list of records (a batch).

    Dict keys are sorted ("deterministic" order), so the same record always
    encodes to the same bytes. Floats that are NaN or infinite encode as
    ``null``.
    """
    if isinstance(obj, msgspec.Struct) or (
        isinstance(obj, list | tuple) and all(isinstance(item, msgspec.Struct) for item in obj)
    ):
        return _ENCODER.encode(obj)
    msg = f"encode takes a record (msgspec.Struct) or a list of them, got {type(obj).__name__}"
    raise SchemaError(msg)
