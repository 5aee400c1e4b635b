"""The wire records of tailguard's topics: which Struct each schema id is.

One ``msgspec.Struct`` per schema id: the inputs are in
:mod:`tailguard.schemas.inputs` (``INPUT_RECORDS``: topic kind → Struct), the
outputs in :mod:`tailguard.schemas.outputs` (``OUTPUT_RECORDS``), both built
on the constrained scalar types of :mod:`tailguard.schemas.scalars`. This
module names them: topic kind → schema id (``SCHEMA_IDS``) and schema id →
Struct (``REGISTRY``). The Structs *are* the contract: the JSON Schema files
in ``jsonschema/`` are generated from them (``python -m
tailguard.schemas.generate``), and :mod:`tailguard.schemas.codec` decodes
Kafka message values straight into them.

Conventions:

- durations are float milliseconds with a ``_ms`` suffix and are never
  negative (``DurationMs``); timestamps are integer Unix epoch milliseconds
  ``ts_ms``; counts are non-negative integers no larger than 2**53 - 1, the
  largest integer every JSON reader (JavaScript included) holds exactly;
- unknown fields are ignored (``forbid_unknown_fields=False``) so producers
  may add fields before tailguard knows them;
- a missing required field, a wrong JSON type, a value outside an enumeration
  (``Literal``) or a constraint below (``Meta``) is a decode error, which the
  codec turns into a dead-letter reason;
- an input may carry ``"schema"``; when it does it must be that record's
  schema id, anything else is an unknown schema version;
- every output carries ``schema``, ``event_id`` and ``ts_ms``; outputs never
  omit fields, so subscribers see explicit ``null`` s.

What a type cannot say (``ttft_ms`` ≤ ``e2e_ms``, durations ≤ 1 h, timestamps
not in the future, …) the codec checks after decoding; see
:mod:`tailguard.schemas.checks`.
"""

from typing import Final

from tailguard.schemas.inputs import INPUT_RECORDS, InputRecord
from tailguard.schemas.outputs import OUTPUT_RECORDS, OutputRecord

__all__ = ["REGISTRY", "SCHEMA_IDS"]

#: Topic kind → schema id, for every schema id (inputs and outputs).
SCHEMA_IDS: Final[dict[str, str]] = {
    "inference": "tailguard.inference.v1",
    "interaction": "tailguard.interaction.v1",
    "gpu": "tailguard.gpu.v1",
    "kv": "tailguard.kv.v1",
    "eval": "tailguard.eval.v1",
    "admin": "tailguard.admin.v1",
    "sli": "tailguard.sli.v1",
    "breach": "tailguard.breach.v1",
    "release": "tailguard.release.v1",
    "capacity": "tailguard.capacity.v1",
    "admin_reply": "tailguard.admin_reply.v1",
    "audit": "tailguard.audit.v1",
    "deadletter": "tailguard.deadletter.v1",
}


#: Schema id → Struct, for every record of ``INPUT_RECORDS`` and ``OUTPUT_RECORDS``.
REGISTRY: Final[dict[str, type[InputRecord | OutputRecord]]] = {
    SCHEMA_IDS[kind]: record for kind, record in (INPUT_RECORDS | OUTPUT_RECORDS).items()
}
