"""tailguard.prompt.v1 and tailguard.prompt_sli.v1: decoding, dead-letter reasons, JSON Schema."""

import hashlib
import json

import jsonschema
import pytest
from tailguard.schemas import DeadLetterReason, Reject
from tailguard.schemas.generate import SCHEMA_DIR
from tailguard.schemas.prompts import (
    PROMPT_SCHEMA,
    PROMPT_SLI_SCHEMA,
    PromptRecord,
    prompt_event_id,
    prompt_or_reject,
)

TEXT = "You are a helpful assistant."
SHA = hashlib.sha256(TEXT.encode()).hexdigest()


def _record(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "schema": PROMPT_SCHEMA,
        "event_id": prompt_event_id("v1", SHA),
        "ts_ms": 1_700_000_000_000,
        "prompt_version": "v1",
        "text": TEXT,
        "text_sha256": SHA,
        "owner": "search-team",
        "parent_version": None,
    }
    base.update(over)
    return {k: v for k, v in base.items() if v is not ...}


def _validator(schema_id: str) -> jsonschema.Draft202012Validator:
    doc = json.loads((SCHEMA_DIR / f"{schema_id}.json").read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(doc)


def test_a_full_record_and_a_hash_only_record_decode() -> None:
    full = prompt_or_reject(json.dumps(_record()).encode())
    assert isinstance(full, PromptRecord) and full.text == TEXT and full.owner == "search-team"
    hashed = prompt_or_reject(json.dumps(_record(text=None, parent_version="v0")).encode())
    assert isinstance(hashed, PromptRecord) and hashed.text is None
    assert hashed.parent_version == "v0"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", DeadLetterReason.MALFORMED_JSON),
        (b"[1, 2]", DeadLetterReason.NOT_AN_OBJECT),
        (json.dumps(_record(prompt_version=...)).encode(), DeadLetterReason.MISSING_FIELD),
        (json.dumps(_record(text=None, text_sha256=None)).encode(), DeadLetterReason.MISSING_FIELD),
        (json.dumps(_record(ts_ms="yesterday")).encode(), DeadLetterReason.WRONG_TYPE),
        (json.dumps(_record(text_sha256="ab" * 32)).encode(), DeadLetterReason.INCONSISTENT),
        (
            json.dumps(_record(schema="tailguard.prompt.v9")).encode(),
            DeadLetterReason.UNKNOWN_SCHEMA_VERSION,
        ),
    ],
)
def test_bad_records_get_a_dead_letter_reason(raw: bytes, reason: DeadLetterReason) -> None:
    got = prompt_or_reject(raw)
    assert isinstance(got, Reject)
    assert got.reason == reason
    assert got.detail


def test_event_id_is_deterministic_per_version_and_text() -> None:
    assert prompt_event_id("v1", SHA) == prompt_event_id("v1", SHA)
    assert prompt_event_id("v1", SHA) != prompt_event_id("v2", SHA)


def test_shipped_json_schema_accepts_text_or_hash_and_refuses_neither() -> None:
    v = _validator(PROMPT_SCHEMA)
    v.validate(_record())
    v.validate(_record(text=...))
    v.validate(_record(text_sha256=..., future_field=1))
    with pytest.raises(jsonschema.ValidationError):
        v.validate(_record(text=..., text_sha256=...))
    with pytest.raises(jsonschema.ValidationError):
        v.validate(_record(text=None, text_sha256=None))
    with pytest.raises(jsonschema.ValidationError):
        v.validate(_record(text_sha256="XYZ"))


def test_prompt_sli_schema_is_shipped() -> None:
    doc = json.loads((SCHEMA_DIR / f"{PROMPT_SLI_SCHEMA}.json").read_text(encoding="utf-8"))
    assert doc["$id"] == PROMPT_SLI_SCHEMA
    required = doc["$defs"]["PromptGroupSli"]["required"]
    assert {"prompt_group", "members", "count", "bad", "ttft_ms", "versions"} <= set(required)
