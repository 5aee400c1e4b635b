"""The A/B and gray-release guard: per-arm state, evaluations and decisions (docs/experiments.md).

One :class:`ExperimentState` per experiment, folded from three inputs and
judged at event-time boundaries::

    requests (inference events with experiment = id) ─┐
    interactions (interrupt / session end)  ──────────┼─▶ pending buckets ──(watermark passes
    offline evals (BLEU, ROUGE-L …)  ─────────────────┘   per evaluate_every  boundary + lateness)
                                                                │
                                    cumulative per-arm stats ◀──┘ fold the closed bucket
                                                │
                                                ▼ evaluate at the boundary (an "update")
        SRM (units per arm vs planned weights) · guardrails (quantile and proportion
        confidence sequences) · pollution (cause flags by arm) · misalignment (evals vs online)
                                                │
                                                ▼ decide
                    rollback | hold | promote | continue   (+ reasons, evidence, weights)

Event time throughout: a request belongs to the bucket of its ``ts_ms``; a
bucket is folded once the experiment's watermark (newest event time seen)
is ``lateness`` past its end, and an event older than the last folded
boundary is counted as late, not merged. The state holds exact counts and
log-bucket histograms, so it does not depend on how events were batched,
and a replay of the same input evaluates the same boundaries with the same
counts, hence takes the same decisions. Re-delivered input is ignored: the
state remembers, per input partition, the highest input offset it absorbed.

Decision rules, per treatment arm against the control (first match wins):

1. **hold** — sample ratio mismatch: the chi-square p-value *and* the
   anytime-valid p-value of the units per arm against the planned weights are
   both below ``srm_alpha``. The comparison is invalid: never promote, and
   guardrail breaches are reported but not acted on.
2. **rollback** — a guardrail is breached: its confidence sequence lies
   entirely on the bad side of the limit. Once per experiment: the state then
   turns ``rolled_back`` and takes no further decisions.
3. **hold** — polluted (a cause flag — prefix-cache miss, batch wait, token
   throttling — differs significantly, by ≥ ``pollution_min_diff``, between
   arms: a hidden degradation hits the arms unequally) or misaligned (an
   offline score improves while an online guardrail is significantly worse).
4. **promote** — every guardrail of every treatment passed (its sequence lies
   within the limit) and every arm has its minimum samples.
5. **continue** — otherwise.

Error control: each comparison runs at ``alpha / (guardrails × treatments)``
(Bonferroni), so the chance that *any* guardrail ever wrongly rolls back —
looking at every update, forever — is at most ``alpha``; the same bound holds
for a wrong promote. See :mod:`tailguard.streams.sequential` for the
sequences and their sources.

Human feedback (``hallucination_rate: {max_diff: d}``): ratings of requests
(interactions of kind ``feedback``) are kept per arm and stratum; the arms are
compared by a stratified permutation test
(:mod:`tailguard.streams.permutation`) at fixed information milestones only,
its share of alpha split over those looks — see :func:`_hallucination`.
"""

import hashlib
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Literal, Protocol

import msgspec
import numpy as np
from tailguard.streams.attribution import FACTORS, factor_flags
from tailguard.streams.columns import event_hashes
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.experiment_def import ExperimentDef, Guardrail, metric_kind
from tailguard.streams.loghist import LogHist
from tailguard.streams.permutation import (
    RESIDUAL,
    Stratum,
    mh_difference,
    mh_interval,
    pool_single_arm,
    seed_of,
    stratified_permutation_test,
)
from tailguard.streams.prompt_evidence import rank_prompts
from tailguard.streams.prompt_tally import OTHER_PROMPT, PromptTally
from tailguard.streams.sequential import (
    SrmResult,
    bernoulli_cs,
    p_value_by_bisection,
    quantile_cs,
    quantile_ranks,
    srm_test,
)
from tailguard.streams.sli import Thresholds
from tailguard.streams.special import chi2_sf

__all__ = [
    "DECISIONS",
    "FEEDBACK_LABELS",
    "INTERACTION_KINDS",
    "ArmStats",
    "Decision",
    "Evaluation",
    "ExperimentInteractions",
    "ExperimentRequests",
    "ExperimentState",
    "GuardrailResult",
    "RequestBook",
    "SessionBook",
    "UnitBook",
    "decide",
    "evaluate",
    "evidence",
    "fixed_horizon_p",
    "hash_strings",
    "look_index",
    "prompt_evidence",
    "rating_strata",
]

DECISIONS = ("rollback", "promote", "hold", "continue")
#: Interaction kind → code on the wire.
INTERACTION_KINDS = {"interrupt": 0, "session_complete": 1, "session_abandon": 2, "feedback": 3}
#: Feedback label → code (0: no label).
FEEDBACK_LABELS = {"correct": 1, "partial": 2, "hallucination": 3}
_STATUS = {"ok": 0, "error": 1, "timeout": 2, "rejected": 3, "cancelled": 4}
#: Fewest units (in all) before SRM is tested at all.
SRM_MIN_UNITS = 100
_STATE_VERSION = 1
#: Gaps per request forwarded for the descriptive per-gap percentiles.
MAX_GAPS = 16


def hash_strings(values: Sequence[str | None]) -> np.ndarray:
    """64-bit FNV-1a of each string (0 for None), as ``uint64``."""
    out = np.zeros(len(values), dtype=np.uint64)
    present = [i for i, v in enumerate(values) if v]
    if present:
        out[present] = event_hashes([str(values[i]) for i in present])
        out[out == 0] = 1
    return out


def _index(names: list[str], values: Sequence[str | None]) -> np.ndarray:
    """Position of each value in ``names`` (appended when new); −1 for None."""
    pos = {n: i for i, n in enumerate(names)}
    out = np.empty(len(values), dtype=np.int32)
    for i, v in enumerate(values):
        if v is None:
            out[i] = -1
            continue
        j = pos.get(v)
        if j is None:
            j = pos[v] = len(names)
            names.append(v)
        out[i] = j
    return out


# ---------------------------------------------------------------- input columns


class _RequestsWire(msgspec.Struct, array_like=True):
    arm_names: list[str]
    prompt_names: list[str]
    ts: bytes
    arm: bytes
    status: bytes
    ttft: bytes
    e2e: bytes
    itl: bytes
    itl_len: bytes
    itl_weight: bytes
    gap: bytes
    ids: bytes
    unit: bytes
    session: bytes
    factors: bytes
    hit: bytes
    query: bytes
    prompt: bytes
    part: bytes
    offset: bytes
    # added later (records without it decode with every trace id "")
    traces: list[str] = []


