"""Breaches and release decisions as Alertmanager webhook messages.

The message is what Alertmanager's webhook receiver POSTs (``webhook_config``,
https://prometheus.io/docs/alerting/latest/configuration/#webhook_config; Go
types ``notify/webhook.Message`` embedding ``template.Data``), so a receiver
written for Alertmanager — PagerDuty/Opsgenie bridges, chat bots, an
Alertmanager-aware incident tool — takes tailguard's events unchanged::

    {
      "version": "4",
      "groupKey": <string>,              key of the alert group
      "truncatedAlerts": <int>,          alerts left out by max_alerts (always 0 here)
      "status": "<resolved|firing>",
      "receiver": <string>,
      "groupLabels": <object>,
      "commonLabels": <object>,
      "commonAnnotations": <object>,
      "externalURL": <string>,
      "alerts": [{"status", "labels", "annotations", "startsAt", "endsAt",
                  "generatorURL", "fingerprint"}]
    }

Labels and annotations are string → string. Each tailguard event becomes one
message holding one alert, so ``commonLabels`` / ``commonAnnotations`` are
that alert's own (what Alertmanager's ``template.Data`` computes for a group
of one) and ``status`` is the alert's.

A breach (``tailguard.breach.v1``)::

    labels       alertname=TailguardBreach, severity, service, model, variant, tenant,
                 slo, kind, breach_id               (a label without a value is left out)
    annotations  summary, description, attribution, exemplars, stages, state, event_id
    status       firing (opened, updated) | resolved (resolved)
    startsAt     opened_ms     endsAt  resolved_ms, or Go's zero time while firing

A release decision (``tailguard.release.v1``)::

    labels       alertname=TailguardRelease, severity (rollback → page, hold → ticket,
                 promote/continue → info), experiment, decision, arm
    annotations  summary, description (the reasons), evidence, weights, event_id
    status       firing        startsAt  ts_ms     endsAt  Go's zero time

``fingerprint`` is Alertmanager's own (prometheus/common ``LabelSet.Fingerprint``):
64-bit FNV-1a over the label names in byte order, each name and value followed
by the byte 0xff, as 16 lower-case hex digits. Like a Prometheus alert, every
transition of one breach has the same labels and so the same fingerprint;
the annotation ``event_id`` (``breach_id:seq``, also sent as the
``Idempotency-Key`` header) tells the transitions apart and is the key a
receiver deduplicates on.
"""

import json
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from tailguard.alerts.events import AlertEvent
from tailguard.schemas.cloudevents import rfc3339_ms

__all__ = [
    "BREACH_ALERTNAME",
    "GO_ZERO_TIME",
    "RELEASE_ALERTNAME",
    "WEBHOOK_VERSION",
    "Alert",
    "WebhookMessage",
    "encode",
    "fingerprint",
    "to_alert",
    "webhook_message",
]

WEBHOOK_VERSION: Final = "4"
BREACH_ALERTNAME: Final = "TailguardBreach"
RELEASE_ALERTNAME: Final = "TailguardRelease"
#: How Go marshals a zero ``time.Time``: Alertmanager's "no end" for a firing alert.
GO_ZERO_TIME: Final = "0001-01-01T00:00:00Z"

#: Why a burn-rate breach was ``updated`` (``streams.breach.UpdateReason``), in words;
#: other kinds carry a sentence.
_UPDATE_REASONS: Final = {
    "severity": "updated: the severity changed",
    "burn_rate": "updated: a burn rate moved materially",
}
_FNV_OFFSET: Final = 14695981039346656037
_FNV_PRIME: Final = 1099511628211
_MASK: Final = (1 << 64) - 1
_SEPARATOR: Final = 0xFF


def fingerprint(labels: Mapping[str, str]) -> str:
    """Alertmanager's fingerprint of a label set (16 hex digits)."""
    h = _FNV_OFFSET
    for name in sorted(labels, key=lambda n: n.encode()):
        for part in (name, labels[name]):
            for byte in part.encode():
                h = ((h ^ byte) * _FNV_PRIME) & _MASK
            h = ((h ^ _SEPARATOR) * _FNV_PRIME) & _MASK
    return f"{h:016x}"


