"""``tailguard alerts``: subscribers of the breaches and releases topics.

::

    tailguard alerts follow [--severity page] [--service chat] [--kind burn_rate]
                            [--topic breaches|releases|both] [--from-beginning] [--output json]
                            [--hide-silenced]
    tailguard alerts forward --webhook http://alertmanager-bridge:9095/hook
                            [--group tailguard-alerts-forward] [--instance-id fwd-1]
                            [--state-file PATH] [--severity page] [--header 'Authorization: …']
                            [--include-silenced]

Breach records an admin silence matched carry ``silenced: true``: ``follow``
shows them dimmed and marked, ``forward`` does not POST them (their
``resolved`` transition excepted) unless told ``--include-silenced``.

:func:`tailguard.cli.main` attaches :data:`alerts` to the main ``tailguard``
group; errors are one ``error:`` line and exit status 2 (a missing broker
included), Ctrl-C or SIGTERM a clean stop.
"""

import logging
import os
import re
from pathlib import Path

import click

from tailguard.alerts.delivery import Backoff
from tailguard.alerts.events import DECISIONS, SEVERITIES, EventFilter, EventKind
from tailguard.catalogue import BREACHES, RELEASES, default_prefix

__all__ = ["alerts", "topic_kinds"]

_BROKER = click.option(
    "--broker",
    default=lambda: os.environ.get("TAILGUARD_BROKER", "localhost:9092"),
    show_default="env TAILGUARD_BROKER or localhost:9092",
    help="Kafka bootstrap servers.",
)
_TOPIC = click.option(
    "--topic",
    type=click.Choice(["breaches", "releases", "both"]),
    default="both",
    show_default=True,
    help="tailguard.breaches, tailguard.releases or both (with TAILGUARD_TOPIC_PREFIX).",
)
_SEVERITY = click.option(
    "--severity",
    "severities",
    multiple=True,
    type=click.Choice(SEVERITIES),
    help="Only these severities (repeatable). Releases: rollback=page, hold=ticket, "
    "promote/continue=info.",
)
_SERVICE = click.option(
    "--service",
    "services",
    multiple=True,
    metavar="NAME",
    help="Only this service, a name or a glob such as 'chat-*' (repeatable). Releases pass "
    "only when they name a service.",
)
_KIND = click.option(
    "--kind",
    "kinds",
    multiple=True,
    metavar="KIND",
    help="Only breaches of this kind: burn_rate, silent_degradation, interference, … "
    "(repeatable; excludes releases).",
)
_DECISION = click.option(
    "--decision",
    "decisions",
    multiple=True,
    type=click.Choice(DECISIONS),
    help="Only release decisions of this kind (repeatable; excludes breaches).",
)
_FROM_BEGINNING = click.option(
    "--from-beginning",
    is_flag=True,
    help="Start at the oldest record (follow), or — for a group without committed offsets — "
    "deliver everything the topics still hold (forward).",
)


def topic_kinds(which: str) -> dict[str, EventKind]:
    """Full topic names (namespace prefix included) → the events they carry."""
    prefix = default_prefix()
    kinds: dict[str, EventKind] = {}
    if which in ("breaches", "both"):
        kinds[prefix + BREACHES] = "breach"
    if which in ("releases", "both"):
        kinds[prefix + RELEASES] = "release"
    return kinds


@click.group()
def alerts() -> None:
    """Subscribers: follow breaches and decisions, or forward them to a webhook."""


@alerts.command("follow")
@_BROKER
@_TOPIC
@_SEVERITY
@_SERVICE
@_KIND
@_DECISION
@_FROM_BEGINNING
@click.option(
    "--output",
    type=click.Choice(["rich", "json"]),
    default="rich",
    show_default=True,
    help="rich: one coloured line per event; json: the event's JSON object per line.",
)
@click.option("-n", "--limit", type=click.IntRange(min=1), default=None, help="Stop after N.")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds.")
@click.option(
    "--hide-silenced",
    is_flag=True,
    help="Leave out breach transitions an admin silence matched (default: shown dimmed, "
    "marked [silenced ID]).",
)
def follow(
    broker: str,
    topic: str,
    severities: tuple[str, ...],
    services: tuple[str, ...],
    kinds: tuple[str, ...],
    decisions: tuple[str, ...],
    from_beginning: bool,
    output: str,
    limit: int | None,
    duration: float | None,
    hide_silenced: bool,
) -> None:
    """Print breaches and release decisions as they arrive (Ctrl-C stops)."""
    from tailguard.alerts.follow import follow_events

    follow_events(
        broker,
        topic_kinds(topic),
        event_filter=EventFilter.of(
            severities=severities,
            services=services,
            kinds=kinds,
            decisions=decisions,
            include_silenced=not hide_silenced,
        ),
        from_beginning=from_beginning,
        output=output,
        limit=limit,
        duration_s=duration,
    )


