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
a few comparisons per event. ``sum(itl_ms) <= max_duration_ms`` bounds every
gap at once (gaps are ≥ 0, checked in C by the type), so the ITL list is
never walked in Python unless the sum is over the limit.

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

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar, overload

import msgspec
from tailguard.schemas.errors import DeadLetterReason, SchemaError
from tailguard.schemas.records import (
    INPUT_RECORDS,
    SCHEMA_IDS,
    AdminCommand,
    EvalScore,
    GpuSample,
    InferenceEvent,
    InputRecord,
    Interaction,
    KvSnapshot,
)

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_DEPTH_LIMIT",
    "Decoded",
    "Kind",
    "Limits",
    "MessageValue",
    "Reject",
    "decode",
    "encode",
    "message_problem",
]

Kind = Literal["inference", "interaction", "gpu", "kv", "eval", "admin"]
#: A Kafka message value: bytes-like, or None for a tombstone.
MessageValue = bytes | bytearray | memoryview | None
R = TypeVar("R", bound=InputRecord)
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


# --- semantic checks after a typed decode ---------------------------------------

_Problem = tuple[DeadLetterReason, str] | None


class _Ctx:
    """Per-call constants of the semantic checks."""

    __slots__ = ("horizon_ms", "limits", "max_itl", "max_ms", "now_ms")

    def __init__(self, now_ms: int, limits: Limits) -> None:
        self.now_ms = now_ms
        self.horizon_ms = now_ms + limits.max_future_skew_ms
        self.max_ms = limits.max_duration_ms
        self.max_itl = limits.max_itl_len
        self.limits = limits


def _future(ts_ms: int, ctx: _Ctx) -> _Problem:
    return (
        _Reason.FUTURE_TIMESTAMP,
        f"ts_ms = {ts_ms} is {ts_ms - ctx.now_ms} ms after now ({ctx.now_ms}); more than "
        f"max_future_skew_ms = {ctx.limits.max_future_skew_ms} ahead is refused "
        "(timestamps are Unix epoch milliseconds)",
    )


def _too_long(field: str, value: float, ctx: _Ctx) -> _Problem:
    return (
        _Reason.ABSURD_VALUE,
        f"{field} = {value!r} ms is more than max_duration_ms = {ctx.max_ms!r}",
    )


def _check_inference(ev: InferenceEvent, ctx: _Ctx) -> _Problem:
    """Rules a type cannot express; comparisons only on the common path."""
    if ev.ts_ms > ctx.horizon_ms:
        return _future(ev.ts_ms, ctx)
    max_ms = ctx.max_ms
    e2e = ev.e2e_ms
    ttft = ev.ttft_ms
    if ttft is None:
        out = ev.output_tokens
        if out is not None and out >= 1:
            return (
                _Reason.INCONSISTENT,
                f"ttft_ms is missing but output_tokens = {out}; ttft_ms is required "
                "when output_tokens >= 1",
            )
    elif ttft > max_ms:
        return _too_long("ttft_ms", ttft, ctx)
    elif ttft > e2e:
        return (_Reason.INCONSISTENT, f"ttft_ms = {ttft!r} is more than e2e_ms = {e2e!r}")
    if e2e > max_ms:
        return _too_long("e2e_ms", e2e, ctx)
    itl = ev.itl_ms
    if itl:
        if len(itl) > ctx.max_itl:
            return (
                _Reason.ABSURD_VALUE,
                f"itl_ms has {len(itl)} gaps, more than max_itl_len = {ctx.max_itl}",
            )
        if sum(itl) > max_ms:  # every gap is >= 0, so this bounds each one
            for i, gap in enumerate(itl):
                if gap > max_ms:
                    return _too_long(f"itl_ms[{i}]", gap, ctx)
    queue = ev.queue_ms
    if queue is not None and queue > max_ms:
        return _too_long("queue_ms", queue, ctx)
    stages = ev.stages_ms
    if stages and sum(stages.values()) > max_ms:
        for stage, ms in stages.items():
            if ms > max_ms:
                return _too_long(f"stages_ms[{stage!r}]", ms, ctx)
    cache = ev.cache
    if cache is not None and cache.prefix_hit_tokens > cache.prefix_query_tokens:
        return (
            _Reason.INCONSISTENT,
            f"cache.prefix_hit_tokens = {cache.prefix_hit_tokens} is more than "
            f"cache.prefix_query_tokens = {cache.prefix_query_tokens}",
        )
    batch = ev.batch
    if batch is not None and batch.wait_ms is not None and batch.wait_ms > max_ms:
        return _too_long("batch.wait_ms", batch.wait_ms, ctx)
    return None


