"""Span attributes → inference event fields (vLLM names and GenAI conventions)."""

from typing import Any

import pytest
from tailguard.streams.otlp import Span, span_fields

T0 = 1_700_000_000_000_000_000  # ns
TID = "4bf92f3577b34da6a3ce929d0e0e4736"


def span(attrs: dict[str, Any], *, status: int = 0, duration_ms: float = 900.0,
         resource: dict[str, Any] | None = None) -> Span:  # fmt: skip
    return Span(
        trace_id=TID,
        span_id="00f067aa0ba902b7",
        name="llm_request",
        start_ns=T0,
        end_ns=T0 + int(duration_ms * 1e6),
        attributes=attrs,
        resource=resource or {"service.name": "vllm", "host.name": "gpu-node-01"},
        status_code=status,
        kind=2,
    )


VLLM = {
    "gen_ai.response.model": "llama-3.1-8b-instruct",
    "gen_ai.request.id": "cmpl-1",
    "gen_ai.usage.prompt_tokens": 812,
    "gen_ai.usage.completion_tokens": 128,
    "gen_ai.latency.time_in_queue": 0.012,
    "gen_ai.latency.time_to_first_token": 0.182,
    "gen_ai.latency.e2e": 3.4,
    "gen_ai.latency.time_in_model_prefill": 0.15,
    "gen_ai.latency.time_in_model_decode": 3.1,
}


def test_a_vllm_request_span_becomes_an_event_in_milliseconds() -> None:
    fields, reason = span_fields(span(VLLM))
    assert reason is None and fields is not None
    assert fields["ttft_ms"] == pytest.approx(182.0) and fields["e2e_ms"] == pytest.approx(3400.0)
    assert fields["queue_ms"] == pytest.approx(12.0)
    assert fields["stages_ms"] == pytest.approx({"queue": 12.0, "prefill": 150.0, "decode": 3100.0})
    assert (fields["output_tokens"], fields["input_tokens"]) == (128, 812)
    assert fields["ts_ms"] == T0 // 1_000_000 and fields["trace_id"] == TID
    assert fields["service"] == "vllm" and fields["host"] == "gpu-node-01"
    assert fields["event_id"] == f"otlp-{TID}-00f067aa0ba902b7" and fields["status"] == "ok"


def test_a_genai_convention_span_takes_its_duration_as_e2e() -> None:
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-x",
             "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5}  # fmt: skip
    fields, _ = span_fields(span(attrs, duration_ms=450.0))
    assert fields is not None and fields["e2e_ms"] == pytest.approx(450.0)
    assert "ttft_ms" not in fields and "output_tokens" not in fields  # no TTFT: no tokens
    assert fields["input_tokens"] == 10
    fields, _ = span_fields(span({**attrs, "gen_ai.server.time_to_first_token": 0.2}))
    assert fields is not None and fields["ttft_ms"] == pytest.approx(200.0)
    assert fields["output_tokens"] == 5


@pytest.mark.parametrize(
    ("attrs", "status", "want"),
    [
        ({"error.type": "TimeoutError"}, 0, ("timeout", "TimeoutError")),
        ({}, 2, ("error", "error")),
        ({"error.type": "500"}, 2, ("error", "500")),
        ({"gen_ai.response.finish_reasons": ["abort"]}, 0, ("cancelled", None)),
    ],
)
def test_status_comes_from_span_status_error_type_and_finish_reasons(
    attrs: dict[str, Any], status: int, want: tuple[str, str | None]
) -> None:
    fields, _ = span_fields(span({**VLLM, **attrs}, status=status))
    assert fields is not None and (fields["status"], fields.get("error_type")) == want


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"http.method": "POST", "http.route": "/v1/chat/completions"}, "not_genai"),
        ({"gen_ai.operation.name": "chat"}, "no_model"),
    ],
)
def test_spans_that_are_no_inference_say_why(attrs: dict[str, Any], reason: str) -> None:
    assert span_fields(span(attrs)) == (None, reason)


def test_experiment_tags_pass_through() -> None:
    attrs = {**VLLM, "tailguard.experiment": "exp-1", "tailguard.variant": "treatment"}
    fields, _ = span_fields(span(attrs))
    assert fields is not None and (fields["experiment"], fields["variant"]) == (
        "exp-1",
        "treatment",
    )
