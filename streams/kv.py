"""Per-instance KV-cache state from ``tailguard.kv`` allocator snapshots.

Every figure is exact: it is computed from the integers of the snapshots,
never estimated. For one snapshot (``b`` = ``block_size``, sequences ``s``)::

    utilisation            = 1 − free_blocks / total_blocks
    internal fragmentation = 1 − Σ tokens_s / (Σ blocks_s · b)   (None when no block is held)
    free-block pressure    = max(0, n − free_blocks) / n       (n = running sequences; 0 if none)
    preemption rate        = Δ preemptions / Δ t   [1/s]       (against the previous snapshot;
                                                                a counter that went down was
                                                                reset: Δ = its new value)
    tenant share           = tokens (blocks) of the tenant's sequences / all tokens (blocks)

Fragmentation is internal fragmentation (the share of the blocks held by running
sequences that holds no token), not the article's utilisation ratio.
*Free-block pressure* is the share of running sequences that would be
preempted if each needed one more block now (vLLM allocates a block per
``block_size`` decoded tokens and preempts when none is free): 0 while free
blocks outnumber the sequences, 1 when none is free.

Over event time the state keeps, per instance, the newest snapshot's figures
and one :class:`KvMinute` per minute: integer sums over the minute's snapshots,
so a minute's figures are ratios of sums (token-weighted fragmentation, mean
utilisation) and again exact::

    snapshots   ·  ·  ·  ·  ·  ·│ ·  ·  ·  ·  ·  · │ ·  ·  ·  ▸ event time
    minutes     [── closed ─────)[──── closed ─────)[─ open ─
                                                 ▲ the first snapshot of a later minute
                                                   closes the open one (returned by apply)

A bounded history (``history_minutes``, default 60) is kept. Replays are
idempotent: a snapshot not newer than the newest one applied for the instance
changes nothing. ``to_bytes``/``from_bytes`` (msgpack) store the state in a
table.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
from tailguard.streams.errors import ConfigError, CorruptStateError

__all__ = [
    "MINUTE_MS",
    "Applied",
    "KvFigures",
    "KvMinute",
    "KvSequenceLike",
    "KvSnapshotLike",
    "KvState",
    "TenantUse",
    "decode_minute",
    "encode_minute",
    "figures",
    "fragmentation",
]

MINUTE_MS = 60_000
_WIRE_VERSION = 1


class KvSequenceLike(Protocol):
    """One running sequence (the ``KvSequence`` record of the schemas fits)."""

    @property
    def tenant(self) -> str: ...
    @property
    def tokens(self) -> int: ...
    @property
    def blocks(self) -> int: ...


class KvSnapshotLike(Protocol):
    """One allocator snapshot (the ``KvSnapshot`` record of the schemas fits)."""

    @property
    def ts_ms(self) -> int: ...
    @property
    def instance(self) -> str: ...
    @property
    def host(self) -> str | None: ...
    @property
    def block_size(self) -> int: ...
    @property
    def total_blocks(self) -> int: ...
    @property
    def free_blocks(self) -> int: ...
    @property
    def preemptions(self) -> int | None: ...
    @property
    def sequences(self) -> Sequence[KvSequenceLike]: ...


def fragmentation(tokens: int, block_tokens: int) -> float | None:
    """``1 − tokens / block_tokens`` (``block_tokens`` = Σ blocks · block_size); None if 0."""
    return None if block_tokens <= 0 else 1.0 - tokens / block_tokens


class TenantUse(msgspec.Struct, array_like=True, gc=False):
    """What one tenant's sequences hold: sequence count, tokens, blocks (sums)."""

    sequences: int = 0
    tokens: int = 0
    blocks: int = 0


class KvFigures(msgspec.Struct, array_like=True, gc=False):
    """The exact figures of one snapshot (see the module docstring)."""

    ts_ms: int
    block_size: int
    total_blocks: int
    free_blocks: int
    sequences: int
    tokens: int
    blocks: int
    #: The snapshot's preemption counter (None when it did not report one).
    preemptions: int | None
    #: Preemptions per second since the previous snapshot (None for the first).
    preemption_rate: float | None
    tenants: dict[str, TenantUse]

    @property
    def utilisation(self) -> float:
        return 0.0 if self.total_blocks == 0 else 1.0 - self.free_blocks / self.total_blocks

    @property
    def fragmentation(self) -> float | None:
        return fragmentation(self.tokens, self.blocks * self.block_size)

    @property
    def free_block_pressure(self) -> float:
        n = self.sequences
        return 0.0 if n == 0 else max(0, n - self.free_blocks) / n

    def token_share(self, tenant: str) -> float | None:
        use = self.tenants.get(tenant)
        return None if self.tokens == 0 else (use.tokens if use else 0) / self.tokens

    def block_share(self, tenant: str) -> float | None:
        use = self.tenants.get(tenant)
        return None if self.blocks == 0 else (use.blocks if use else 0) / self.blocks