class Alert(msgspec.Struct, kw_only=True):
    """One alert of a webhook message (Alertmanager's ``template.Alert``)."""

    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str = msgspec.field(name="startsAt")
    ends_at: str = msgspec.field(name="endsAt")
    generator_url: str = msgspec.field(name="generatorURL")
    fingerprint: str


class WebhookMessage(msgspec.Struct, kw_only=True):
    """The JSON body of one webhook POST (Alertmanager's ``webhook.Message``)."""

    version: str = WEBHOOK_VERSION
    group_key: str = msgspec.field(name="groupKey")
    truncated_alerts: int = msgspec.field(default=0, name="truncatedAlerts")
    status: str
    receiver: str
    group_labels: dict[str, str] = msgspec.field(name="groupLabels")
    common_labels: dict[str, str] = msgspec.field(name="commonLabels")
    common_annotations: dict[str, str] = msgspec.field(name="commonAnnotations")
    external_url: str = msgspec.field(name="externalURL")
    alerts: list[Alert]


_encoder = msgspec.json.Encoder()


def encode(message: WebhookMessage) -> bytes:
    """The JSON body to POST."""
    return _encoder.encode(message)


def _labels(**values: Any) -> dict[str, str]:
    """String labels; a missing or empty value is left out (Prometheus: empty = absent)."""
    return {k: str(v) for k, v in values.items() if v is not None and v != ""}


def _when(ms: Any) -> str:
    return rfc3339_ms(int(ms)) if isinstance(ms, int | float) else GO_ZERO_TIME


def _rate(value: Any) -> str:
    return f"{value:.1f}×" if isinstance(value, int | float) else str(value)


def _percent(value: Any) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, int | float) else str(value)


def _attribution(causes: Any) -> str:
    """``queue_wait 62% · prefix_cache_miss 30%`` from the ranked causes."""
    if not isinstance(causes, list):
        return ""
    parts = [
        f"{c.get('cause')} {_percent(c.get('share'))}"
        for c in causes
        if isinstance(c, dict) and c.get("cause")
    ]
    return " · ".join(parts)


def _stages(stages: Any) -> str:
    """``prefill +1290 ms (×7.2) · queue +300 ms``: the stages whose P99 grew most."""
    if not isinstance(stages, list):
        return ""
    parts = []
    for s in stages:
        if not isinstance(s, dict) or not s.get("stage"):
            continue
        text = f"{s['stage']} +{s.get('increase_ms')} ms"
        if s.get("ratio") is not None:
            text += f" (×{s['ratio']})"
        parts.append(text)
    return " · ".join(parts)


def _breach_alert(event: AlertEvent, generator_url: str) -> Alert:
    b = event.body
    series = b["series"]
    name = "/".join(
        str(series.get(k, "default")) for k in ("service", "model", "variant", "tenant")
    )
    labels = _labels(
        alertname=BREACH_ALERTNAME,
        severity=event.severity,
        service=series.get("service"),
        model=series.get("model"),
        variant=series.get("variant"),
        tenant=series.get("tenant"),
        slo=b.get("slo"),
        kind=event.breach_kind,
        breach_id=b["breach_id"],
    )
    state = b["state"]
    kind = event.breach_kind or "breach"
    summary = f"{event.severity}: {kind} breach of {b.get('slo')} on {name} ({state})"
    details = []
    rates = b.get("burn_rates")
    if isinstance(rates, dict) and rates:
        details.append("burn rates " + ", ".join(f"{w} {_rate(r)}" for w, r in rates.items()))
    if b.get("budget_remaining") is not None:
        details.append(f"error budget left {_percent(b['budget_remaining'])}")
    reason = b.get("reason")
    if isinstance(reason, str) and reason:
        details.append(_UPDATE_REASONS.get(reason, reason))
    exemplars = b.get("exemplars")
    annotations = {
        "summary": summary,
        "description": "; ".join(details) or summary,
        "attribution": _attribution(b.get("attribution")),
        "exemplars": ",".join(str(x) for x in exemplars) if isinstance(exemplars, list) else "",
        "stages": _stages(b.get("stages")),
        "state": state,
        "event_id": event.event_id,
    }
    resolved = state == "resolved"
    return Alert(
        status="resolved" if resolved else "firing",
        labels=labels,
        annotations=annotations,
        starts_at=_when(b.get("opened_ms", b.get("at_ms", b.get("ts_ms")))),
        ends_at=_when(b.get("resolved_ms")) if resolved else GO_ZERO_TIME,
        generator_url=generator_url,
        fingerprint=fingerprint(labels),
    )


