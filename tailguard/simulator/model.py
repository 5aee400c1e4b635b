"""The traffic model: arrivals → requests → ``tailguard.inference.v1`` events. Pure; no Kafka.

:func:`generate` yields one event (a plain dict) per request in
arrival order; :func:`generate_batches` groups them per ``service/model`` for a
producer. Output is a function of the :class:`SimConfig` alone (its ``seed``
and resolved ``start_ms`` included): the same config yields the same events.
Two independent random streams are spawned from the seed, one for arrivals and
one for requests, and every request draw is made whether or not an incident
needs it, so a run with a ``silent_collapse`` incident and the same run
without it differ only inside the incident.

Latency of one request (all ms; ``LN(m, s)`` is lognormal with median ``m``,
log-space sigma ``s``)::

    arrival ─ tokenize ─ queue ─────────────────────── prefill ─┬─ decode ───── detokenize ─ end
                         scheduler + batch wait + throttle       first token
              │◀─────────────────── ttft_ms ───────────────────▶│◀─ Σ itl_ms ─▶│

    tokenize = (0.3 + 0.0012·input_tokens) · LN(1, 0.25)
    queue    = LN(12, 0.8) · (1 + 0.6·(load - 1)) · kv_front  scheduler queue, noisy neighbours
             + batch.wait_ms                                 normally Exp(mean 3 ms)
             + throttle wait                                 0 unless flow-controlled
    prefill  = (110 + 0.2·uncached + 0.01·cached) · ttft_scale(model) · slow · LN(1, 0.33)
               · kv_front
    gap_i    = itl_median(model) · LN(1, 0.12) [per request] · LN(1, 0.22) [per token]
               · (1 + 0.12·(load - 1)) · kv_decode
               (+ U(40, 150) ms with probability 0.3 % · load: a neighbour's prefill stalls decode)

    kv_front, kv_decode = 1 + 0.6·x, 1 + 0.4·x   x = (fragmentation level − 0.08) / 0.29 of the
                                                 request's instance at its arrival: 0 unless a
                                                 noisy neighbour reaches it (simulator.kv)
    e2e      = ttft + Σ gaps + detokenize (0.2 + 0.004·output_tokens)

With the default fleet this gives TTFT median ≈ 180 ms and P95 ≈ 320 ms, gaps
around 25-35 ms, and about 0.2 % non-ok requests (error 70 %, timeout 30 %).
Prefix-cache hits are drawn per request from Beta(60, 0.8) (mean 98.7 %).

Silent collapse (the article's chain) on a hit request:

- prefix-cache miss storm: hit share ~ Beta(0.75, 9.5) (mean 7.3 %), so the
  prefill runs over ~93 % of the prompt;
- dynamic batching with ``min_batch=4``, ``timeout=350 ms``, backoff 50 ms:
  70 % of requests wait out the timeout in an under-filled batch (size 1-3),
  ``wait = 350 + 50·(2^k - 1)`` after ``k`` consecutive timeouts (k geometric,
  ≤ 4), ``batch.timed_out = true``; the rest fill to 4 after U(50, 350) ms;
- token flow control at 128 tokens/s (``flow_control.limit_tokens_per_s`` is
  128 on every hit request, 4096 otherwise): 65 % are ``throttled`` and wait
  deficit/128 s for the token bucket (deficit ~ Exp(mean 48 tokens)), and their
  gaps are floored at (3-5 streams)/128 s.

The P95 TTFT of hit requests goes from ~320 ms to ~1840 ms while ``status`` stays
``ok`` and the arrival rate is untouched.

``itl_ms`` holds one gap per streamed chunk after the first (vLLM's
benchmark semantics). One token is one chunk, so ``len(itl_ms) =
output_tokens - 1`` — except that the list is capped at ``cfg.max_itl_gaps``
(default 64) to keep events small: when ``output_tokens - 1 = n`` exceeds the
cap ``c``, the ``n`` token gaps are grouped into ``c`` consecutive chunks in
``numpy.array_split`` order (the first ``n mod c`` chunks hold ``n // c + 1``
tokens, the rest ``n // c``) and each element is the sum of its chunk's gaps.
``Σ itl_ms`` and TPOT are unchanged by the grouping; per-token ITL of a chunk
is its gap divided by its token count, which a consumer can recompute from
``output_tokens`` and ``len(itl_ms)``. ``max_itl_gaps=None`` disables the cap.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tailguard.simulator.arrivals import ArrivalBlock, Trace, arrival_blocks, load_trace
from tailguard.simulator.config import Incident, SimConfig
from tailguard.simulator.kv import frag_slowdown, fragmentation_level, noisy_windows

__all__ = [
    "BATCH_BACKOFF_MS",
    "BATCH_TIMEOUT_MS",
    "FLOW_LIMIT_COLLAPSE",
    "FLOW_LIMIT_NORMAL",
    "MIN_BATCH",
    "Incident",
    "SimConfig",
    "batch_events",
    "generate",
    "generate_batches",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# --- normal state ---------------------------------------------------------------------------
TOKENIZE_BASE_MS = 0.3
TOKENIZE_PER_TOKEN_MS = 0.0012
QUEUE_MEDIAN_MS = 14.0
QUEUE_SIGMA = 0.8
BATCH_WAIT_MEAN_MS = 3.0
PREFILL_BASE_MS = 135.0
PREFILL_UNCACHED_MS_PER_TOKEN = 0.15
PREFILL_CACHED_MS_PER_TOKEN = 0.01
PREFILL_SIGMA = 0.33
CACHE_HIT_BETA_NORMAL = (60.0, 0.8)  # mean 0.987
ITL_REQUEST_SIGMA = 0.12
ITL_TOKEN_SIGMA = 0.22
ITL_SPIKE_P = 0.003
FLOW_LIMIT_NORMAL = 4096
SESSION_MS = 15 * 60 * 1000
MAX_INPUT_TOKENS = 131_072
MAX_OUTPUT_TOKENS = 8192
# --- silent collapse (the article's numbers) ------------------------------------------------
CACHE_HIT_BETA_COLLAPSE = (0.75, 9.5)  # mean 0.073
MIN_BATCH = 4
BATCH_TIMEOUT_MS = 350.0
BATCH_BACKOFF_MS = 50.0
COLLAPSE_BATCH_TIMEOUT_P = 0.7
FLOW_LIMIT_COLLAPSE = 128
COLLAPSE_THROTTLED_P = 0.65
THROTTLE_DEFICIT_MEAN_TOKENS = 48.0
# --- statuses -------------------------------------------------------------------------------
ERROR_TYPES = ("engine_error", "cuda_oom", "upstream_reset", "deadline_exceeded", "rate_limited")
STATUSES = ("ok", "error", "timeout", "rejected")


@dataclass(frozen=True, slots=True)
class _Target:
    """An incident's filter as fleet indices (-1: any)."""

    kind: str
    start_s: float
    end_s: float
    level: float
    service: int
    model: int
    tenant: int
    variant: int
    instance: int


