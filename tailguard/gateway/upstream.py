"""A simulated OpenAI-compatible upstream that streams with known delays.

For the gateway's tests, benchmark and demo: ``POST /v1/chat/completions`` and
``/v1/completions``, streamed (SSE) or not, and ``GET /v1/models``. A streamed
response sends the role-only opener at once, the first token after the TTFT,
then one token per chunk after each gap, a ``usage`` chunk when the request
asks for one (``stream_options.include_usage``) and ``data: [DONE]``::

    request ─┬─ {"delta":{"role":"assistant","content":""}}   (at once: not a token)
             │◀──── ttft ────▶ tok0 ◀─ itl[0] ─▶ tok1 ◀─ itl[1] ─▶ … tok(n-1) ─ [usage] ─ [DONE]

Delays come from the command line (``--ttft-ms``, ``--itl-ms`` — one value or a
comma-separated list used in turn —, ``--tokens``, ``--jitter``: a lognormal
factor with that log-space sigma on every delay) or per request from headers
``x-sim-ttft-ms``, ``x-sim-itl-ms``, ``x-sim-tokens`` and ``x-sim-status`` (answer
with that HTTP status instead). Every chunk carries ``tg_sent_ns``, the
``time.monotonic_ns()`` (system-wide on Linux) at which it was written, and
``tg_received_ns``, when the request arrived, so a benchmark can time each
chunk's way through the gateway and a test can compare the gateway's TTFT with
the upstream's own; ``system_fingerprint`` names the upstream (``--name``).
"""

import asyncio
import math
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

__all__ = ["SimUpstream", "UpstreamProfile", "run_upstream"]

_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class UpstreamProfile:
    """Default delays of a simulated upstream (milliseconds)."""

    name: str = "sim"
    ttft_ms: float = 150.0
    itl_ms: tuple[float, ...] = (30.0,)
    tokens: int = 32
    #: log-space sigma of a lognormal factor on every delay (0: exact delays)
    jitter: float = 0.0
    seed: int | None = None


class _Body(msgspec.Struct, gc=False):
    model: str = "sim-model"
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    messages: list[Any] | None = None
    prompt: Any = None


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


class SimUpstream:
    """The aiohttp app of one simulated upstream."""

    def __init__(self, profile: UpstreamProfile) -> None:
        self.profile = profile
        self.requests = 0
        self._rng = random.Random(profile.seed)
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self._completion)
        self.app.router.add_post("/v1/completions", self._completion)
        self.app.router.add_get("/v1/models", self._models)

    def _factor(self) -> float:
        s = self.profile.jitter
        return math.exp(self._rng.gauss(0.0, s)) if s > 0 else 1.0

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "sim-model", "object": "model", "owned_by": "sim"}]}
        )

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        received_ns = time.monotonic_ns()
        self.requests += 1
        p = self.profile
        h = request.headers
        raw = await request.read()
        try:
            body = msgspec.json.decode(raw, type=_Body)
        except msgspec.DecodeError as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        if h.get("x-sim-status"):
            code = int(h["x-sim-status"])
            return web.json_response({"error": {"message": f"simulated {code}"}}, status=code)
        ttft = float(h["x-sim-ttft-ms"]) if h.get("x-sim-ttft-ms") else p.ttft_ms * self._factor()
        gaps = _floats(h["x-sim-itl-ms"]) if h.get("x-sim-itl-ms") else p.itl_ms
        jitter = not h.get("x-sim-itl-ms")
        tokens = int(h["x-sim-tokens"]) if h.get("x-sim-tokens") else p.tokens
        limit = body.max_completion_tokens or body.max_tokens
        if limit:
            tokens = min(tokens, limit)
        chat = request.path.endswith("/chat/completions")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        fp = f"tg-sim-{p.name}"
        prompt_tokens = 8 + len(raw) // 16

        def chunk(text: str | None, *, role: bool = False, finish: str | None = None) -> bytes:
            if chat:
                delta: dict[str, Any] = {}
                if role:
                    delta = {"role": "assistant", "content": ""}
                elif text is not None:
                    delta = {"content": text}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish}
            obj = {
                "id": rid,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": body.model,
                "system_fingerprint": fp,
                "choices": [choice],
                "tg_sent_ns": time.monotonic_ns(),
                "tg_received_ns": received_ns,
            }
            return b"data: " + _encode(obj) + b"\n\n"

        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": tokens,
            "total_tokens": prompt_tokens + tokens,
        }
        if not body.stream:
            await asyncio.sleep((ttft + sum(gaps[i % len(gaps)] for i in range(tokens - 1))) / 1e3)
            text = "".join(f"tok{i} " for i in range(tokens))
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text},
                 "finish_reason": "length"}
                if chat
                else {"index": 0, "text": text, "finish_reason": "length"}
            )  # fmt: skip
            return web.json_response(
                {
                    "id": rid,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": created,
                    "model": body.model,
                    "system_fingerprint": fp,
                    "choices": [choice],
                    "usage": usage,
                },
                headers={"x-upstream": p.name},
            )
        resp = web.StreamResponse(
            status=200,
            headers={
                "content-type": "text/event-stream",
                "cache-control": "no-cache",
                "x-upstream": p.name,
            },
        )
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        start = loop.time()
        if chat:
            await resp.write(chunk(None, role=True))
        # Sleep to absolute deadlines so delays do not accumulate scheduling slack.
        due = start + ttft / 1e3
        for i in range(tokens):
            if i:
                gap = gaps[(i - 1) % len(gaps)]
                due += (gap * self._factor() if jitter else gap) / 1e3
            await asyncio.sleep(max(due - loop.time(), 0.0))
            await resp.write(chunk(f"tok{i} "))
        await resp.write(chunk(None, finish="length"))
        options = body.stream_options or {}
        if options.get("include_usage"):
            tail: dict[str, Any] = {
                "id": rid,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": body.model,
                "system_fingerprint": fp,
                "choices": [],
                "usage": usage,
            }
            await resp.write(b"data: " + _encode(tail) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def run_upstream(profile: UpstreamProfile, host: str, port: int) -> None:
    """Serve until interrupted."""
    from tailguard.gateway.server import new_event_loop

    web.run_app(
        SimUpstream(profile).app, host=host, port=port, print=None, access_log=None,
        loop=new_event_loop(),
    )  # fmt: skip
