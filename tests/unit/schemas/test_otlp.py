"""OTLP batches built with the OpenTelemetry SDK, in both encodings of the Collector's
Kafka exporter (otlp_proto, otlp_json), become validated inference events."""

import base64
import json
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from tailguard.schemas.otlp import OtlpDecodeError, decode_spans, spans_to_events

NOW_MS = 1_700_000_100_000
START_NS = 1_700_000_000_000_000_000


def vllm_attrs(i: int) -> dict[str, Any]:
    return {
        "gen_ai.response.model": "llama-3.1-8b-instruct",
        "gen_ai.request.id": f"cmpl-{i}",
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.max_tokens": 256,
        "gen_ai.usage.prompt_tokens": 100 + i,
        "gen_ai.usage.completion_tokens": 20 + i,
        "gen_ai.latency.time_in_queue": 0.010 + i / 1000,
        "gen_ai.latency.time_to_first_token": 0.150 + i / 100,
        "gen_ai.latency.e2e": 1.5 + i / 10,
    }


def sdk_spans() -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "vllm", "host.name": "gpu-node-01"})
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.entrypoints")
    for i in range(3):
        s = tracer.start_span(
            "llm_request", kind=SpanKind.SERVER, attributes=vllm_attrs(i),
            start_time=START_NS + i * 1_000_000,
        )  # fmt: skip
        s.end(end_time=START_NS + i * 1_000_000 + 1_600_000_000)
    failed = tracer.start_span(
        "chat gpt-x", kind=SpanKind.CLIENT, start_time=START_NS,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-x",
                    "error.type": "timeout"},
    )  # fmt: skip
    failed.set_status(Status(StatusCode.ERROR, "deadline exceeded"))
    failed.end(end_time=START_NS + 30_000_000_000)
    http = tracer.start_span("POST /v1/chat/completions", start_time=START_NS)
    http.set_attribute("http.request.method", "POST")
    http.end(end_time=START_NS + 2_000_000_000)
    return list(exporter.get_finished_spans())


def otlp_proto(spans: list[ReadableSpan]) -> bytes:
    return encode_spans(spans).SerializeToString()


def otlp_json(spans: list[ReadableSpan]) -> bytes:
    """The OTLP/JSON mapping as the Collector's otlp_json encoding writes it: camelCase,
    hex ids, enums as integers, 64-bit integers as strings."""
    doc = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in s:
                        s[key] = base64.b64decode(s[key]).hex()
    return json.dumps(doc).encode()


@pytest.mark.parametrize("encode", [otlp_proto, otlp_json])
def test_sdk_spans_become_the_expected_events(encode: Any) -> None:
    spans = sdk_spans()
    result = spans_to_events(decode_spans(encode(spans)), now_ms=NOW_MS)
    assert result.spans == 5
    assert result.unusable == {"not_genai": 1}
    by_id = {e.event_id: e for e in result.events}
    assert len(by_id) == 4
    vllm = sorted((e for e in result.events if e.model != "gpt-x"), key=lambda e: e.ts_ms)
    for i, e in enumerate(vllm):
        sdk = next(s for s in spans if s.attributes["gen_ai.request.id"] == f"cmpl-{i}")  # type: ignore[index]
        assert e.trace_id == f"{sdk.context.trace_id:032x}"
        assert e.event_id == f"otlp-{sdk.context.trace_id:032x}-{sdk.context.span_id:016x}"
        assert e.ts_ms == (START_NS + i * 1_000_000) // 1_000_000
        assert e.ttft_ms == pytest.approx(150 + 10 * i)
        assert e.e2e_ms == pytest.approx(1500 + 100 * i)
        assert e.queue_ms == pytest.approx(10 + i)
        assert (e.input_tokens, e.output_tokens) == (100 + i, 20 + i)
        assert (e.service, e.host, e.status) == ("vllm", "gpu-node-01", "ok")
    (timeout,) = [e for e in result.events if e.model == "gpt-x"]
    assert (timeout.status, timeout.error_type) == ("timeout", "timeout")
    assert timeout.e2e_ms == pytest.approx(30_000)


def test_both_encodings_decode_to_the_same_spans() -> None:
    spans = sdk_spans()
    assert decode_spans(otlp_proto(spans)) == decode_spans(otlp_json(spans))


def test_protobufs_own_json_mapping_is_read_too() -> None:
    spans = sdk_spans()
    doc = MessageToDict(encode_spans(spans), preserving_proto_field_name=True)  # base64 ids
    assert decode_spans(json.dumps(doc).encode()) == decode_spans(otlp_proto(spans))


def test_events_the_contract_refuses_are_counted_not_raised() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    s = provider.get_tracer("t").start_span("llm_request", start_time=START_NS)
    s.set_attributes({**vllm_attrs(0), "gen_ai.latency.time_to_first_token": -1.0})
    s.end(end_time=START_NS + 10)
    result = spans_to_events(decode_spans(otlp_proto(list(exporter.get_finished_spans()))),
                             now_ms=NOW_MS)  # fmt: skip
    assert result.events == [] and result.unusable == {"invalid_negative_duration": 1}


@pytest.mark.parametrize(
    ("raw", "encoding"),
    [(b"{not json", "otlp_json"), (b"\xff\xff\xff\xff", "otlp_proto"), (b"[1, 2]", "otlp_proto")],
)
def test_a_message_that_is_neither_encoding_is_refused(raw: bytes, encoding: str) -> None:
    with pytest.raises(OtlpDecodeError) as info:
        decode_spans(raw)
    assert info.value.encoding == encoding
