"""The output records: what tailguard publishes, as ``msgspec.Struct`` types.

One Struct per output schema id this package defines: ``tailguard.sli.v1``
(SLI figures of one series over one window, with its percentile summaries
and, if attached, t-digests), ``tailguard.deadletter.v1`` (bad input and why
it was refused), ``tailguard.admin_reply.v1`` (the one reply to an admin
command) and ``tailguard.audit.v1`` (the audit trail). Every output carries
``schema``, ``event_id`` and ``ts_ms``; outputs never omit fields, so
subscribers see explicit ``null`` s, and unknown fields are ignored when one
is read back.
"""

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta
from tailguard.schemas.errors import DeadLetterReason
from tailguard.schemas.scalars import Count

__all__ = [
    "OUTPUT_RECORDS",
    "AdminReply",
    "AuditRecord",
    "Centroid",
    "DeadLetter",
    "OutputRecord",
    "PercentileSummary",
    "Series",
    "SliSnapshot",
    "TDigestDict",
]


class _Output(msgspec.Struct, kw_only=True, omit_defaults=False, forbid_unknown_fields=False):
    """Base of the output records: every field is always written (``null`` included)."""


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


OutputRecord = SliSnapshot | DeadLetter | AdminReply | AuditRecord

#: Topic kind → output Struct (only the outputs this package defines).
OUTPUT_RECORDS: Final[dict[str, type[OutputRecord]]] = {
    "sli": SliSnapshot,
    "deadletter": DeadLetter,
    "admin_reply": AdminReply,
    "audit": AuditRecord,
}
