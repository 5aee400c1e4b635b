"""The wire records of tailguard's topics as ``msgspec.Struct`` types.

One Struct per schema id. The Structs *are* the contract: the JSON Schema
files in ``jsonschema/`` are generated from them (``python -m
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
:mod:`tailguard.schemas.codec`.

Input Structs set ``gc=False``: they hold only scalars, lists of scalars,
dicts of scalars and nested Structs of the same kind, so they cannot form
reference cycles, and untracked objects make decoding large batches cheaper
(msgspec "Struct GC" docs). Do not put a Struct inside itself.
"""

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta
from tailguard.schemas.errors import DeadLetterReason

__all__ = [
    "INPUT_RECORDS",
    "MAX_SAFE_INT",
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
    "EvalScore",
    "ExperimentTag",
    "FlowControl",
    "GpuSample",
    "InferenceEvent",
    "InputRecord",
    "Interaction",
    "KvSequence",
    "KvSnapshot",
    "OutputRecord",
    "PercentileSummary",
    "Series",
    "SliSnapshot",
    "TDigestDict",
]

#: Largest integer that every JSON reader holds exactly (2**53 - 1).
MAX_SAFE_INT: Final = 2**53 - 1

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

# --- constrained scalar types (each constraint also lands in the JSON Schema) ---

DurationMs = Annotated[
    float, Meta(ge=0, description="Duration in milliseconds, >= 0 (at most 1 h by default).")
]
TimestampMs = Annotated[
    int,
    Meta(
        ge=0,
        le=MAX_SAFE_INT,
        description="Unix epoch milliseconds (UTC); at most 5 minutes ahead of the "
        "consumer's clock by default.",
    ),
]
Count = Annotated[int, Meta(ge=0, le=MAX_SAFE_INT)]
PositiveCount = Annotated[int, Meta(ge=1, le=MAX_SAFE_INT)]
Name = Annotated[str, Meta(min_length=1)]
Percent = Annotated[float, Meta(ge=0, le=100)]
NonNegative = Annotated[float, Meta(ge=0)]
Ratio = Annotated[float, Meta(ge=0, le=1)]
# The length bounds matter: Python's "$" also matches before a final newline.
TraceId = Annotated[
    str,
    Meta(
        pattern="^[0-9a-f]{32}$",
        min_length=32,
        max_length=32,
        description="W3C trace id: 32 lower-case hex digits.",
    ),
]

Status = Literal["ok", "error", "timeout", "cancelled", "rejected"]
InteractionKind = Literal["interrupt", "session_complete", "session_abandon", "feedback"]
FeedbackLabel = Literal["correct", "partial", "hallucination"]


class _Input(
    msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=False, gc=False
):
    """Base of the input records: unknown fields ignored, defaults omitted on encode.

    msgspec inherits every option but ``kw_only``, which each subclass repeats.
    """


class _Output(msgspec.Struct, kw_only=True, omit_defaults=False, forbid_unknown_fields=False):
    """Base of the output records: every field is always written (``null`` included)."""


# --- tailguard.inference.v1 ----------------------------------------------------


class CacheInfo(_Input, kw_only=True):
    """Prefix (KV) cache use of one request: hit rate = hit / query tokens."""

    prefix_hit_tokens: Count
    prefix_query_tokens: Count


class BatchInfo(_Input, kw_only=True):
    """The dynamic batch the request was served in."""

    size: PositiveCount
    wait_ms: DurationMs | None = None
    timed_out: bool = False


class FlowControl(_Input, kw_only=True):
    """Token flow control applied to the request."""

    throttled: bool
    limit_tokens_per_s: NonNegative | None = None


class ExperimentTag(_Input, kw_only=True):
    """One experiment a request is in: the gateway's layers are orthogonal, so a
    request may be in one experiment per layer."""

    experiment: Name
    variant: Name
    layer: str | None = None
    prompt_version: str | None = None


