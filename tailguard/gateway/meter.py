"""What one proxied response looked like, chunk by chunk. Pure: bytes and clock readings in.

A streamed OpenAI-compatible response is Server-Sent Events: ``data: {json}``
events separated by a blank line, ended by ``data: [DONE]``. The meter is fed
the body *as the proxy received it* with the clock reading of each read, and
times the **token chunks** — events with at least one choice that carries
output (``delta.content``, ``text``, reasoning, tool calls or a refusal)::

    arrival      first token chunk      chunk 2           chunk n         end
      │◀──── ttft ────▶│◀── itl[0] ──▶│ … │◀─ itl[n-2] ─▶│◀── tail ──▶│
      │◀──────────────────────────── e2e ─────────────────────────────▶│

This follows vLLM's ``bench serve`` (TTFT at the first chunk with choices,
one ITL gap per later chunk) with one difference: a chunk whose choices carry
no output at all — the role-only opener ``{"delta": {"role": "assistant",
"content": ""}}`` some servers send before any token, a bare
``finish_reason``, the ``usage`` chunk — is not a token, so it neither ends the
TTFT nor adds a gap. Several events read in one network read share one clock
reading: their gaps are 0, which is what the proxy saw.

Tokens: ``usage.completion_tokens`` / ``usage.prompt_tokens`` when the
response has a usage block (``stream_options.include_usage``), else the
number of token chunks (one chunk is one token for vLLM and most servers).
A non-streamed response arrives whole: TTFT = E2E, no gaps.
"""

from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

__all__ = ["Measurement", "Meter"]

#: Largest non-streamed body kept for reading its usage block.
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
#: Longest partial SSE event kept between reads (a bigger one is skipped).
MAX_PENDING_BYTES: Final = 1024 * 1024


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: list[Any] | None = None


class _Choice(msgspec.Struct, gc=False):
    delta: _Delta | None = None
    text: str | None = None
    message: _Delta | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Chunk(msgspec.Struct, gc=False):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    model: str | None = None
    error: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


def _carries_output(choices: list[_Choice]) -> bool:
    for c in choices:
        if c.text:
            return True
        d = c.delta if c.delta is not None else c.message
        if d is not None and (
            d.content or d.reasoning_content or d.reasoning or d.refusal or d.tool_calls
        ):
            return True
    return False


@dataclass(slots=True)
class Measurement:
    """The timings and counts of one response (seconds; the event converts to ms)."""

    e2e_s: float
    ttft_s: float | None
    gaps_s: list[float]
    token_chunks: int
    output_tokens: int | None
    input_tokens: int | None
    model: str | None
    done: bool
    stream_error: str | None


@dataclass(slots=True)
class Meter:
    """Feed it the response body with clock readings; :meth:`finish` says what happened.

    ``t0`` is the request's arrival on the same clock (``time.perf_counter``).
    """

    t0: float
    streaming: bool
    _pending: bytearray = field(default_factory=bytearray)
    _body: bytearray = field(default_factory=bytearray)
    _first: float | None = None
    _last: float | None = None
    _gaps: list[float] = field(default_factory=list)
    _chunks: int = 0
    _usage: _Usage | None = None
    _model: str | None = None
    _done: bool = False
    _error: str | None = None
    bad_events: int = 0

    @property
    def saw_done(self) -> bool:
        """The stream's ``data: [DONE]`` went by: the client has the whole answer."""
        return self._done

    def feed(self, data: bytes, t: float) -> None:
        """Bytes of the body as they were read, at clock reading ``t``."""
        if not self.streaming:
            if len(self._body) + len(data) <= MAX_BODY_BYTES:
                self._body += data
            return
        pending = self._pending
        pending += data
        start = 0
        while True:
            end = pending.find(b"\n\n", start)
            sep = 2
            crlf = pending.find(b"\r\n\r\n", start)
            if crlf != -1 and (end == -1 or crlf < end):
                end, sep = crlf, 4
            if end == -1:
                break
            self._event(bytes(pending[start:end]), t)
            start = end + sep
        if start:
            del pending[:start]
        if len(pending) > MAX_PENDING_BYTES:
            self.bad_events += 1
            pending.clear()

    def _event(self, raw: bytes, t: float) -> None:
        payload = b""
        for line in raw.splitlines():
            if line.startswith(b"data:"):
                part = line[5:]
                payload = payload + b"\n" + part if payload else part
            elif line.startswith(b"event:") and line[6:].strip() == b"error":
                self._error = "stream_error"
        payload = payload.strip()
        if not payload:
            return
        if payload == b"[DONE]":
            self._done = True
            return
        try:
            chunk = _decode_chunk(payload)
        except msgspec.DecodeError:
            self.bad_events += 1
            return
        if chunk.error is not None:
            self._error = "stream_error"
        if chunk.usage is not None:
            self._usage = chunk.usage
        if chunk.model and self._model is None:
            self._model = chunk.model
        if chunk.choices and _carries_output(chunk.choices):
            self._chunks += 1
            if self._first is None:
                self._first = t
            else:
                assert self._last is not None
                self._gaps.append(t - self._last)
            self._last = t

    def finish(self, t: float) -> Measurement:
        """The measurement, the response having ended at clock reading ``t``."""
        e2e = max(t - self.t0, 0.0)
        if not self.streaming:
            usage, model = None, None
            if self._body:
                try:
                    chunk = _decode_chunk(bytes(self._body))
                except msgspec.DecodeError:
                    chunk = None
                if chunk is not None:
                    usage, model = chunk.usage, chunk.model
                    if chunk.error is not None:
                        self._error = "response_error"
            out = usage.completion_tokens if usage is not None else None
            return Measurement(
                e2e_s=e2e,
                ttft_s=e2e,
                gaps_s=[],
                token_chunks=0,
                output_tokens=out,
                input_tokens=usage.prompt_tokens if usage is not None else None,
                model=model,
                done=True,
                stream_error=self._error,
            )
        usage = self._usage
        output = usage.completion_tokens if usage is not None else None
        if output is None:
            output = self._chunks
        return Measurement(
            e2e_s=e2e,
            ttft_s=None if self._first is None else max(self._first - self.t0, 0.0),
            gaps_s=self._gaps,
            token_chunks=self._chunks,
            output_tokens=output,
            input_tokens=usage.prompt_tokens if usage is not None else None,
            model=self._model,
            done=self._done,
            stream_error=self._error,
        )
