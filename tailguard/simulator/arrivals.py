"""Arrival processes: Poisson, bursty (2-state MMPP) and trace replay.

Each process yields :class:`ArrivalBlock` s: sorted arrival offsets in seconds
after the first arrival (which is at offset 0), one block per stretch of event
time, so a long run never holds all its arrivals in memory.

Bursty arrivals are a Markov-modulated Poisson process with two states::

            rate r_c                       rate r_b = burst_factor · r_c
    calm ───────────────╮  Exp(mean D_c)  ╭──────────── burst ─────╮ Exp(mean D_b)
         ◀──────────────┴─────────────────┴────────────────────────╯

    D_b = burst_mean_s,   D_c = D_b · (1 - f) / f     (f = burst_fraction)
    mean rate = r_c·(1 - f) + r_b·f = rate  ⇒  r_c = rate / (1 - f + burst_factor·f)

Within a state the arrivals are Poisson; the first state is drawn from the
stationary distribution (burst with probability f).

Replay reads ``TIMESTAMP,ContextTokens,GeneratedTokens`` rows, e.g. the Azure
LLM inference trace 2023 (CC-BY 4.0; Patel, Choukse, Zhang, Shah, Goiri,
Maleki, Bianchini, "Splitwise: Efficient generative LLM inference using phase
splitting", ISCA 2024): offset = (TIMESTAMP - first TIMESTAMP) / speedup.
TIMESTAMP is ISO 8601 (``2023-11-16 18:15:46.6805900``, read as UTC; digits
past microseconds are dropped) or a number of seconds.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tailguard.simulator.config import TRACE_COLUMNS, SimConfig
from tailguard.simulator.errors import SimConfigError

__all__ = ["ArrivalBlock", "Trace", "arrival_blocks", "block_seconds", "load_trace"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ArrivalBlock:
    """Arrivals in ``[start_s, end_s)``: sorted offsets and, for replay, token counts."""

    start_s: float
    end_s: float
    t_s: FloatArray
    input_tokens: IntArray | None = None
    output_tokens: IntArray | None = None


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded replay trace: offsets (s, from the first row, unscaled) and token counts."""

    offsets_s: FloatArray
    input_tokens: IntArray
    output_tokens: IntArray

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last arrival (unscaled)."""
        return float(self.offsets_s[-1]) if len(self.offsets_s) else 0.0


def block_seconds(rate: float) -> float:
    """Event time per block: about 2,000 expected arrivals, between 50 ms and 10 s."""
    return min(10.0, max(0.05, 2000.0 / rate))


def _parse_ts(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def load_trace(path: str | Path) -> Trace:
    """Read a replay CSV (columns ``TIMESTAMP,ContextTokens,GeneratedTokens``; others ignored).

    Rows are stably sorted by time. Raises :class:`SimConfigError` naming the
    line of the first bad row.
    """
    p = Path(path)
    ts: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    with p.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            msg = f"trace {str(p)!r} lacks column(s) {', '.join(missing)}"
            raise SimConfigError(msg)
        i_ts, i_in, i_out = (header.index(c) for c in TRACE_COLUMNS)
        for line, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            try:
                t = _parse_ts(row[i_ts])
                n_in, n_out = int(row[i_in]), int(row[i_out])
            except (ValueError, IndexError):
                msg = (
                    f"trace {str(p)!r} line {line}: expected TIMESTAMP,ContextTokens,"
                    f"GeneratedTokens (ISO time or seconds, two integers), got {row!r}"
                )
                raise SimConfigError(msg) from None
            if n_in < 0 or n_out < 0 or not math.isfinite(t):
                msg = f"trace {str(p)!r} line {line}: token counts must be >= 0, got {row!r}"
                raise SimConfigError(msg)
            ts.append(t)
            ins.append(n_in)
            outs.append(n_out)
    if not ts:
        msg = f"trace {str(p)!r} has no rows"
        raise SimConfigError(msg)
    t_arr = np.asarray(ts, dtype=np.float64)
    order = np.argsort(t_arr, kind="stable")
    t_arr = t_arr[order]
    return Trace(
        offsets_s=t_arr - t_arr[0],
        input_tokens=np.asarray(ins, dtype=np.int64)[order],
        output_tokens=np.asarray(outs, dtype=np.int64)[order],
    )


def _poisson_blocks(cfg: SimConfig, rng: np.random.Generator) -> Iterator[ArrivalBlock]:
    assert cfg.duration_s is not None
    step = block_seconds(cfg.rate)
    a = 0.0
    first = True
    while a < cfg.duration_s:
        b = min(a + step, cfg.duration_s)
        n = int(rng.poisson(cfg.rate * (b - a)))
        t = np.sort(rng.uniform(a, b, n))
        if first:
            t = np.concatenate(([0.0], t))
            first = False
        yield ArrivalBlock(a, b, t)
        a = b


def _bursty_blocks(cfg: SimConfig, rng: np.random.Generator) -> Iterator[ArrivalBlock]:
    assert cfg.duration_s is not None
    f, k = cfg.burst_fraction, cfg.burst_factor
    calm_rate = cfg.rate / (1.0 - f + k * f)
    rates = (calm_rate, calm_rate * k)
    means = (cfg.burst_mean_s * (1.0 - f) / f, cfg.burst_mean_s)
    state = int(rng.random() < f)
    switch = float(rng.exponential(means[state]))
    step = block_seconds(cfg.rate * k)
    a = 0.0
    first = True
    while a < cfg.duration_s:
        b = min(a + step, cfg.duration_s)
        parts: list[FloatArray] = []
        seg = a
        while seg < b:
            seg_end = min(b, switch)
            n = int(rng.poisson(rates[state] * (seg_end - seg)))
            parts.append(rng.uniform(seg, seg_end, n))
            seg = seg_end
            if seg >= switch:
                state = 1 - state
                switch += float(rng.exponential(means[state]))
        t = np.sort(np.concatenate(parts)) if parts else np.empty(0)
        if first:
            t = np.concatenate(([0.0], t))
            first = False
        yield ArrivalBlock(a, b, t)
        a = b


def _replay_blocks(cfg: SimConfig, trace: Trace) -> Iterator[ArrivalBlock]:
    t = trace.offsets_s / cfg.speedup
    end = t[-1] + 1e-9 if cfg.duration_s is None else cfg.duration_s
    n_keep = int(np.searchsorted(t, end, side="left"))
    mean_rate = len(t) / max(t[-1], 1e-9)
    step = block_seconds(mean_rate)
    a = 0.0
    lo = 0
    while lo < n_keep:
        b = min(a + step, end)
        hi = min(int(np.searchsorted(t, b, side="left")), n_keep)
        if b >= end:
            hi = n_keep
        yield ArrivalBlock(
            a,
            b,
            t[lo:hi].copy(),
            trace.input_tokens[lo:hi].copy(),
            trace.output_tokens[lo:hi].copy(),
        )
        lo = hi
        a = b


def arrival_blocks(
    cfg: SimConfig, rng: np.random.Generator, trace: Trace | None = None
) -> Iterator[ArrivalBlock]:
    """The arrivals of ``cfg`` block by block (``trace`` is loaded if replay needs it)."""
    if cfg.arrivals == "poisson":
        yield from _poisson_blocks(cfg, rng)
    elif cfg.arrivals == "bursty":
        yield from _bursty_blocks(cfg, rng)
    else:
        assert cfg.trace is not None
        yield from _replay_blocks(cfg, trace if trace is not None else load_trace(cfg.trace))