def figures(snap: KvSnapshotLike, previous: KvFigures | None = None) -> KvFigures:
    """The figures of ``snap``; ``previous`` (the instance's prior snapshot) gives the rate."""
    tenants: dict[str, TenantUse] = {}
    tokens = blocks = 0
    for seq in snap.sequences:
        use = tenants.get(seq.tenant)
        if use is None:
            use = tenants[seq.tenant] = TenantUse()
        use.sequences += 1
        use.tokens += seq.tokens
        use.blocks += seq.blocks
        tokens += seq.tokens
        blocks += seq.blocks
    rate: float | None = None
    if (
        previous is not None
        and snap.preemptions is not None
        and previous.preemptions is not None
        and snap.ts_ms > previous.ts_ms
    ):
        delta = snap.preemptions - previous.preemptions
        if delta < 0:  # the counter restarted with the server
            delta = snap.preemptions
        rate = delta * 1000.0 / (snap.ts_ms - previous.ts_ms)
    return KvFigures(
        ts_ms=snap.ts_ms,
        block_size=snap.block_size,
        total_blocks=snap.total_blocks,
        free_blocks=snap.free_blocks,
        sequences=len(snap.sequences),
        tokens=tokens,
        blocks=blocks,
        preemptions=snap.preemptions,
        preemption_rate=rate,
        tenants=dict(sorted(tenants.items())),
    )


class KvMinute(msgspec.Struct, array_like=True, gc=False):
    """Integer sums over the snapshots of one instance in ``[end_ms − 1 min, end_ms)``."""

    end_ms: int
    snapshots: int = 0
    #: Σ tokens and Σ blocks·block_size of the running sequences, over the snapshots.
    tokens: int = 0
    block_tokens: int = 0
    #: Σ (total − free) and Σ total blocks, over the snapshots.
    used_blocks: int = 0
    total_blocks: int = 0
    #: Σ max(0, n − free) and Σ n (running sequences), over the snapshots.
    short_sequences: int = 0
    sequences: int = 0
    #: Preemptions counted between snapshots of this minute and the one before it,
    #: over ``span_ms`` of event time (0 when the instance reports no counter).
    preempted: int = 0
    span_ms: int = 0
    tenants: dict[str, TenantUse] = {}

    @property
    def start_ms(self) -> int:
        return self.end_ms - MINUTE_MS

    @property
    def fragmentation(self) -> float | None:
        """Token-weighted internal fragmentation of the minute."""
        return fragmentation(self.tokens, self.block_tokens)

    @property
    def utilisation(self) -> float | None:
        return None if self.total_blocks == 0 else self.used_blocks / self.total_blocks

    @property
    def free_block_pressure(self) -> float | None:
        if self.snapshots == 0:
            return None
        return 0.0 if self.sequences == 0 else self.short_sequences / self.sequences

    @property
    def preemption_rate(self) -> float | None:
        return None if self.span_ms == 0 else self.preempted * 1000.0 / self.span_ms

    def token_share(self, tenant: str) -> float | None:
        use = self.tenants.get(tenant)
        return None if self.tokens == 0 else (use.tokens if use else 0) / self.tokens

    def add(self, f: KvFigures, previous: KvFigures | None) -> None:
        """Fold one snapshot's figures in (``previous``: the instance's snapshot before it)."""
        self.snapshots += 1
        self.tokens += f.tokens
        self.block_tokens += f.blocks * f.block_size
        self.used_blocks += f.total_blocks - f.free_blocks
        self.total_blocks += f.total_blocks
        self.short_sequences += max(0, f.sequences - f.free_blocks)
        self.sequences += f.sequences
        if (
            previous is not None
            and f.preemptions is not None
            and previous.preemptions is not None
            and f.preemption_rate is not None
        ):
            delta = f.preemptions - previous.preemptions
            self.preempted += delta if delta >= 0 else f.preemptions
            self.span_ms += f.ts_ms - previous.ts_ms
        for tenant, use in f.tenants.items():
            mine = self.tenants.get(tenant)
            if mine is None:
                mine = self.tenants[tenant] = TenantUse()
            mine.sequences += use.sequences
            mine.tokens += use.tokens
            mine.blocks += use.blocks