class _Fleet:
    """Index tables of the configured fleet, built once per run."""

    def __init__(self, cfg: SimConfig, trace: Trace | None) -> None:
        self.cfg = cfg
        pairs = [(si, m) for si, s in enumerate(cfg.services) for m in s.models]
        svc_w = np.array([s.weight for s in cfg.services], dtype=np.float64)
        svc_w /= svc_w.sum()
        w = []
        for si, m in pairs:
            within = sum(x.weight for x in cfg.services[si].models)
            w.append(svc_w[si] * m.weight / within)
        self.pair_w = np.asarray(w) / np.sum(w)
        self.pair_keys = [(cfg.services[si].name, m.name) for si, m in pairs]
        self.model_names = list(dict.fromkeys(m.name for _, m in pairs))
        self.pair_service = np.array([si for si, _ in pairs], dtype=np.int64)
        self.pair_model = np.array([self.model_names.index(m.name) for _, m in pairs])
        self.pair_itl = np.array([m.itl_median_ms for _, m in pairs], dtype=np.float64)
        self.pair_ttft_scale = np.array([m.ttft_scale for _, m in pairs], dtype=np.float64)
        counts = np.array([m.instances for _, m in pairs], dtype=np.int64)
        self.pair_inst_count = counts
        self.pair_inst_offset = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        layout = cfg.instance_layout()
        self.inst_names = [name for name, _, _ in layout]
        self.inst_hosts = [host for _, host, _ in layout]
        self.inst_gpus = [gpus for _, _, gpus in layout]
        self.inst_pair = np.repeat(np.arange(len(pairs)), counts)
        svcs = cfg.services
        self.svc_in = np.array(
            [(math.log(s.input_tokens_median), s.input_tokens_sigma) for s in svcs]
        )
        self.svc_out = np.array(
            [(math.log(s.output_tokens_median), s.output_tokens_sigma) for s in svcs]
        )
        tw = (
            np.asarray(cfg.tenant_weights, dtype=np.float64)
            if cfg.tenant_weights is not None
            else 1.0 / np.arange(1, len(cfg.tenants) + 1)
        )
        self.tenant_w = tw / tw.sum()
        self.variants = list(cfg.variants) if cfg.variants else ["default"]
        users = cfg.users_per_tenant
        self.unit_ids = [[f"{t}-u{u:05d}" for u in range(users)] for t in cfg.tenants]
        self.session_off = np.array(
            [[zlib.crc32(uid.encode()) % SESSION_MS for uid in row] for row in self.unit_ids],
            dtype=np.int64,
        )
        # Variant by position in hash order, so each arm holds the same number of
        # (equally active) users and request counts per arm are exactly binomial.
        self.unit_variant = np.zeros((len(cfg.tenants), users), dtype=np.int64)
        if cfg.experiment is not None:
            nv = len(self.variants)
            for ti, row in enumerate(self.unit_ids):
                order = sorted(range(users), key=lambda u: _h64(f"{cfg.experiment}/{row[u]}"))
                for pos, u in enumerate(order):
                    self.unit_variant[ti, u] = pos % nv
        self.targets = [self._compile(i) for i in cfg.incidents]
        self.noisy = noisy_windows(cfg)
        if cfg.arrivals == "replay" and trace is not None and trace.span_s > 0:
            self.mean_rate = len(trace.offsets_s) / trace.span_s * cfg.speedup
        else:
            self.mean_rate = cfg.rate

    def _compile(self, inc: Incident) -> _Target:
        t, cfg = inc.target, self.cfg

        def idx(value: str | None, names: list[str]) -> int:
            return -1 if value is None else names.index(value)

        return _Target(
            kind=inc.kind,
            start_s=inc.start_s,
            end_s=inc.end_s,
            level=inc.level,
            service=idx(t.service, [s.name for s in cfg.services]),
            model=idx(t.model, self.model_names),
            tenant=idx(t.tenant, list(cfg.tenants)),
            variant=idx(t.variant, self.variants),
            instance=idx(t.instance, self.inst_names),
        )

    def allowed_pairs(self, tg: _Target) -> IntArray:
        """Pairs a target's traffic may go to (instance > model/service filters)."""
        if tg.instance >= 0:
            return np.array([self.inst_pair[tg.instance]], dtype=np.int64)
        ok = np.ones(len(self.pair_w), dtype=bool)
        if tg.service >= 0:
            ok &= self.pair_service == tg.service
        if tg.model >= 0:
            ok &= self.pair_model == tg.model
        return np.flatnonzero(ok).astype(np.int64)


