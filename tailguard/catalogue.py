"""The topic catalogue: every topic tailguard reads or writes, in one place.

``tailguard topics create`` creates them all from here, the agents declare their
faust topics from here, and ``tailguard topics list`` prints it. Names are
part of tailguard's external contract and must not change.

Partition counts: the input topics and the internal series topic share one
count (``partitions``, default 4, env ``TAILGUARD_PARTITIONS``) because the
tables that hold per-series state are co-partitioned with the series topic.
Retention is in milliseconds; ``compact`` topics keep the latest value per key.

A *namespace* prefix (env ``TAILGUARD_TOPIC_PREFIX``, default empty) puts a
whole deployment's topics side by side with another's on one cluster; the
integration tests use it to isolate each test. Without a prefix the names are
exactly the contract's.
"""

import os
from dataclasses import dataclass

__all__ = [
    "ADMIN",
    "ADMIN_REPLIES",
    "AUDIT",
    "BREACHES",
    "CAPACITY",
    "CONTROL",
    "DEADLETTER",
    "EVALS",
    "GPU",
    "INFERENCE",
    "INTERACTIONS",
    "KV",
    "OTLP",
    "PROMPTS",
    "PROMPT_SLI",
    "RATINGS",
    "RELEASES",
    "SERIES",
    "SLI",
    "TopicSpec",
    "catalogue",
    "default_partitions",
    "default_prefix",
]

INFERENCE = "tailguard.inference"
INTERACTIONS = "tailguard.interactions"
GPU = "tailguard.gpu"
KV = "tailguard.kv"
EVALS = "tailguard.evals"
ADMIN = "tailguard.admin"
OTLP = "tailguard.otlp"
SLI = "tailguard.sli"
BREACHES = "tailguard.breaches"
RELEASES = "tailguard.releases"
CAPACITY = "tailguard.capacity"
ADMIN_REPLIES = "tailguard.admin.replies"
AUDIT = "tailguard.audit"
DEADLETTER = "tailguard.deadletter"
#: Blind rating hand-off: sampled requests for human raters, without their arm
#: (tailguard.rating.v1, written by the gateway; :mod:`tailguard.gateway.ratings`).
RATINGS = "tailguard.ratings"
#: The prompt registry: prompt_version → tailguard.prompt.v1, compacted, kept
#: forever; every worker reads all of it (:mod:`tailguard.agents.prompts`).
PROMPTS = "tailguard.prompts"
#: SLI snapshots per (service, model, prompt group) (tailguard.prompt_sli.v1).
PROMPT_SLI = "tailguard.prompt_sli"
#: Internal: compact per-request rows re-keyed by deployment for the prompt-group SLIs.
INTERNAL_PROMPTS = "tailguard.internal.prompts"
#: Internal: validated inference events re-keyed by series, so that one
#: partition (and one worker) owns each series' state.
SERIES = "tailguard.internal.series"
#: Internal: worker-wide admin state (SLO overrides, silences, acks, key
#: retirements), compacted and kept forever; every worker reads all of it
#: (:mod:`tailguard.agents.control`).
CONTROL = "tailguard.internal.control"
#: Internal topics partitioned like the series topic, declared by their agents
#: too; created up front so faust finds them at its first assignment.
INTERNAL_ADMIN = "tailguard.internal.admin"
INTERNAL_EXPERIMENTS = "tailguard.internal.experiments"
INTERNAL_INTERFERENCE = "tailguard.internal.interference"
INTERNAL_CAPACITY = "tailguard.internal.capacity"

_HOUR = 3_600_000
_DAY = 24 * _HOUR


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """How one topic is created."""

    name: str
    partitions: int
    retention_ms: int
    compact: bool = False
    description: str = ""
    max_message_bytes: int = 8 * 1024 * 1024

    def config(self) -> dict[str, str]:
        """Kafka topic configs for the admin client."""
        cfg = {
            "retention.ms": str(self.retention_ms),
            "max.message.bytes": str(self.max_message_bytes),
        }
        cfg["cleanup.policy"] = "compact,delete" if self.compact else "delete"
        return cfg