def _all_inference_ok(events: list[InferenceEvent], ctx: _Ctx) -> bool:
    """True only if every event passes :func:`_check_inference` (the hot loop).

    One loop over the batch with locals, no call per event for the common
    shape. It may say False for a batch that would pass (the caller then runs
    the full check per event, which has the last word), never the reverse;
    events carrying the rarer optional parts go through the full check.
    """
    horizon = ctx.horizon_ms
    max_ms = ctx.max_ms
    max_itl = ctx.max_itl
    for ev in events:
        e2e = ev.e2e_ms
        if ev.ts_ms > horizon or e2e > max_ms:
            return False
        ttft = ev.ttft_ms
        if ttft is None:
            if ev.output_tokens:  # >= 0 by type, so truthy means >= 1
                return False
        elif ttft > e2e:
            return False
        itl = ev.itl_ms
        if itl and (len(itl) > max_itl or sum(itl) > max_ms):
            return False
        if (
            ev.queue_ms is not None or ev.stages_ms or ev.cache is not None or ev.batch is not None
        ) and _check_inference(ev, ctx) is not None:
            return False
    return True


def _all_ok(check: Callable[[Any, _Ctx], _Problem]) -> Callable[[list[Any], _Ctx], bool]:
    """The batch form of a per-event check, for kinds without a hand-written one."""

    def all_ok(events: list[Any], ctx: _Ctx) -> bool:
        return all(check(ev, ctx) is None for ev in events)

    return all_ok


def _check_timestamp_only(ev: Interaction | EvalScore | AdminCommand, ctx: _Ctx) -> _Problem:
    if ev.ts_ms > ctx.horizon_ms:
        return _future(ev.ts_ms, ctx)
    return None


def _check_gpu(ev: GpuSample, ctx: _Ctx) -> _Problem:
    if ev.ts_ms > ctx.horizon_ms:
        return _future(ev.ts_ms, ctx)
    used, total = ev.mem_used_mib, ev.mem_total_mib
    if used is not None and total is not None and used > total:
        return (
            _Reason.INCONSISTENT,
            f"mem_used_mib = {used!r} is more than mem_total_mib = {total!r}",
        )
    return None


def _check_kv(ev: KvSnapshot, ctx: _Ctx) -> _Problem:
    if ev.ts_ms > ctx.horizon_ms:
        return _future(ev.ts_ms, ctx)
    if ev.free_blocks > ev.total_blocks:
        return (
            _Reason.INCONSISTENT,
            f"free_blocks = {ev.free_blocks} is more than total_blocks = {ev.total_blocks}",
        )
    for i, seq in enumerate(ev.sequences):
        if seq.tokens > seq.blocks * ev.block_size:
            return (
                _Reason.INCONSISTENT,
                f"sequences[{i}] holds {seq.tokens} tokens in {seq.blocks} blocks of "
                f"block_size = {ev.block_size}; they do not fit",
            )
    return None


# --- decoders, one set per topic kind, built once -------------------------------


@dataclass(frozen=True, slots=True)
class _KindSpec:
    schema_id: str
    fast: msgspec.json.Decoder[Any]  # Record | list[Record], the one-call path
    one: msgspec.json.Decoder[Any]  # Record, for single elements on the slow path
    check: Callable[[Any, _Ctx], _Problem]  # one event: the authority
    all_ok: Callable[[list[Any], _Ctx], bool]  # a batch: fast, may only err towards False


