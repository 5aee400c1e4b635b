"""OpenTelemetry spans → ``tailguard.inference.v1`` fields. Pure: plain values in, a dict out.

The decoding of the wire formats (``otlp_proto``, ``otlp_json``) lives in the
schemas package (its ``otlp`` module); this module only reads a span's
attributes. Two kinds of spans are understood:

**vLLM request spans** (``llm_request``; vLLM's ``SpanAttributes``, latencies in
*seconds*)::

    gen_ai.latency.time_to_first_token  → ttft_ms
    gen_ai.latency.e2e                  → e2e_ms (else the span's duration)
    gen_ai.latency.time_in_queue        → queue_ms and stages_ms.queue
    gen_ai.latency.time_in_model_prefill / _decode / _inference → stages_ms.prefill / …
    gen_ai.usage.completion_tokens | gen_ai.usage.output_tokens → output_tokens
    gen_ai.usage.prompt_tokens | gen_ai.usage.input_tokens      → input_tokens
    gen_ai.response.model | gen_ai.request.model                → model

**Spans of the OpenTelemetry GenAI semantic conventions** (``gen_ai.operation.name``,
``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` / ``output_tokens``,
``error.type``): E2E is the span's duration. The conventions have no TTFT
attribute; ``gen_ai.server.time_to_first_token`` (the name of their TTFT
*metric*, seconds) and ``gen_ai.response.time_to_first_chunk`` are read when a
producer sets them. A span without any TTFT keeps its input tokens but not its
output tokens (the contract needs ``ttft_ms`` for ``output_tokens`` ≥ 1).

Common to both: ``ts_ms`` = span start (vLLM starts the span at the request's
arrival); ``service`` = resource ``service.name``; ``instance`` = resource
``service.instance.id`` (else ``host.name``); ``host`` = resource ``host.name``;
``trace_id`` = the span's trace id (kept for exemplars); ``event_id`` =
``otlp-<trace id>-<span id>`` (a re-delivered batch is a duplicate, not new
traffic); status ``error`` when the span status is ERROR or ``error.type`` is
set (``timeout`` when that type says so), ``cancelled`` when
``gen_ai.response.finish_reasons`` holds ``abort`` / ``cancelled``, else ``ok``.
Attributes ``tailguard.{variant,experiment,prompt_version,tenant,unit_id,session_id}``
pass through, so a server can tag its spans with the experiment arm.

A span without any ``gen_ai.*`` attribute (an HTTP or database span of the same
trace) is not an inference: :func:`span_fields` says why it cannot be used
instead of raising, and the agent counts the reasons.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["UNUSABLE_REASONS", "Span", "span_fields"]

#: Why a span was not turned into an event (a counter label).
UNUSABLE_REASONS: Final = ("not_genai", "no_model", "no_duration")

STATUS_ERROR: Final = 2
_TTFT_KEYS: Final = (
    "gen_ai.latency.time_to_first_token",
    "gen_ai.server.time_to_first_token",
    "gen_ai.response.time_to_first_chunk",
)
_STAGES: Final = (
    ("gen_ai.latency.time_in_queue", "queue"),
    ("gen_ai.latency.time_in_scheduler", "scheduler"),
    ("gen_ai.latency.time_in_model_prefill", "prefill"),
    ("gen_ai.latency.time_in_model_decode", "decode"),
    ("gen_ai.latency.time_in_model_inference", "inference"),
)
_PASS: Final = (
    ("tailguard.variant", "variant"),
    ("tailguard.experiment", "experiment"),
    ("tailguard.prompt_version", "prompt_version"),
    ("tailguard.tenant", "tenant"),
    ("tailguard.unit_id", "unit_id"),
    ("tailguard.session_id", "session_id"),
)
_CANCELLED: Final = frozenset({"abort", "aborted", "cancelled", "canceled"})


@dataclass(frozen=True, slots=True)
class Span:
    """One span, wire format already decoded: ids as lower-case hex, times in ns."""

    trace_id: str
    span_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any] = field(default_factory=dict)
    resource: Mapping[str, Any] = field(default_factory=dict)
    status_code: int = 0
    status_message: str = ""
    kind: int = 0


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) else None


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def span_fields(span: Span) -> tuple[dict[str, Any] | None, str | None]:
    """The event fields of ``span``, or ``(None, reason)`` when it is not usable.

    The fields still go through the contract's validation (the caller's job):
    a negative or absurd duration is bad input like any producer's.
    """
    a = span.attributes
    if not any(k.startswith("gen_ai.") for k in a):
        return None, "not_genai"
    model = a.get("gen_ai.response.model") or a.get("gen_ai.request.model")
    if not isinstance(model, str) or not model:
        return None, "no_model"
    e2e_s = _seconds(a.get("gen_ai.latency.e2e"))
    if e2e_s is None:
        if span.end_ns <= 0 or span.end_ns < span.start_ns:
            return None, "no_duration"
        e2e_s = (span.end_ns - span.start_ns) / 1e9
    r = span.resource
    service = r.get("service.name")
    out: dict[str, Any] = {
        "schema": "tailguard.inference.v1",
        "event_id": f"otlp-{span.trace_id}-{span.span_id}",
        "ts_ms": span.start_ns // 1_000_000,
        "service": service if isinstance(service, str) and service else "unknown_service",
        "model": model,
        "e2e_ms": _ms(e2e_s),
    }
    ttft_s = next((s for k in _TTFT_KEYS if (s := _seconds(a.get(k))) is not None), None)
    if ttft_s is not None:
        out["ttft_ms"] = _ms(ttft_s)
    output = _count(a.get("gen_ai.usage.completion_tokens", a.get("gen_ai.usage.output_tokens")))
    if output is not None and (ttft_s is not None or output == 0):
        out["output_tokens"] = output
    inputs = _count(a.get("gen_ai.usage.prompt_tokens", a.get("gen_ai.usage.input_tokens")))
    if inputs is not None:
        out["input_tokens"] = inputs
    stages: dict[str, float] = {}
    for key, stage in _STAGES:
        s = _seconds(a.get(key))
        if s is not None:
            stages[stage] = _ms(s)
    if stages:
        out["stages_ms"] = stages
        if "queue" in stages:
            out["queue_ms"] = stages["queue"]
    error_type = a.get("error.type")
    reasons = a.get("gen_ai.response.finish_reasons")
    finish = {str(x).lower() for x in reasons} if isinstance(reasons, list | tuple) else set()
    if span.status_code == STATUS_ERROR or error_type:
        kind = str(error_type or "error")
        out["status"] = "timeout" if "timeout" in kind.lower() else "error"
        out["error_type"] = kind[:200]
    elif finish & _CANCELLED:
        out["status"] = "cancelled"
    else:
        out["status"] = "ok"
    if len(span.trace_id) == 32 and span.trace_id != "0" * 32:
        out["trace_id"] = span.trace_id
    instance = r.get("service.instance.id") or r.get("host.name")
    if isinstance(instance, str) and instance:
        out["instance"] = instance
    host = r.get("host.name")
    if isinstance(host, str) and host:
        out["host"] = host
    for key, name in _PASS:
        value = a.get(key, r.get(key))
        if isinstance(value, str) and value:
            out[name] = value
    return out, None
