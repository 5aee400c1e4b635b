"""Faust topic handles for the catalogue (:mod:`tailguard.catalogue`)."""

from dataclasses import dataclass

import faust
from faust.types import TopicT
from tailguard.agents.settings import Settings

from tailguard import catalogue as cat

__all__ = ["Topics", "declare_topics"]


@dataclass(frozen=True, slots=True)
class Topics:
    """The topics the agents read and write."""

    inference: TopicT
    series: TopicT
    gpu: TopicT
    sli: TopicT
    breaches: TopicT
    deadletter: TopicT


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
    )
