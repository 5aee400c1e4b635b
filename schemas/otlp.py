"""``tailguard.otlp``: OTLP trace batches as the OpenTelemetry Collector's Kafka exporter writes.


One Kafka message holds one batch of spans in either encoding of that
exporter (``encoding:`` in its configuration):

- ``otlp_proto`` (its default): the protobuf ``ExportTraceServiceRequest`` —
  the same wire format as ``TracesData`` (both are ``repeated ResourceSpans
  resource_spans = 1``), decoded with the ``opentelemetry-proto`` package;
- ``otlp_json``: the OTLP/JSON mapping of the same message
  (``{"resourceSpans": [{"resource": …, "scopeSpans": [{"spans": […]}]}]}``):
  lowerCamelCase keys, trace and span ids as hex, 64-bit integers as strings or
  numbers, enums as integers. Also read: protobuf's own JSON mapping (ids in
  base64, snake_case keys, enum names).

The encoding is sniffed (a JSON message starts with ``{``, which can never
begin an ``ExportTraceServiceRequest``) unless the caller names it.

:func:`decode_spans` turns a message into :class:`~tailguard.streams.otlp.Span`
values (raising :class:`OtlpDecodeError` for a message that is neither);
:func:`spans_to_events` maps them (:func:`tailguard.streams.otlp.span_fields`)
and validates the results exactly as any producer's events are validated
(:func:`tailguard.schemas.codec.decode`), counting what it could not use.
"""

import base64
import binascii
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec
from tailguard.schemas.codec import decode
from tailguard.schemas.errors import SchemaError
from tailguard.schemas.inputs import InferenceEvent
from tailguard.schemas.limits import DEFAULT_LIMITS, Limits
from tailguard.streams.otlp import Span, span_fields

__all__ = [
    "Encoding",
    "OtlpDecodeError",
    "OtlpEvents",
    "decode_spans",
    "spans_to_events",
]

Encoding = Literal["auto", "otlp_proto", "otlp_json"]
_SLICE: Final = 500

_STATUS_NAMES: Final = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_KIND_NAMES: Final = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}


class OtlpDecodeError(SchemaError):
    """A ``tailguard.otlp`` message that is neither OTLP protobuf nor OTLP JSON.

    ::

        TailguardError (Exception)
        └── SchemaError (TailguardError, ValueError)
            └── OtlpDecodeError      ``encoding`` says which decoder refused it
    """

    def __init__(self, message: str, encoding: str) -> None:
        super().__init__(message)
        self.encoding = encoding


@dataclass(slots=True)
class OtlpEvents:
    """The inference events of one message and the spans that did not make one."""

    events: list[InferenceEvent] = field(default_factory=list)
    spans: int = 0
    #: reason → spans: not_genai, no_model, no_duration, invalid_<dead-letter reason>
    unusable: Counter[str] = field(default_factory=Counter)


# --- protobuf -------------------------------------------------------------------


def _any_value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which)


def _attrs(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def _from_proto(raw: bytes) -> list[Span]:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError as exc:
        msg = f"not an OTLP ExportTraceServiceRequest (otlp_proto): {exc}"
        raise OtlpDecodeError(msg, "otlp_proto") from exc
    out: list[Span] = []
    for rs in request.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    Span(
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        name=s.name,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=_attrs(s.attributes),
                        resource=resource,
                        status_code=s.status.code,
                        status_message=s.status.message,
                        kind=s.kind,
                    )
                )
    return out


# --- JSON -----------------------------------------------------------------------


