"""tailguard's wire contracts: records, codec, dead letters, CloudEvents framing.

Importing this package loads msgspec and the standard library only (no faust,
no Kafka client), so producers and tests can use it cheaply.

- :mod:`.records`: the ``msgspec.Struct`` of every schema id, ``SCHEMA_IDS``,
  ``REGISTRY``;
- :mod:`.codec`: ``decode`` (bytes → valid records + rejects) and ``encode``;
- :mod:`.errors`: ``SchemaError`` and the ``DeadLetterReason`` values;
- :mod:`.deadletter`: a ``Reject`` → a ``tailguard.deadletter.v1`` record;
- :mod:`.cloudevents`: the Kafka headers of CloudEvents binary mode;
- :mod:`.generate`: writes the JSON Schema files in ``jsonschema/``.
"""

from tailguard.schemas.cloudevents import ce_headers
from tailguard.schemas.codec import (
    DEFAULT_LIMITS,
    Decoded,
    Kind,
    Limits,
    MessageValue,
    Reject,
    decode,
    encode,
)
from tailguard.schemas.deadletter import dead_letter, dead_letter_id
from tailguard.schemas.errors import DeadLetterReason, SchemaError
from tailguard.schemas.records import (
    INPUT_RECORDS,
    OUTPUT_RECORDS,
    REGISTRY,
    SCHEMA_IDS,
    AdminCommand,
    AdminReply,
    AuditRecord,
    BatchInfo,
    CacheInfo,
    Centroid,
    DeadLetter,
    EvalScore,
    FlowControl,
    GpuSample,
    InferenceEvent,
    InputRecord,
    Interaction,
    KvSequence,
    KvSnapshot,
    OutputRecord,
    PercentileSummary,
    Series,
    SliSnapshot,
    TDigestDict,
)

__all__ = [
    "DEFAULT_LIMITS",
    "INPUT_RECORDS",
    "OUTPUT_RECORDS",
    "REGISTRY",
    "SCHEMA_IDS",
    "AdminCommand",
    "AdminReply",
    "AuditRecord",
    "BatchInfo",
    "CacheInfo",
    "Centroid",
    "DeadLetter",
    "DeadLetterReason",
    "Decoded",
    "EvalScore",
    "FlowControl",
    "GpuSample",
    "InferenceEvent",
    "InputRecord",
    "Interaction",
    "Kind",
    "KvSequence",
    "KvSnapshot",
    "Limits",
    "MessageValue",
    "OutputRecord",
    "PercentileSummary",
    "Reject",
    "SchemaError",
    "Series",
    "SliSnapshot",
    "TDigestDict",
    "ce_headers",
    "dead_letter",
    "dead_letter_id",
    "decode",
    "encode",
]