def _spec(
    kind: Kind,
    check: Callable[[Any, _Ctx], _Problem],
    all_ok: Callable[[list[Any], _Ctx], bool] | None = None,
) -> _KindSpec:
    record = INPUT_RECORDS[kind]
    return _KindSpec(
        schema_id=SCHEMA_IDS[kind],
        fast=msgspec.json.Decoder(record | list[record]),  # type: ignore[valid-type]
        one=msgspec.json.Decoder(record),
        check=check,
        all_ok=all_ok or _all_ok(check),
    )


_SPECS: Final[dict[str, _KindSpec]] = {
    "inference": _spec("inference", _check_inference, _all_inference_ok),
    "interaction": _spec("interaction", _check_timestamp_only),
    "gpu": _spec("gpu", _check_gpu),
    "kv": _spec("kv", _check_kv),
    "eval": _spec("eval", _check_timestamp_only),
    "admin": _spec("admin", _check_timestamp_only),
}

_RAW: Final = msgspec.json.Decoder(msgspec.Raw)
_RAW_LIST: Final = msgspec.json.Decoder(list[msgspec.Raw])
_ANY: Final = msgspec.json.Decoder()


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
    return _whole_message_problem(raw, limits)


def _whole_message_problem(raw: bytes, limits: Limits) -> Reject | None:
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
    if _too_deep(raw, limits.max_depth):
        return Reject(_Reason.TOO_DEEP, _too_deep_detail(limits))
    return None


def _too_deep_detail(limits: Limits) -> str:
    return f"arrays and objects nest more than max_depth = {limits.max_depth} levels"


# --- classification of typed-decode errors ---------------------------------------

_AT: Final = re.compile(r"(.*) - at `(\$[^`]*)`", re.DOTALL)
_MISSING: Final = re.compile(r"Object missing required field `([^`]*)`")
_BELOW_MIN: Final = re.compile(r"Expected `(?:int|float)` >=? ")
_ABOVE_MAX: Final = re.compile(r"Expected `(?:int|float)` <=? ")
_PATH_PART: Final = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def _split_error(exc: msgspec.ValidationError) -> tuple[str, str]:
    text = str(exc)
    m = _AT.fullmatch(text)
    return (m.group(1), m.group(2)) if m else (text, "$")


def _last_field(path: str) -> str:
    names = [m.group(1) for m in _PATH_PART.finditer(path) if m.group(1)]
    return names[-1] if names else ""


def _value_at(element: bytes, path: str) -> tuple[bool, Any]:
    """The value at a msgspec error path (``$.a.b[3]``), if it can be found."""
    try:
        value: Any = _ANY.decode(element)
    except (msgspec.DecodeError, RecursionError):
        return False, None
    for m in _PATH_PART.finditer(path):
        name, index = m.group(1), m.group(2)
        if name is not None and isinstance(value, dict) and name in value:
            value = value[name]
        elif index is not None and index != "..." and isinstance(value, list):
            position = int(index)
            if position >= len(value):
                return False, None
            value = value[position]
        elif index == "..." and isinstance(value, dict):
            return True, value  # msgspec does not name the dict key: show the dict
        else:
            return False, None
    return True, value


