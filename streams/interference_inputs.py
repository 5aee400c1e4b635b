"""Tenant interference: what the detector reads — each series' closed minutes
(:class:`SliPoint`, kept per series in a :class:`SeriesHistory`, folded per tenant
into :class:`TenantMinute` s) and the instances' KV minutes (:class:`KvBook`).

See :mod:`~tailguard.streams.interference` for how they are judged.
"""

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.interference_model import METRICS
from tailguard.streams.kv import MINUTE_MS, KvMinute, fragmentation

__all__ = [
    "KvBook",
    "KvView",
    "SeriesHistory",
    "SliPoint",
    "TenantMinute",
    "frag_between",
    "share_between",
    "tenant_minutes",
]


class SliPoint(msgspec.Struct, array_like=True, gc=False):
    """One series' 1-minute SLI snapshot, reduced to what the detector reads."""

    end_ms: int
    count: int
    errors: int = 0
    ttft_p99: float | None = None
    ttft_n: int = 0
    itl_p99: float | None = None
    itl_n: int = 0
    e2e_p99: float | None = None
    e2e_n: int = 0
    compliance: float | None = None

    def p99(self, metric: str) -> tuple[float | None, int]:
        if metric == "ttft_ms":
            return self.ttft_p99, self.ttft_n
        if metric == "itl_ms":
            return self.itl_p99, self.itl_n
        return self.e2e_p99, self.e2e_n


class SeriesHistory(msgspec.Struct):
    """The recent 1-minute points of one series (variant, tenant) of a deployment."""

    variant: str
    tenant: str
    points: list[SliPoint] = []
    #: Trace ids of the slowest requests of the newest point.
    exemplars: list[str] = []

    def add(self, point: SliPoint, exemplars: Sequence[str], history_minutes: int) -> bool:
        """Keep ``point`` (False when that minute is already held: a replay)."""
        ends = [p.end_ms for p in self.points]
        if point.end_ms in ends:
            return False
        if not ends or point.end_ms > ends[-1]:
            self.points.append(point)
            self.exemplars = list(exemplars)
        else:
            self.points.append(point)
            self.points.sort(key=lambda p: p.end_ms)
        horizon = self.points[-1].end_ms - history_minutes * MINUTE_MS
        if self.points[0].end_ms <= horizon:
            self.points = [p for p in self.points if p.end_ms > horizon]
        return True

    def to_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> "SeriesHistory":
        try:
            return msgspec.msgpack.decode(data, type=cls)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            msg = f"series history does not decode ({exc}); restore the worker from the changelog"
            raise CorruptStateError(msg) from exc


@dataclass(slots=True)
class TenantMinute:
    """One tenant's minute, folded across its variants."""

    count: int = 0
    errors: int = 0
    p99: dict[str, float] = field(default_factory=dict)
    n: dict[str, int] = field(default_factory=dict)
    compliance: float | None = None
    variants: set[str] = field(default_factory=set)
    _weighted: dict[str, float] = field(default_factory=dict)
    _compliance_sum: float = 0.0
    _compliance_n: int = 0

    @property
    def rate(self) -> float:
        return self.count / 60.0

    def add(self, variant: str, p: SliPoint) -> None:
        self.count += p.count
        self.errors += p.errors
        self.variants.add(variant)
        for metric in METRICS:
            value, n = p.p99(metric)
            if value is None or n <= 0:
                continue
            self._weighted[metric] = self._weighted.get(metric, 0.0) + value * n
            self.n[metric] = self.n.get(metric, 0) + n
            self.p99[metric] = self._weighted[metric] / self.n[metric]
        if p.compliance is not None and p.count > 0:
            self._compliance_sum += p.compliance * p.count
            self._compliance_n += p.count
            self.compliance = self._compliance_sum / self._compliance_n


def tenant_minutes(
    histories: Iterable[SeriesHistory], lo_ms: int, hi_ms: int
) -> dict[str, dict[int, TenantMinute]]:
    """Tenant → minute end → :class:`TenantMinute`, for minutes ending in ``[lo_ms, hi_ms]``."""
    out: dict[str, dict[int, TenantMinute]] = {}
    for h in histories:
        for p in h.points:
            if lo_ms <= p.end_ms <= hi_ms:
                minute = out.setdefault(h.tenant, {}).setdefault(p.end_ms, TenantMinute())
                minute.add(h.variant, p)
    return out


