"""Faust topic handles for the catalogue (:mod:`tailguard.catalogue`)."""

import logging
from dataclasses import dataclass

import faust
from faust.types import TopicT
from tailguard.agents.settings import Settings

from tailguard import catalogue as cat

__all__ = ["INTERFERENCE", "Topics", "declare_topics", "internal_topic", "precreate_topics"]

log = logging.getLogger(__name__)

#: Internal: 1-minute SLI points and KV minutes re-keyed by deployment
#: (service|model) for the interference detector (:mod:`tailguard.agents.interference`).
#: faust declares it (``internal=True``) with the worker's partition count.
INTERFERENCE = "tailguard.internal.interference"
_DAY_S = 86_400.0
_DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class Topics:
    """The topics the agents read and write."""

    inference: TopicT
    series: TopicT
    gpu: TopicT
    sli: TopicT
    breaches: TopicT
    deadletter: TopicT
    kv: TopicT
    interference: TopicT


def declare_topics(app: faust.App, settings: Settings) -> Topics:
    """Topic handles; the topics themselves are created by ``tailguard topics create``."""

    def topic(name: str) -> TopicT:
        return app.topic(
            settings.topic_prefix + name,
            key_serializer="raw",
            value_serializer="raw",
            allow_empty=True,
        )

    return Topics(
        inference=topic(cat.INFERENCE),
        series=topic(cat.SERIES),
        gpu=topic(cat.GPU),
        sli=topic(cat.SLI),
        breaches=topic(cat.BREACHES),
        deadletter=topic(cat.DEADLETTER),
        kv=topic(cat.KV),
        interference=internal_topic(app, settings, settings.topic_prefix + INTERFERENCE),
    )


def internal_topic(app: faust.App, settings: Settings, name: str) -> TopicT:
    """A worker-internal topic (full ``name``): raw bytes, partitioned like the series
    topic (so equal partition numbers land on one worker), kept one day."""
    return app.topic(
        name,
        key_serializer="raw",
        value_serializer="raw",
        allow_empty=True,
        internal=True,
        partitions=settings.partitions,
        retention=_DAY_S,
    )


def precreate_topics(settings: Settings, internal: list[str], tables: list[str]) -> None:
    """Create internal topics (full names) and the changelogs of ``tables`` now, if missing.

    faust declares both itself, but just before the consumer group join; on a
    fresh or busy broker the new topics are often not yet in the metadata of
    that first assignment ("Ignoring missing topic"): the internal topic is
    then not consumed, and a table whose changelog has "0 partitions" fails
    every write with ``PartitionsMismatch``, until a metadata refresh minutes
    later. Created here, at build time, they are known by the time faust
    joins. Idempotent; a broker that does not answer is left to faust.
    Changelogs are compacted and never expire, as faust makes them.
    """
    from tailguard.errors import TailguardError
    from tailguard.kafka_admin import create_topics

    specs = [
        cat.TopicSpec(name, settings.partitions, _DAY_MS, description="internal")
        for name in internal
    ]
    specs += [
        cat.TopicSpec(f"{settings.app_id}-{table}-changelog", settings.partitions, -1, compact=True)
        for table in tables
    ]
    try:
        create_topics(settings.broker, specs, timeout_s=15.0)
    except TailguardError as exc:
        log.warning("tailguard: topics not created up front (faust will declare them): %s", exc)