@dataclass(slots=True)
class ExperimentRequests:
    """Requests of one experiment as columns (index i = one request).

    ``arm`` and ``prompt`` index ``arm_names`` / ``prompt_names`` (−1: none);
    ``unit`` / ``session`` are 64-bit hashes (0: none); ``query`` is −1 when
    the request reported no prefix-cache figures; ``part`` / ``offset`` are the
    input position (−1: unknown, no replay protection); ``traces`` the
    request's ``trace_id`` (``""``: none), for the prompt evidence's exemplars.

    Gaps: ``gap`` is one gap per request (NaN without gaps), chosen by the event
    hash — gaps within one request share its decode speed, so they are not
    independent, and the quantile tests need independent draws; one gap per
    request is exactly that, a sample of the per-token gap distribution with
    each request weighted once. ``itl`` keeps at most :data:`MAX_GAPS` evenly
    spaced gaps of each request, each standing for ``itl_weight`` gaps (for the
    descriptive per-gap P95/P99), so a message's size does not grow with the
    completion length.
    """

    arm_names: list[str]
    prompt_names: list[str]
    ts: np.ndarray
    arm: np.ndarray
    status: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    itl: np.ndarray
    itl_len: np.ndarray
    itl_weight: np.ndarray
    gap: np.ndarray
    ids: np.ndarray
    unit: np.ndarray
    session: np.ndarray
    factors: np.ndarray
    hit: np.ndarray
    query: np.ndarray
    prompt: np.ndarray
    part: np.ndarray
    offset: np.ndarray
    traces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.traces and self.ts.size:
            self.traces = [""] * int(self.ts.size)

    def __len__(self) -> int:
        return int(self.ts.size)

    @classmethod
    def from_events(
        cls, events: Sequence[Any], positions: Sequence[tuple[int, int]] | None = None
    ) -> "ExperimentRequests":
        """Columns of ``InferenceEvent``-like objects (duck-typed)."""
        n = len(events)
        arm_names: list[str] = []
        prompt_names: list[str] = []
        ids = event_hashes([ev.event_id for ev in events])
        gaps: list[Sequence[float]] = []
        weights: list[int] = []
        picked: list[float] = []
        for ev, h in zip(events, ids.tolist(), strict=True):
            g = ev.itl_ms or ()
            k = len(g)
            if not k:
                gaps.append(g)
                weights.append(1)
                picked.append(math.nan)
                continue
            picked.append(g[h % k])
            if k <= MAX_GAPS:
                gaps.append(g)
                weights.append(1)
            else:
                stride = -(-k // MAX_GAPS)
                kept = g[::stride]
                gaps.append(kept)
                weights.append(round(k / len(kept)))
        caches = [ev.cache for ev in events]
        part = np.full(n, -1, dtype=np.int64)
        offset = np.full(n, -1, dtype=np.int64)
        if positions is not None:
            part = np.fromiter((p for p, _ in positions), dtype=np.int64, count=n)
            offset = np.fromiter((o for _, o in positions), dtype=np.int64, count=n)
        return cls(
            arm_names=arm_names,
            prompt_names=prompt_names,
            ts=np.fromiter((ev.ts_ms for ev in events), dtype=np.int64, count=n),
            arm=_index(arm_names, [ev.variant for ev in events]),
            status=np.fromiter((_STATUS.get(ev.status, 4) for ev in events), np.uint8, n),
            ttft=np.fromiter(
                (np.nan if ev.ttft_ms is None else ev.ttft_ms for ev in events), np.float64, n
            ),
            e2e=np.fromiter((ev.e2e_ms for ev in events), dtype=np.float64, count=n),
            itl=np.fromiter(chain.from_iterable(gaps), dtype=np.float64),
            itl_len=np.fromiter((len(g) for g in gaps), dtype=np.int64, count=n),
            itl_weight=np.asarray(weights, dtype=np.int64),
            gap=np.asarray(picked, dtype=np.float64),
            ids=ids,
            unit=hash_strings([ev.unit_id for ev in events]),
            session=hash_strings([ev.session_id for ev in events]),
            factors=factor_flags(events),
            hit=np.fromiter((c.prefix_hit_tokens if c else 0 for c in caches), np.int64, n),
            query=np.fromiter((c.prefix_query_tokens if c else -1 for c in caches), np.int64, n),
            prompt=_index(prompt_names, [ev.prompt_version for ev in events]),
            part=part,
            offset=offset,
            traces=[getattr(ev, "trace_id", None) or "" for ev in events],
        )

    def take(self, index: np.ndarray) -> "ExperimentRequests":
        """The requests at ``index`` (in that order)."""
        index = np.asarray(index, dtype=np.int64)
        ends = np.r_[0, np.cumsum(self.itl_len)]
        lens = self.itl_len[index]
        total = int(lens.sum())
        if total:
            shift = np.repeat(ends[index] - (np.cumsum(lens) - lens), lens)
            itl = self.itl[shift + np.arange(total)]
        else:
            itl = np.empty(0, dtype=np.float64)
        return ExperimentRequests(
            arm_names=self.arm_names,
            prompt_names=self.prompt_names,
            ts=self.ts[index],
            arm=self.arm[index],
            status=self.status[index],
            ttft=self.ttft[index],
            e2e=self.e2e[index],
            itl=itl,
            itl_len=lens,
            itl_weight=self.itl_weight[index],
            gap=self.gap[index],
            ids=self.ids[index],
            unit=self.unit[index],
            session=self.session[index],
            factors=self.factors[index],
            hit=self.hit[index],
            query=self.query[index],
            prompt=self.prompt[index],
            part=self.part[index],
            offset=self.offset[index],
            traces=[self.traces[i] for i in index.tolist()],
        )

    def sampled_gap(self) -> np.ndarray:
        """One gap per request (NaN without gaps), chosen by the event hash."""
        return self.gap

    def to_wire(self) -> _RequestsWire:
        return _RequestsWire(
            arm_names=self.arm_names,
            prompt_names=self.prompt_names,
            ts=self.ts.astype("<i8").tobytes(),
            arm=self.arm.astype("<i4").tobytes(),
            status=self.status.astype(np.uint8).tobytes(),
            ttft=self.ttft.astype("<f8").tobytes(),
            e2e=self.e2e.astype("<f8").tobytes(),
            itl=self.itl.astype("<f8").tobytes(),
            itl_len=self.itl_len.astype("<i4").tobytes(),
            itl_weight=self.itl_weight.astype("<i4").tobytes(),
            gap=self.gap.astype("<f8").tobytes(),
            ids=self.ids.astype("<u8").tobytes(),
            unit=self.unit.astype("<u8").tobytes(),
            session=self.session.astype("<u8").tobytes(),
            factors=self.factors.astype(np.uint8).tobytes(),
            hit=self.hit.astype("<i8").tobytes(),
            query=self.query.astype("<i8").tobytes(),
            prompt=self.prompt.astype("<i4").tobytes(),
            part=self.part.astype("<i4").tobytes(),
            offset=self.offset.astype("<i8").tobytes(),
            traces=self.traces if any(self.traces) else [],
        )

    @classmethod
    def from_wire(cls, w: _RequestsWire) -> "ExperimentRequests":
        """Inverse of :meth:`to_wire`; ``ValueError`` when the columns disagree."""
        r = cls(
            arm_names=list(w.arm_names),
            prompt_names=list(w.prompt_names),
            ts=np.frombuffer(w.ts, "<i8"),
            arm=np.frombuffer(w.arm, "<i4"),
            status=np.frombuffer(w.status, np.uint8),
            ttft=np.frombuffer(w.ttft, "<f8"),
            e2e=np.frombuffer(w.e2e, "<f8"),
            itl=np.frombuffer(w.itl, "<f8"),
            itl_len=np.frombuffer(w.itl_len, "<i4").astype(np.int64),
            itl_weight=np.frombuffer(w.itl_weight, "<i4").astype(np.int64),
            gap=np.frombuffer(w.gap, "<f8"),
            ids=np.frombuffer(w.ids, "<u8"),
            unit=np.frombuffer(w.unit, "<u8"),
            session=np.frombuffer(w.session, "<u8"),
            factors=np.frombuffer(w.factors, np.uint8),
            hit=np.frombuffer(w.hit, "<i8"),
            query=np.frombuffer(w.query, "<i8"),
            prompt=np.frombuffer(w.prompt, "<i4"),
            part=np.frombuffer(w.part, "<i4").astype(np.int64),
            offset=np.frombuffer(w.offset, "<i8"),
            traces=list(w.traces),
        )
        n = r.ts.size
        cols = (r.arm, r.status, r.ttft, r.e2e, r.itl_len, r.ids, r.unit, r.session)
        more = (r.factors, r.hit, r.query, r.prompt, r.part, r.offset, r.itl_weight, r.gap)
        if (
            any(c.size != n for c in (*cols, *more))
            or int(r.itl_len.sum()) != r.itl.size
            or len(r.traces) != n
        ):
            msg = "experiment request columns disagree in length"
            raise ValueError(msg)
        if n and (
            int(r.arm.max()) >= len(r.arm_names) or int(r.prompt.max()) >= len(r.prompt_names)
        ):
            msg = "experiment request columns index past their name lists"
            raise ValueError(msg)
        return r


class _InteractionsWire(msgspec.Struct, array_like=True):
    arm_names: list[str]
    ts: bytes
    kind: bytes
    arm: bytes
    unit: bytes
    session: bytes
    part: bytes
    offset: bytes
    # feedback (added later: records without them decode with empty columns)
    label: bytes = b""
    rater: bytes = b""
    request: bytes = b""


@dataclass(slots=True)
class ExperimentInteractions:
    """Interactions of one experiment as columns (``kind``: :data:`INTERACTION_KINDS`).

    Feedback: ``label`` (:data:`FEEDBACK_LABELS`, 0: none), ``rater`` and
    ``request`` (the rated request's ``event_id``) as 64-bit hashes (0: none).
    """

    arm_names: list[str]
    ts: np.ndarray
    kind: np.ndarray
    arm: np.ndarray
    unit: np.ndarray
    session: np.ndarray
    part: np.ndarray
    offset: np.ndarray
    label: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint8))
    rater: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    request: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))

    def __post_init__(self) -> None:
        n = self.ts.size
        if self.label.size == 0 and n:
            self.label = np.zeros(n, dtype=np.uint8)
        if self.rater.size == 0 and n:
            self.rater = np.zeros(n, dtype=np.uint64)
        if self.request.size == 0 and n:
            self.request = np.zeros(n, dtype=np.uint64)

    def __len__(self) -> int:
        return int(self.ts.size)

    @classmethod
    def from_events(
        cls, events: Sequence[Any], positions: Sequence[tuple[int, int]] | None = None
    ) -> "ExperimentInteractions":
        n = len(events)
        arm_names: list[str] = []
        part = np.full(n, -1, dtype=np.int64)
        offset = np.full(n, -1, dtype=np.int64)
        if positions is not None:
            part = np.fromiter((p for p, _ in positions), dtype=np.int64, count=n)
            offset = np.fromiter((o for _, o in positions), dtype=np.int64, count=n)
        return cls(
            arm_names=arm_names,
            ts=np.fromiter((ev.ts_ms for ev in events), dtype=np.int64, count=n),
            kind=np.fromiter((INTERACTION_KINDS[ev.kind] for ev in events), np.uint8, n),
            arm=_index(arm_names, [ev.variant for ev in events]),
            unit=hash_strings([ev.unit_id for ev in events]),
            session=hash_strings([ev.session_id for ev in events]),
            part=part,
            offset=offset,
            label=np.fromiter(
                (FEEDBACK_LABELS.get(getattr(ev, "label", None) or "", 0) for ev in events),
                np.uint8,
                n,
            ),
            rater=hash_strings([getattr(ev, "rater", None) for ev in events]),
            request=hash_strings([getattr(ev, "request_event_id", None) for ev in events]),
        )

    def to_wire(self) -> _InteractionsWire:
        return _InteractionsWire(
            arm_names=self.arm_names,
            ts=self.ts.astype("<i8").tobytes(),
            kind=self.kind.astype(np.uint8).tobytes(),
            arm=self.arm.astype("<i4").tobytes(),
            unit=self.unit.astype("<u8").tobytes(),
            session=self.session.astype("<u8").tobytes(),
            part=self.part.astype("<i4").tobytes(),
            offset=self.offset.astype("<i8").tobytes(),
            label=self.label.astype(np.uint8).tobytes(),
            rater=self.rater.astype("<u8").tobytes(),
            request=self.request.astype("<u8").tobytes(),
        )

    @classmethod
    def from_wire(cls, w: _InteractionsWire) -> "ExperimentInteractions":
        r = cls(
            arm_names=list(w.arm_names),
            ts=np.frombuffer(w.ts, "<i8"),
            kind=np.frombuffer(w.kind, np.uint8),
            arm=np.frombuffer(w.arm, "<i4"),
            unit=np.frombuffer(w.unit, "<u8"),
            session=np.frombuffer(w.session, "<u8"),
            part=np.frombuffer(w.part, "<i4").astype(np.int64),
            offset=np.frombuffer(w.offset, "<i8"),
            label=np.frombuffer(w.label, np.uint8),
            rater=np.frombuffer(w.rater, "<u8"),
            request=np.frombuffer(w.request, "<u8"),
        )
        n = r.ts.size
        cols = (r.kind, r.arm, r.unit, r.session, r.part, r.offset, r.label, r.rater, r.request)
        if any(c.size != n for c in cols):
            msg = "experiment interaction columns disagree in length"
            raise ValueError(msg)
        if n and (
            int(r.arm.max()) >= len(r.arm_names) or int(r.kind.max()) > 3 or int(r.label.max()) > 3
        ):
            msg = "experiment interaction columns hold unknown arms or kinds"
            raise ValueError(msg)
        return r


