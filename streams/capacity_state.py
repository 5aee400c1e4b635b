"""Bytes of the capacity agent's state, so a restarted worker continues where it was.

Four kinds of record per deployment (service|model), each a msgpack array
with a version, stored by :mod:`tailguard.agents.capacity` in its RocksDB
table (changelogged)::

    core     load window (open intervals, watermark), the published knee,
             scaling hysteresis (streaks, last action, episode), warm-up
             tracker, GPUs seen, last published hold, the offset of the
             last applied internal message and, per input partition, the
             newest input position applied (:mod:`~tailguard.streams.input_marks`)
    knee     the knee history (up to 240 interval samples, ~8 KB), the last
             evaluations' knee candidates and the published knee: it changes
             only when a load interval closes, so it is written then and not
             with every message (the core is; before, the core carried the
             history and every message rewrote it)
    experts  every expert's breaker (state, last-100 window, probes, opened
             at) and the deployment's recent expert traffic
    rag      one index's similarity window, published threshold, refit
             counter and last direction

Configuration (intervals, policies, quantiles) is not stored: it comes from
the running worker's tuning, so a changed setting applies after a restart.
Values are kept exactly (float64), so a restored state decides exactly as the
one that was saved would have — a property the unit tests check by cutting a
scenario at every point and comparing with an uninterrupted run.
"""

from collections import deque
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec
from tailguard.streams.breaker import Breaker, BreakerPolicy, ExpertBreakers
from tailguard.streams.capacity import LoadWindow, OpenInterval, ScaleState, WarmupTracker
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.input_marks import Marks
from tailguard.streams.knee import Knee, KneeConfig, KneeTracker, LoadSample, find_knee
from tailguard.streams.rag import RagConfig, RagThreshold

__all__ = [
    "MAX_SEGMENTS",
    "CoreState",
    "decode_core",
    "decode_experts",
    "decode_knee",
    "decode_rag",
    "encode_core",
    "encode_experts",
    "encode_knee",
    "encode_rag",
    "restore_segments",
    "segment_changes",
]

_VERSION = 1
_W = TypeVar("_W")


@dataclass(slots=True)
class CoreState:
    """Everything of a deployment but its breakers and RAG indexes."""

    load: LoadWindow
    knee: KneeTracker
    scale: ScaleState = field(default_factory=ScaleState)
    warmup: WarmupTracker = field(default_factory=WarmupTracker)
    gpus: set[tuple[str, int]] = field(default_factory=set)
    last_hold: str | None = None
    #: Offset of the last internal message applied (its partition is fixed by the key).
    offset: int = -1
    #: Newest input position applied per input partition (replays of the ingest).
    applied: Marks = field(default_factory=dict)
    #: Segments holding the open intervals' values: ``(number, newest interval
    #: start it holds)``, oldest first.
    segments: list[tuple[int, int]] = field(default_factory=list)
    #: Number of the next segment.
    next_segment: int = 0


#: A confirmed-candidate knee: concurrency, P95, tokens/s, samples, bins, interval.
_RecentKnee = tuple[float, float, float, int, int, float, float]


class _CoreWire(msgspec.Struct, array_like=True):
    version: int
    open: list[tuple[int, list[float], int]]
    closed_through: int
    late: int
    samples: list[tuple[int, float, float, float]]
    knee_published: float | None
    high_streak: int
    low_streak: int
    last_action_ms: int | None
    last_action: str | None
    episode: str | None
    warm_before: dict[str, list[float]]
    warm_after: dict[str, list[float]]
    warm_reported: list[str]
    gpus: list[tuple[str, int]]
    last_hold: str | None
    offset: int
    #: The knee tracker's last evaluations (added later: absent in older state,
    #: which restores with none — the next evaluations refill them).
    knee_recent: list[_RecentKnee | None] = []
    #: ``(input partition, offset, row index)``: the marks (absent in older state,
    #: which restores with none: a replay of the ingest then counts its rows again).
    applied: list[tuple[int, int, int]] = []
    #: The segments listed (absent in older state, whose ``open`` holds every value).
    segments: list[tuple[int, int]] = []
    next_segment: int = 0


class _SegmentWire(msgspec.Struct, array_like=True):
    version: int
    #: ``(interval start, the E2E values added to it)``.
    values: list[tuple[int, list[float]]]


class _KneeWire(msgspec.Struct, array_like=True):
    version: int
    samples: list[tuple[int, float, float, float]]
    published: float | None
    recent: list[_RecentKnee | None]


class _BreakerWire(msgspec.Struct, array_like=True):
    expert: int
    state: str
    window: list[tuple[bool, float]]
    probes: list[tuple[bool, float]]
    opened_ms: int | None
    seen: int