def _h64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(slots=True)
class _Requests:
    """The columns of one block of requests (index i = one request)."""

    t_s: FloatArray
    pair: IntArray
    tenant: IntArray
    instance: IntArray
    input_tokens: IntArray
    output_tokens: IntArray


def _place(fleet: _Fleet, block: ArrivalBlock, rng: np.random.Generator) -> _Requests:
    """Who sends each arrival and where it goes, plus the noisy neighbours' extra arrivals."""
    n0 = len(block.t_s)
    t_parts = [block.t_s]
    pair_parts = [rng.choice(len(fleet.pair_w), n0, p=fleet.pair_w)]
    ten_parts = [rng.choice(len(fleet.tenant_w), n0, p=fleet.tenant_w)]
    inst_parts = [np.full(n0, -1, dtype=np.int64)]
    unset = np.full(n0, -1, dtype=np.int64)
    in_parts = [block.input_tokens if block.input_tokens is not None else unset]
    out_parts = [block.output_tokens if block.output_tokens is not None else unset]
    for tg in fleet.targets:
        if tg.kind != "noisy_neighbor":
            continue
        lo, hi = max(block.start_s, tg.start_s), min(block.end_s, tg.end_s)
        if hi <= lo:
            continue
        allowed = fleet.allowed_pairs(tg)
        share = float(fleet.pair_w[allowed].sum())
        extra_rate = fleet.mean_rate * fleet.tenant_w[tg.tenant] * share * (tg.level - 1.0)
        k = int(rng.poisson(extra_rate * (hi - lo)))
        t_parts.append(rng.uniform(lo, hi, k))
        pair_parts.append(rng.choice(allowed, k, p=fleet.pair_w[allowed] / share))
        ten_parts.append(np.full(k, tg.tenant, dtype=np.int64))
        inst_parts.append(np.full(k, tg.instance, dtype=np.int64))
        in_parts.append(np.full(k, -1, dtype=np.int64))
        out_parts.append(np.full(k, -1, dtype=np.int64))
    t = np.concatenate(t_parts)
    order = np.argsort(t, kind="stable")
    pair = np.concatenate(pair_parts).astype(np.int64)[order]
    n = len(t)
    # instance: forced for noisy traffic aimed at one instance, else uniform in the pair
    forced = np.concatenate(inst_parts)[order]
    pick = np.floor(rng.random(n) * fleet.pair_inst_count[pair]).astype(np.int64)
    instance = np.where(forced >= 0, forced, fleet.pair_inst_offset[pair] + pick)
    svc = fleet.pair_service[pair]
    syn_in = np.rint(rng.lognormal(fleet.svc_in[svc, 0], fleet.svc_in[svc, 1]))
    syn_out = np.rint(rng.lognormal(fleet.svc_out[svc, 0], fleet.svc_out[svc, 1]))
    given_in = np.concatenate(in_parts)[order]
    given_out = np.concatenate(out_parts)[order]
    inp = np.where(given_in >= 0, given_in, syn_in)
    out = np.where(given_out >= 0, given_out, syn_out)
    return _Requests(
        t_s=t[order],
        pair=pair,
        tenant=np.concatenate(ten_parts).astype(np.int64)[order],
        instance=instance.astype(np.int64),
        input_tokens=np.clip(inp, 1, MAX_INPUT_TOKENS).astype(np.int64),
        output_tokens=np.clip(out, 1, MAX_OUTPUT_TOKENS).astype(np.int64),
    )


