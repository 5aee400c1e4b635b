"""``tailguard alerts follow``: breaches and release decisions as they arrive.

Like ``tailguard tail`` (:func:`tailguard.console.follow`) it reads with a
throw-away consumer group, assigned to every partition, committing nothing;
unlike it, it reads several topics through one consumer (breaches and
releases interleave in arrival order) and raises
:class:`~tailguard.console.TopicMissing` rather than exiting, so the CLI
prints one ``error:`` line. One line per event (rich colours on a terminal,
plain text in a pipe)::

    2024-06-01 12:09:00Z  OPENED    page    burn_rate   chat/llama-3.1-8b/default/default
        ttft-p99 · burn 1h 20.0× 5m 40.0× · budget 50% · queue_wait 62% · 3 exemplars
    2024-06-01 12:10:00Z  ROLLBACK  page    release     exp-42 arm canary  ttft p95 +40%

(the details follow the subject on the same line). A breach transition an
admin silence matched (``silenced: true``) is shown dimmed and marked, it is
not left out (``--hide-silenced`` leaves it out)::

    2024-06-01 12:11:00Z  UPDATED   page    burn_rate   chat/llama-3.1-8b/default/default
        [silenced sil-3f2a] ttft-p99 · burn 1h 16.0× 5m 30.0×

``--output json`` prints each event's JSON object on one line instead.
"""

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition
from rich.console import Console
from rich.markup import escape

from tailguard.alerts.errors import BadEvent
from tailguard.alerts.events import AlertEvent, EventFilter, EventKind, decode_event
from tailguard.console import TopicMissing
from tailguard.errors import TailguardError
from tailguard.kafka_admin import ensure_broker

__all__ = ["event_line", "follow_events", "read_events"]

_STATE_STYLE = {
    "opened": "bold red",
    "updated": "yellow",
    "resolved": "green",
    "rollback": "bold red",
    "hold": "yellow",
    "promote": "green",
    "continue": "cyan",
}
_SERIES_FIELDS = ("service", "model", "variant", "tenant")
_SEVERITY_STYLE = {"page": "bold red", "ticket": "yellow", "info": "dim"}