def _default_state_file(group: str, instance_id: str | None) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", group + (f".{instance_id}" if instance_id else ""))
    return Path(".state") / "alerts" / f"{name}.json"


_FORWARD_HELP = """Forward breaches and release decisions to an Alertmanager-compatible
webhook: one POST per event, in Alertmanager's webhook format (version 4), with an
Idempotency-Key header (the event id). Breach transitions an admin silence matched
(silenced: true) are committed without a POST, except resolved ones (they close an
alert that fired before the silence); --include-silenced POSTs them all.

\b
A failed POST (connection error, timeout, non-2xx) is retried with exponential
backoff and jitter, forever, until a 2xx or SIGTERM; nothing is skipped. The
Kafka offset is committed only after the 2xx, and the event id is first written
to --state-file, so a forwarder restarted after a crash does not POST an event
again that it had delivered. Receivers should still deduplicate on the
Idempotency-Key: a crash in the milliseconds between the 2xx and the state file
write, or an answer lost on the way back, means a second POST.

\b
Examples:
  tailguard alerts forward --webhook http://127.0.0.1:9095/alerts --severity page
  tailguard alerts forward --webhook https://hooks.example/x --topic breaches \\
      --instance-id fwd-1 --header 'Authorization: Bearer $TOKEN'
"""


@alerts.command("forward", help=_FORWARD_HELP)
@_BROKER
@click.option("--webhook", "url", required=True, metavar="URL", help="http(s) URL to POST to.")
@_TOPIC
@_SEVERITY
@_SERVICE
@_KIND
@_DECISION
@_FROM_BEGINNING
@click.option(
    "--send-resolved/--no-send-resolved",
    default=True,
    show_default=True,
    help="Forward breaches' resolved transitions (Alertmanager's send_resolved).",
)
@click.option(
    "--include-silenced",
    is_flag=True,
    help="Also POST breach transitions an admin silence matched (silenced: true). By default "
    "they do not page: only their resolved transition is sent, to close an alert that "
    "fired before the silence.",
)
@click.option(
    "--group",
    default="tailguard-alerts-forward",
    show_default=True,
    help="Kafka consumer group (its committed offsets say what was delivered).",
)
@click.option(
    "--instance-id",
    default=None,
    help="Static group membership (group.instance.id): a restart under the same id takes "
    "its partitions back at once. One forwarder per id.",
)
@click.option(
    "--state-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Delivery log (event ids delivered per partition). Default: "
    ".state/alerts/<group>[.<instance-id>].json. Keep it on persistent storage.",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="'NAME: VALUE'",
    help="Extra HTTP header, e.g. 'Authorization: Bearer …' (repeatable).",
)
@click.option("--timeout", type=float, default=10.0, show_default=True, help="POST timeout, s.")
@click.option(
    "--backoff-base", type=float, default=0.5, show_default=True, help="First retry delay, s."
)
@click.option(
    "--backoff-max", type=float, default=60.0, show_default=True, help="Longest retry delay, s."
)
@click.option(
    "--receiver",
    default="tailguard",
    show_default=True,
    help="The message's receiver field (Alertmanager's receiver name).",
)
@click.option("--external-url", default="", help="The message's externalURL field.")
@click.option(
    "--generator-url",
    default="",
    help="Each alert's generatorURL; may hold {event_id}, {breach_id}, {experiment}.",
)
@click.option("--loglevel", default="info", show_default=True)
def forward(
    broker: str,
    url: str,
    topic: str,
    severities: tuple[str, ...],
    services: tuple[str, ...],
    kinds: tuple[str, ...],
    decisions: tuple[str, ...],
    from_beginning: bool,
    send_resolved: bool,
    include_silenced: bool,
    group: str,
    instance_id: str | None,
    state_file: Path | None,
    headers: tuple[str, ...],
    timeout: float,
    backoff_base: float,
    backoff_max: float,
    receiver: str,
    external_url: str,
    generator_url: str,
    loglevel: str,
) -> None:
    from tailguard.alerts.forward import ForwardOptions, run_forward
    from tailguard.alerts.webhook import HttpWebhook, parse_header

    logging.basicConfig(
        level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    webhook = HttpWebhook(url, timeout_s=timeout, headers=tuple(parse_header(h) for h in headers))
    opts = ForwardOptions(
        broker=broker,
        webhook=webhook,
        kinds=topic_kinds(topic),
        group=group,
        state_file=state_file or _default_state_file(group, instance_id),
        instance_id=instance_id,
        from_beginning=from_beginning,
        event_filter=EventFilter.of(
            severities=severities,
            services=services,
            kinds=kinds,
            decisions=decisions,
            send_resolved=send_resolved,
            include_silenced=include_silenced,
        ),
        backoff=Backoff(base_s=backoff_base, max_s=backoff_max),
        receiver=receiver,
        external_url=external_url,
        generator_url=generator_url,
    )
    run_forward(opts)
