"""KV-cache allocator snapshots (``tailguard.kv.v1``) consistent with the simulated requests.

Every ``interval_s`` of event time, one snapshot per serving instance of the
fleet: the sequences that instance is running at that moment (one per request,
with its tenant, tokens and blocks), its block pool and a preemption counter.
The snapshots are derived from the inference events themselves
(:class:`KvTracker` watches them go by), so a request is in a snapshot exactly
while the events say it runs::

    arrival ─ tokenize ─ queue ─┬─ prefill ─┬─ decode ───────────────┬─ end
                                admitted     first token             e2e_ms
                                │◀─ tokens = input ─▶│◀ input + generated ▶│

    generated(T) = 1 + ⌊(T − first token) / (end − first token) · (output_tokens − 1)⌋
    blocks       = ⌈tokens / (block_size · (1 − slack))⌉

Requests that never reached the engine (``timeout`` stuck in the queue,
``rejected``) hold no blocks. ``slack`` is the share of a sequence's blocks
that the allocator reserves but does not fill (look-ahead reservation, partly
filled last block): it is what *internal fragmentation* measures,
``1 − Σ tokens / (Σ blocks · block_size)`` (:mod:`tailguard.streams.kv`).

Fragmentation level of an instance (the article's numbers: one tenant →
0.08, four tenants → 0.37)::

    level(i, t) = FRAG_BASE + (FRAG_PEAK − FRAG_BASE) · max over noisy_neighbor incidents
                  that reach instance i of  severity · ramp(t)

    severity = min(1, (intensity − 1) / 3)    a 4× neighbour adds three tenants' worth of
                                              load: the article's step from 1 to 4 tenants
    ramp(t)  = 0 before the incident, rising linearly to 1 over FRAG_RAMP_UP_S,
               falling back to 0 over FRAG_RAMP_DOWN_S after it ends

Healthy instances stay at 0.08 (each sequence's slack spreads ± FRAG_SPREAD/2
around it, from a hash of its ``event_id``, so a sequence keeps its slack from
snapshot to snapshot). The model (:mod:`tailguard.simulator.model`) slows every
request on an instance by the same level (:func:`frag_slowdown`): the capacity
lost to fragmentation shrinks the running batch, so prefills wait behind
decodes and decode steps stall.

Capacity: each instance has ``total_blocks`` sized so that its healthy mean
occupancy is about ``KV_TARGET_UTILISATION`` at the configured rate (Little's
law over the service's token distributions). When the running sequences do
not fit, the newest ones are preempted (vLLM's recompute policy): they are left
out of the snapshot and counted in ``preemptions``.

Everything is a function of the config and the events: the same run yields
the same snapshots; no random draws are taken from the request streams.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tailguard.simulator.config import SimConfig

__all__ = [
    "DEFAULT_KV_INTERVAL_S",
    "FRAG_BASE",
    "FRAG_PEAK",
    "FRAG_RAMP_DOWN_S",
    "FRAG_RAMP_UP_S",
    "KV_BLOCK_SIZE",
    "KvTracker",
    "NoisyWindow",
    "frag_slowdown",
    "fragmentation_level",
    "instance_blocks",
    "noisy_windows",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

KV_BLOCK_SIZE = 16
FRAG_BASE = 0.08
FRAG_PEAK = 0.37
FRAG_RAMP_UP_S = 180.0
FRAG_RAMP_DOWN_S = 60.0
#: Spread of the per-sequence slack around the instance's level.
FRAG_SPREAD = 0.04
#: The ceiling of ⌈tokens / …⌉ wastes about half a block per sequence on top of
#: the slack; the slack target is lowered by about that much so the measured
#: fragmentation lands on the level.
_ROUNDING_SHARE = 0.006
KV_TARGET_UTILISATION = 0.45
DEFAULT_KV_INTERVAL_S = 5.0
#: TTFT and decode slowdown at the peak level: prefill x (1 + 1.0), queue x (1 + 1.0),
#: token gaps x (1 + 0.5) (see :func:`frag_slowdown`).
FRAG_PREFILL_SLOWDOWN = 0.6
FRAG_DECODE_SLOWDOWN = 0.4


@dataclass(frozen=True, slots=True)
class NoisyWindow:
    """A ``noisy_neighbor`` incident as the instances it reaches and its severity."""

    start_s: float
    end_s: float
    severity: float
    #: One flag per instance of ``cfg.instance_layout()``.
    instances: tuple[bool, ...]


def _instance_pairs(cfg: SimConfig) -> list[tuple[str, str]]:
    """``(service, model)`` of every instance, in ``instance_layout`` order."""
    return [(s.name, m.name) for s in cfg.services for m in s.models for _ in range(m.instances)]


def noisy_windows(cfg: SimConfig) -> list[NoisyWindow]:
    """The config's ``noisy_neighbor`` incidents, compiled (see the module docstring)."""
    pairs = _instance_pairs(cfg)
    names = [name for name, _, _ in cfg.instance_layout()]
    out: list[NoisyWindow] = []
    for inc in cfg.incidents:
        if inc.kind != "noisy_neighbor":
            continue
        t = inc.target
        reach = tuple(
            (t.service is None or t.service == svc)
            and (t.model is None or t.model == model)
            and (t.instance is None or t.instance == name)
            for (svc, model), name in zip(pairs, names, strict=True)
        )
        severity = min(1.0, (inc.level - 1.0) / 3.0)
        out.append(NoisyWindow(inc.start_s, inc.end_s, severity, reach))
    return out


