"""Breaches and release decisions as Alertmanager webhook messages (version 4)."""

import json
from typing import Any

import jsonschema
import pytest

from tailguard.alerts.alertmanager import (
    GO_ZERO_TIME,
    encode,
    fingerprint,
    webhook_message,
)
from tailguard.alerts.events import decode_event

#: The webhook body as Alertmanager documents it (configuration.md, ``<webhook_config>``)
#: and its Go types declare it (``notify/webhook.Message`` embedding ``template.Data``):
#: exactly these keys, labels and annotations string → string, times RFC 3339.
_KV = {"type": "object", "additionalProperties": {"type": "string"}}
_RFC3339 = {
    "type": "string",
    "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$",
}
ALERTMANAGER_WEBHOOK = {
    "type": "object",
    "required": [
        "version",
        "groupKey",
        "truncatedAlerts",
        "status",
        "receiver",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "alerts",
    ],
    "additionalProperties": False,
    "properties": {
        "version": {"const": "4"},
        "groupKey": {"type": "string"},
        "truncatedAlerts": {"type": "integer", "minimum": 0},
        "status": {"enum": ["firing", "resolved"]},
        "receiver": {"type": "string"},
        "groupLabels": _KV,
        "commonLabels": _KV,
        "commonAnnotations": _KV,
        "externalURL": {"type": "string"},
        "alerts": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": [
                    "status",
                    "labels",
                    "annotations",
                    "startsAt",
                    "endsAt",
                    "generatorURL",
                    "fingerprint",
                ],
                "additionalProperties": False,
                "properties": {
                    "status": {"enum": ["firing", "resolved"]},
                    "labels": {**_KV, "required": ["alertname"]},
                    "annotations": _KV,
                    "startsAt": _RFC3339,
                    "endsAt": _RFC3339,
                    "generatorURL": {"type": "string"},
                    "fingerprint": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
                },
            },
        },
    },
}


def message_of(record: dict[str, Any], kind: str = "breach", **options: Any) -> dict[str, Any]:
    event = decode_event(json.dumps(record).encode(), kind)  # type: ignore[arg-type]
    body: dict[str, Any] = json.loads(encode(webhook_message(event, **options)))
    return body


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({}, "cbf29ce484222325"),
        ({"name": "garland, briggs", "fear": "love is not enough"}, "507a62d79ee76c9a"),
    ],
)
def test_fingerprint_is_alertmanagers(labels: dict[str, str], expected: str) -> None:
    # Vectors of prometheus/common model.LabelSet.Fingerprint (5799056148416392346).
    assert fingerprint(labels) == expected
    assert int("507a62d79ee76c9a", 16) == 5799056148416392346


def test_fingerprint_ignores_label_order_but_not_values() -> None:
    assert fingerprint({"a": "b", "c": "d"}) == fingerprint({"c": "d", "a": "b"})
    assert fingerprint({"a": "b"}) != fingerprint({"a": "c"})
    assert fingerprint({"ab": ""}) != fingerprint({"a": "b"})


def test_an_opened_breach_is_a_firing_alert_with_its_series_as_labels(make_breach: Any) -> None:
    body = message_of(make_breach())
    jsonschema.validate(body, ALERTMANAGER_WEBHOOK)
    [alert] = body["alerts"]
    assert alert["status"] == body["status"] == "firing"
    assert alert["labels"] == {
        "alertname": "TailguardBreach",
        "severity": "page",
        "service": "chat",
        "model": "llama-3.1-8b",
        "variant": "default",
        "tenant": "acme",
        "slo": "ttft-p99",
        "kind": "burn_rate",
        "breach_id": "b1",
    }
    assert alert["startsAt"] == "2024-06-01T12:09:00.000Z"
    assert alert["endsAt"] == GO_ZERO_TIME
    assert alert["fingerprint"] == fingerprint(alert["labels"])
    notes = alert["annotations"]
    assert notes["event_id"] == "b1:0"
    assert notes["state"] == "opened"
    assert notes["summary"] == (
        "page: burn_rate breach of ttft-p99 on chat/llama-3.1-8b/default/acme (opened)"
    )
    assert "burn rates 1h 14.9×, 5m 100.0×" in notes["description"]
    assert "error budget left 42%" in notes["description"]
    assert notes["attribution"] == "queue_wait 62% · prefix_cache_miss 30%"
    assert notes["exemplars"] == (
        "4bf92f3577b34da6a3ce929d0e0e4736,00f067aa0ba902b7a3ce929d0e0e4736"
    )
    assert notes["stages"] == "prefill +1290.0 ms (×7.14)"
    assert body["commonLabels"] == alert["labels"]
    assert body["commonAnnotations"] == notes
    assert body["groupLabels"] == {"alertname": "TailguardBreach", "breach_id": "b1"}
    assert body["groupKey"] == '{}:{alertname="TailguardBreach", breach_id="b1"}'
    assert body["version"] == "4"
    assert body["truncatedAlerts"] == 0
    assert body["receiver"] == "tailguard"