def _match(fleet: _Fleet, tg: _Target, r: _Requests, variant: IntArray) -> BoolArray:
    m: BoolArray = (r.t_s >= tg.start_s) & (r.t_s < tg.end_s)
    if tg.service >= 0:
        m &= fleet.pair_service[r.pair] == tg.service
    if tg.model >= 0:
        m &= fleet.pair_model[r.pair] == tg.model
    if tg.instance >= 0:
        m &= r.instance == tg.instance
    # a noisy neighbour slows everyone on the shared service/model, not just itself
    if tg.tenant >= 0 and tg.kind != "noisy_neighbor":
        m &= r.tenant == tg.tenant
    if tg.variant >= 0 and tg.kind != "noisy_neighbor":
        m &= variant == tg.variant
    return m


def _chunk(gaps: FloatArray, n_gaps: IntArray, cap: int | None) -> tuple[FloatArray, IntArray]:
    """Group each request's token gaps into at most ``cap`` chunks, all requests at once.

    Request ``e`` owns ``gaps[o_e : o_e + n_e]``; with ``q, r = divmod(n_e, cap)``
    its chunk ``k`` starts at gap ``o_e + k·q + min(k, r)`` (``numpy.array_split``
    order: the first ``r`` chunks hold ``q + 1`` gaps, the rest ``q``; for
    ``n_e <= cap`` that is one gap per chunk). Returns the chunk sums rounded to
    0.01 ms and the offsets of each request's chunks (``len = n + 1``).
    """
    n_chunks = n_gaps if cap is None else np.minimum(n_gaps, cap)
    chunk_off = np.concatenate(([0], np.cumsum(n_chunks))).astype(np.int64)
    if len(gaps) == 0:
        return np.empty(0), chunk_off
    if cap is None:
        return np.round(gaps, 2).astype(np.float64), chunk_off
    gap_off = np.concatenate(([0], np.cumsum(n_gaps))).astype(np.int64)
    owner = np.repeat(np.arange(len(n_gaps)), n_chunks)
    k = np.arange(int(chunk_off[-1])) - chunk_off[owner]
    q, rem = np.divmod(n_gaps[owner], cap)
    starts = gap_off[owner] + k * q + np.minimum(k, rem)
    return np.round(np.add.reduceat(gaps, starts), 2).astype(np.float64), chunk_off


