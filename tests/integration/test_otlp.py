"""OTLP span batches, built with the OpenTelemetry SDK and vLLM's attribute names, in both
encodings of the Collector's Kafka exporter, become the expected inference events."""

import base64
import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from tailguard.schemas.columnar import rows_of

pytestmark = pytest.mark.integration


def vllm_spans(n: int, start_ns: int, model: str) -> list[ReadableSpan]:
    """What vLLM's OutputProcessor exports per finished request (``llm_request``, SERVER,
    latencies in seconds, the span starting at the request's arrival), plus one HTTP span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "vllm-chat", "host.name": "gpu-node-07"})
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.v1.engine.output_processor")
    for i in range(n):
        arrival = start_ns + i * 50_000_000
        span = tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=arrival)
        span.set_attributes(
            {
                "gen_ai.response.model": model,
                "gen_ai.request.id": f"chatcmpl-{i}",
                "gen_ai.request.temperature": 0.7,
                "gen_ai.request.top_p": 0.95,
                "gen_ai.request.max_tokens": 512,
                "gen_ai.request.n": 1,
                "gen_ai.usage.prompt_tokens": 300 + i,
                "gen_ai.usage.completion_tokens": 40 + i,
                "gen_ai.latency.time_in_queue": 0.005 * (i + 1),
                "gen_ai.latency.time_to_first_token": 0.2 + 0.01 * i,
                "gen_ai.latency.e2e": 1.2 + 0.05 * i,
                "gen_ai.latency.time_in_model_prefill": 0.15,
                "gen_ai.latency.time_in_model_decode": 0.9,
                "gen_ai.latency.time_in_model_inference": 1.05,
            }
        )
        span.end(end_time=arrival + int((1.2 + 0.05 * i) * 1e9))
    http = tracer.start_span("POST /v1/chat/completions", kind=SpanKind.SERVER,
                             start_time=start_ns)  # fmt: skip
    http.set_attribute("http.request.method", "POST")
    http.end(end_time=start_ns + 1_000_000_000)
    return list(exporter.get_finished_spans())


def otlp_json(spans: list[ReadableSpan]) -> bytes:
    """OTLP/JSON as the Collector's otlp_json encoding writes it (hex ids, integer enums)."""
    doc = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in s:
                        s[key] = base64.b64decode(s[key]).hex()
    return json.dumps(doc).encode()


def test_otlp_proto_and_json_batches_become_inference_events(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
) -> None:
    # Every span inside one minute (5 s into the last whole minute), so its 1m snapshot
    # counts all of a model's requests whatever the wall clock's second.
    minute_ns = 60_000_000_000
    now_ns = (time.time_ns() // minute_ns - 1) * minute_ns + 5_000_000_000
    proto_spans = vllm_spans(5, now_ns, "llama-3.1-8b-instruct")
    json_spans = vllm_spans(4, now_ns + 1_000_000_000, "qwen2.5-7b-instruct")
    otlp = namespace.topic("tailguard.otlp")
    produce(
        namespace.broker,
        otlp,
        [
            (None, encode_spans(proto_spans).SerializeToString()),
            (None, otlp_json(json_spans)),
            (None, b"\x08\x96\x01 this is no OTLP"),
        ],
    )
    worker = worker_factory("w1", "--loglevel", "info")
    worker.env["TAILGUARD_STATS_INTERVAL_S"] = "1"
    worker.start()
    inference = collector("tailguard.inference")

    def requests(records: list[Any]) -> list[dict[str, Any]]:
        """The inference messages' requests (the OTLP ingest writes columns)."""
        return [e for m in records for e in rows_of(json.dumps(m).encode())]

    inference.wait_for(lambda r: len(requests(r)) >= 9, timeout=120, worker=worker)
    events = requests(inference.records)
    assert len(events) == 9
    by_id = {e["event_id"]: e for e in events}
    for spans, model in (
        (proto_spans, "llama-3.1-8b-instruct"),
        (json_spans, "qwen2.5-7b-instruct"),
    ):
        for s in spans:
            if s.name != "llm_request":
                continue
            tid, sid = f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}"
            e = by_id[f"otlp-{tid}-{sid}"]
            a = s.attributes
            assert e["trace_id"] == tid and e["model"] == model
            assert (e["service"], e["host"], e["status"]) == ("vllm-chat", "gpu-node-07", "ok")
            assert e["ts_ms"] == s.start_time // 1_000_000
            assert e["ttft_ms"] == pytest.approx(a["gen_ai.latency.time_to_first_token"] * 1000)
            assert e["e2e_ms"] == pytest.approx(a["gen_ai.latency.e2e"] * 1000)
            assert e["queue_ms"] == pytest.approx(a["gen_ai.latency.time_in_queue"] * 1000)
            assert e["stages_ms"]["prefill"] == pytest.approx(150.0)
            assert e["output_tokens"] == a["gen_ai.usage.completion_tokens"]
            assert e["input_tokens"] == a["gen_ai.usage.prompt_tokens"]
    # The unreadable message: one dead letter. The two HTTP spans: counted, not dead-lettered.
    dead = collector("tailguard.deadletter")
    dead.wait_for(lambda r: len(r) >= 1, timeout=60, worker=worker)
    assert len(dead.records) == 1 and dead.records[0]["topic"] == otlp
    assert dead.records[0]["reason"] == "wrong_type"
    pattern = re.compile(
        r"otlp messages=3 spans=11 events=9 bad_messages=1 unusable\[not_genai=2\]"
    )
    deadline = time.monotonic() + 30
    while not pattern.search(worker.log_path.read_text(errors="replace")):
        assert time.monotonic() < deadline, worker.log_tail()
        time.sleep(0.5)
    # And the events feed the pipeline like any producer's: SLI snapshots count them.
    sli = collector("tailguard.sli")
    sli.wait_for(
        lambda r: max((x["count"] for x in r if x.get("window") == "1m"), default=0) >= 5,
        timeout=120,
        worker=worker,
    )