# ---------------------------------------------------------------- per-arm stats

_COUNTERS = (
    "requests", "ok", "failed", "cancelled", "units", "hit_tokens", "query_tokens",
    "sessions", "completed", "interrupted",
)  # fmt: skip
_HISTS = ("ttft", "e2e", "itl", "itl_all")
#: Prompt versions remembered per arm (the most frequent; the rest are summed as "other").
MAX_PROMPT_VERSIONS = 8
#: Rating strata kept per arm (the rest are summed into "other").
MAX_RATING_STRATA = 64
#: Distinct raters remembered per arm (for the evidence's rater count).
MAX_RATERS = 4096
#: Stratum of feedback whose rated request the guard does not know.
UNKNOWN_STRATUM = "unknown"
#: Slowest bad requests (with a trace id) kept per arm and prompt version.
PROMPT_EXEMPLARS = 3
#: TTFT (ms) over which an ok request is bad when the caller names no limit (default TTFT SLO).
DEFAULT_BAD_TTFT_MS = Thresholds().ttft_ms


class _ArmWire(msgspec.Struct, array_like=True):
    counters: list[int]
    factors: list[int]
    hists: list[tuple[int, bytes]]
    prompts: dict[str, int]
    # human feedback (added later; older state decodes without it)
    ratings: dict[str, list[int]] = {}
    raters: list[int] = []
    # prompt evidence (added later; older state decodes without it)
    bad: int = 0
    prompt_tallies: dict[str, tuple[int, int, list[tuple[float, str]]]] = {}


class ArmStats:
    """Exact counters and latency histograms of one arm (over a bucket or in total).

    Latencies are of ``ok`` requests; ``itl`` holds one gap per request (see
    :meth:`ExperimentRequests.sampled_gap`), ``itl_all`` every gap. Success
    rate = ok / (ok + failed), cancelled requests left out.

    Human feedback: ``ratings`` maps a stratum (prompt group or version) to
    ``[rated, hallucination, partial]``; ``raters`` holds the distinct raters'
    hashes (at most :data:`MAX_RATERS`). Hallucination rate = hallucination /
    rated (``partial`` counts as not a hallucination).

    Prompt evidence: ``bad`` counts the arm's bad requests (failed, or ok with a
    TTFT over the experiment's limit, see :attr:`ExperimentDef.bad_ttft_ms`) and
    ``prompt_tallies`` maps a prompt version to its requests, bad requests and
    the :data:`PROMPT_EXEMPLARS` slowest bad ones that had a trace,
    ``(e2e_ms, trace_id)`` largest first. At most :data:`MAX_PROMPT_VERSIONS`
    versions (those with the most bad requests; the rest summed as ``~other``);
    merging sums the counts and keeps the largest exemplar tuples, so without
    trimming it does not depend on the order of the parts.
    """

    __slots__ = (
        *_COUNTERS, *_HISTS, "factors", "prompts", "ratings", "raters", "bad", "prompt_tallies",
    )  # fmt: skip

    def __init__(self) -> None:
        for name in _COUNTERS:
            setattr(self, name, 0)
        for name in _HISTS:
            setattr(self, name, LogHist())
        self.factors = [0] * len(FACTORS)
        self.prompts: dict[str, int] = {}
        self.ratings: dict[str, list[int]] = {}
        self.raters: set[int] = set()
        self.bad = 0
        self.prompt_tallies: dict[str, PromptTally] = {}

    # typed views of the slots (mypy)
    requests: int
    ok: int
    failed: int
    cancelled: int
    units: int
    hit_tokens: int
    query_tokens: int
    sessions: int
    completed: int
    interrupted: int
    ttft: LogHist
    e2e: LogHist
    itl: LogHist
    itl_all: LogHist

    def add_requests(
        self, r: ExperimentRequests, new_units: int, bad_ttft_ms: float = DEFAULT_BAD_TTFT_MS
    ) -> None:
        """Fold every request of ``r`` (all of one arm) in; an ok request with a TTFT
        over ``bad_ttft_ms`` counts as bad (as does every failed one)."""
        ok = r.status == 0
        failed = (r.status >= 1) & (r.status <= 3)
        bad = failed | (ok & (r.ttft > bad_ttft_ms))  # NaN TTFT compares False
        self.requests += len(r)
        self.bad += int(bad.sum())
        self.ok += int(ok.sum())
        self.failed += int(failed.sum())
        self.cancelled += int((r.status == 4).sum())
        self.units += new_units
        ttft = r.ttft[ok]
        self.ttft.add(ttft[~np.isnan(ttft)])
        self.e2e.add(r.e2e[ok])
        gap = r.sampled_gap()[ok]
        self.itl.add(gap[~np.isnan(gap)])
        if r.itl.size:
            owner_ok = np.repeat(ok, r.itl_len)
            weight = np.repeat(r.itl_weight, r.itl_len)
            self.itl_all.add(r.itl[owner_ok], weight[owner_ok])
        for bit in range(len(FACTORS)):
            self.factors[bit] += int(((r.factors >> bit) & 1).sum())
        has_cache = r.query >= 0
        self.hit_tokens += int(r.hit[has_cache].sum())
        self.query_tokens += int(r.query[has_cache].sum())
        if (r.prompt >= 0).any():
            idx, counts = np.unique(r.prompt[r.prompt >= 0], return_counts=True)
            for i, c in zip(idx.tolist(), counts.tolist(), strict=True):
                name = r.prompt_names[i]
                self.prompts[name] = self.prompts.get(name, 0) + c
            self._trim_prompts()
            self._tally_prompts(r, bad)

    def _tally_prompts(self, r: ExperimentRequests, bad: np.ndarray) -> None:
        named = r.prompt >= 0
        size = len(r.prompt_names)
        n = np.bincount(r.prompt[named], minlength=size)
        n_bad = np.bincount(r.prompt[named & bad], minlength=size)
        found: dict[int, list[tuple[float, str]]] = {}
        for i in np.flatnonzero(named & bad).tolist():
            trace = r.traces[i]
            if trace:
                e2e = float(r.e2e[i])
                found.setdefault(int(r.prompt[i]), []).append((e2e if e2e == e2e else 0.0, trace))
        for p in np.flatnonzero(n).tolist():
            self._tally(r.prompt_names[p], int(n[p]), int(n_bad[p]), found.get(p, []))
        self._trim_tallies()

    def _tally(
        self, name: str, requests: int, bad: int, exemplars: list[tuple[float, str]]
    ) -> None:
        cell = self.prompt_tallies.setdefault(name, PromptTally())
        cell.requests += requests
        cell.bad += bad
        if exemplars:
            cell.exemplars = heapq.nlargest(PROMPT_EXEMPLARS, cell.exemplars + exemplars)

    def _trim_tallies(self) -> None:
        tallies = self.prompt_tallies
        if len(tallies) <= MAX_PROMPT_VERSIONS:
            return
        ranked = sorted(
            (k for k in tallies if k != OTHER_PROMPT),
            key=lambda k: (-tallies[k].bad, -tallies[k].requests, k),
        )
        keep = {k: tallies[k] for k in ranked[: MAX_PROMPT_VERSIONS - 1]}
        rest = [t for k, t in tallies.items() if k not in keep]
        keep[OTHER_PROMPT] = PromptTally(
            sum(t.requests for t in rest),
            sum(t.bad for t in rest),
            heapq.nlargest(PROMPT_EXEMPLARS, [e for t in rest for e in t.exemplars]),
        )
        self.prompt_tallies = keep

    def add_rating(self, stratum: str, label: int, rater: int) -> None:
        """Fold one feedback label (:data:`FEEDBACK_LABELS` code) of a request in ``stratum``."""
        if stratum not in self.ratings and len(self.ratings) >= MAX_RATING_STRATA:
            stratum = "other"
        cell = self.ratings.setdefault(stratum, [0, 0, 0])
        cell[0] += 1
        cell[1] += int(label == FEEDBACK_LABELS["hallucination"])
        cell[2] += int(label == FEEDBACK_LABELS["partial"])
        if rater and len(self.raters) < MAX_RATERS:
            self.raters.add(rater)

    @property
    def rated(self) -> int:
        return sum(c[0] for c in self.ratings.values())

    @property
    def hallucinations(self) -> int:
        return sum(c[1] for c in self.ratings.values())

    def _trim_prompts(self) -> None:
        if len(self.prompts) > MAX_PROMPT_VERSIONS:
            ranked = sorted(self.prompts.items(), key=lambda kv: (-kv[1], kv[0]))
            keep = dict(ranked[: MAX_PROMPT_VERSIONS - 1])
            keep["other"] = keep.get("other", 0) + sum(
                c for _, c in ranked[MAX_PROMPT_VERSIONS - 1 :]
            )
            self.prompts = keep

    def merge(self, other: "ArmStats") -> None:
        for name in _COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in _HISTS:
            getattr(self, name).merge(getattr(other, name))
        self.factors = [a + b for a, b in zip(self.factors, other.factors, strict=True)]
        for k, v in other.prompts.items():
            self.prompts[k] = self.prompts.get(k, 0) + v
        self._trim_prompts()
        for k, cell in other.ratings.items():
            if k not in self.ratings and len(self.ratings) >= MAX_RATING_STRATA:
                k = "other"
            mine = self.ratings.setdefault(k, [0, 0, 0])
            for i in range(3):
                mine[i] += cell[i]
        for r in sorted(other.raters):
            if len(self.raters) >= MAX_RATERS:
                break
            self.raters.add(r)
        self.bad += other.bad
        for name in sorted(other.prompt_tallies):
            t = other.prompt_tallies[name]
            self._tally(name, t.requests, t.bad, t.exemplars)
        self._trim_tallies()

    def to_wire(self) -> _ArmWire:
        return _ArmWire(
            counters=[getattr(self, n) for n in _COUNTERS],
            factors=list(self.factors),
            hists=[getattr(self, n).to_wire() for n in _HISTS],
            prompts=dict(self.prompts),
            ratings={k: list(v) for k, v in self.ratings.items()},
            raters=sorted(self.raters),
            bad=self.bad,
            prompt_tallies={
                k: (t.requests, t.bad, list(t.exemplars)) for k, t in self.prompt_tallies.items()
            },
        )

    @classmethod
    def from_wire(cls, w: _ArmWire) -> "ArmStats":
        out = cls()
        if len(w.counters) != len(_COUNTERS) or len(w.hists) != len(_HISTS):
            msg = "arm stats have the wrong number of fields"
            raise CorruptStateError(msg)
        for name, v in zip(_COUNTERS, w.counters, strict=True):
            setattr(out, name, int(v))
        for name, h in zip(_HISTS, w.hists, strict=True):
            setattr(out, name, LogHist.from_wire(h))
        out.factors = [int(x) for x in w.factors][: len(FACTORS)] + [0] * max(
            0, len(FACTORS) - len(w.factors)
        )
        out.prompts = dict(w.prompts)
        out.ratings = {k: ([int(x) for x in v] + [0, 0, 0])[:3] for k, v in w.ratings.items()}
        out.raters = {int(r) for r in w.raters}
        out.bad = int(w.bad)
        out.prompt_tallies = {
            k: PromptTally(int(n), int(b), [(float(e), str(t)) for e, t in ex])
            for k, (n, b, ex) in w.prompt_tallies.items()
        }
        return out

    # -- figures ----------------------------------------------------------
    def hist(self, source: str) -> LogHist:
        h: LogHist = getattr(self, source)
        return h

    def proportion(self, metric: str) -> tuple[int, int]:
        """``(successes, trials)`` of a proportion metric."""
        if metric == "success_rate":
            return self.ok, self.ok + self.failed
        if metric == "interruption_rate":
            return self.interrupted, self.sessions
        if metric == "session_completion":
            return self.completed, self.sessions
        if metric == "hallucination_rate":
            return self.hallucinations, self.rated
        msg = f"not a proportion metric: {metric}"
        raise ValueError(msg)

    @property
    def cache_hit_rate(self) -> float | None:
        return self.hit_tokens / self.query_tokens if self.query_tokens else None