def _is_negative(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value < 0


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(value: Any, limit: int = 80) -> str:
    return _cut(repr(value), limit)


def _classify(
    exc: msgspec.ValidationError, element: bytes, schema_id: str
) -> tuple[DeadLetterReason, str]:
    """Map one msgspec validation error to a dead-letter reason and a detail."""
    message, path = _split_error(exc)
    where = path[2:] if path.startswith("$.") else path
    message = _cut(message, 200)  # it may quote the producer's value, of any length
    missing = _MISSING.fullmatch(message)
    if missing is not None:
        inside = "" if path == "$" else f" in {where}"
        return _Reason.MISSING_FIELD, f"required field {missing.group(1)!r} is missing{inside}"
    if path == "$" and message.startswith("Expected `object`"):
        return _Reason.NOT_AN_OBJECT, f"an event must be a JSON object: {message}"
    found, value = _value_at(element, path)
    shown = f" = {_shown(value)}" if found else ""
    if path == "$.schema":
        return (
            _Reason.UNKNOWN_SCHEMA_VERSION,
            f"schema{shown} is not {schema_id!r}, the only schema id this topic reads",
        )
    if message == "Number out of range":
        return (
            _Reason.NAN_OR_INFINITE,
            f"{where} is a number too large for a 64-bit float (it would be infinite)",
        )
    field = _last_field(path)
    if _BELOW_MIN.match(message):
        if field.endswith("_ms") and field != "ts_ms":
            if path.endswith("[...]") and isinstance(value, dict):  # name the dict entry
                key = next((k for k, v in value.items() if _is_negative(v)), None)
                where, shown = f"{where[:-5]}[{key!r}]", f" = {_shown(value.get(key))}"
            return (
                _Reason.NEGATIVE_DURATION,
                f"{where}{shown} is negative; durations are milliseconds >= 0",
            )
        return _Reason.ABSURD_VALUE, f"{where}{shown} is out of range: {message}"
    if _ABOVE_MAX.match(message):
        return _Reason.ABSURD_VALUE, f"{where}{shown} is out of range: {message}"
    return _Reason.WRONG_TYPE, f"{where}{shown}: {message}"


# --- the slow path ---------------------------------------------------------------


def _judge(
    element: bytes, index: int | None, keep: bytes | None, spec: _KindSpec, ctx: _Ctx
) -> Any | Reject:
    """Decode and check one element; a record, or a Reject at ``index``."""
    try:
        record = spec.one.decode(element)
    except msgspec.ValidationError as exc:
        reason, detail = _classify(exc, element, spec.schema_id)
        return Reject(reason, detail, index, keep)
    except msgspec.DecodeError as exc:  # not expected: the syntax was checked already
        return Reject(_Reason.MALFORMED_JSON, f"JSON is malformed: {exc}", index, keep)
    except RecursionError:
        return Reject(_Reason.TOO_DEEP, _too_deep_detail(ctx.limits), index, keep)
    problem = spec.check(record, ctx)
    if problem is None:
        return record
    return Reject(problem[0], problem[1], index, keep)


def _sort(parts: Sequence[bytes], batch: bool, spec: _KindSpec, ctx: _Ctx) -> Decoded[Any]:
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


def _slow_path(raw: bytes, spec: _KindSpec, ctx: _Ctx) -> Decoded[Any]:
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
                    f"got {_shown(_ANY.decode(raw), 40)}",
                )
            parts = [raw]
    except msgspec.DecodeError as exc:
        return _nonstandard_json(raw, str(exc), spec, ctx)
    except RecursionError:
        return _whole(_Reason.TOO_DEEP, _too_deep_detail(ctx.limits))
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


def _nonstandard_json(raw: bytes, error: str, spec: _KindSpec, ctx: _Ctx) -> Decoded[Any]:
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
        return _whole(_Reason.TOO_DEEP, _too_deep_detail(ctx.limits))
    except ValueError:  # JSONDecodeError, and integers too long to convert
        return malformed
    if not literals:
        return malformed  # something else msgspec refuses (e.g. a lone surrogate escape)
    batch = isinstance(document, list)
    elements = document if batch else [document]
    if not batch and not isinstance(document, dict):
        return _whole(
            _Reason.NOT_AN_OBJECT,
            f"a message must be a JSON object or an array of objects, got {_shown(document, 40)}",
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
    spec = _SPECS.get(kind)
    if spec is None:
        msg = f"unknown input kind {kind!r}; expected one of {sorted(_SPECS)}"
        raise SchemaError(msg)
    if raw is None:
        return _whole(_Reason.MALFORMED_JSON, "message value is null (a tombstone), not JSON")
    if not isinstance(raw, bytes):
        raw = bytes(raw)  # bytearray / memoryview: one copy, then the bytes fast paths
    whole = _whole_message_problem(raw, limits)
    if whole is not None:
        return Decoded([], [whole])
    ctx = _Ctx(now_ms, limits)
    try:
        decoded = spec.fast.decode(raw)
    except msgspec.DecodeError:  # ValidationError is a subclass
        return _slow_path(raw, spec, ctx)
    except RecursionError:
        return _whole(_Reason.TOO_DEEP, _too_deep_detail(limits))
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