def _simulate(
    fleet: _Fleet,
    block: ArrivalBlock,
    rng: np.random.Generator,
    tag: str,
    seq0: int,
) -> list[dict[str, Any]]:
    cfg = fleet.cfg
    r = _place(fleet, block, rng)
    n = len(r.t_s)
    if n == 0:
        return []
    inp, out = r.input_tokens, r.output_tokens
    user = rng.integers(0, cfg.users_per_tenant, n)
    variant = fleet.unit_variant[r.tenant, user]

    # --- incidents: every draw is made unconditionally (see module docstring) ---
    u_collapse = rng.random(n)
    collapse = np.zeros(n, dtype=bool)
    err_rate = np.full(n, cfg.baseline_error_rate)
    burst = np.zeros(n, dtype=bool)
    load = np.ones(n)
    slow = np.ones(n)
    canary = np.zeros(n, dtype=bool)  # prompt_cache_miss: a new prompt version misses the cache
    for tg in fleet.targets:
        m = _match(fleet, tg, r, variant)
        if tg.kind == "silent_collapse":
            collapse |= m & (u_collapse < tg.level)
        elif tg.kind == "error_burst":
            err_rate[m] = np.maximum(err_rate[m], tg.level)
            burst |= m
        elif tg.kind == "noisy_neighbor":
            load[m] = np.maximum(load[m], tg.level)
        elif tg.kind == "prompt_cache_miss":
            canary |= m & (u_collapse < tg.level)
        else:  # slow_treatment
            slow[m] *= tg.level

    # KV fragmentation a noisy neighbour causes (1.0 everywhere else; see simulator.kv)
    frag_front, frag_decode = frag_slowdown(fragmentation_level(fleet.noisy, r.instance, r.t_s))

    # --- front half: tokenize, queue, batching, cache, flow control, prefill ---
    tokenize = (TOKENIZE_BASE_MS + TOKENIZE_PER_TOKEN_MS * inp) * rng.lognormal(0.0, 0.25, n)
    sched = (
        rng.lognormal(math.log(QUEUE_MEDIAN_MS), QUEUE_SIGMA, n)
        * (1.0 + 0.6 * (load - 1.0))
        * frag_front
    )
    b_size = np.clip(2 + rng.poisson(6.0 + 2.0 * (load - 1.0)), 1, 64)
    b_wait = np.minimum(rng.exponential(BATCH_WAIT_MEAN_MS, n), BATCH_TIMEOUT_MS)
    timed_out = collapse & (rng.random(n) < COLLAPSE_BATCH_TIMEOUT_P)
    k = np.minimum(rng.geometric(0.55, n) - 1, 4)
    wait_to = BATCH_TIMEOUT_MS + BATCH_BACKOFF_MS * (2.0**k - 1.0)
    wait_fill = rng.uniform(50.0, BATCH_TIMEOUT_MS, n)
    small = rng.integers(1, MIN_BATCH, n)
    filled = collapse & ~timed_out
    b_wait = np.where(timed_out, wait_to, np.where(filled, wait_fill, b_wait))
    b_size = np.where(timed_out, small, np.where(filled, MIN_BATCH, b_size))
    hit_share = np.where(
        collapse | canary,
        rng.beta(*CACHE_HIT_BETA_COLLAPSE, n),
        rng.beta(*CACHE_HIT_BETA_NORMAL, n),
    )
    hit = np.minimum(np.rint(hit_share * inp), inp).astype(np.int64)
    throttled = collapse & (rng.random(n) < COLLAPSE_THROTTLED_P)
    deficit = rng.exponential(THROTTLE_DEFICIT_MEAN_TOKENS, n)
    throttle_wait = np.where(throttled, deficit / FLOW_LIMIT_COLLAPSE * 1000.0, 0.0)
    gap_floor = np.where(throttled, rng.integers(3, 6, n) * 1000.0 / FLOW_LIMIT_COLLAPSE, 0.0)
    limit = np.where(collapse, FLOW_LIMIT_COLLAPSE, FLOW_LIMIT_NORMAL)
    prefill = (
        (
            PREFILL_BASE_MS
            + PREFILL_UNCACHED_MS_PER_TOKEN * (inp - hit)
            + PREFILL_CACHED_MS_PER_TOKEN * hit
        )
        * fleet.pair_ttft_scale[r.pair]
        * slow
        * rng.lognormal(0.0, PREFILL_SIGMA, n)
        * frag_front
    )
    queue = sched + b_wait + throttle_wait

    # --- status: ok / error (before or mid-stream) / timeout / rejected ---
    nonok = rng.random(n) < err_rate
    u_kind = rng.random(n)
    u_mid = rng.random(n)
    u_cut = rng.random(n)
    u_err = rng.integers(0, 3, n)  # the first three ERROR_TYPES are engine errors
    is_err = nonok & np.where(burst, u_kind < 0.6, u_kind < 0.7)
    is_timeout = nonok & ~is_err & np.where(burst, u_kind < 0.85, True)
    is_rejected = nonok & ~is_err & ~is_timeout
    mid = is_err & (u_mid < 0.5) & (out > 1)
    n_out = np.where(nonok, 0, out)
    n_out = np.where(mid, 1 + np.floor(u_cut * (out - 1)).astype(np.int64), n_out)

    # --- back half: per-token gaps grouped into chunks, detokenize ---
    n_gaps = np.maximum(n_out - 1, 0)
    total = int(n_gaps.sum())
    req_scale = (
        fleet.pair_itl[r.pair]
        * rng.lognormal(0.0, ITL_REQUEST_SIGMA, n)
        * (1.0 + 0.12 * (load - 1.0))
        * frag_decode
    )
    gaps = np.repeat(req_scale, n_gaps) * np.exp(ITL_TOKEN_SIGMA * rng.standard_normal(total))
    spikes = np.flatnonzero(rng.random(total) < np.repeat(ITL_SPIKE_P * load, n_gaps))
    gaps[spikes] += rng.uniform(40.0, 150.0, len(spikes))
    if throttled.any():
        gaps = np.maximum(gaps, np.repeat(gap_floor, n_gaps))
    chunks, chunk_off = _chunk(gaps, n_gaps, cfg.max_itl_gaps)
    csum = np.concatenate(([0.0], np.cumsum(chunks)))
    detok = 0.2 + 0.004 * n_out

    trace_hex = rng.bytes(16 * n).hex()
    u_rej = rng.uniform(0.5, 2.0, n)
    u_pre = rng.random(n)

    # --- per-status timings, rounded (stages sum to e2e within rounding) ---
    timeout_ms = float(cfg.request_timeout_ms)
    has_out = n_out > 0
    pre_err = is_err & ~has_out
    stuck = is_timeout | is_rejected
    tok_r = np.round(tokenize, 3)
    queue_r = np.round(
        np.where(is_timeout, timeout_ms - tok_r, np.where(is_rejected, u_rej, queue)), 3
    )
    prefill_r = np.round(np.where(pre_err, prefill * u_pre, np.where(stuck, 0.0, prefill)), 3)
    front = np.round(tok_r + queue_r + prefill_r, 3)
    decode_r = np.where(has_out, np.round(csum[chunk_off[1:]] - csum[chunk_off[:-1]], 3), 0.0)
    detok_r = np.where(has_out, np.round(detok, 3), 0.0)
    e2e = np.where(is_timeout, timeout_ms, np.round(front + decode_r + detok_r, 3))
    status_i = np.where(is_err, 1, np.where(is_timeout, 2, np.where(is_rejected, 3, 0)))
    err_i = np.where(is_err, u_err, np.where(is_timeout, 3, 4))
    hit = np.where(is_rejected, 0, hit)
    b_wait_r = np.round(b_wait, 3)

    # --- assemble the dicts ---
    ts_ms = (cfg.first_ms + np.floor(r.t_s * 1000.0)).astype(np.int64)
    chunk_list: list[float] = chunks.tolist()
    chunk_off_l: list[int] = chunk_off.tolist()
    keys, tenants, units = fleet.pair_keys, cfg.tenants, fleet.unit_ids
    variants, experiment = fleet.variants, cfg.experiment
    inst_names, inst_hosts, inst_gpus = fleet.inst_names, fleet.inst_hosts, fleet.inst_gpus
    columns = (
        ts_ms, r.pair, r.tenant, user, variant, r.instance, inp, n_out, has_out, status_i,
        err_i, tok_r, queue_r, prefill_r, front, decode_r, detok_r, e2e, hit, b_size,
        b_wait_r, timed_out, throttled, limit, fleet.session_off[r.tenant, user],
    )  # fmt: skip
    events: list[dict[str, Any]] = []
    for i, (
        ts, pair, ti, ui, vi, inst, inp_i, out_i, has_out_i, st, et, tok, q, pf, ttft, dec,
        dtk, e2e_i, hit_i, bs, bw, bto, thr, lim, soff,
    ) in enumerate(zip(*(c.tolist() for c in columns), strict=True)):  # fmt: skip
        service, model = keys[pair]
        unit = units[ti][ui]
        ev: dict[str, Any] = {
            "event_id": f"{tag}-{seq0 + i:09x}",
            "ts_ms": ts,
            "service": service,
            "model": model,
            "status": STATUSES[st],
            "e2e_ms": e2e_i,
        }
        if has_out_i:
            ev["ttft_ms"] = ttft
        ev["output_tokens"] = out_i
        ev["input_tokens"] = inp_i
        ev["itl_ms"] = chunk_list[chunk_off_l[i] : chunk_off_l[i + 1]]
        if experiment is not None:
            ev["variant"] = variants[vi]
            ev["experiment"] = experiment
        else:
            ev["variant"] = "default"
        ev["tenant"] = tenants[ti]
        ev["unit_id"] = unit
        ev["session_id"] = f"{unit}-s{(ts + soff) // SESSION_MS:x}"
        ev["trace_id"] = trace_hex[32 * i : 32 * i + 32]
        ev["instance"] = inst_names[inst]
        ev["host"] = inst_hosts[inst]
        ev["gpu_ids"] = list(inst_gpus[inst])
        if st:
            ev["error_type"] = ERROR_TYPES[et]
        ev["queue_ms"] = q
        ev["stages_ms"] = {
            "tokenize": tok,
            "queue": q,
            "prefill": pf,
            "decode": dec,
            "detokenize": dtk,
        }
        ev["cache"] = {"prefix_hit_tokens": hit_i, "prefix_query_tokens": inp_i}
        if st != 3:  # a rejected request never reached the batcher
            ev["batch"] = {"size": bs, "wait_ms": bw, "timed_out": bto}
        ev["flow_control"] = {"throttled": thr, "limit_tokens_per_s": lim}
        events.append(ev)
    if any(tg.kind == "prompt_cache_miss" for tg in fleet.targets):
        for ev, new_prompt in zip(events, canary.tolist(), strict=True):
            ev["prompt_version"] = "v2" if new_prompt else "v1"
    return events


