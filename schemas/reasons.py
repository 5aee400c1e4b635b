"""How a typed-decode error becomes a dead-letter reason and a detail for people.

msgspec says what it refused and where (``<message> - at `$.path```).
:func:`classify` maps that to ``missing_field``, ``not_an_object``,
``unknown_schema_version``, ``nan_or_infinite`` (a number too large for a
64-bit float), ``negative_duration`` (a ``*_ms`` field other than ``ts_ms``
below 0), ``absurd_value`` (any other value out of range) or ``wrong_type``,
with a detail that names the field and, when it can be found in the element,
the value sent, cut to a readable length (:func:`short_repr`).
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec
from tailguard.schemas.errors import DeadLetterReason

__all__ = ["classify", "short_repr"]

_Reason = DeadLetterReason
_ANY: Final = msgspec.json.Decoder()


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


def short_repr(value: Any, limit: int = 80) -> str:
    return _cut(repr(value), limit)


def classify(
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
    shown = f" = {short_repr(value)}" if found else ""
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
                where, shown = f"{where[:-5]}[{key!r}]", f" = {short_repr(value.get(key))}"
            return (
                _Reason.NEGATIVE_DURATION,
                f"{where}{shown} is negative; durations are milliseconds >= 0",
            )
        return _Reason.ABSURD_VALUE, f"{where}{shown} is out of range: {message}"
    if _ABOVE_MAX.match(message):
        return _Reason.ABSURD_VALUE, f"{where}{shown} is out of range: {message}"
    return _Reason.WRONG_TYPE, f"{where}{shown}: {message}"
