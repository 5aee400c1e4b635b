"""Blind rating hand-off: a sample of finished requests for human raters, without the arm.

The hallucination guardrail needs people to label answers (``correct``,
``partial``, ``hallucination``), and a rater who knows which arm produced an
answer is no longer a blind judge. The gateway therefore forwards a sample of
its completed requests to ``tailguard.ratings`` (``tailguard.rating.v1``)
carrying only what a rater needs and the key to join the label back::

    gateway ── request (experiment p7, arm treatment, prompt v2) ─▶ tailguard.inference
       │                                    (event_id e1, variant, prompt_version …)
       └─ sampled? ─▶ tailguard.ratings  {request_event_id: e1, service, model,
                                          messages (no system prompt), response}
                      rating tool / raters
                           └─▶ tailguard.interactions  {kind: feedback, label, rater,
                                                         request_event_id: e1}
    A/B guard: e1 → (arm, prompt version) from its request book → per-arm, per-stratum rates

Left out on purpose — each names or betrays the arm: ``experiment``,
``variant``, ``experiments`` (every layer's arm), ``prompt_version`` (in a
prompt experiment the version *is* the arm), the system prompt (its text is
the version), ``model`` and ``instance`` (in a model canary they are the
arm: the upstream is named e.g. ``canary``), ``unit_id`` and
``session_id`` (with the layer salt they give the arm) and every
``x-tailguard-*`` header. The record goes out without Kafka headers.
The ``event_id`` of the rating record is derived from the request's, so a
re-send is recognisable.

Sampling is deterministic per request (the event id's hash against
``rate``), so whoever replays a gateway's events can tell which ones were
offered for rating.
"""

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = [
    "ARM_REVEALING",
    "RATING_SCHEMA",
    "rating_payload",
    "response_text",
    "sampled",
    "user_messages",
]

RATING_SCHEMA: Final = "tailguard.rating.v1"
#: Inference event fields that never go to raters.
ARM_REVEALING: Final = frozenset(
    {
        "experiment",
        "variant",
        "experiments",
        "prompt_version",
        "model",
        "instance",
        "unit_id",
        "session_id",
    }
)
#: Longest text forwarded per field (characters).
MAX_TEXT = 20_000


def sampled(event_id: str, rate: float) -> bool:
    """Whether the request ``event_id`` is offered for rating (share ``rate``)."""
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    h = hashlib.blake2b(event_id.encode(), digest_size=8, person=b"tg-ratings").digest()
    return int.from_bytes(h, "big") / 2.0**64 < rate


def user_messages(body: bytes) -> list[dict[str, str]] | None:
    """The request's messages a rater may see: every role but ``system``/``developer``
    (the prompt version lives there); ``/v1/completions``' ``prompt`` as one user message."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, Mapping):
        return None
    out: list[dict[str, str]] = []
    messages = data.get("messages")
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        for m in messages:
            if not isinstance(m, Mapping) or m.get("role") in ("system", "developer"):
                continue
            content = m.get("content")
            if isinstance(content, list):  # content parts: keep the text ones
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
            out.append(
                {"role": str(m.get("role", "user")), "content": str(content or "")[:MAX_TEXT]}
            )
    elif isinstance(data.get("prompt"), str):
        out.append({"role": "user", "content": data["prompt"][:MAX_TEXT]})
    return out or None


def response_text(raw: bytes, streaming: bool) -> str | None:
    """The answer's text from an OpenAI-compatible response (JSON or SSE chunks)."""
    parts: list[str] = []

    def take(obj: Any) -> None:
        if not isinstance(obj, Mapping):
            return
        for choice in obj.get("choices") or ():
            if not isinstance(choice, Mapping):
                continue
            for holder in (choice.get("delta"), choice.get("message")):
                if isinstance(holder, Mapping) and isinstance(holder.get("content"), str):
                    parts.append(holder["content"])
            if isinstance(choice.get("text"), str):
                parts.append(choice["text"])

    if streaming:
        for line in raw.split(b"\n"):
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            try:
                take(json.loads(data))
            except (ValueError, UnicodeDecodeError):
                continue
    else:
        try:
            take(json.loads(raw))
        except (ValueError, UnicodeDecodeError):
            return None
    text = "".join(parts)
    return text[:MAX_TEXT] if parts else None


def rating_payload(
    event: Mapping[str, Any],
    *,
    messages: list[dict[str, str]] | None,
    response: str | None,
) -> dict[str, Any]:
    """The ``tailguard.rating.v1`` record of one finished request (its inference
    ``event``): what a rater sees, and ``request_event_id`` to join the label back."""
    request_id = str(event["event_id"])
    out: dict[str, Any] = {
        "schema": RATING_SCHEMA,
        "event_id": hashlib.blake2b(f"rating|{request_id}".encode(), digest_size=16).hexdigest(),
        "ts_ms": event["ts_ms"],
        "request_event_id": request_id,
        "service": event.get("service"),
        "tenant": event.get("tenant", "default"),
        "messages": messages,
        "response": response,
    }
    assert not ARM_REVEALING & out.keys()
    return out
