"""tailguard's wire contracts: records, codec, dead letters, CloudEvents framing.

Importing this package loads msgspec and the standard library only (no faust,
no Kafka client), so producers and tests can use it cheaply.

- :mod:`.records`: ``SCHEMA_IDS`` and ``REGISTRY``, naming the ``msgspec.Struct``
  of every schema id: the inputs in :mod:`.inputs`, the outputs in
  :mod:`.outputs`, on the scalar types of :mod:`.scalars`;
- :mod:`.codec`: ``decode`` (bytes → valid records + rejects) and ``encode``,
  with :mod:`.limits`, :mod:`.checks`, :mod:`.reasons` and :mod:`.rejects`;
- :mod:`.errors`: ``SchemaError`` and the ``DeadLetterReason`` values;
- :mod:`.deadletter`: a ``Reject`` → a ``tailguard.deadletter.v1`` record;
- :mod:`.cloudevents`: the Kafka headers of CloudEvents binary mode;
- :mod:`.generate`: writes the JSON Schema files in ``jsonschema/``.
"""

from tailguard.schemas.checks import Kind
from tailguard.schemas.cloudevents import ce_headers
from tailguard.schemas.codec import MessageValue, decode, encode
from tailguard.schemas.deadletter import dead_letter, dead_letter_id
from tailguard.schemas.errors import DeadLetterReason, SchemaError
from tailguard.schemas.inputs import (
    INPUT_RECORDS,
    AdminCommand,
    BatchInfo,
    CacheInfo,
    EvalScore,
    FlowControl,
    GpuSample,
    InferenceEvent,
    InputRecord,
    Interaction,
    KvSequence,
    KvSnapshot,
)
from tailguard.schemas.limits import DEFAULT_LIMITS, Limits
from tailguard.schemas.outputs import (
    OUTPUT_RECORDS,
    AdminReply,
    AuditRecord,
    Centroid,
    DeadLetter,
    OutputRecord,
    PercentileSummary,
    Series,
    SliSnapshot,
    TDigestDict,
)
from tailguard.schemas.records import REGISTRY, SCHEMA_IDS
from tailguard.schemas.rejects import Decoded, Reject

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