def default_partitions() -> int:
    """Partition count of the data topics (env ``TAILGUARD_PARTITIONS``, default 4)."""
    raw = os.environ.get("TAILGUARD_PARTITIONS", "4")
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"TAILGUARD_PARTITIONS must be a positive integer, got {raw!r}"
        raise ValueError(msg)
    return value


def default_prefix() -> str:
    """Topic namespace prefix (env ``TAILGUARD_TOPIC_PREFIX``, default none)."""
    return os.environ.get("TAILGUARD_TOPIC_PREFIX", "")


def catalogue(partitions: int | None = None, prefix: str | None = None) -> list[TopicSpec]:
    """Every topic of the external contract plus the internal ones."""
    p = partitions or default_partitions()
    pre = default_prefix() if prefix is None else prefix
    return [
        TopicSpec(
            pre + t.name,
            t.partitions,
            t.retention_ms,
            t.compact,
            t.description,
            t.max_message_bytes,
        )
        for t in _specs(p)
    ]


def _specs(p: int) -> list[TopicSpec]:
    return [
        TopicSpec(INFERENCE, p, 7 * _DAY, description="per-request inference events (input)"),
        TopicSpec(INTERACTIONS, p, 7 * _DAY, description="user interactions (input)"),
        TopicSpec(GPU, p, 1 * _DAY, description="NVML samples keyed host:gpu (input)"),
        TopicSpec(KV, p, 1 * _DAY, description="KV-cache allocator snapshots (input)"),
        TopicSpec(EVALS, 1, 30 * _DAY, description="offline evaluation scores (input)"),
        TopicSpec(ADMIN, 1, 7 * _DAY, description="signed operator commands (input)"),
        TopicSpec(OTLP, p, 1 * _DAY, description="OTLP trace spans (input)"),
        TopicSpec(SERIES, p, 1 * _DAY, description="internal: inference events keyed by series"),
        TopicSpec(INTERNAL_ADMIN, p, 1 * _DAY, description="internal: admin queries by owner"),
        TopicSpec(
            INTERNAL_EXPERIMENTS,
            p,
            1 * _DAY,
            description="internal: experiments",
        ),
        TopicSpec(
            INTERNAL_INTERFERENCE,
            p,
            1 * _DAY,
            description="internal: interference",
        ),
        TopicSpec(INTERNAL_CAPACITY, p, 1 * _DAY, description="internal: load rows by deployment"),
        TopicSpec(INTERNAL_PROMPTS, p, 1 * _DAY, description="internal: prompt rows by deployment"),
        TopicSpec(SLI, p, 7 * _DAY, description="SLI snapshots per series and window"),
        TopicSpec(BREACHES, p, 30 * _DAY, description="SLO breach lifecycle"),
        TopicSpec(RELEASES, 1, 30 * _DAY, compact=True, description="gray-release decisions"),
        TopicSpec(CAPACITY, 1, 30 * _DAY, description="capacity recommendations"),
        TopicSpec(ADMIN_REPLIES, 1, 7 * _DAY, description="one reply per admin command"),
        TopicSpec(AUDIT, 1, 90 * _DAY, description="audit trail"),
        # retention -1 with compaction: the latest value of each key is kept forever.
        TopicSpec(CONTROL, 1, -1, compact=True, description="internal: worker-wide admin state"),
        TopicSpec(DEADLETTER, p, 14 * _DAY, description="bad input with reasons"),
        TopicSpec(RATINGS, p, 7 * _DAY, description="requests for blind human rating (no arm)"),
        TopicSpec(PROMPTS, 1, -1, compact=True, description="prompt registry (input)"),
        TopicSpec(PROMPT_SLI, p, 7 * _DAY, description="SLI snapshots per prompt group"),
    ]
