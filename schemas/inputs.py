"""The input records: what producers send on tailguard's input topics.

One ``msgspec.Struct`` per input schema id: ``tailguard.inference.v1`` (one
finished inference request, with its cache, batch, flow-control and
experiment parts) and the other inputs, ``tailguard.interaction.v1``,
``tailguard.gpu.v1``, ``tailguard.kv.v1``, ``tailguard.eval.v1`` and
``tailguard.admin.v1``. The codec decodes Kafka message values straight into
them.

Unknown fields are ignored (``forbid_unknown_fields=False``) so producers may
add fields before tailguard knows them, and defaults are omitted on encode.
An input may carry ``"schema"``; when it does it must be that record's schema
id, anything else is an unknown schema version. What a type cannot say
(``ttft_ms`` ≤ ``e2e_ms``, durations ≤ 1 h, timestamps not in the future, …)
is checked after decoding; see :mod:`tailguard.schemas.checks`.

Input Structs set ``gc=False``: they hold only scalars, lists of scalars,
dicts of scalars and nested Structs of the same kind, so they cannot form
reference cycles, and untracked objects make decoding large batches cheaper.
Do not put a Struct inside itself.
"""

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta
from tailguard.schemas.scalars import (
    Count,
    DurationMs,
    Name,
    NonNegative,
    Percent,
    PositiveCount,
    TimestampMs,
    TraceId,
)

__all__ = [
    "INPUT_RECORDS",
    "AdminCommand",
    "BatchInfo",
    "CacheInfo",
    "EvalScore",
    "ExperimentTag",
    "FlowControl",
    "GpuSample",
    "InferenceEvent",
    "InputRecord",
    "Interaction",
    "KvSequence",
    "KvSnapshot",
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


InputRecord = InferenceEvent | Interaction | GpuSample | KvSnapshot | EvalScore | AdminCommand

#: Topic kind → input Struct.
INPUT_RECORDS: Final[dict[str, type[InputRecord]]] = {
    "inference": InferenceEvent,
    "interaction": Interaction,
    "gpu": GpuSample,
    "kv": KvSnapshot,
    "eval": EvalScore,
    "admin": AdminCommand,
}