class _ExpertsWire(msgspec.Struct, array_like=True):
    version: int
    breakers: list[_BreakerWire]
    recent: list[list[int]]


class _RagWire(msgspec.Struct, array_like=True):
    version: int
    values: list[float]
    published: float | None
    pending: int
    direction: int


_core_decoder = msgspec.msgpack.Decoder(_CoreWire)
_experts_decoder = msgspec.msgpack.Decoder(_ExpertsWire)
_knee_decoder = msgspec.msgpack.Decoder(_KneeWire)
_rag_decoder = msgspec.msgpack.Decoder(_RagWire)
_segment_decoder = msgspec.msgpack.Decoder(_SegmentWire)


def _decode(decoder: "msgspec.msgpack.Decoder[_W]", data: bytes, what: str) -> _W:
    try:
        wire = decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        msg = f"capacity {what} state does not decode: {exc}"
        raise CorruptStateError(msg) from exc
    version = getattr(wire, "version", None)
    if version != _VERSION:
        msg = f"capacity {what} state has version {version}, this worker reads {_VERSION}"
        raise CorruptStateError(msg)
    return wire


def _recent_wire(k: Knee) -> _RecentKnee:
    if k.concurrency is None or k.p95_ms is None or k.tokens_per_s is None:
        msg = "a recent knee candidate always has a concurrency, P95 and tokens/s"
        raise ValueError(msg)
    low = k.concurrency if k.low is None else k.low
    high = k.concurrency if k.high is None else k.high
    return (k.concurrency, k.p95_ms, k.tokens_per_s, k.samples, k.bins, low, high)


def encode_core(core: CoreState, *, history: bool = True) -> bytes:
    """The core; ``history=False`` leaves out the knee history and candidates (kept
    in their own record, :func:`encode_knee`), the published knee stays in."""
    load, knee, scale, warm = core.load, core.knee, core.scale, core.warmup
    wire = _CoreWire(
        version=_VERSION,
        open=[
            (start, slot.e2e[slot.saved :], slot.tokens)
            for start, slot in sorted(load.open.items())
        ],
        closed_through=load.closed_through,
        late=load.late,
        samples=_samples(knee) if history else [],
        knee_published=knee.published,
        high_streak=scale.high_streak,
        low_streak=scale.low_streak,
        last_action_ms=scale.last_action_ms,
        last_action=scale.last_action,
        episode=scale.episode,
        warm_before=warm.before,
        warm_after=warm.warm,
        warm_reported=sorted(warm.reported),
        gpus=sorted(core.gpus),
        last_hold=core.last_hold,
        offset=core.offset,
        knee_recent=_recent(knee) if history else [],
        applied=[(part, offset, index) for part, (offset, index) in sorted(core.applied.items())],
        segments=list(core.segments),
        next_segment=core.next_segment,
    )
    return msgspec.msgpack.encode(wire)


def _samples(knee: KneeTracker) -> list[tuple[int, float, float, float]]:
    return [(s.ts_ms, s.concurrency, s.p95_ms, s.tokens_per_s) for s in knee.samples]


def _recent(knee: KneeTracker) -> list[_RecentKnee | None]:
    return [None if k is None else _recent_wire(k) for k in knee.recent]


def _tracker(
    config: KneeConfig,
    samples: list[tuple[int, float, float, float]],
    recent: list[_RecentKnee | None],
    published: float | None,
) -> KneeTracker:
    history = deque(LoadSample(*s) for s in samples[-config.history :])
    candidates = deque(
        None if k is None else Knee(k[0], k[1], k[2], k[3], k[4], "kneedle", low=k[5], high=k[6])
        for k in recent[-config.confirm_window :]
    )
    tracker = KneeTracker(config, history, published=published, recent=candidates)
    if history:
        tracker.current = find_knee(list(history), config)
    return tracker


def encode_knee(knee: KneeTracker) -> bytes:
    """The knee record: history, recent candidates, published knee."""
    wire = _KneeWire(_VERSION, _samples(knee), knee.published, _recent(knee))
    return msgspec.msgpack.encode(wire)


def decode_knee(data: bytes, config: KneeConfig) -> KneeTracker:
    """The knee tracker in ``data``; :class:`CorruptStateError` when it does not restore."""
    w = _decode(_knee_decoder, data, "knee")
    return _tracker(config, w.samples, w.recent, w.published)