# ---------------------------------------------------------------- books (ports)


class UnitBook(Protocol):
    """Which arm each randomisation unit was first seen in (persisted by the agent)."""

    def arm_of(self, unit: int) -> str | None: ...

    def remember(self, unit: int, arm: str) -> None: ...


class SessionBook(Protocol):
    """Sessions interrupted mid-stream and not yet ended (persisted by the agent)."""

    def interrupted(self, session: int) -> bool: ...

    def mark_interrupted(self, session: int) -> None: ...

    def forget(self, session: int) -> None: ...


class RequestBook(Protocol):
    """Arm and prompt version of each request of an experiment with a hallucination
    guardrail, by the hash of its ``event_id`` (persisted by the agent): how blind
    feedback, which names only ``request_event_id``, finds its arm and stratum."""

    def request(self, event: int) -> tuple[str, str] | None: ...

    def remember_request(self, event: int, arm: str, prompt_version: str) -> None: ...


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class LastDecision:
    decision: str
    arm: str | None
    codes: tuple[str, ...]
    seq: int
    event_id: str
    at_ms: int


class _StateWire(msgspec.Struct, array_like=True):
    version: int
    experiment: str
    definition: dict[str, Any] | None
    status: str
    generation: int
    watermark: int | None
    closed_ms: int | None
    offsets: dict[str, int]
    total: dict[str, _ArmWire]
    pending: dict[int, dict[str, _ArmWire]]
    counters: dict[str, int]
    srm_max_log_bf: float
    evals: dict[str, dict[str, tuple[int, float, int | None]]]
    last: tuple[str, str | None, list[str], int, str, int] | None
    seq: int
    changed_ms: int | None
    # added later (older state decodes without them)
    looks: dict[str, list[Any]] = {}


