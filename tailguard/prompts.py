"""``tailguard prompts``: publish prompt versions to the registry and list them.

::

    tailguard prompts add FILE [--version V] [--owner O] [--parent P] [--hash-only]
    tailguard prompts list

The registry is the compacted topic ``tailguard.prompts`` (key:
``prompt_version``, value: ``tailguard.prompt.v1``). ``add`` reads it first: a
version is immutable, so registering the same version with the same text again
sends nothing, and with another text is refused. ``--hash-only`` publishes the
text's SHA-256 instead of the text (the workers then group the version with its
``--parent``). ``list`` reads the topic to its end and groups the versions the
way every worker does (:class:`~tailguard.streams.prompt_groups.PromptGrouper`,
threshold from ``TAILGUARD_PROMPT_THRESHOLD``).
"""

import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import msgspec

from tailguard import catalogue as cat
from tailguard.errors import TailguardError

__all__ = [
    "PromptError",
    "Registered",
    "build_record",
    "prompt_threshold",
    "prompts",
    "publish_prompt",
    "read_registry",
    "read_text",
]


class PromptError(TailguardError, ValueError):
    """A prompt file or registration that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Registered:
    """What ``add`` did: ``sent`` False when the same version and text were there already."""

    version: str
    text_sha256: str
    sent: bool
    partition: int = -1
    offset: int = -1


def prompt_threshold() -> float:
    """The grouping threshold (env ``TAILGUARD_PROMPT_THRESHOLD``, default the model's)."""
    from tailguard.streams.prompt_groups import DEFAULT_THRESHOLD

    raw = os.environ.get("TAILGUARD_PROMPT_THRESHOLD", "")
    if not raw:
        return float(DEFAULT_THRESHOLD)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not -1.0 <= value <= 1.0:
        msg = f"TAILGUARD_PROMPT_THRESHOLD is a cosine similarity in [-1, 1], got {raw!r}"
        raise PromptError(msg)
    return value


def read_text(path: Path) -> str:
    """The prompt text of ``path`` (UTF-8, not empty)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        msg = f"prompt file {path} does not exist"
        raise PromptError(msg) from None
    except IsADirectoryError:
        msg = f"prompt file {path} is a directory; give one text file per version"
        raise PromptError(msg) from None
    except UnicodeDecodeError as exc:
        msg = f"prompt file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise PromptError(msg) from None
    except OSError as exc:
        msg = f"cannot read prompt file {path}: {exc.strerror}"
        raise PromptError(msg) from None
    if not text.strip():
        msg = f"prompt file {path} is empty"
        raise PromptError(msg)
    return text


def build_record(
    text: str,
    version: str,
    *,
    owner: str | None = None,
    parent: str | None = None,
    hash_only: bool = False,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """The ``tailguard.prompt.v1`` record of one version (validated)."""
    from tailguard.schemas.prompts import PROMPT_SCHEMA, decode_prompt, prompt_event_id

    digest = hashlib.sha256(text.encode()).hexdigest()
    record: dict[str, Any] = {
        "schema": PROMPT_SCHEMA,
        "event_id": prompt_event_id(version, digest),
        "ts_ms": int(time.time() * 1000) if now_ms is None else now_ms,
        "prompt_version": version,
        "text": None if hash_only else text,
        "text_sha256": digest,
        "owner": owner,
        "parent_version": parent,
    }
    try:
        decode_prompt(json.dumps(record).encode())
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        msg = f"prompt version {version!r} cannot be registered: {exc}"
        raise PromptError(msg) from None
    return record


def _topic_or_fail(consumer: Any, broker: str, topic: str) -> None:
    from confluent_kafka import KafkaException

    try:
        topics = consumer.list_topics(timeout=10).topics
    except KafkaException as exc:
        msg = f"cannot read the topics of {broker}: {exc.args[0]}"
        raise PromptError(msg) from None
    if topic not in topics:
        msg = (
            f"topic {topic} does not exist on {broker}: create the catalogue with "
            "`tailguard topics create` (and check TAILGUARD_TOPIC_PREFIX)"
        )
        raise PromptError(msg)


def read_registry(
    broker: str, *, prefix: str | None = None, timeout_s: float = 30.0
) -> dict[str, dict[str, Any]]:
    """Every registered version (latest record per key), in registry (offset) order.

    Records that are not valid ``tailguard.prompt.v1`` are skipped, as the
    workers dead-letter them.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from tailguard.kafka_admin import ensure_broker
    from tailguard.schemas.prompts import decode_prompt

    ensure_broker(broker, timeout_s=min(10.0, timeout_s))
    topic = (cat.default_prefix() if prefix is None else prefix) + cat.PROMPTS
    consumer = Consumer(
        {
            "bootstrap.servers": broker,
            "group.id": f"tailguard-prompts-cli-{uuid.uuid4().hex}",  # never joined
            "enable.auto.commit": False,
            "log_level": 2,
        }
    )
    registry: dict[str, dict[str, Any]] = {}
    try:
        _topic_or_fail(consumer, broker, topic)
        tp = TopicPartition(topic, 0)
        high = _high_watermark(consumer, tp)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while high > 0:
            for m in consumer.consume(500, timeout=0.5):
                raw_key = m.key()
                if m.error() is not None or raw_key is None:
                    continue
                key = raw_key.decode("utf-8", "replace")
                if m.value() is None:
                    registry.pop(key, None)
                    continue
                try:
                    record = decode_prompt(m.value())
                except (msgspec.ValidationError, msgspec.DecodeError):
                    continue
                if key in registry:
                    continue  # immutable: the first registration of a version stands
                registry[key] = msgspec.to_builtins(record)
            # Compaction leaves gaps: the position, not the last offset seen, says "done".
            if consumer.position([tp])[0].offset >= high:
                break
            if time.monotonic() > deadline:
                msg = f"{topic} not read to its end (offset {high}) within {timeout_s:.0f} s"
                raise PromptError(msg)
    finally:
        consumer.close()
    return registry


def _high_watermark(consumer: Any, tp: Any, attempts: int = 10) -> int:
    """The partition's end offset; retried while a just-created topic elects its leader."""
    from confluent_kafka import KafkaError, KafkaException

    settling = {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._TIMED_OUT,
    }
    for attempt in range(attempts):
        try:
            _low, high = consumer.get_watermark_offsets(tp, timeout=10)
            return int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            transient = isinstance(error, KafkaError) and (
                error.code() in settling or error.retriable()
            )
            if not transient or attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
    msg = "unreachable"
    raise AssertionError(msg)


def publish_prompt(broker: str, record: dict[str, Any], *, prefix: str | None = None) -> Registered:
    """Send ``record`` to the registry unless its version is there; refuse a changed text."""
    from confluent_kafka import Producer

    version, digest = record["prompt_version"], record["text_sha256"]
    held = read_registry(broker, prefix=prefix).get(version)
    if held is not None:
        if held.get("text_sha256") == digest or (
            held.get("text") is not None
            and hashlib.sha256(held["text"].encode()).hexdigest() == digest
        ):
            return Registered(version, digest, sent=False)
        msg = (
            f"prompt version {version!r} is registered with another text; versions are "
            "immutable: register the new text under a new --version"
        )
        raise PromptError(msg)
    topic = (cat.default_prefix() if prefix is None else prefix) + cat.PROMPTS
    producer = Producer(
        {
            "bootstrap.servers": broker,
            "acks": "all",
            "enable.idempotence": True,
            "message.timeout.ms": 10_000,
            "log_level": 2,
        }
    )
    report: list[tuple[Any, Any]] = []
    producer.produce(
        topic,
        key=version.encode(),
        value=json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode(),
        on_delivery=lambda err, m: report.append((err, m)),
    )
    producer.flush(15)
    if not report or report[0][0] is not None:
        why = report[0][0] if report else "no delivery report within 15 s (broker away?)"
        msg = f"prompt version {version!r} was not delivered to {topic}: {why}"
        raise PromptError(msg)
    delivered = report[0][1]
    return Registered(version, digest, True, delivered.partition(), delivered.offset())


# -- the click commands -------------------------------------------------------

_BROKER = click.option(
    "--broker",
    default=lambda: os.environ.get("TAILGUARD_BROKER", "localhost:9092"),
    show_default="env TAILGUARD_BROKER or localhost:9092",
    help="Kafka bootstrap servers.",
)


@click.group()
def prompts() -> None:
    """The prompt registry (tailguard.prompts) and its prompt groups."""


@prompts.command("add")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--version", "version", default=None, help="Prompt version (default: FILE's stem).")
@click.option("--owner", default=None, help="Who owns the prompt (team or person).")
@click.option("--parent", default=None, help="The version this one was derived from.")
@click.option(
    "--hash-only",
    is_flag=True,
    help="Publish the text's SHA-256, not the text (grouped with --parent).",
)
@_BROKER
def prompts_add(
    file: Path,
    version: str | None,
    owner: str | None,
    parent: str | None,
    hash_only: bool,
    broker: str,
) -> None:
    """Register the prompt in FILE as one version (idempotent)."""
    text = read_text(file)
    name = version if version is not None else file.stem
    record = build_record(text, name, owner=owner, parent=parent, hash_only=hash_only)
    done = publish_prompt(broker, record)
    what = "hash" if hash_only else "text"
    if done.sent:
        click.echo(
            f"registered {done.version} ({what}, sha256 {done.text_sha256[:12]}) "
            f"at offset {done.offset}"
        )
    else:
        click.echo(f"{done.version} is already registered with this text; nothing sent")


@prompts.command("list")
@_BROKER
def prompts_list(broker: str) -> None:
    """Every registered version with its group (as the workers compute it), owner and parent."""
    from tailguard.streams.prompt_groups import PromptGrouper

    registry = read_registry(broker)
    grouper = PromptGrouper(prompt_threshold())
    click.echo(f"{'version':24} {'group':27} {'owner':16} parent")
    for version, rec in registry.items():
        group = grouper.add(version, rec.get("text"), rec.get("parent_version"))
        click.echo(
            f"{version:24} {group:27} {rec.get('owner') or '-':16} "
            f"{rec.get('parent_version') or '-'}"
        )
    click.echo(f"{len(registry)} version(s) in {len(grouper.groups())} group(s)")
