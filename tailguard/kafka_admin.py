"""Topic administration with confluent-kafka's AdminClient."""

from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tailguard.catalogue import TopicSpec, catalogue
from tailguard.errors import TailguardError

__all__ = ["BrokerUnavailable", "TopicReport", "create_topics", "ensure_broker"]


class BrokerUnavailable(TailguardError, ConnectionError):
    """The Kafka broker does not answer."""


@dataclass(frozen=True, slots=True)
class TopicReport:
    created: list[str]
    existing: list[str]


def ensure_broker(broker: str, timeout_s: float = 10.0) -> AdminClient:
    """An admin client whose broker answered within ``timeout_s``."""
    # log_level 2: librdkafka would print a "Connection refused" line per retry
    # before the one clear error below.
    admin = AdminClient({"bootstrap.servers": broker, "log_level": 2})
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        msg = (
            f"no Kafka broker answers at {broker} ({exc.args[0]}). Start the local one with "
            "`make kafka-up`, or point TAILGUARD_BROKER / --broker at yours."
        )
        raise BrokerUnavailable(msg) from None
    return admin


def create_topics(
    broker: str, specs: list[TopicSpec] | None = None, timeout_s: float = 30.0
) -> TopicReport:
    """Create every catalogue topic that does not exist yet (idempotent)."""
    admin = ensure_broker(broker)
    specs = specs if specs is not None else catalogue()
    have = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [s for s in specs if s.name not in have]
    created: list[str] = []
    if wanted:
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name, num_partitions=s.partitions, replication_factor=1, config=s.config()
                )
                for s in wanted
            ],
            operation_timeout=timeout_s,
        )
        for name, fut in futures.items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as exc:
                err = exc.args[0]
                if getattr(err, "name", lambda: "")() != "TOPIC_ALREADY_EXISTS":
                    msg = f"could not create topic {name}: {err}"
                    raise TailguardError(msg) from None
    existing = sorted(s.name for s in specs if s.name in have)
    return TopicReport(created=sorted(created), existing=existing)