def _ramp(w: NoisyWindow, t_s: FloatArray) -> FloatArray:
    up = np.clip((t_s - w.start_s) / FRAG_RAMP_UP_S, 0.0, 1.0)
    at_end = min(1.0, (w.end_s - w.start_s) / FRAG_RAMP_UP_S)
    down = at_end * np.clip(1.0 - (t_s - w.end_s) / FRAG_RAMP_DOWN_S, 0.0, 1.0)
    return np.where(t_s < w.end_s, up, down)


def fragmentation_level(
    windows: list[NoisyWindow], instance: IntArray, t_s: FloatArray
) -> FloatArray:
    """Fragmentation level of ``instance[k]`` at ``t_s[k]`` (seconds after the first arrival)."""
    level = np.zeros(len(t_s))
    for w in windows:
        reach = np.asarray(w.instances, dtype=bool)[instance]
        level = np.maximum(level, np.where(reach, w.severity * _ramp(w, t_s), 0.0))
    return FRAG_BASE + (FRAG_PEAK - FRAG_BASE) * level


def frag_slowdown(level: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(front, decode)`` latency factors of requests served at fragmentation ``level``.

    1 at the base level, rising linearly to ``1 + FRAG_PREFILL_SLOWDOWN`` (queue
    and prefill) and ``1 + FRAG_DECODE_SLOWDOWN`` (token gaps) at the peak.
    """
    x = np.clip((level - FRAG_BASE) / (FRAG_PEAK - FRAG_BASE), 0.0, None)
    return 1.0 + FRAG_PREFILL_SLOWDOWN * x, 1.0 + FRAG_DECODE_SLOWDOWN * x


def instance_blocks(cfg: SimConfig, mean_rate: float | None = None) -> list[int]:
    """``total_blocks`` of every instance: healthy occupancy ≈ ``KV_TARGET_UTILISATION``.

    Little's law: mean tokens held = arrival rate · E[tokens · seconds held per
    request], with lognormal prompt/completion sizes (E[X] = e^(μ+σ²/2),
    E[X²] = e^(2μ+2σ²)) and a request holding its prompt through ~0.2 s of
    prefill and its prompt plus the tokens generated so far while decoding.
    """
    rate = cfg.rate if mean_rate is None else mean_rate
    tenants_rate = rate
    svc_w = np.array([s.weight for s in cfg.services], dtype=np.float64)
    svc_w /= svc_w.sum()
    out: list[int] = []
    for si, svc in enumerate(cfg.services):
        within = sum(m.weight for m in svc.models)
        mu_in, s_in = math.log(svc.input_tokens_median), svc.input_tokens_sigma
        mu_out, s_out = math.log(svc.output_tokens_median), svc.output_tokens_sigma
        e_in = math.exp(mu_in + s_in**2 / 2)
        e_out = math.exp(mu_out + s_out**2 / 2)
        e_out2 = math.exp(2 * mu_out + 2 * s_out**2)
        for m in svc.models:
            lam = tenants_rate * svc_w[si] * m.weight / within / m.instances
            itl_s = m.itl_median_ms / 1000.0
            token_seconds = e_in * (0.2 + e_out * itl_s) + e_out2 / 2 * itl_s
            blocks = lam * token_seconds / (KV_BLOCK_SIZE * (1 - FRAG_BASE))
            total = max(256, math.ceil(blocks / KV_TARGET_UTILISATION / 64) * 64)
            out.extend([total] * m.instances)
    return out


def _unit(event_id: str) -> float:
    """A stable number in [0, 1) per request."""
    digest = hashlib.blake2b(event_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(slots=True)
class _Running:
    admit_ms: float
    first_ms: float | None
    end_ms: float
    input_tokens: int
    output_tokens: int
    tenant: str
    unit: float

    def tokens_at(self, t_ms: float) -> int:
        if self.first_ms is None or t_ms < self.first_ms:
            return self.input_tokens
        span = self.end_ms - self.first_ms
        done = (t_ms - self.first_ms) / span if span > 0 else 1.0
        generated = 1 + math.floor(done * max(self.output_tokens - 1, 0))
        return self.input_tokens + min(generated, self.output_tokens)


@dataclass
class KvTracker:
    """Turns a run's inference events (in arrival order) into KV snapshots.

    ``watch(events)`` passes the events through while noting them; ``due()``
    returns the snapshots whose time every arrival seen so far has passed (all
    requests that could run then are known); ``finish()`` the rest, up to the
    end of the run. Snapshot ``k`` is at ``start_ms + k · interval``; within a
    time, instances come in ``instance_layout`` order.
    """

    cfg: SimConfig
    interval_s: float = DEFAULT_KV_INTERVAL_S
    block_size: int = KV_BLOCK_SIZE
    mean_rate: float | None = None
    _windows: list[NoisyWindow] = field(init=False)
    _names: list[str] = field(init=False)
    _hosts: list[str] = field(init=False)
    _index: dict[str, int] = field(init=False)
    _totals: list[int] = field(init=False)
    _running: list[list[_Running]] = field(init=False)
    _preemptions: list[int] = field(init=False)
    _next_ms: int = field(init=False)
    _seen_ms: int | None = field(init=False, default=None)
    emitted: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            msg = f"KV snapshot interval must be > 0 s, got {self.interval_s!r}"
            raise ValueError(msg)
        layout = self.cfg.instance_layout()
        self._windows = noisy_windows(self.cfg)
        self._names = [name for name, _, _ in layout]
        self._hosts = [host for _, host, _ in layout]
        self._index = {name: i for i, name in enumerate(self._names)}
        self._totals = instance_blocks(self.cfg, self.mean_rate)
        self._running = [[] for _ in layout]
        self._preemptions = [0] * len(layout)
        self._next_ms = self.cfg.first_ms

    @property
    def interval_ms(self) -> int:
        return max(1, round(self.interval_s * 1000))

    def observe(self, ev: dict[str, Any]) -> None:
        """Note one inference event (events must come in arrival order)."""
        ts = int(ev["ts_ms"])
        self._seen_ms = ts if self._seen_ms is None else max(self._seen_ms, ts)
        if ev["status"] not in ("ok", "error"):
            return  # timed out in the queue or rejected: never held KV blocks
        inst = self._index.get(ev.get("instance", ""))
        if inst is None:
            return
        stages = ev.get("stages_ms") or {}
        admit = ts + float(stages.get("tokenize", 0.0)) + float(stages.get("queue", 0.0))
        ttft = ev.get("ttft_ms")
        self._running[inst].append(
            _Running(
                admit_ms=admit,
                first_ms=None if ttft is None else ts + float(ttft),
                end_ms=ts + float(ev["e2e_ms"]),
                input_tokens=int(ev.get("input_tokens") or 0),
                output_tokens=int(ev.get("output_tokens") or 0),
                tenant=str(ev.get("tenant", "default")),
                unit=_unit(str(ev["event_id"])),
            )
        )

    def watch(self, events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Yield ``events`` unchanged, observing each."""
        for ev in events:
            self.observe(ev)
            yield ev

    def due(self) -> list[dict[str, Any]]:
        """Snapshots strictly before the newest arrival seen (their inputs are complete)."""
        if self._seen_ms is None:
            return []
        return self._until(self._seen_ms - 1)

    def finish(self) -> list[dict[str, Any]]:
        """The remaining snapshots, through the end of the run (its duration, or the
        last arrival for a replay without one)."""
        if self.cfg.duration_s is not None:
            end = self.cfg.first_ms + round(self.cfg.duration_s * 1000)
        else:
            end = self._seen_ms if self._seen_ms is not None else self.cfg.first_ms
        return self._until(end)

    def _until(self, last_ms: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while self._next_ms <= last_ms:
            out.extend(self.snapshot(self._next_ms))
            self._next_ms += self.interval_ms
        return out

    def snapshot(self, t_ms: int) -> list[dict[str, Any]]:
        """One snapshot per instance at ``t_ms`` (prunes requests that ended)."""
        t_s = np.full(len(self._names), (t_ms - self.cfg.first_ms) / 1000.0)
        levels = fragmentation_level(self._windows, np.arange(len(self._names)), t_s).tolist()
        out: list[dict[str, Any]] = []
        for i, name in enumerate(self._names):
            running = [r for r in self._running[i] if r.end_ms > t_ms]
            self._running[i] = running
            total = self._totals[i]
            used = 0
            preempted = 0
            sequences: list[dict[str, Any]] = []
            for r in running:
                if r.admit_ms > t_ms:
                    continue
                tokens = r.tokens_at(t_ms)
                slack = levels[i] - _ROUNDING_SHARE + FRAG_SPREAD * (r.unit - 0.5)
                slack = min(max(slack, 0.0), 0.9)
                blocks = max(1, math.ceil(tokens / (self.block_size * (1.0 - slack))))
                if preempted or used + blocks > total:
                    preempted += 1  # the newest are preempted first (LIFO, as vLLM does)
                    continue
                used += blocks
                sequences.append({"tenant": r.tenant, "tokens": tokens, "blocks": blocks})
            self._preemptions[i] += preempted
            out.append(
                {
                    "ts_ms": t_ms,
                    "instance": name,
                    "host": self._hosts[i],
                    "block_size": self.block_size,
                    "total_blocks": total,
                    "free_blocks": total - used,
                    "preemptions": self._preemptions[i],
                    "sequences": sequences,
                }
            )
        self.emitted += len(out)
        return out