def read_events(
    broker: str,
    kinds: Mapping[str, EventKind],
    *,
    from_beginning: bool = False,
    duration_s: float | None = None,
    on_ready: Callable[[], None] | None = None,
) -> Iterator[tuple[str, AlertEvent | BadEvent]]:
    """Yield ``(topic, event)`` for every record of the ``kinds`` topics as it arrives.

    A record that is not an event comes as the :class:`BadEvent` saying why.
    Stops after ``duration_s`` seconds when given. ``on_ready`` is called once
    the broker answered and the topics exist.
    """
    admin = ensure_broker(broker)
    listed = admin.list_topics(timeout=10).topics
    assignment = []
    for topic in kinds:
        meta = listed.get(topic)
        if meta is None or meta.error is not None:
            why = (
                f"topic {topic} does not exist on {broker}; run `tailguard topics create` "
                "(or set TAILGUARD_TOPIC_PREFIX to the deployment's namespace)"
            )
            raise TopicMissing(why)
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        assignment += [TopicPartition(topic, p, start) for p in meta.partitions]
    consumer = Consumer(
        {
            "bootstrap.servers": broker,
            "group.id": f"tailguard-alerts-follow-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    with closing(consumer):
        consumer.assign(assignment)
        if on_ready is not None:
            on_ready()
        began = time.monotonic()
        while duration_s is None or time.monotonic() - began < duration_s:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                if error.fatal():
                    text = f"could not read {msg.topic()}: {error.str()}"
                    raise TailguardError(text)
                continue  # transient (broker restarting): librdkafka retries
            topic = str(msg.topic())
            try:
                yield topic, decode_event(msg.value(), kinds[topic])
            except BadEvent as exc:
                yield topic, exc


def _when(ms: Any) -> str:
    if not isinstance(ms, int | float):
        return "—"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _breach_details(b: Mapping[str, Any]) -> list[str]:
    parts = [str(b.get("slo", "?"))]
    rates = b.get("burn_rates")
    if isinstance(rates, dict) and rates:
        shown = " ".join(
            f"{w} {r:.1f}×" for w, r in list(rates.items())[:2] if isinstance(r, int | float)
        )
        parts.append(f"burn {shown}")
    budget = b.get("budget_remaining")
    if isinstance(budget, int | float):
        parts.append(f"budget {budget:.0%}")
    causes = b.get("attribution")
    if isinstance(causes, list) and causes and isinstance(causes[0], dict):
        top = causes[0]
        share = top.get("share")
        parts.append(
            f"{top.get('cause')} {share:.0%}" if isinstance(share, int | float) else str(top)
        )
    exemplars = b.get("exemplars")
    if isinstance(exemplars, list) and exemplars:
        parts.append(f"{len(exemplars)} exemplar{'s' if len(exemplars) != 1 else ''}")
    return parts


def event_line(event: AlertEvent) -> str:
    """One line of rich markup for ``event``."""
    b = event.body
    if event.kind == "breach":
        verb = str(b["state"])
        s = b["series"]
        what = event.breach_kind or "breach"
        subject = "/".join(str(s.get(k, "default")) for k in _SERIES_FIELDS)
        details = _breach_details(b)
        when = _when(b.get("at_ms", b.get("ts_ms")))
    else:
        verb = str(event.decision)
        what = "release"
        subject = f"{b['experiment']}" + (f" arm {b['arm']}" if b.get("arm") else "")
        reasons = b.get("reasons")
        details = [str(r) for r in reasons[:2]] if isinstance(reasons, list) else []
        when = _when(b.get("ts_ms"))
    vstyle = _STATE_STYLE.get(verb, "bold")
    sstyle = _SEVERITY_STYLE.get(event.severity, "bold")
    subject_style = "bold"
    mark = ""
    if event.silenced:  # muted: still shown, but it does not look like a page
        vstyle = sstyle = subject_style = "dim"
        silence = b.get("silence_id")
        mark = f"  [dim italic]{escape(f'[silenced {silence}]' if silence else '[silenced]')}[/]"
    return (
        f"[dim]{when}[/dim]  [{vstyle}]{escape(verb.upper()):<9}[/{vstyle}] "
        f"[{sstyle}]{escape(event.severity):<7}[/{sstyle}] {escape(what):<19} "
        f"[{subject_style}]{escape(subject)}[/{subject_style}]"
        + mark
        + (f"  [dim]{escape(' · '.join(details))}[/dim]" if details else "")
    )


def follow_events(
    broker: str,
    kinds: Mapping[str, EventKind],
    *,
    event_filter: EventFilter,
    from_beginning: bool = False,
    output: str = "rich",
    limit: int | None = None,
    duration_s: float | None = None,
    console: Console | None = None,
) -> int:
    """Print matching events until Ctrl-C, ``limit`` events or ``duration_s``; returns
    how many were printed. A record that is not an event is noted on stderr."""
    out = console or Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    shown = 0

    def banner() -> None:
        if output != "json":
            err.print(f"[dim]following {', '.join(kinds)} on {broker} (Ctrl-C to stop)[/dim]")

    try:
        for topic, item in read_events(
            broker, kinds, from_beginning=from_beginning, duration_s=duration_s, on_ready=banner
        ):
            if isinstance(item, BadEvent):
                err.print(f"[yellow]warning: a record of {topic} is not an event: {item}[/]")
                continue
            if not event_filter.matches(item):
                continue
            if output == "json":
                out.out(json.dumps(item.body, separators=(",", ":")), highlight=False)
            else:
                out.print(event_line(item))
            shown += 1
            if limit is not None and shown >= limit:
                break
    except KeyboardInterrupt:
        pass
    if output != "json":
        err.print(f"[dim]{shown} event{'s' if shown != 1 else ''} shown[/dim]")
    return shown