class InferenceEvent(_Input, kw_only=True):
    """One finished inference request (ok, error, timeout, cancelled or rejected).

    TTFT = ``ttft_ms``; TPOT = (e2e_ms - ttft_ms) / (output_tokens - 1) when
    output_tokens > 1; ITL = every element of ``itl_ms``; E2E = ``e2e_ms``
    (vLLM ``bench serve`` definitions). ``ttft_ms`` is required when
    ``output_tokens`` >= 1 and never exceeds ``e2e_ms``.
    """

    schema: Literal["tailguard.inference.v1"] | None = None
    event_id: Annotated[str, Meta(min_length=1, description="Unique id; the dedup key.")]
    ts_ms: Annotated[TimestampMs, Meta(description="Request arrival, epoch milliseconds.")]
    service: Name
    model: Name
    status: Status
    e2e_ms: DurationMs
    ttft_ms: DurationMs | None = None
    output_tokens: Count | None = None
    input_tokens: Count | None = None
    itl_ms: Annotated[
        list[DurationMs],
        Meta(description="Gaps between consecutive streamed chunks, in order."),
    ] = []
    variant: Name = "default"
    experiment: str | None = None
    experiments: Annotated[
        list[ExperimentTag],
        Meta(
            description=(
                "Every experiment the request is in, one per routing layer; `experiment`/"
                "`variant` repeat the one that chose the upstream (else the first layer's)."
            )
        ),
    ] = []
    prompt_version: str | None = None
    tenant: Name = "default"
    unit_id: str | None = None
    session_id: str | None = None
    trace_id: TraceId | None = None
    instance: str | None = None
    host: str | None = None
    gpu_ids: list[Count] = []
    error_type: str | None = None
    queue_ms: DurationMs | None = None
    stages_ms: Annotated[
        dict[str, DurationMs],
        Meta(description="Stage name (tokenize, queue, prefill, decode, ...) → milliseconds."),
    ] = {}
    cache: CacheInfo | None = None
    batch: BatchInfo | None = None
    flow_control: FlowControl | None = None
    warmup: Annotated[bool, Meta(description="Warm-up request: excluded from SLOs.")] = False
    expert_ids: list[Count] = []
    rag_top1_similarity: Annotated[float, Meta(ge=-1, le=1)] | None = None
    rag_index: Annotated[
        str, Meta(max_length=256, description="Retrieval index that answered (RAG threshold).")
    ] = "default"


# --- the other inputs -----------------------------------------------------------


class Interaction(_Input, kw_only=True):
    """User behaviour around a request: interrupt, session end, feedback."""

    schema: Literal["tailguard.interaction.v1"] | None = None
    event_id: Name
    ts_ms: TimestampMs
    service: Name
    kind: InteractionKind
    unit_id: str | None = None
    session_id: str | None = None
    request_event_id: str | None = None
    experiment: str | None = None
    variant: str | None = None
    goal_reached: bool | None = None
    label: FeedbackLabel | None = None
    rater: str | None = None


class GpuSample(_Input, kw_only=True):
    """One NVML sample of one GPU."""

    schema: Literal["tailguard.gpu.v1"] | None = None
    ts_ms: TimestampMs
    host: Name
    gpu: Annotated[Count, Meta(description="GPU index on the host.")]
    uuid: str | None = None
    name: str | None = None
    util_gpu_pct: Percent | None = None
    util_mem_pct: Percent | None = None
    mem_used_mib: NonNegative | None = None
    mem_total_mib: NonNegative | None = None
    power_w: NonNegative | None = None
    temp_c: float | None = None
    sm_clock_mhz: NonNegative | None = None
    pcie_tx_kbps: NonNegative | None = None
    pcie_rx_kbps: NonNegative | None = None
    throttle_reasons: list[str] = []
    xid: Annotated[int | None, Meta(description="Last XID error, or null.")] = None


class KvSequence(_Input, kw_only=True):
    """One running sequence in a KV-cache snapshot."""

    tenant: Name = "default"
    tokens: Count
    blocks: Count