def _get(obj: Mapping[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    value = obj.get(camel)
    return obj.get(snake, default) if value is None else value


def _id(value: Any, size: int) -> str:
    """An OTLP/JSON id: hex (the OTLP mapping) or base64 (protobuf's JSON mapping)."""
    if not isinstance(value, str) or not value:
        return ""
    if len(value) == 2 * size:
        try:
            bytes.fromhex(value)
        except ValueError:
            pass
        else:
            return value.lower()
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return ""


def _int(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return 0
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return 0


def _json_value(v: Any) -> Any:
    if not isinstance(v, Mapping):
        return None
    for key in ("stringValue", "string_value"):
        if key in v:
            return v[key]
    for key in ("boolValue", "bool_value"):
        if key in v:
            return bool(v[key])
    for key in ("intValue", "int_value"):
        if key in v:
            return _int(v[key])
    for key in ("doubleValue", "double_value"):
        if key in v:
            x = v[key]
            return float(x) if isinstance(x, int | float | str) and x != "" else None
    for key in ("arrayValue", "array_value"):
        if key in v:
            return [_json_value(x) for x in (v[key] or {}).get("values", [])]
    for key in ("kvlistValue", "kvlist_value"):
        if key in v:
            return _json_attrs((v[key] or {}).get("values", []))
    for key in ("bytesValue", "bytes_value"):
        if key in v:
            return _id(v[key], len(v[key]) // 2) or None
    return None


def _json_attrs(kvs: Any) -> dict[str, Any]:
    if not isinstance(kvs, list):
        return {}
    return {
        str(kv["key"]): _json_value(kv.get("value"))
        for kv in kvs
        if isinstance(kv, Mapping) and "key" in kv
    }


def _enum(value: Any, names: Mapping[str, int]) -> int:
    if isinstance(value, str) and value in names:
        return names[value]
    return _int(value)


def _from_json(raw: bytes) -> list[Span]:
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        msg = f"not OTLP JSON (otlp_json): {exc}"
        raise OtlpDecodeError(msg, "otlp_json") from exc
    if not isinstance(doc, Mapping):
        msg = "not OTLP JSON (otlp_json): the message is not a JSON object"
        raise OtlpDecodeError(msg, "otlp_json")
    resource_spans = _get(doc, "resourceSpans", "resource_spans", [])
    if not isinstance(resource_spans, list):
        msg = "not OTLP JSON (otlp_json): resourceSpans is not a list"
        raise OtlpDecodeError(msg, "otlp_json")
    out: list[Span] = []
    for rs in resource_spans:
        if not isinstance(rs, Mapping):
            continue
        resource = _json_attrs((rs.get("resource") or {}).get("attributes"))
        for ss in _get(rs, "scopeSpans", "scope_spans", []) or []:
            if not isinstance(ss, Mapping):
                continue
            for s in ss.get("spans") or []:
                if not isinstance(s, Mapping):
                    continue
                status = s.get("status") or {}
                out.append(
                    Span(
                        trace_id=_id(_get(s, "traceId", "trace_id"), 16),
                        span_id=_id(_get(s, "spanId", "span_id"), 8),
                        name=str(s.get("name") or ""),
                        start_ns=_int(_get(s, "startTimeUnixNano", "start_time_unix_nano", 0)),
                        end_ns=_int(_get(s, "endTimeUnixNano", "end_time_unix_nano", 0)),
                        attributes=_json_attrs(s.get("attributes")),
                        resource=resource,
                        status_code=_enum(status.get("code", 0), _STATUS_NAMES),
                        status_message=str(status.get("message") or ""),
                        kind=_enum(s.get("kind", 0), _KIND_NAMES),
                    )
                )
    return out


# --- entry points ---------------------------------------------------------------


def decode_spans(raw: bytes, encoding: Encoding = "auto") -> list[Span]:
    """The spans of one ``tailguard.otlp`` message; :class:`OtlpDecodeError` if unreadable."""
    if encoding == "auto":
        encoding = "otlp_json" if raw.lstrip()[:1] == b"{" else "otlp_proto"
    return _from_json(raw) if encoding == "otlp_json" else _from_proto(raw)


def spans_to_events(
    spans: Iterable[Span], *, now_ms: int, limits: Limits = DEFAULT_LIMITS
) -> OtlpEvents:
    """Inference events of ``spans``, validated like any producer's; the rest counted."""
    result = OtlpEvents()
    fields: list[dict[str, Any]] = []
    for span in spans:
        result.spans += 1
        got, reason = span_fields(span)
        if got is None:
            result.unusable[reason or "unknown"] += 1
        else:
            fields.append(got)
    # Validated in slices that stay far below a message's size and batch limits.
    for i in range(0, len(fields), _SLICE):
        part = msgspec.json.encode(fields[i : i + _SLICE])
        checked = decode(part, "inference", now_ms=now_ms, limits=limits)
        result.events.extend(checked.valid)
        for reject in checked.rejects:
            result.unusable[f"invalid_{reject.reason}"] += 1
    return result
