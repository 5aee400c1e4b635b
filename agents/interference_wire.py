"""Records of ``tailguard.internal.interference``, the detector's one input topic.

The tenant-interference detector must see every tenant of a deployment
(service, model) together, so everything it reads is re-keyed by deployment
onto this topic (msgpack, tagged):

- :class:`PointsMsg`: the closed minutes of a deployment's series that one
  fold closed, sent by the series folder (:func:`point_of`, from the same
  summaries as the final 1-minute snapshots on ``tailguard.sli``; at most
  :data:`POINTS_PER_MESSAGE` a record); :class:`PointMsg`, one series' closed
  minute, is what it sent before, and still decodes;
- :class:`KvMsg`: one instance's closed KV minute, sent to every partition;
- :class:`TickMsg`: "judge this deployment again", from the worker's own timer.
"""

import msgspec
from tailguard.streams import WindowSummary
from tailguard.streams.interference import SliPoint
from tailguard.streams.kv import KvMinute

__all__ = [
    "POINTS_PER_MESSAGE",
    "InternalMsg",
    "KvMsg",
    "PointMsg",
    "PointsMsg",
    "TickMsg",
    "decode_internal",
    "encode_internal",
    "point_of",
    "points_records",
]

#: Exemplar traces a point carries at most.
_EXEMPLARS = 5
#: Points a :class:`PointsMsg` holds at most (~250 bytes each with five exemplars).
POINTS_PER_MESSAGE = 1_000


class PointMsg(msgspec.Struct, tag="p", array_like=True):
    """One series' 1-minute SLI point, on its way to its deployment's partition."""

    service: str
    model: str
    variant: str
    tenant: str
    point: SliPoint
    exemplars: list[str] = []

    @property
    def deployment(self) -> str:
        return f"{self.service}|{self.model}"


class PointsMsg(msgspec.Struct, tag="ps", array_like=True):
    """Points of one deployment's series, in the order their minutes closed: the
    detector reads and writes the deployment's state once for all of them."""

    points: list[PointMsg]


class KvMsg(msgspec.Struct, tag="k", array_like=True):
    """One instance's closed KV minute, sent to every partition."""

    instance: str
    minute: KvMinute


class TickMsg(msgspec.Struct, tag="t", array_like=True):
    """ "Judge this deployment again": sent by the worker's own timer to a deployment
    that waits (its first judgement, or a stalled series), so the judgement runs
    inside an event of the deployment's partition (where its tables live)."""

    service: str
    model: str

    @property
    def deployment(self) -> str:
        return f"{self.service}|{self.model}"


InternalMsg = PointMsg | PointsMsg | KvMsg | TickMsg
encode_internal = msgspec.msgpack.Encoder().encode
_decode_internal = msgspec.msgpack.Decoder(InternalMsg).decode


def decode_internal(data: bytes | None) -> InternalMsg:
    """A record of the internal interference topic; ``ValueError`` when it does not decode."""
    try:
        return _decode_internal(data or b"")
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(str(exc)) from exc


def _p99(summary: WindowSummary, metric: str) -> tuple[float | None, int]:
    row = summary.latency.get(metric) or {}
    p99, count = row.get("p99"), row.get("count") or 0
    return (None if p99 is None else float(p99)), int(count)


def point_of(series: tuple[str, str, str, str], end_ms: int, summary: WindowSummary) -> PointMsg:
    """The point of a series' closed minute ending at ``end_ms`` (``summary``: its
    final 1-minute window)."""
    service, model, variant, tenant = series
    ttft_p99, ttft_n = _p99(summary, "ttft_ms")
    itl_p99, itl_n = _p99(summary, "itl_ms")
    e2e_p99, e2e_n = _p99(summary, "e2e_ms")
    point = SliPoint(
        end_ms=end_ms,
        count=summary.count,
        errors=summary.errors,
        ttft_p99=ttft_p99,
        ttft_n=ttft_n,
        itl_p99=itl_p99,
        itl_n=itl_n,
        e2e_p99=e2e_p99,
        e2e_n=e2e_n,
        compliance=summary.slo_compliance,
    )
    return PointMsg(service, model, variant, tenant, point, summary.exemplars[:_EXEMPLARS])


def points_records(points: dict[str, list[PointMsg]]) -> list[tuple[bytes, bytes]]:
    """Closed minutes by deployment as records, one per deployment (:class:`PointsMsg`,
    in the order they closed; :data:`POINTS_PER_MESSAGE` at most a record).

    The detector then reads and writes a deployment's state once for all the
    series one fold closed; a record per series rewrote it once a series — and
    the state lists every series, so a deployment's state bytes a minute grew
    with the square of its tenants."""
    out = []
    for deployment, held in points.items():
        key = deployment.encode()
        for lo in range(0, len(held), POINTS_PER_MESSAGE):
            out.append((key, encode_internal(PointsMsg(held[lo : lo + POINTS_PER_MESSAGE]))))
    return out