class KvSnapshot(_Input, kw_only=True):
    """KV-cache allocator snapshot of one serving instance."""

    schema: Literal["tailguard.kv.v1"] | None = None
    ts_ms: TimestampMs
    instance: Name
    block_size: Annotated[PositiveCount, Meta(description="Tokens per KV block.")]
    total_blocks: Count
    free_blocks: Count
    host: str | None = None
    preemptions: Annotated[Count | None, Meta(description="Counter since start.")] = None
    sequences: list[KvSequence] = []


class EvalScore(_Input, kw_only=True):
    """An offline evaluation score (BLEU, ROUGE-L, ...) of one experiment arm."""

    schema: Literal["tailguard.eval.v1"] | None = None
    ts_ms: TimestampMs
    experiment: Name
    variant: Name
    metric: Annotated[Name, Meta(description="bleu, rouge_l, ...")]
    value: float
    n: Count | None = None


class AdminCommand(_Input, kw_only=True):
    """A signed operator command.

    ``signature`` is the hex HMAC-SHA256 over the canonical JSON of the
    command without ``signature``, keyed by the secret of ``key_id``. It is
    optional here so that an unsigned command still decodes and can be
    *refused with a reply*; verifying it is the admin agent's job, over the
    raw JSON object (this Struct drops unknown fields, so re-encoding it does
    not reproduce what was signed).
    """

    schema: Literal["tailguard.admin.v1"] | None = None
    command_id: Name
    ts_ms: TimestampMs
    actor: Name
    action: Name
    args: dict[str, Any] = {}
    key_id: str | None = None
    signature: str | None = None


# --- outputs --------------------------------------------------------------------


class Series(_Output, kw_only=True):
    """A series: (service, model, variant, tenant)."""

    service: str
    model: str
    variant: str = "default"
    tenant: str = "default"


class PercentileSummary(_Output, kw_only=True):
    """Percentiles of one latency metric over a window; null when count is 0."""

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    count: Count = 0


class Centroid(_Output, kw_only=True):
    """One t-digest centroid: mean ``m`` and weight ``c``."""

    m: float
    c: float