def decode_core(
    data: bytes,
    *,
    interval_ms: int,
    grace_ms: int,
    knee: KneeConfig,
    warmup_after: int,
) -> CoreState:
    """The core state in ``data``; :class:`CorruptStateError` when it does not restore."""
    w = _decode(_core_decoder, data, "core")
    load = LoadWindow(
        interval_ms,
        grace_ms,
        open={start: OpenInterval(list(e2e), tokens) for start, e2e, tokens in w.open},
        closed_through=w.closed_through,
        late=w.late,
    )
    tracker = _tracker(knee, w.samples, w.knee_recent, w.knee_published)
    scale = ScaleState(w.high_streak, w.low_streak, w.last_action_ms, w.last_action, w.episode)
    warm = WarmupTracker(
        warmup_after,
        {k: list(v) for k, v in w.warm_before.items()},
        {k: list(v) for k, v in w.warm_after.items()},
        set(w.warm_reported),
    )
    return CoreState(
        load,
        tracker,
        scale,
        warm,
        {(h, g) for h, g in w.gpus},
        w.last_hold,
        w.offset,
        {part: (offset, index) for part, offset, index in w.applied},
        [(seq, newest) for seq, newest in w.segments],
        w.next_segment,
    )


def encode_experts(experts: ExpertBreakers) -> bytes:
    wire = _ExpertsWire(
        version=_VERSION,
        breakers=[
            _BreakerWire(e, b.state, list(b.window), list(b.probes), b.opened_ms, b.seen)
            for e, b in sorted(experts.breakers.items())
        ],
        recent=[list(ids) for ids in experts.recent],
    )
    return msgspec.msgpack.encode(wire)


def decode_experts(data: bytes, policy: BreakerPolicy) -> ExpertBreakers:
    w = _decode(_experts_decoder, data, "experts")
    out = ExpertBreakers(policy, recent=deque(tuple(ids) for ids in w.recent))
    for bw in w.breakers:
        b = Breaker(bw.expert, policy, bw.state, probes=list(bw.probes), opened_ms=bw.opened_ms)
        b.seen = bw.seen
        b._reset(list(bw.window))  # recounts errors and slow requests of the window
        out.breakers[bw.expert] = b
    return out


def encode_rag(tracker: RagThreshold) -> bytes:
    wire = _RagWire(
        version=_VERSION,
        values=list(tracker.values),
        published=tracker.published,
        pending=tracker.pending,
        direction=tracker.direction,
    )
    return msgspec.msgpack.encode(wire)


def decode_rag(data: bytes, config: RagConfig) -> RagThreshold:
    w = _decode(_rag_decoder, data, "rag")
    values = deque(w.values[-config.window :])
    return RagThreshold(config, values, w.published, w.pending, w.direction)


# --- segments: the open intervals' values, each stored once -------------------


#: Segments a core lists at most: past it, the next segment holds every value of
#: the open intervals and replaces them (an interval of a busy deployment sees
#: hundreds of messages; each value is then rewritten a few times, not hundreds).
MAX_SEGMENTS = 32


def segment_changes(core: CoreState) -> tuple[tuple[int, bytes] | None, list[int]]:
    """What a save of ``core`` writes of its open intervals' values: the next segment
    ``(number, bytes)`` to write before the core (None: nothing new), and the
    segments to delete after it (their intervals all closed, or replaced by the new
    segment). ``core`` then lists its segments as the new core record must.

    A segment holds each value once and the core only what no segment does, so
    saving after every message no longer rewrites every value of an open
    interval (an interval of a busy deployment holds thousands, and a message
    touches tens of deployments).
    """
    through = core.load.closed_through
    done = [number for number, newest in core.segments if newest <= through]
    listed = [(number, newest) for number, newest in core.segments if newest > through]
    whole = len(listed) >= MAX_SEGMENTS
    if whole:
        done += [number for number, _ in listed]
        listed = []
    values = [
        (start, slot.e2e if whole else slot.e2e[slot.saved :])
        for start, slot in sorted(core.load.open.items())
        if len(slot.e2e) > (0 if whole else slot.saved)
    ]
    core.segments = listed
    if not values:
        return None, done
    for start, _ in values:
        slot = core.load.open[start]
        slot.saved = len(slot.e2e)
    number = core.next_segment
    core.next_segment += 1
    core.segments.append((number, values[-1][0]))
    return (number, msgspec.msgpack.encode(_SegmentWire(_VERSION, values))), done


def restore_segments(core: CoreState, segments: list[bytes]) -> None:
    """Put the values of ``core``'s segments (their bytes, in its order) back in front
    of the open intervals' own, as they were added; an interval closed since holds
    none. :class:`CorruptStateError` for bytes that do not decode."""
    front: dict[int, list[float]] = {}
    for data in segments:
        for start, values in _decode(_segment_decoder, data, "segment").values:
            if start in core.load.open:
                front.setdefault(start, []).extend(values)
    for start, values in front.items():
        slot = core.load.open[start]
        slot.e2e = values + slot.e2e
        slot.saved = len(values)