def run_tag(cfg: SimConfig) -> str:
    """The event-id prefix of a run: ``sim-`` + 12 hex digits of hash(seed, start_ms)."""
    return (
        "sim-" + hashlib.blake2b(f"{cfg.seed}:{cfg.first_ms}".encode(), digest_size=6).hexdigest()
    )


def generate(cfg: SimConfig) -> Iterator[dict[str, Any]]:
    """Yield the run's ``tailguard.inference.v1`` events in arrival order (lazily).

    ``event_id`` is ``{run_tag}-{sequence:09x}``: unique within a run and
    deterministic for ``(seed, start_ms)``, so replaying a config reproduces its
    ids while a fresh run (new default ``start_ms``) does not collide with an
    old one in a consumer's dedup horizon. ``ts_ms`` is the arrival time.
    """
    trace = load_trace(cfg.trace) if cfg.arrivals == "replay" and cfg.trace is not None else None
    fleet = _Fleet(cfg, trace)
    arrivals_ss, requests_ss = np.random.SeedSequence(cfg.seed).spawn(2)
    arrivals_rng = np.random.default_rng(arrivals_ss)
    requests_rng = np.random.default_rng(requests_ss)
    tag = run_tag(cfg)
    seq = 0
    for block in arrival_blocks(cfg, arrivals_rng, trace):
        events = _simulate(fleet, block, requests_rng, tag, seq)
        seq += len(events)
        yield from events


