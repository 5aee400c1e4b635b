"""The meter times token chunks of an SSE stream as the proxy read them."""

import json

import pytest

from tailguard.gateway.meter import Meter


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def delta(content: str | None = None, role: bool = False) -> bytes:
    d: dict[str, object] = {"role": "assistant", "content": ""} if role else {"content": content}
    return sse({"choices": [{"index": 0, "delta": d, "finish_reason": None}], "model": "m"})


def test_role_opener_is_not_a_token_and_gaps_are_between_token_chunks() -> None:
    m = Meter(t0=10.0, streaming=True)
    m.feed(delta(role=True), 10.001)
    m.feed(delta("a"), 10.100)
    m.feed(delta("b"), 10.120)
    m.feed(delta("c") + delta("d"), 10.160)  # two events in one read: gap 0
    m.feed(sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}), 10.161)
    m.feed(b"data: [DONE]\n\n", 10.162)
    out = m.finish(10.165)
    assert out.ttft_s == pytest.approx(0.100)
    assert out.gaps_s == pytest.approx([0.020, 0.040, 0.0])
    assert out.output_tokens == 4 and out.token_chunks == 4
    assert out.done and out.model == "m" and out.e2e_s == pytest.approx(0.165)


def test_usage_block_wins_over_counted_chunks() -> None:
    m = Meter(t0=0.0, streaming=True)
    m.feed(delta("hello world"), 0.05)
    m.feed(sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}), 0.06)
    out = m.finish(0.07)
    assert (out.output_tokens, out.input_tokens, out.token_chunks) == (3, 7, 1)


def test_events_split_across_reads_and_crlf_separators_are_reassembled() -> None:
    raw = delta("x").replace(b"\n\n", b"\r\n\r\n") + delta("y")
    m = Meter(t0=0.0, streaming=True)
    m.feed(raw[:7], 0.01)
    m.feed(raw[7:30], 0.02)
    m.feed(raw[30:], 0.03)
    out = m.finish(0.04)
    assert out.token_chunks == 2 and out.ttft_s == pytest.approx(0.03)


def test_completions_text_tool_calls_and_reasoning_count_as_output() -> None:
    m = Meter(t0=0.0, streaming=True)
    m.feed(sse({"choices": [{"text": "a"}]}), 0.1)
    m.feed(sse({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}), 0.2)
    m.feed(sse({"choices": [{"delta": {"reasoning_content": "hm"}}]}), 0.3)
    assert m.finish(0.4).token_chunks == 3


def test_an_error_event_in_the_stream_is_reported() -> None:
    m = Meter(t0=0.0, streaming=True)
    m.feed(sse({"error": {"message": "overloaded"}}), 0.1)
    assert m.finish(0.2).stream_error == "stream_error"


def test_garbage_events_are_counted_not_raised() -> None:
    m = Meter(t0=0.0, streaming=True)
    m.feed(b"data: {not json\n\n: comment\n\n", 0.1)
    assert m.bad_events == 1 and m.finish(0.2).ttft_s is None


def test_non_streamed_response_ttft_is_e2e_and_tokens_come_from_usage() -> None:
    m = Meter(t0=1.0, streaming=False)
    body = {"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 9}}
    m.feed(json.dumps(body).encode(), 1.5)
    out = m.finish(1.5)
    assert out.ttft_s == out.e2e_s == pytest.approx(0.5)
    assert out.gaps_s == [] and out.output_tokens == 9