def test_a_resolved_breach_ends_at_resolved_ms_with_the_same_fingerprint(
    make_breach: Any,
) -> None:
    opened = message_of(make_breach())
    resolved = message_of(
        make_breach(
            state="resolved", seq=2, event_id="b1:2", resolved_ms=1_717_244_400_000, rules=[]
        )
    )
    jsonschema.validate(resolved, ALERTMANAGER_WEBHOOK)
    alert = resolved["alerts"][0]
    assert alert["status"] == resolved["status"] == "resolved"
    assert alert["endsAt"] == "2024-06-01T12:20:00.000Z"
    assert alert["startsAt"] == opened["alerts"][0]["startsAt"]
    assert alert["fingerprint"] == opened["alerts"][0]["fingerprint"]
    assert resolved["groupKey"] == opened["groupKey"]
    assert alert["annotations"]["event_id"] == "b1:2"


def test_different_breaches_have_different_fingerprints(make_breach: Any) -> None:
    one = message_of(make_breach())["alerts"][0]["fingerprint"]
    other = message_of(make_breach(breach_id="b2", event_id="b2:0"))["alerts"][0]["fingerprint"]
    assert one != other


def test_a_silent_degradation_keeps_its_reason_and_leaves_empty_fields_out(
    make_breach: Any,
) -> None:
    record = make_breach(
        kind="silent_degradation",
        severity="ticket",
        slo="latency_attainment",
        burn_rates={},
        budget_remaining=None,
        reason="latency SLO attainment 41.20 % (baseline 99.98 %)",
        exemplars=[],
        attribution=[],
        stages=[],
    )
    record["series"]["tenant"] = ""
    body = message_of(record)
    jsonschema.validate(body, ALERTMANAGER_WEBHOOK)
    alert = body["alerts"][0]
    assert "tenant" not in alert["labels"]  # Prometheus: an empty label is no label
    assert alert["labels"]["kind"] == "silent_degradation"
    assert alert["annotations"]["description"] == (
        "latency SLO attainment 41.20 % (baseline 99.98 %)"
    )
    assert alert["annotations"]["exemplars"] == ""
    assert alert["annotations"]["attribution"] == ""


def test_a_burn_rate_update_says_why(make_breach: Any) -> None:
    body = message_of(make_breach(state="updated", seq=1, event_id="b1:1", reason="severity"))
    assert body["status"] == "firing"
    assert "updated: the severity changed" in body["alerts"][0]["annotations"]["description"]


@pytest.mark.parametrize(
    ("decision", "severity"),
    [("rollback", "page"), ("hold", "ticket"), ("promote", "info"), ("continue", "info")],
)
def test_a_release_decision_is_a_firing_alert_with_the_decisions_severity(
    make_release: Any, decision: str, severity: str
) -> None:
    body = message_of(make_release(decision=decision), "release")
    jsonschema.validate(body, ALERTMANAGER_WEBHOOK)
    alert = body["alerts"][0]
    assert alert["status"] == "firing"
    assert alert["labels"] == {
        "alertname": "TailguardRelease",
        "severity": severity,
        "experiment": "exp-42",
        "decision": decision,
        "arm": "canary",
    }
    assert alert["startsAt"] == "2024-06-01T12:30:00.000Z"
    assert alert["endsAt"] == GO_ZERO_TIME
    notes = alert["annotations"]
    assert notes["summary"] == f"{severity}: {decision} of arm canary in experiment exp-42"
    assert notes["description"].startswith("ttft p95 guardrail")
    assert json.loads(notes["evidence"])["ttft_p95_ms"]["canary"] == 437.0
    assert notes["weights"] == "control=1.0, canary=0.0"
    assert notes["event_id"] == "exp-42:rollback:0"
    assert body["groupLabels"] == {"alertname": "TailguardRelease", "experiment": "exp-42"}


def test_receiver_urls_and_generator_placeholders(make_breach: Any) -> None:
    body = message_of(
        make_breach(),
        receiver="team-llm",
        external_url="https://tailguard.example",
        generator_url="https://tailguard.example/breaches/{breach_id}?e={event_id}&x={other}",
    )
    jsonschema.validate(body, ALERTMANAGER_WEBHOOK)
    assert body["receiver"] == "team-llm"
    assert body["externalURL"] == "https://tailguard.example"
    assert body["alerts"][0]["generatorURL"] == (
        "https://tailguard.example/breaches/b1?e=b1:0&x={other}"
    )


def test_the_workers_own_breach_payload_maps_to_a_valid_message() -> None:
    from tailguard.agents.breaches import breach_payload
    from tailguard.streams.breach import Transition

    t = Transition(
        state="opened",
        breach_id="c0ffee",
        seq=0,
        at_ms=1_717_243_740_000,
        series_key="chat|m|default|default",
        slo="ttft-p99",
        severity="page",
        opened_ms=1_717_243_740_000,
        resolved_ms=None,
        burn_rates={"1h": 15.0, "5m": 90.0},
        peak_burn_rates={"1h": 15.0, "5m": 90.0},
        sli={"1h": 0.85},
        budget_remaining=0.9,
        rules=("page-1h-5m",),
    )
    payload = breach_payload(
        t, ("chat", "m", "default", "default"), exemplars=["ab" * 16], gpu=[], now_ms=1
    )
    body = message_of(json.loads(json.dumps(payload)))
    jsonschema.validate(body, ALERTMANAGER_WEBHOOK)
    assert body["alerts"][0]["labels"]["breach_id"] == "c0ffee"
    assert body["alerts"][0]["annotations"]["event_id"] == "c0ffee:0"