class _Wire(msgspec.Struct, array_like=True):
    version: int
    instance: str
    host: str | None
    latest: KvFigures | None
    open: KvMinute | None
    minutes: list[KvMinute]


@dataclass(slots=True)
class Applied:
    """What :meth:`KvState.apply` did with one snapshot."""

    #: False for a snapshot not newer than the newest applied (a replay or a late one).
    accepted: bool
    #: Minutes the snapshot closed (oldest first).
    closed: list[KvMinute] = field(default_factory=list)


@dataclass(slots=True)
class KvState:
    """KV state of one instance: the newest snapshot's figures and a minute history."""

    instance: str
    host: str | None = None
    latest: KvFigures | None = None
    #: The minute the newest snapshot falls in (still collecting snapshots).
    open: KvMinute | None = None
    #: Closed minutes, oldest first, at most ``history_minutes`` of event time.
    minutes: list[KvMinute] = field(default_factory=list)
    history_minutes: int = 60

    def __post_init__(self) -> None:
        if not isinstance(self.history_minutes, int) or self.history_minutes < 1:
            msg = f"history_minutes must be an integer ≥ 1, got {self.history_minutes!r}"
            raise ConfigError(msg)

    def apply(self, snap: KvSnapshotLike) -> Applied:
        """Fold one snapshot of this instance in (idempotent for replays)."""
        if snap.instance != self.instance:
            msg = f"snapshot of instance {snap.instance!r} fed to the state of {self.instance!r}"
            raise ConfigError(msg)
        previous = self.latest
        if previous is not None and snap.ts_ms <= previous.ts_ms:
            return Applied(accepted=False)
        f = figures(snap, previous)
        end = snap.ts_ms - snap.ts_ms % MINUTE_MS + MINUTE_MS
        closed: list[KvMinute] = []
        if self.open is not None and self.open.end_ms != end:
            closed.append(self.open)
            self.minutes.append(self.open)
            self.open = None
        if self.open is None:
            self.open = KvMinute(end_ms=end, tenants={})
        self.open.add(f, previous)
        self.latest = f
        if snap.host is not None:
            self.host = snap.host
        horizon = end - self.history_minutes * MINUTE_MS
        if self.minutes and self.minutes[0].end_ms <= horizon:
            self.minutes = [m for m in self.minutes if m.end_ms > horizon]
        return Applied(accepted=True, closed=closed)

    def apply_all(self, snaps: Iterable[KvSnapshotLike]) -> list[Applied]:
        return [self.apply(s) for s in snaps]

    def history(self) -> list[KvMinute]:
        """Closed minutes then the open one, oldest first."""
        return [*self.minutes, *([self.open] if self.open is not None else [])]

    def to_bytes(self) -> bytes:
        wire = _Wire(
            version=_WIRE_VERSION,
            instance=self.instance,
            host=self.host,
            latest=self.latest,
            open=self.open,
            minutes=self.minutes,
        )
        return msgspec.msgpack.encode(wire)

    @classmethod
    def from_bytes(cls, data: bytes, *, history_minutes: int = 60) -> "KvState":
        try:
            wire = msgspec.msgpack.decode(data, type=_Wire)
            if wire.version != _WIRE_VERSION:
                msg = f"state version {wire.version}, this code reads {_WIRE_VERSION}"
                raise ValueError(msg)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            msg = (
                f"KV state does not decode ({exc}); delete the worker data dir and let it "
                "restore from the changelog"
            )
            raise CorruptStateError(msg) from exc
        return cls(
            instance=wire.instance,
            host=wire.host,
            latest=wire.latest,
            open=wire.open,
            minutes=list(wire.minutes),
            history_minutes=history_minutes,
        )


_minute_encoder = msgspec.msgpack.Encoder()
_minute_decoder = msgspec.msgpack.Decoder(KvMinute)


def encode_minute(minute: KvMinute) -> bytes:
    """A minute as msgpack (what the KV agent forwards to the interference detector)."""
    return _minute_encoder.encode(minute)


def decode_minute(data: bytes) -> KvMinute:
    try:
        return _minute_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        msg = f"KV minute does not decode: {exc}"
        raise CorruptStateError(msg) from exc
