"""The prompt registry and per-prompt-group SLIs, as msgspec Structs.

``tailguard.prompt.v1`` — one prompt version on the compacted topic
``tailguard.prompts`` (key: ``prompt_version``; the latest record per key is
kept forever). It carries the prompt's ``text``, or only its ``text_sha256``
when the text must not leave its owner (then it is grouped with its
``parent_version``). Published by ``tailguard prompts add`` or any producer
that validates against the shipped JSON Schema.

``tailguard.prompt_sli.v1`` — a snapshot of one (service, model, prompt
group) on ``tailguard.prompt_sli`` (key ``service|model|prompt_group``): the
group's member versions, the window's requests, bad requests (errors and
latency-SLO violations), SLO compliance, TTFT quantiles and the same per
version, plus totals since the worker's state for the group began. ``final``
is true once for each closed window; provisional snapshots (``final`` false)
of the open windows are published periodically.
"""

import hashlib
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta
from tailguard.schemas.errors import DeadLetterReason
from tailguard.schemas.reasons import classify
from tailguard.schemas.rejects import Reject
from tailguard.schemas.scalars import TimestampMs

__all__ = [
    "PROMPT_SCHEMA",
    "PROMPT_SLI_SCHEMA",
    "PromptGroupSli",
    "PromptRecord",
    "decode_prompt",
    "prompt_event_id",
    "prompt_or_reject",
]

PROMPT_SCHEMA: Final = "tailguard.prompt.v1"
PROMPT_SLI_SCHEMA: Final = "tailguard.prompt_sli.v1"

Version = Annotated[str, Meta(min_length=1, max_length=256)]
Sha256 = Annotated[
    str,
    Meta(
        pattern="^[0-9a-f]{64}$",
        min_length=64,
        max_length=64,
        description="SHA-256 of the prompt's UTF-8 text: 64 lower-case hex digits.",
    ),
]


class PromptRecord(msgspec.Struct, kw_only=True, omit_defaults=False, forbid_unknown_fields=False):
    """One prompt version. At least one of ``text`` and ``text_sha256`` is present."""

    schema: Literal["tailguard.prompt.v1"] = "tailguard.prompt.v1"
    event_id: Annotated[str, Meta(min_length=1)]
    ts_ms: TimestampMs
    prompt_version: Version
    text: Annotated[str, Meta(min_length=1)] | None = None
    text_sha256: Sha256 | None = None
    owner: str | None = None
    parent_version: Version | None = None


def prompt_event_id(version: str, text_sha256: str) -> str:
    """Deterministic id of a registration: the same version and text give the same id."""
    return hashlib.sha256(f"{version}\x1f{text_sha256}".encode()).hexdigest()[:32]


_decoder = msgspec.json.Decoder(PromptRecord)


def decode_prompt(raw: bytes) -> PromptRecord:
    """Decode and check one registry record; raises ``msgspec.ValidationError`` /
    ``msgspec.DecodeError`` (the dead-letter reason) when it is not a valid one."""
    record = _decoder.decode(raw)
    if record.text is None and record.text_sha256 is None:
        msg = "a prompt record needs text or text_sha256"
        raise msgspec.ValidationError(msg)
    if record.text is not None:
        digest = hashlib.sha256(record.text.encode()).hexdigest()
        if record.text_sha256 is not None and record.text_sha256 != digest:
            msg = "text_sha256 is not the SHA-256 of text"
            raise msgspec.ValidationError(msg)
    return record


def prompt_or_reject(raw: bytes) -> PromptRecord | Reject:
    """The record of ``raw``, or the :class:`Reject` (dead-letter reason and detail) it earns."""
    try:
        return decode_prompt(raw)
    except msgspec.ValidationError as exc:
        if str(exc).startswith(("a prompt record needs", "text_sha256 is not")):
            reason = (
                DeadLetterReason.MISSING_FIELD
                if "needs" in str(exc)
                else DeadLetterReason.INCONSISTENT
            )
            return Reject(reason, str(exc))
        reason, detail = classify(exc, raw, PROMPT_SCHEMA)
        return Reject(reason, detail)
    except msgspec.DecodeError as exc:
        return Reject(DeadLetterReason.MALFORMED_JSON, f"not JSON: {exc}")


class PromptGroupSli(
    msgspec.Struct, kw_only=True, omit_defaults=False, forbid_unknown_fields=False
):
    """One SLI snapshot of a prompt group (see the module docstring)."""

    schema: Literal["tailguard.prompt_sli.v1"] = "tailguard.prompt_sli.v1"
    event_id: str
    ts_ms: int
    service: str
    model: str
    prompt_group: str
    #: Every version of the group known to the registry, in the order they joined.
    members: list[str]
    window_s: float
    window_start_ms: int
    window_end_ms: int
    final: bool
    count: int
    bad: int
    errors: int
    cancelled: int
    slo_compliance: float | None
    #: {p50, p90, p95, p99, count} of TTFT in ms (null when no request had one).
    ttft_ms: dict[str, Any]
    #: version → {count, bad} of the window's requests.
    versions: dict[str, dict[str, int]]
    #: {count, bad, slo_compliance, late} since the group's state began.
    total: dict[str, Any]