def _release_alert(event: AlertEvent, generator_url: str) -> Alert:
    b = event.body
    labels = _labels(
        alertname=RELEASE_ALERTNAME,
        severity=event.severity,
        experiment=b["experiment"],
        decision=event.decision,
        arm=b.get("arm"),
    )
    arm = f" of arm {b['arm']}" if b.get("arm") else ""
    summary = f"{event.severity}: {event.decision}{arm} in experiment {b['experiment']}"
    reasons = b.get("reasons")
    weights = b.get("weights")
    annotations = {
        "summary": summary,
        "description": "; ".join(str(r) for r in reasons)
        if isinstance(reasons, list) and reasons
        else summary,
        "evidence": json.dumps(b.get("evidence") or {}, separators=(",", ":"), sort_keys=True),
        "weights": ", ".join(f"{arm_}={w}" for arm_, w in weights.items())
        if isinstance(weights, dict)
        else "",
        "event_id": event.event_id,
    }
    return Alert(
        status="firing",
        labels=labels,
        annotations=annotations,
        starts_at=_when(b.get("ts_ms")),
        ends_at=GO_ZERO_TIME,
        generator_url=generator_url,
        fingerprint=fingerprint(labels),
    )


def to_alert(event: AlertEvent, *, generator_url: str = "") -> Alert:
    """The Alertmanager alert of one event.

    ``generator_url`` may hold ``{event_id}``, ``{breach_id}`` and ``{experiment}``
    placeholders (a link to the tool that shows the event); empty by default.
    """
    link = generator_url.format_map(
        _Placeholders(
            event_id=event.event_id,
            breach_id=str(event.body.get("breach_id", "")),
            experiment=str(event.body.get("experiment", "")),
        )
    )
    if event.kind == "breach":
        return _breach_alert(event, link)
    return _release_alert(event, link)


class _Placeholders(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _group_key(group_labels: Mapping[str, str]) -> str:
    """Alertmanager's shape: route key, ``:``, the group labels as ``{a="x", b="y"}``."""
    pairs = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(group_labels.items()))
    return "{}:{" + pairs + "}"


def webhook_message(
    event: AlertEvent,
    *,
    receiver: str = "tailguard",
    external_url: str = "",
    generator_url: str = "",
) -> WebhookMessage:
    """The webhook message that carries ``event`` as one alert.

    Groups are per breach (``alertname``, ``breach_id``) or per experiment
    (``alertname``, ``experiment``), so ``groupKey`` is stable across a
    breach's transitions, as Alertmanager's is across a group's notifications.
    """
    alert = to_alert(event, generator_url=generator_url)
    group_by = ("alertname", "breach_id") if event.kind == "breach" else ("alertname", "experiment")
    group_labels = {k: alert.labels[k] for k in group_by if k in alert.labels}
    return WebhookMessage(
        group_key=_group_key(group_labels),
        status=alert.status,
        receiver=receiver,
        group_labels=group_labels,
        common_labels=dict(alert.labels),
        common_annotations=dict(alert.annotations),
        external_url=external_url,
        alerts=[alert],
    )
