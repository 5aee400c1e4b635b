"""Reply and audit payloads: they fit their schemas and never carry a secret."""

import json

import jsonschema
import msgspec
from tailguard.schemas import AdminReply, AuditRecord
from tailguard.schemas.generate import build_schema

from tailguard.admin.gate import Envelope, Refusal
from tailguard.admin.records import (
    audit_payload,
    decision_payload,
    event_id,
    redact,
    reply_payload,
)

ORIGIN = {"topic": "tailguard.admin", "partition": 0, "offset": 42}
ENVELOPE = Envelope("c-1", 1, "alice", "ops", "silence.add", {"service": "chat", "token": "t0p"})


def test_a_reply_and_its_audit_record_fit_their_schemas() -> None:
    reply = reply_payload(ENVELOPE, ORIGIN, now_ms=5, worker="w", result={"x": 1})
    refused = reply_payload(
        Envelope(), ORIGIN, now_ms=5, worker="w", refusal=Refusal("malformed", "m")
    )
    audit = audit_payload(
        ENVELOPE, ORIGIN, now_ms=5, worker="w", authenticated=True, role="operator"
    )
    decision = decision_payload(
        "breach.opened", {"breach_id": "b"}, "opened", seed="e", now_ms=5, worker="w"
    )
    for payload, record, kind in (
        (reply, AdminReply, "admin_reply"),
        (refused, AdminReply, "admin_reply"),
        (audit, AuditRecord, "audit"),
        (decision, AuditRecord, "audit"),
    ):
        msgspec.convert(payload, record)
        jsonschema.validate(json.loads(json.dumps(payload)), build_schema(kind))
    assert reply["ok"] and reply["error"] is None and reply["result"] == {"x": 1}
    assert not refused["ok"] and refused["error"] == {"code": "malformed", "message": "m"}
    assert refused["command_id"] is None and refused["origin"] == ORIGIN


def test_ids_are_deterministic_per_admin_message() -> None:
    one = reply_payload(ENVELOPE, ORIGIN, now_ms=5, worker="a")
    two = reply_payload(ENVELOPE, ORIGIN, now_ms=9, worker="b")
    other = reply_payload(ENVELOPE, {**ORIGIN, "offset": 43}, now_ms=5, worker="a")
    assert one["event_id"] == two["event_id"] != other["event_id"]
    assert event_id("audit", "decision", "x") == event_id("audit", "decision", "x")


def test_secret_looking_arguments_are_redacted_and_hashed() -> None:
    audit = audit_payload(
        ENVELOPE, ORIGIN, now_ms=5, worker="w", authenticated=True, role="operator"
    )
    assert audit["args"] == {"service": "chat", "token": "[redacted]"}
    assert "t0p" not in json.dumps(audit)
    assert len(audit["args_sha256"]) == 64


def test_long_text_is_cut_in_the_audit() -> None:
    cut = redact({"openslo": "y" * 10_000, "nested": [{"Password": "p"}]})
    assert len(cut["openslo"]) < 2_100 and cut["openslo"].endswith("more characters]")
    assert cut["nested"] == [{"Password": "[redacted]"}]