class KvView(Protocol):
    """The KV minutes of the instances, as the detector reads them."""

    def instances_with(self, tenants: Collection[str], since_ms: int, until_ms: int) -> list[str]:
        """Instances with a minute ending in ``(since_ms, until_ms]`` that held
        sequences of every one of ``tenants``, sorted."""
        ...

    def minutes(self, instance: str) -> Sequence[KvMinute]:
        """The instance's minutes, oldest first."""
        ...


class KvBook:
    """KV minutes per instance in memory, indexed by tenant (a :class:`KvView`).

    ``add`` keeps at most ``history_minutes`` of event time per instance and
    ignores a minute it already holds (replays).
    """

    def __init__(self, history_minutes: int = 90) -> None:
        self.history_minutes = history_minutes
        self._minutes: dict[str, list[KvMinute]] = {}
        self._tenants: dict[str, set[str]] = {}

    def add(self, instance: str, minute: KvMinute) -> bool:
        held = self._minutes.setdefault(instance, [])
        if any(m.end_ms == minute.end_ms for m in held):
            return False
        held.append(minute)
        if len(held) > 1 and held[-2].end_ms > minute.end_ms:
            held.sort(key=lambda m: m.end_ms)
        horizon = held[-1].end_ms - self.history_minutes * MINUTE_MS
        if held[0].end_ms <= horizon:
            self._minutes[instance] = [m for m in held if m.end_ms > horizon]
        for tenant in minute.tenants:
            self._tenants.setdefault(tenant, set()).add(instance)
        return True

    def load(self, instance: str, minutes: Iterable[KvMinute]) -> None:
        """Restore an instance's stored minutes."""
        for minute in minutes:
            self.add(instance, minute)

    def minutes(self, instance: str) -> Sequence[KvMinute]:
        return self._minutes.get(instance, [])

    def instances(self) -> list[str]:
        return sorted(self._minutes)

    def instances_with(self, tenants: Collection[str], since_ms: int, until_ms: int) -> list[str]:
        wanted = list(tenants)
        if not wanted:
            return []
        candidates = set.intersection(*(self._tenants.get(t, set()) for t in wanted))
        out = []
        for instance in sorted(candidates):
            for m in self._minutes.get(instance, []):
                if since_ms < m.end_ms <= until_ms and all(
                    t in m.tenants and m.tenants[t].sequences > 0 for t in wanted
                ):
                    out.append(instance)
                    break
        return out

    @staticmethod
    def encode(minutes: Sequence[KvMinute]) -> bytes:
        return msgspec.msgpack.encode(list(minutes))

    @staticmethod
    def decode(data: bytes) -> list[KvMinute]:
        try:
            return msgspec.msgpack.decode(data, type=list[KvMinute])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            msg = f"KV history does not decode ({exc}); restore the worker from the changelog"
            raise CorruptStateError(msg) from exc


def frag_between(minutes: Sequence[KvMinute], lo_ms: int, hi_ms: int) -> float | None:
    """Token-weighted fragmentation over the minutes ending in ``(lo_ms, hi_ms]``."""
    tokens = block_tokens = 0
    for m in minutes:
        if lo_ms < m.end_ms <= hi_ms:
            tokens += m.tokens
            block_tokens += m.block_tokens
    frag: float | None = fragmentation(tokens, block_tokens)
    return frag


def share_between(minutes: Sequence[KvMinute], tenant: str, lo_ms: int, hi_ms: int) -> float | None:
    """The tenant's share of the tokens held over the minutes ending in ``(lo_ms, hi_ms]``."""
    mine = total = 0
    for m in minutes:
        if lo_ms < m.end_ms <= hi_ms:
            total += m.tokens
            use = m.tenants.get(tenant)
            mine += use.tokens if use is not None else 0
    return None if total == 0 else mine / total