class TDigestDict(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A t-digest in the ``tdigest`` package's dict format (``TDigest.to_dict()``).

    Load it with ``tdigest.TDigest().update_from_dict(d)``; fields left out
    keep that package's defaults.
    """

    n: int | None = None
    delta: float | None = None
    K: int | None = None
    centroids: list[Centroid]


class SliSnapshot(_Output, kw_only=True):
    """SLI figures of one series over one window, published periodically."""

    schema: Literal["tailguard.sli.v1"] = "tailguard.sli.v1"
    event_id: str
    ts_ms: int
    series: Series
    window_s: int
    window_end_ms: int
    count: Count
    errors: Count
    ttft_ms: PercentileSummary
    tpot_ms: PercentileSummary
    itl_ms: PercentileSummary
    e2e_ms: PercentileSummary
    goodput_rps: float
    slo_compliance: float | None
    cancelled: Count = 0
    success_rate: float | None = None
    ttft_compliance: float | None = None
    itl_compliance: float | None = None
    exemplars: Annotated[list[str], Meta(description="trace_ids of the slowest requests.")] = []
    digests: Annotated[
        dict[str, TDigestDict] | None, Meta(description="Metric name → t-digest, if attached.")
    ] = None
    window: Annotated[str | None, Meta(description="Window name: 1m, 5m, 30m, 1h, 6h, 1d, 3d.")] = (
        None
    )
    final: Annotated[
        bool,
        Meta(
            description=(
                "true: the window ends at a closed bucket and will not change (event time); "
                "false: a provisional snapshot that includes the open minute."
            )
        ),
    ] = True
    late: Annotated[Count, Meta(description="Late events of the series so far (not merged).")] = 0
    duplicates: Annotated[
        Count, Meta(description="Duplicate event_ids of the series so far (counted once).")
    ] = 0
    stages_ms: Annotated[
        dict[str, PercentileSummary],
        Meta(
            description=(
                "Per-stage latency (the events' stages_ms, e.g. tokenize, queue, prefill, "
                "decode) over the window; stages no request reported are absent."
            )
        ),
    ] = {}


class DeadLetter(_Output, kw_only=True):
    """Bad input with its origin and the reason it was refused.

    ``original_b64`` holds the offending bytes: the single bad element when the
    message was a batch (``index`` is its position in it), else the whole
    message. A message too large to carry is cut to its first bytes
    (``original_truncated`` is true; ``original_size`` is always the full
    length).
    """

    schema: Literal["tailguard.deadletter.v1"] = "tailguard.deadletter.v1"
    event_id: str
    ts_ms: int
    topic: str
    partition: int
    offset: int
    reason: DeadLetterReason
    detail: str
    original_b64: str
    original_size: Count
    original_truncated: bool = False
    index: int | None = None


class ReplyError(_Output, kw_only=True):
    """Why a command was refused: a stable ``code`` and a message for people."""

    code: Annotated[
        str,
        Meta(
            description=(
                "malformed, invalid, unsigned, unknown_key, key_expired, bad_signature, stale, "
                "future, replayed, unknown_action, forbidden, bad_args, not_found, conflict, "
                "not_enabled or failed"
            )
        ),
    ]
    message: str


class Origin(_Output, kw_only=True):
    """Where a command was read: its admin topic, partition and offset."""

    topic: str
    partition: int
    offset: int


class AdminReply(_Output, kw_only=True):
    """The one reply to an admin command, keyed by ``command_id``.

    ``command_id`` (and ``action``, ``actor``, ``key_id``) is null when the
    message was not a readable command; ``origin`` then says which message it was.
    """

    schema: Literal["tailguard.admin_reply.v1"] = "tailguard.admin_reply.v1"
    event_id: str
    ts_ms: int
    command_id: str | None
    ok: bool
    action: str | None
    actor: str | None
    key_id: str | None
    error: ReplyError | None
    result: dict[str, Any] | None
    origin: Origin
    worker: str


class AuditRecord(_Output, kw_only=True):
    """One entry of the audit trail: an admin command (accepted or refused) or an
    automatic decision. Never holds a secret."""

    schema: Literal["tailguard.audit.v1"] = "tailguard.audit.v1"
    event_id: str
    ts_ms: int
    kind: Literal["command", "decision"]
    actor: Annotated[
        str | None,
        Meta(description="Who: the command's actor (as claimed when refused), or tailguard."),
    ]
    authenticated: Annotated[
        bool | None, Meta(description="Whether the command's signature was verified.")
    ]
    key_id: str | None
    role: str | None
    action: str | None
    args: Annotated[
        dict[str, Any] | None,
        Meta(description="Arguments, with secret-looking values redacted and long text cut."),
    ]
    args_sha256: str | None
    outcome: Annotated[
        str, Meta(description="ok, refused or failed for commands; the decision otherwise.")
    ]
    error: ReplyError | None
    command_id: str | None
    command_ts_ms: int | None
    origin: Origin | None
    worker: str
    summary: str = ""


InputRecord = InferenceEvent | Interaction | GpuSample | KvSnapshot | EvalScore | AdminCommand
OutputRecord = SliSnapshot | DeadLetter | AdminReply | AuditRecord

#: Topic kind → input Struct.
INPUT_RECORDS: Final[dict[str, type[InputRecord]]] = {
    "inference": InferenceEvent,
    "interaction": Interaction,
    "gpu": GpuSample,
    "kv": KvSnapshot,
    "eval": EvalScore,
    "admin": AdminCommand,
}

#: Topic kind → output Struct (only the outputs this package defines).
OUTPUT_RECORDS: Final[dict[str, type[OutputRecord]]] = {
    "sli": SliSnapshot,
    "deadletter": DeadLetter,
    "admin_reply": AdminReply,
    "audit": AuditRecord,
}

#: Schema id → Struct, for every record defined here.
REGISTRY: Final[dict[str, type[InputRecord | OutputRecord]]] = {
    SCHEMA_IDS[kind]: record for kind, record in (INPUT_RECORDS | OUTPUT_RECORDS).items()
}