@dataclass(slots=True)
class ExperimentState:
    """Everything the guard keeps about one experiment; serialises to msgpack bytes.

    ``definition`` is set for experiments created through the admin API (YAML
    ones are looked up by id); ``status``: ``running``, ``stopped`` or
    ``rolled_back`` (terminal for this generation); ``generation`` counts
    re-creations of the same id and is part of every decision id.
    """

    experiment: str
    definition: dict[str, Any] | None = None
    status: str = "running"
    generation: int = 1
    watermark: int | None = None
    closed_ms: int | None = None
    offsets: dict[str, int] = field(default_factory=dict)
    total: dict[str, ArmStats] = field(default_factory=dict)
    pending: dict[int, dict[str, ArmStats]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    srm_max_log_bf: float = 0.0
    evals: dict[str, dict[str, tuple[int, float, int | None]]] = field(default_factory=dict)
    last: LastDecision | None = None
    seq: int = 0
    changed_ms: int | None = None
    #: The hallucination_rate test's last look per ``guardrail@arm``: [look index,
    #: status, p-value, difference, lo, hi, alpha per look] (see :func:`_hallucination`).
    looks: dict[str, list[Any]] = field(default_factory=dict)

    # -- bytes --------------------------------------------------------------
    def to_bytes(self) -> bytes:
        last = self.last
        return msgspec.msgpack.encode(
            _StateWire(
                version=_STATE_VERSION,
                experiment=self.experiment,
                definition=self.definition,
                status=self.status,
                generation=self.generation,
                watermark=self.watermark,
                closed_ms=self.closed_ms,
                offsets=self.offsets,
                total={k: v.to_wire() for k, v in self.total.items()},
                pending={
                    t: {k: v.to_wire() for k, v in arms.items()} for t, arms in self.pending.items()
                },
                counters=self.counters,
                srm_max_log_bf=self.srm_max_log_bf,
                evals=self.evals,
                last=None
                if last is None
                else (
                    last.decision,
                    last.arm,
                    list(last.codes),
                    last.seq,
                    last.event_id,
                    last.at_ms,
                ),
                seq=self.seq,
                changed_ms=self.changed_ms,
                looks=self.looks,
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> "ExperimentState":
        try:
            w = msgspec.msgpack.decode(data, type=_StateWire)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            msg = f"experiment state does not decode: {exc}"
            raise CorruptStateError(msg) from exc
        if w.version != _STATE_VERSION:
            msg = f"experiment state version {w.version} is not {_STATE_VERSION}"
            raise CorruptStateError(msg)
        return cls(
            experiment=w.experiment,
            definition=w.definition,
            status=w.status,
            generation=w.generation,
            watermark=w.watermark,
            closed_ms=w.closed_ms,
            offsets=dict(w.offsets),
            total={k: ArmStats.from_wire(v) for k, v in w.total.items()},
            pending={
                int(t): {k: ArmStats.from_wire(v) for k, v in arms.items()}
                for t, arms in w.pending.items()
            },
            counters=dict(w.counters),
            srm_max_log_bf=w.srm_max_log_bf,
            evals={a: dict(m) for a, m in w.evals.items()},
            last=None
            if w.last is None
            else LastDecision(
                w.last[0], w.last[1], tuple(w.last[2]), w.last[3], w.last[4], w.last[5]
            ),
            seq=w.seq,
            changed_ms=w.changed_ms,
            looks={k: list(v) for k, v in w.looks.items()},
        )

    # -- helpers ------------------------------------------------------------
    def count(self, name: str, n: int = 1) -> None:
        if n:
            self.counters[name] = self.counters.get(name, 0) + n

    def _fresh(self, source: str, part: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """Mask of rows not absorbed before (per input partition offsets); updates them."""
        keep = np.ones(part.size, dtype=bool)
        for p in np.unique(part).tolist():
            if p < 0:
                continue
            rows = part == p
            key = f"{source}:{p}"
            seen = self.offsets.get(key, -1)
            old = rows & (offset <= seen)
            keep &= ~old
            fresh = offset[rows & ~old]
            if fresh.size:
                self.offsets[key] = int(fresh.max())
        return keep

    def _bucket(self, key: int, arm: str) -> ArmStats:
        return self.pending.setdefault(key, {}).setdefault(arm, ArmStats())

    def _admit(self, defn: ExperimentDef, ts: np.ndarray) -> np.ndarray:
        """Rows not before the start and not late; counts the late ones."""
        ok = np.ones(ts.size, dtype=bool)
        if defn.start_ms is not None:
            ok &= ts >= defn.start_ms
        if self.closed_ms is not None:
            late = ok & (ts < self.closed_ms)
            self.count("late", int(late.sum()))
            ok &= ~late
        return ok

    # -- folding ------------------------------------------------------------
    def absorb_requests(
        self,
        defn: ExperimentDef,
        r: ExperimentRequests,
        units: UnitBook,
        requests: RequestBook | None = None,
    ) -> int:
        """Fold requests in (idempotent per input offset); returns how many were taken.

        With a ``requests`` book and a ``hallucination_rate`` guardrail, every
        request's arm and prompt version is remembered by its event id, for
        feedback that names only the request (blind rating)."""
        if self.status != "running" or not len(r):
            return 0
        fresh = self._fresh("r", r.part, r.offset)
        self.count("replayed", int((~fresh).sum()))
        names = defn.arm_names
        arm_of_row = np.array(
            [names.index(a) if a in names else -1 for a in r.arm_names] + [-1], dtype=np.int32
        )[r.arm]
        known = arm_of_row >= 0
        self.count("unknown_arm", int((fresh & ~known).sum()))
        keep = fresh & known & self._admit(defn, r.ts)
        if not keep.any():
            return 0
        rows = np.flatnonzero(keep)
        sub = r.take(rows)
        arms = arm_of_row[rows]
        self.watermark = max(self.watermark or 0, int(sub.ts.max()))
        every = defn.evaluate_every_ms
        keys = sub.ts - sub.ts % every
        if self.closed_ms is None:
            self.closed_ms = int(keys.min())
        ids = sub.unit if defn.unit == "unit_id" else sub.session
        new_unit = np.zeros(len(sub), dtype=bool)
        for i in np.flatnonzero(ids != 0).tolist():
            u, arm = int(ids[i]), names[int(arms[i])]
            first = units.arm_of(u)
            if first is None:
                units.remember(u, arm)
                new_unit[i] = True
            elif first != arm:
                self.count("unit_crossovers")
        self.count("no_unit", int((ids == 0).sum()))
        if requests is not None and any(g.metric == "hallucination_rate" for g in defn.guardrails):
            prompts = sub.prompt_names
            for h, a, pi in zip(sub.ids.tolist(), arms.tolist(), sub.prompt.tolist(), strict=True):
                requests.remember_request(int(h), names[a], prompts[pi] if pi >= 0 else "")
        pairs = np.unique(np.stack([keys, arms.astype(np.int64)]), axis=1)
        for key, a in pairs.T.tolist():
            sel = np.flatnonzero((keys == key) & (arms == a))
            self._bucket(int(key), names[int(a)]).add_requests(
                sub.take(sel), int(new_unit[sel].sum()), defn.bad_ttft_ms
            )
        self.count("requests", len(sub))
        return len(sub)

    def absorb_interactions(
        self,
        defn: ExperimentDef,
        x: ExperimentInteractions,
        units: UnitBook,
        sessions: SessionBook,
        requests: RequestBook | None = None,
        stratum_of: Callable[[str], str | None] | None = None,
        *,
        source: str = "i",
    ) -> int:
        """Fold interactions in: an ended session counts once, as interrupted when an
        interrupt of it came before its end. Returns how many were taken.

        Feedback with a label is a rating of one request. Its arm: the feedback's
        own ``variant`` when it names an arm, else the arm of the rated request
        (``request_event_id`` in the ``requests`` book), else the first arm of its
        ``unit_id``. Its stratum: ``stratum_of(prompt version of the rated request)``
        (default: the version itself; ``"unknown"`` when the request is not known,
        the version ``""`` when it had none) — see :func:`_hallucination`.

        Interactions come from another topic and naturally trail the requests (a
        session ends minutes after its last request), so they neither move the
        watermark nor are dropped when late: one older than the last folded
        boundary joins the oldest open bucket (counted as ``interactions_late``).
        """
        if self.status != "running" or not len(x):
            return 0
        fresh = self._fresh(source, x.part, x.offset)
        self.count("replayed", int((~fresh).sum()))
        keep = fresh & (x.ts >= defn.start_ms if defn.start_ms is not None else True)
        names = defn.arm_names
        taken = 0
        every = defn.evaluate_every_ms
        for i in np.flatnonzero(keep).tolist():
            arm = x.arm_names[int(x.arm[i])] if x.arm[i] >= 0 else None
            kind = int(x.kind[i])
            rated = None
            if kind == 3 and requests is not None and x.request[i]:
                rated = requests.request(int(x.request[i]))
                if arm not in names and rated is not None:
                    arm = rated[0]
            if arm not in names and x.unit[i]:
                arm = units.arm_of(int(x.unit[i]))
            if arm is None or arm not in names:
                self.count("interactions_unknown_arm")
                continue
            session = int(x.session[i])
            if kind == 3 and x.label[i]:
                ts = self._late_to_open(int(x.ts[i]))
                version = rated[1] if rated is not None else None
                if version is None:
                    stratum = UNKNOWN_STRATUM
                else:
                    stratum = (stratum_of(version) if stratum_of else None) or version
                self._bucket(ts - ts % every, arm).add_rating(
                    stratum, int(x.label[i]), int(x.rater[i])
                )
                self.count("ratings")
                taken += 1
                continue
            if session == 0 or kind == 3:
                self.count("interactions_ignored")
                continue
            ts = self._late_to_open(int(x.ts[i]))
            taken += 1
            if kind == 0:
                sessions.mark_interrupted(session)
                continue
            stats = self._bucket(ts - ts % every, arm)
            stats.sessions += 1
            stats.completed += int(kind == 1)
            if sessions.interrupted(session):
                stats.interrupted += 1
            sessions.forget(session)
        self.count("interactions", taken)
        return taken

    def _late_to_open(self, ts: int) -> int:
        """An interaction older than the last folded boundary joins the oldest open bucket."""
        if self.closed_ms is not None and ts < self.closed_ms:
            self.count("interactions_late")
            return self.closed_ms
        return ts

    def absorb_eval(self, arm: str, metric: str, ts_ms: int, value: float, n: int | None) -> bool:
        """Keep the newest offline score per arm and metric; True when it changed."""
        have = self.evals.get(arm, {}).get(metric)
        if have is not None and have[0] >= ts_ms:
            return False
        self.evals.setdefault(arm, {})[metric] = (ts_ms, float(value), n)
        return True

    def close_ready(self, defn: ExperimentDef, lateness_ms: int) -> list[int]:
        """Fold every pending bucket the watermark has passed by ``lateness_ms``;
        returns the boundaries (bucket ends) to evaluate at, oldest first."""
        if self.watermark is None or self.closed_ms is None:
            return []
        every = defn.evaluate_every_ms
        horizon = self.watermark - lateness_ms
        out = []
        while self.pending:
            key = min(self.pending)
            if key + every > horizon:
                break
            for arm, stats in self.pending.pop(key).items():
                self.total.setdefault(arm, ArmStats()).merge(stats)
            self.closed_ms = max(self.closed_ms, key + every)
            out.append(key + every)
        if not self.pending and horizon - horizon % every > self.closed_ms:
            self.closed_ms = horizon - horizon % every
        return out

    def arm(self, name: str) -> ArmStats:
        return self.total.get(name) or ArmStats()

    def record(self, decision: "Decision") -> bool:
        """Remember ``decision`` if it is news (kind, arm or reasons changed); sets its
        ``seq`` and ``event_id``. Returns whether it should be published."""
        if self.status != "running":
            return False
        last = self.last
        if (
            last is not None
            and last.decision == decision.decision
            and last.arm == decision.arm
            and last.codes == tuple(decision.codes)
        ):
            return False
        self.seq += 1
        decision.seq = self.seq
        decision.event_id = decision_id(
            self.experiment, self.generation, self.seq, decision.decision
        )
        decision.generation = self.generation
        self.last = LastDecision(
            decision.decision,
            decision.arm,
            tuple(decision.codes),
            self.seq,
            decision.event_id,
            decision.at_ms,
        )
        self.changed_ms = decision.at_ms
        if decision.decision == "rollback":
            self.status = "rolled_back"
        return True


def decision_id(experiment: str, generation: int, seq: int, decision: str) -> str:
    """Deterministic decision id; a rollback's does not depend on when it happened,
    so any re-send of "the" rollback of a generation has the same id."""
    ident = (
        f"{experiment}|{generation}|rollback"
        if decision == "rollback"
        else f"{experiment}|{generation}|{seq}|{decision}"
    )
    return hashlib.blake2b(ident.encode(), digest_size=16).hexdigest()


# ---------------------------------------------------------------- evaluation


@dataclass(slots=True)
class ArmValue:
    """One arm's figure of a metric with its confidence sequence at the test level."""

    value: float | None
    lo: float
    hi: float
    n: int


@dataclass(slots=True)
class GuardrailResult:
    """One guardrail of one treatment arm at one evaluation."""

    guardrail: Guardrail
    arm: str
    control: ArmValue
    treatment: ArmValue
    estimate: float | None
    interval: tuple[float, float]
    status: Literal["breached", "passed", "undecided", "insufficient"]
    worse: bool
    alpha: float
    _reject: Callable[[float], bool] | None = None
    _fixed: Callable[[], float | None] | None = None
    #: Test-specific evidence (the hallucination guardrail's permutation test).
    details: dict[str, Any] | None = None

    def p_value(self) -> float | None:
        """Anytime-valid p-value of "the guardrail holds" (smallest α that breaches);
        for the hallucination guardrail, its stratified permutation p-value."""
        if self.details is not None:
            p = self.details.get("p_value")
            return None if p is None else float(p)
        if self._reject is None:
            return None
        return float(p_value_by_bisection(self._reject))

    def p_value_fixed(self) -> float | None:
        """Classical fixed-horizon two-sided p-value of "no difference between the arms"."""
        return None if self._fixed is None else self._fixed()


@dataclass(slots=True)
class Evaluation:
    """Everything judged at one boundary."""

    experiment: str
    at_ms: int
    results: list[GuardrailResult]
    srm: SrmResult | None
    srm_flagged: bool
    pollution: list[dict[str, Any]]
    misaligned: list[dict[str, Any]]
    arms: dict[str, ArmStats]


def _arm_interval(stats: ArmStats, metric: str, alpha: float) -> ArmValue:
    kind, _, q = metric_kind(metric)
    if kind == "quantile":
        assert q is not None
        h = stats.hist(metric.split("_p")[0])
        n = h.n
        if n == 0:
            return ArmValue(None, 0.0, math.inf, 0)
        r_lo, r_hi = quantile_ranks(n, q, alpha)
        lo, hi = quantile_cs(np.cumsum(h.counts), h.lo, r_lo, r_hi)
        return ArmValue(h.quantile(q), float(lo), float(hi), n)
    s, t = stats.proportion(metric)
    if t == 0:
        return ArmValue(None, 0.0, 1.0, 0)
    lo, hi = bernoulli_cs(s, t, alpha)
    return ArmValue(s / t, float(lo), float(hi), t)


def _effect(kind: str, t: ArmValue, c: ArmValue) -> tuple[float, float, float | None]:
    """(lo, hi, estimate) of the treatment-vs-control effect from arm intervals."""
    if kind == "level":
        return t.lo, t.hi, t.value
    if kind == "diff":
        est = None if t.value is None or c.value is None else t.value - c.value
        return t.lo - c.hi, t.hi - c.lo, est
    lo = t.lo / c.hi if c.hi > 0 else 0.0
    hi = t.hi / c.lo if c.lo > 0 else math.inf
    est = None if t.value is None or not c.value else t.value / c.value
    return lo, hi, est


def _verdict(g: Guardrail, lo: float, hi: float) -> str:
    if g.bound == "max":
        return "breached" if lo > g.limit else "passed" if hi <= g.limit else "undecided"
    return "breached" if hi < g.limit else "passed" if lo >= g.limit else "undecided"


def _min_n(defn: ExperimentDef, metric: str) -> tuple[str, int]:
    if metric in ("interruption_rate", "session_completion"):
        return "sessions", defn.min_samples.sessions
    if metric == "hallucination_rate":
        return "ratings", defn.min_samples.ratings
    return "requests", defn.min_samples.requests


def fixed_horizon_p(table: tuple[tuple[int, int], tuple[int, int]]) -> float | None:
    """Pearson chi-square p-value (no continuity correction) of a 2×2 table
    ``((a_yes, a_no), (b_yes, b_no))`` — the two-sided two-proportion z-test."""
    (a, b), (c, d) = table
    n = a + b + c + d
    rows, cols = (a + b, c + d), (a + c, b + d)
    if n == 0 or 0 in rows or 0 in cols:
        return None
    chi2 = n * (a * d - b * c) ** 2 / (rows[0] * rows[1] * cols[0] * cols[1])
    return float(chi2_sf(chi2, 1))


def _quantile_table(t: LogHist, c: LogHist, q: float) -> tuple[tuple[int, int], tuple[int, int]]:
    """Counts at or below / above the pooled q-quantile's bucket (Mood's test generalised)."""
    lo = min(t.lo, c.lo)
    hi = max(t.hi, c.hi)
    dt, dc = t.dense(lo, hi), c.dense(lo, hi)
    pooled = np.cumsum(dt + dc)
    j = int(np.searchsorted(pooled, max(1, math.ceil(q * pooled[-1]))))
    below_t, below_c = int(dt[: j + 1].sum()), int(dc[: j + 1].sum())
    return (below_t, t.n - below_t), (below_c, c.n - below_c)


def _guardrail(
    defn: ExperimentDef, g: Guardrail, arm: str, t_stats: ArmStats, c_stats: ArmStats
) -> GuardrailResult:
    alpha = defn.test_alpha
    kind, bad, q = metric_kind(g.metric)
    per_arm = alpha if g.kind == "level" else alpha / 2.0

    def intervals(a: float) -> tuple[ArmValue, ArmValue]:
        return _arm_interval(t_stats, g.metric, a), _arm_interval(c_stats, g.metric, a)

    tv, cv = intervals(per_arm)
    lo, hi, est = _effect(g.kind, tv, cv)
    _, need = _min_n(defn, g.metric)
    enough = tv.n >= max(need, 1) and (g.kind == "level" or cv.n >= max(need, 1))
    status = _verdict(g, lo, hi) if enough else "insufficient"
    # "worse": significantly on the bad side of no change (misalignment), at the same level
    wt, wc = intervals(alpha / 2.0)
    if kind == "quantile":
        wlo, whi, _ = _effect("ratio", wt, wc)
        worse = wlo > 1.0 if bad == "up" else whi < 1.0
    else:
        wlo, whi, _ = _effect("diff", wt, wc)
        worse = wlo > 0.0 if bad == "up" else whi < 0.0
    worse = worse and enough

    def reject(a: float) -> bool:
        ta, ca = intervals(a if g.kind == "level" else a / 2.0)
        lo_a, hi_a, _ = _effect(g.kind, ta, ca)
        return _verdict(g, lo_a, hi_a) == "breached"

    def fixed() -> float | None:
        if kind == "quantile":
            assert q is not None
            src = g.metric.split("_p")[0]
            return fixed_horizon_p(_quantile_table(t_stats.hist(src), c_stats.hist(src), q))
        s1, n1 = t_stats.proportion(g.metric)
        s2, n2 = c_stats.proportion(g.metric)
        return fixed_horizon_p(((s1, n1 - s1), (s2, n2 - s2)))

    return GuardrailResult(
        guardrail=g,
        arm=arm,
        control=cv,
        treatment=tv,
        estimate=est,
        interval=(lo, hi),
        status=status,  # type: ignore[arg-type]
        worse=worse,
        alpha=alpha,
        _reject=reject if enough else None,
        _fixed=fixed,
    )


def rating_strata(t: ArmStats, c: ArmStats) -> dict[str, Stratum]:
    """The permutation test's strata of a treatment and the control."""
    out: dict[str, Stratum] = {}
    for key in sorted(set(t.ratings) | set(c.ratings)):
        tc, cc = t.ratings.get(key, [0, 0, 0]), c.ratings.get(key, [0, 0, 0])
        out[key] = Stratum(tc[1], tc[0], cc[1], cc[0])
    return out


def look_index(defn: ExperimentDef, n: int) -> int:
    """The last information milestone ``n`` rated requests (per arm) reached:
    −1 before ``min_samples.ratings``, else k with ratings·2^k ≤ n (k < rating_looks)."""
    first = max(1, defn.min_samples.ratings)
    if n < first:
        return -1
    k: int = (int(n) // first).bit_length() - 1
    return min(int(defn.rating_looks) - 1, k)


def _hallucination(
    defn: ExperimentDef,
    g: Guardrail,
    arm: str,
    t: ArmStats,
    c: ArmStats,
    state: "ExperimentState | None",
) -> GuardrailResult:
    """``hallucination_rate: {max_diff: d}`` by a stratified permutation test, judged
    only at fixed information milestones.

    Looks: the test runs when the smaller arm's rated requests first reach
    ``min_samples.ratings × 2^k`` (k = 0 … ``rating_looks`` − 1), at level
    ``α_look = test_alpha / rating_looks`` each (Bonferroni over the looks), and
    its verdict stands until the next milestone. So however often the guard
    evaluates, this guardrail is tested at most ``rating_looks`` times and the
    chance that it ever rolls back an arm that does not raise the rate is at
    most ``test_alpha``.

    Verdict at a look: **breached** when the one-sided permutation p-value
    (treatment worse, :func:`~tailguard.streams.permutation.stratified_permutation_test`)
    is below ``α_look`` *and* the pooled difference exceeds ``d`` (significant and
    larger than tolerated); **passed** when the upper bound of the pooled
    difference's interval at ``α_look`` is within ``d``; else undecided.
    """
    tv = _arm_interval(t, g.metric, defn.test_alpha / 2.0)
    cv = _arm_interval(c, g.metric, defn.test_alpha / 2.0)
    strata = rating_strata(t, c)
    n = min(t.rated, c.rated)
    k = look_index(defn, n)
    alpha_look = defn.test_alpha / defn.rating_looks
    key = f"{g.name}@{arm}"
    held = state.looks.get(key) if state is not None else None
    if k >= 0 and (held is None or int(held[0]) < k):
        seed = seed_of(defn.id, state.generation if state else 1, arm, k)
        res = stratified_permutation_test(strata, seed=seed)
        lo, hi = mh_interval(pool_single_arm(strata).values(), alpha_look)
        d = res.difference
        if d is not None and res.p_value < alpha_look and d > g.limit:
            status = "breached"
        elif d is not None and hi <= g.limit:
            status = "passed"
        else:
            status = "undecided"
        held = [k, status, res.p_value, d, lo, hi, alpha_look, res.method, res.strata]
        if state is not None:
            state.looks[key] = held
    if held is None or k < 0:
        status, p, d, lo, hi, method, used = "insufficient", None, None, -1.0, 1.0, None, 0
        look = None
    else:
        look, status, p, d, lo, hi, _, method, used = held
    pooled = pool_single_arm(strata)
    details = {
        "test": "stratified permutation (Mantel-Haenszel risk difference, one-sided)",
        "p_value": p,
        "difference_at_look": d,
        "method": method,
        "look": None if look is None else int(look) + 1,
        "looks": defn.rating_looks,
        "look_at_ratings": None if look is None else max(1, defn.min_samples.ratings) << int(look),
        "alpha_per_look": alpha_look,
        "raters": len(t.raters | c.raters),
        "raters_per_arm": {arm: len(t.raters), defn.control: len(c.raters)},
        "strata": {
            name: {
                arm: {"rated": s.n_t, "hallucination": s.x_t},
                defn.control: {"rated": s.n_c, "hallucination": s.x_c},
            }
            for name, s in list(strata.items())[:16]
        },
        "strata_used": used,
        "pooled_single_arm_strata": RESIDUAL in pooled,
    }
    est = None if tv.value is None or cv.value is None else tv.value - cv.value
    pooled_d = mh_difference(pooled.values())
    return GuardrailResult(
        guardrail=g,
        arm=arm,
        control=cv,
        treatment=tv,
        estimate=pooled_d if pooled_d is not None else est,
        interval=(float(lo), float(hi)),
        status=status,  # type: ignore[arg-type]
        worse=status == "breached",
        alpha=alpha_look,
        _fixed=lambda: fixed_horizon_p(((t.hallucinations, t.rated - t.hallucinations),
                                        (c.hallucinations, c.rated - c.hallucinations))),
        details=details,
    )  # fmt: skip


def _pollution(defn: ExperimentDef, arms: dict[str, ArmStats]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    control = arms[defn.control]
    alpha = defn.alpha / (len(FACTORS) * len(defn.treatments)) / 2.0
    need = max(defn.min_samples.requests, 1)
    for arm in defn.treatments:
        t = arms[arm]
        if t.requests < need or control.requests < need:
            continue
        for bit, factor in enumerate(FACTORS):
            st, sc = t.factors[bit], control.factors[bit]
            (tl,), (th,) = (np.atleast_1d(v) for v in bernoulli_cs(st, t.requests, alpha))
            (cl,), (ch,) = (np.atleast_1d(v) for v in bernoulli_cs(sc, control.requests, alpha))
            rt, rc = st / t.requests, sc / control.requests
            lo, hi = float(tl - ch), float(th - cl)
            if (lo > 0 or hi < 0) and abs(rt - rc) >= defn.pollution_min_diff:
                out.append(
                    {
                        "arm": arm,
                        "factor": factor,
                        "rates": {arm: round(rt, 5), defn.control: round(rc, 5)},
                        "difference": round(rt - rc, 5),
                        "interval": [round(lo, 5), round(hi, 5)],
                        "cache_hit_rate": {
                            arm: _round(t.cache_hit_rate),
                            defn.control: _round(control.cache_hit_rate),
                        },
                        "prompt_versions": {arm: t.prompts, defn.control: control.prompts},
                    }
                )
    return out


def _misaligned(
    defn: ExperimentDef, state: ExperimentState, results: list[GuardrailResult]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    control_evals = state.evals.get(defn.control, {})
    for arm in defn.treatments:
        worse = [r for r in results if r.arm == arm and r.worse]
        if not worse:
            continue
        for metric, (_, value, _n) in sorted(state.evals.get(arm, {}).items()):
            base = control_evals.get(metric)
            if base is None:
                continue
            ref = base[1]
            gain = (value - ref) / abs(ref) if ref else (math.inf if value > ref else 0.0)
            if metric in defn.evals_lower_is_better:
                gain = -gain
            if gain >= defn.eval_min_gain and gain > 0:
                out.append(
                    {
                        "arm": arm,
                        "eval_metric": metric,
                        "offline": {arm: value, defn.control: ref},
                        "offline_gain": round(gain, 5),
                        "online_worse": [r.guardrail.metric for r in worse],
                    }
                )
    return out


def evaluate(defn: ExperimentDef, state: ExperimentState, at_ms: int) -> Evaluation:
    """Judge the experiment on its folded state (updates the SRM running maximum)."""
    arms = {name: state.arm(name) for name in defn.arm_names}
    control = arms[defn.control]
    results = [
        _hallucination(defn, g, arm, arms[arm], control, state)
        if g.metric == "hallucination_rate" and g.kind == "diff"
        else _guardrail(defn, g, arm, arms[arm], control)
        for arm in defn.treatments
        for g in defn.guardrails
    ]
    units = [arms[a].units for a in defn.arm_names]
    srm = None
    flagged = False
    if sum(units) >= SRM_MIN_UNITS:
        weights = defn.weights
        srm = srm_test(units, [weights[a] for a in defn.arm_names], max_log_bf=state.srm_max_log_bf)
        state.srm_max_log_bf = srm.max_log_bf
        flagged = srm.p_value < defn.srm_alpha and srm.p_value_sequential < defn.srm_alpha
    return Evaluation(
        experiment=defn.id,
        at_ms=at_ms,
        results=results,
        srm=srm,
        srm_flagged=flagged,
        pollution=_pollution(defn, arms),
        misaligned=_misaligned(defn, state, results),
        arms=arms,
    )


@dataclass(slots=True)
class Decision:
    """A release decision; ``seq`` / ``event_id`` are set when the state records it."""

    experiment: str
    decision: Literal["rollback", "promote", "hold", "continue"]
    arm: str | None
    reasons: list[str]
    codes: list[str]
    weights: dict[str, float]
    at_ms: int
    evaluation: Evaluation | None = None
    actor: str = "tailguard"
    seq: int = 0
    event_id: str = ""
    generation: int = 1


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    if math.isinf(x):
        return "∞"
    return f"{x:.{digits}g}"


def _describe(r: GuardrailResult) -> str:
    g = r.guardrail
    lo, hi = r.interval
    what = {"ratio": "treatment/control", "diff": "treatment−control", "level": "value"}[g.kind]
    op = "≤" if g.bound == "max" else "≥"
    text = (
        f"{g.metric} in {r.arm}: {what} {_fmt(r.estimate)} "
        f"[{_fmt(lo)}, {_fmt(hi)}], limit {op} {g.limit:g} "
        f"({r.treatment.n} vs {r.control.n} samples)"
    )
    if r.details is not None and r.details.get("p_value") is not None:
        d = r.details
        text += (
            f"; human feedback: {_fmt(r.treatment.value)} vs {_fmt(r.control.value)} "
            f"hallucination rate, stratified permutation p = {d['p_value']:.2g} "
            f"< {d['alpha_per_look']:.2g} at look {d['look']} of {d['looks']}, "
            f"{d['raters']} raters"
        )
    return text


def decide(defn: ExperimentDef, ev: Evaluation) -> Decision:
    """The decision for one evaluation (rules in the module docstring)."""
    planned = defn.weights
    breached = [r for r in ev.results if r.status == "breached"]
    reasons: list[str] = []
    codes: list[str] = []
    if ev.srm_flagged and ev.srm is not None:
        s = ev.srm
        counts = ", ".join(f"{a} {c}" for a, c in zip(defn.arm_names, s.counts, strict=True))
        reasons.append(
            f"sample ratio mismatch: units {counts} vs planned "
            + ", ".join(f"{a} {planned[a]:.0%}" for a in defn.arm_names)
            + f" (chi-square p = {s.p_value:.2g}, sequential p = {s.p_value_sequential:.2g}): "
            "the comparison is invalid, never promote"
        )
        codes.append("srm")
    for r in breached:
        reasons.append(f"guardrail breached: {_describe(r)}")
        codes.append(f"guardrail_breached:{r.guardrail.name}:{r.arm}")
    for p in ev.pollution:
        rates = p["rates"]
        reasons.append(
            f"polluted: {p['factor']} rate {rates[p['arm']]:.1%} in {p['arm']} vs "
            f"{rates[defn.control]:.1%} in {defn.control} — a hidden degradation hits the "
            "arms unequally"
        )
        codes.append(f"polluted:{p['factor']}:{p['arm']}")
    for m in ev.misaligned:
        reasons.append(
            f"misaligned: offline {m['eval_metric']} improves by {m['offline_gain']:.1%} in "
            f"{m['arm']} while online {', '.join(m['online_worse'])} got significantly worse"
        )
        codes.append(f"misaligned:{m['eval_metric']}:{m['arm']}")

    if ev.srm_flagged:
        if breached:
            codes.append("breach_not_acted_on_under_srm")
        return Decision(defn.id, "hold", None, reasons, codes, dict(planned), ev.at_ms, ev)
    if breached:
        arm = breached[0].arm
        weights = {a: (1.0 if a == defn.control else 0.0) for a in defn.arm_names}
        return Decision(defn.id, "rollback", arm, reasons, codes, weights, ev.at_ms, ev)
    if ev.pollution or ev.misaligned:
        return Decision(defn.id, "hold", None, reasons, codes, dict(planned), ev.at_ms, ev)
    units_ok = all(ev.arms[a].units >= defn.min_samples.units for a in defn.arm_names)
    if ev.results and units_ok and all(r.status == "passed" for r in ev.results):
        share = 1.0 / len(defn.treatments)
        weights = {a: (0.0 if a == defn.control else share) for a in defn.arm_names}
        winner = defn.treatments[0] if len(defn.treatments) == 1 else None
        reasons.append("every guardrail passed with its minimum samples")
        codes.append("all_guardrails_passed")
        return Decision(defn.id, "promote", winner, reasons, codes, weights, ev.at_ms, ev)
    pending = sorted({r.guardrail.metric for r in ev.results if r.status != "passed"})
    if pending:
        reasons.append("collecting evidence: " + ", ".join(pending) + " not yet decided")
    return Decision(defn.id, "continue", None, reasons, codes, dict(planned), ev.at_ms, ev)


def _round(x: float | None, digits: int = 6) -> float | None:
    if x is None or not math.isfinite(x):
        return None if x is None else x
    return float(f"{x:.{digits}g}")


def _interval(lo: float, hi: float) -> list[float | None]:
    return [_round(lo) if math.isfinite(lo) else None, _round(hi) if math.isfinite(hi) else None]


def prompt_evidence(
    defn: ExperimentDef,
    arms: dict[str, ArmStats],
    group_of: Callable[[str], str | None] | None = None,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """``(prompts, prompt_groups)``: per arm, the prompt versions and groups that hold
    most of its bad requests, worst first, each with exemplar trace ids
    (:func:`~tailguard.streams.prompt_evidence.rank_prompts` over the arm's
    ``prompt_tallies``; shares and lift are within the arm, so the treatment's rows
    read against the control's). ``group_of``: a version's prompt group (None or
    ``None`` returned: the version is its own group)."""
    prompts: dict[str, list[dict[str, Any]]] = {}
    groups: dict[str, list[dict[str, Any]]] = {}
    for name in defn.arm_names:
        s = arms.get(name) or ArmStats()
        prompts[name], groups[name] = rank_prompts(
            s.prompt_tallies, total_requests=s.requests, total_bad=s.bad, group_of=group_of
        )
    return prompts, groups


def _hallucination_strata(s: ArmStats) -> list[dict[str, Any]]:
    """The arm's rating strata with hallucinations, most first (at most 16)."""
    total = s.hallucinations
    cells = sorted(
        ((k, c) for k, c in s.ratings.items() if c[1]), key=lambda kc: (-kc[1][1], -kc[1][0], kc[0])
    )
    return [
        {
            "stratum": k,
            "rated": c[0],
            "hallucination": c[1],
            "partial": c[2],
            "hallucination_rate": _round(c[1] / c[0]) if c[0] else None,
            "hallucination_share": _round(c[1] / total) if total else 0.0,
        }
        for k, c in cells[:16]
    ]


def evidence(
    defn: ExperimentDef,
    ev: Evaluation,
    *,
    with_p_values: bool = True,
    group_of: Callable[[str], str | None] | None = None,
) -> dict[str, Any]:
    """The per-metric evidence of a decision (plain JSON values).

    Per guardrail and treatment: both arms' values with their own confidence
    sequences and sample sizes, the effect (ratio, difference or level), its
    interval, the anytime-valid p-value of "the guardrail holds" (compare it
    with ``alpha``, the per-test level), the fixed-horizon p-value of "no
    difference" for reference, and the status.

    Prompt evidence (issue 10 item 5): ``bad_requests`` (the rule and the count
    per arm), ``prompts`` / ``prompt_groups`` per arm (:func:`prompt_evidence`,
    ``group_of`` names the groups) and, when a ``hallucination_rate`` guardrail is
    breached, ``hallucinations``: per arm the rating strata (prompt group or
    version) with their hallucination-labelled ratings, most first.
    """
    metrics: dict[str, Any] = {}
    for r in ev.results:
        g = r.guardrail
        key = g.name if len(defn.treatments) == 1 else f"{g.name}@{r.arm}"
        difference = (
            None
            if r.treatment.value is None or r.control.value is None
            else r.treatment.value - r.control.value
        )
        metrics[key] = {
            "metric": g.metric,
            "arm": r.arm,
            "constraint": {g.key: g.limit},
            "arms": {
                r.arm: {
                    "value": _round(r.treatment.value),
                    "interval": _interval(r.treatment.lo, r.treatment.hi),
                    "n": r.treatment.n,
                },
                defn.control: {
                    "value": _round(r.control.value),
                    "interval": _interval(r.control.lo, r.control.hi),
                    "n": r.control.n,
                },
            },
            "difference": _round(difference),
            "ratio": _round(r.estimate) if g.kind == "ratio" else None,
            "effect": g.kind,
            "estimate": _round(r.estimate),
            "interval": _interval(*r.interval),
            "p_value": _round(r.p_value()) if with_p_values else None,
            "p_value_fixed_horizon": _round(r.p_value_fixed()) if with_p_values else None,
            "alpha": _round(r.alpha),
            "n": {r.arm: r.treatment.n, defn.control: r.control.n},
            "status": r.status,
            "worse": r.worse,
        }
        if r.details is not None:
            metrics[key]["test"] = r.details
    out: dict[str, Any] = {"metrics": metrics}
    if ev.srm is not None:
        s = ev.srm
        out["srm"] = {
            "unit": defn.unit,
            "counts": dict(zip(defn.arm_names, s.counts, strict=True)),
            "expected": {a: round(e, 2) for a, e in zip(defn.arm_names, s.expected, strict=True)},
            "chi2": _round(s.chi2),
            "df": s.df,
            "p_value": _round(s.p_value),
            "p_value_sequential": _round(s.p_value_sequential),
            "alpha": defn.srm_alpha,
            "flagged": ev.srm_flagged,
        }
    out["pollution"] = ev.pollution
    out["misaligned"] = ev.misaligned
    out["arms"] = {
        name: {
            "requests": s.requests,
            "units": s.units,
            "success_rate": _round(s.ok / (s.ok + s.failed)) if s.ok + s.failed else None,
            "ttft_p95_ms": _round(s.ttft.quantile(0.95)),
            "itl_p95_ms": _round(s.itl_all.quantile(0.95)),
            "itl_p99_ms": _round(s.itl_all.quantile(0.99)),
            "e2e_p95_ms": _round(s.e2e.quantile(0.95)),
            "sessions": s.sessions,
            "interruption_rate": _round(s.interrupted / s.sessions) if s.sessions else None,
            "session_completion": _round(s.completed / s.sessions) if s.sessions else None,
            "cache_hit_rate": _round(s.cache_hit_rate),
            "cause_rates": {
                f: _round(s.factors[i] / s.requests) if s.requests else None
                for i, f in enumerate(FACTORS)
            },
            "prompt_versions": dict(s.prompts),
            "rated": s.rated,
            "hallucination_rate": _round(s.hallucinations / s.rated) if s.rated else None,
            "raters": len(s.raters),
        }
        for name, s in ev.arms.items()
    }
    out["bad_requests"] = {
        "rule": "status error, timeout or rejected, or ok with ttft_ms over ttft_ms_limit",
        "ttft_ms_limit": defn.bad_ttft_ms,
        "counts": {name: s.bad for name, s in ev.arms.items()},
    }
    out["prompts"], out["prompt_groups"] = prompt_evidence(defn, ev.arms, group_of)
    rails = ev.results
    if any(r.guardrail.metric == "hallucination_rate" and r.status == "breached" for r in rails):
        out["hallucinations"] = {
            name: _hallucination_strata(ev.arms.get(name) or ArmStats()) for name in defn.arm_names
        }
    return out
