"""The CLI's side of the admin plane: build, sign and send a command, wait for its reply.

The reply consumer is positioned at the end of ``tailguard.admin.replies``
*before* the command is sent, so the reply cannot be missed; it reads
without joining a consumer group and commits nothing.
"""

import json
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tailguard import catalogue as cat
from tailguard.admin.errors import AdminError, KeyFileError, NoReply
from tailguard.admin.keys import load_key
from tailguard.schemas.signing import signed

__all__ = ["Sent", "Signer", "build_command", "send_command", "signer_from"]


@dataclass(frozen=True, slots=True)
class Signer:
    """Who signs: a key id, its secret (never shown) and the actor to name."""

    key_id: str
    secret: bytes = field(repr=False)
    actor: str


def signer_from(
    *,
    key_id: str | None,
    keys_file: str | None,
    secret_env: str | None,
    actor: str | None,
    env: Mapping[str, str] | None = None,
) -> Signer:
    """Resolve the signing key: ``--secret-env``, else the keys file, else
    ``TAILGUARD_ADMIN_SECRET``; the actor defaults to the key's bound actor, then ``$USER``."""
    env = os.environ if env is None else env
    bound: str | None = None
    if secret_env:
        if secret_env not in env:
            msg = f"environment variable {secret_env} (--secret-env) is not set"
            raise KeyFileError(msg)
        if not key_id:
            msg = "--secret-env needs --key-id (or TAILGUARD_ADMIN_KEY_ID)"
            raise KeyFileError(msg)
        secret = env[secret_env].encode("utf-8")
    elif keys_file:
        key = load_key(keys_file, key_id, env)
        key_id, secret, bound = key.key_id, key.secret, key.actor
    elif env.get("TAILGUARD_ADMIN_SECRET"):
        if not key_id:
            msg = "TAILGUARD_ADMIN_SECRET needs --key-id (or TAILGUARD_ADMIN_KEY_ID)"
            raise KeyFileError(msg)
        secret = env["TAILGUARD_ADMIN_SECRET"].encode("utf-8")
    else:
        msg = (
            "no signing key: pass --keys-file FILE (or TAILGUARD_ADMIN_KEYS) with --key-id, or "
            "--key-id with --secret-env NAME, or set TAILGUARD_ADMIN_KEY_ID and "
            "TAILGUARD_ADMIN_SECRET"
        )
        raise KeyFileError(msg)
    assert key_id is not None
    who = actor or bound or env.get("USER") or "unknown"
    return Signer(key_id=key_id, secret=secret, actor=who)


def build_command(
    action: str,
    args: Mapping[str, Any],
    signer: Signer,
    *,
    now_ms: int | None = None,
    command_id: str | None = None,
) -> dict[str, Any]:
    """A signed ``tailguard.admin.v1`` command."""
    body = {
        "schema": "tailguard.admin.v1",
        "command_id": command_id or f"cli-{uuid.uuid4().hex}",
        "ts_ms": int(time.time() * 1000) if now_ms is None else now_ms,
        "actor": signer.actor,
        "key_id": signer.key_id,
        "action": action,
        "args": dict(args),
    }
    return signed(body, signer.secret)


@dataclass(frozen=True, slots=True)
class Sent:
    """Where the command went."""

    topic: str
    partition: int
    offset: int


def send_command(
    broker: str, command: Mapping[str, Any], *, prefix: str | None = None, timeout_s: float = 15.0
) -> tuple[Sent, dict[str, Any]]:
    """Send ``command`` and wait for its reply; raises :class:`NoReply` after ``timeout_s``."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    from tailguard.kafka_admin import ensure_broker

    ensure_broker(broker, timeout_s=min(10.0, timeout_s))  # BrokerUnavailable: one clear line
    pre = cat.default_prefix() if prefix is None else prefix
    admin_topic, replies_topic = pre + cat.ADMIN, pre + cat.ADMIN_REPLIES
    consumer = Consumer(
        {
            "bootstrap.servers": broker,
            "group.id": f"tailguard-admin-cli-{uuid.uuid4().hex}",  # never joined
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "log_level": 2,
        }
    )
    try:
        try:
            topics = consumer.list_topics(timeout=10).topics
            for name in (admin_topic, replies_topic):
                if name not in topics:
                    msg = (
                        f"topic {name} does not exist on {broker}: create the catalogue with "
                        "`tailguard topics create` (and check TAILGUARD_TOPIC_PREFIX)"
                    )
                    raise AdminError(msg)
            start = []
            for p in topics[replies_topic].partitions:
                _low, high = consumer.get_watermark_offsets(
                    TopicPartition(replies_topic, p), timeout=10
                )
                start.append(TopicPartition(replies_topic, p, high))
            consumer.assign(start)
        except KafkaException as exc:
            msg = f"cannot read {replies_topic} on {broker}: {exc.args[0]}"
            raise AdminError(msg) from None
        sent = _produce(broker, admin_topic, command, Producer)
        command_id = command.get("command_id")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in consumer.consume(100, timeout=0.25):
                value = record.value()
                if record.error() is not None or not value:
                    continue
                try:
                    reply = json.loads(value)
                except ValueError:
                    continue
                if isinstance(reply, dict) and reply.get("command_id") == command_id:
                    return sent, reply
        msg = (
            f"no reply to command {command_id} within {timeout_s:.0f} s. It was delivered to "
            f"{sent.topic} (partition {sent.partition}, offset {sent.offset}), but no worker "
            "answered: is a `tailguard worker` running against this broker (same "
            "TAILGUARD_TOPIC_PREFIX)? A worker that starts later still runs it if it is then "
            "less than 5 minutes old."
        )
        raise NoReply(msg)
    finally:
        consumer.close()


def _produce(broker: str, topic: str, command: Mapping[str, Any], producer_type: Any) -> Sent:
    producer = producer_type(
        {
            "bootstrap.servers": broker,
            "acks": "all",
            "message.timeout.ms": 10_000,
            "log_level": 2,
        }
    )
    report: list[Any] = []
    value = json.dumps(command, separators=(",", ":"), ensure_ascii=False).encode()
    producer.produce(
        topic,
        key=str(command.get("actor", "")).encode(),
        value=value,
        on_delivery=lambda err, msg: report.append((err, msg)),
    )
    producer.flush(15)
    if not report:
        msg = f"the command was not delivered to {topic} within 15 s (broker away?)"
        raise AdminError(msg)
    err, msg_ = report[0]
    if err is not None:
        msg = f"the command was not delivered to {topic}: {err}"
        raise AdminError(msg)
    return Sent(msg_.topic(), msg_.partition(), msg_.offset())