def generate_batches(
    cfg: SimConfig, batch_size: int, *, max_span_ms: int = 1000
) -> Iterator[list[dict[str, Any]]]:
    """Yield lists of events of one ``service/model`` each, at most ``batch_size`` long.

    A batch is closed when it is full, or when an event arrives more than
    ``max_span_ms`` of event time after the batch's first event (so a quiet
    service/model is not held back), or at the end. Within a batch events are in
    arrival order; batches come out in the order they close.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        msg = f"batch_size must be an integer >= 1, got {batch_size!r}"
        raise ValueError(msg)
    if isinstance(max_span_ms, bool) or not isinstance(max_span_ms, int) or max_span_ms < 0:
        msg = f"max_span_ms must be an integer >= 0, got {max_span_ms!r}"
        raise ValueError(msg)
    yield from batch_events(generate(cfg), batch_size, max_span_ms=max_span_ms)


def batch_events(
    events: Iterable[dict[str, Any]], batch_size: int, *, max_span_ms: int = 1000
) -> Iterator[list[dict[str, Any]]]:
    """:func:`generate_batches` over events already generated (e.g. watched by a
    :class:`~tailguard.simulator.kv.KvTracker`); arguments are not re-checked."""
    open_: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for ev in events:
        ts = ev["ts_ms"]
        stale = [k for k, b in open_.items() if ts - b[0]["ts_ms"] > max_span_ms]
        for k in sorted(stale, key=lambda k: open_[k][0]["ts_ms"]):
            yield open_.pop(k)
        key = (ev["service"], ev["model"])
        buf = open_.setdefault(key, [])
        buf.append(ev)
        if len(buf) >= batch_size:
            yield open_.pop(key)
    for k in sorted(open_, key=lambda k: open_[k][0]["ts_ms"]):
        yield open_[k]
