"""Arrival processes: Poisson rate, bursty (MMPP) overdispersion, trace replay."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tailguard.simulator import SimConfig, SimConfigError, generate, load_trace
from tailguard.simulator.arrivals import arrival_blocks

T0_MS = 1_699_995_600_000  # the start_ms of conftest's make_cfg
AZURE_TRACE = Path("/work/shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv")
MakeCfg = Callable[..., SimConfig]
EventsOf = Callable[[SimConfig], list[dict[str, Any]]]


def _ts(events: list[dict[str, Any]]) -> np.ndarray:
    return np.asarray([e["ts_ms"] for e in events], dtype=np.int64)


def test_poisson_arrivals_hold_the_rate_and_have_exponential_gaps(
    make_cfg: MakeCfg, events_of: EventsOf
) -> None:
    ts = _ts(events_of(make_cfg(rate=100.0, duration_s=120.0)))
    assert len(ts) / 120.0 == pytest.approx(100.0, rel=0.03)
    gaps = np.diff(ts) / 1000.0
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # CV of Exp = 1
    counts = np.bincount((ts - T0_MS) // 1000)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.2)  # Poisson dispersion


def test_bursty_arrivals_keep_the_mean_rate_but_come_in_bursts(make_cfg: MakeCfg) -> None:
    cfg = make_cfg(rate=20.0, duration_s=3000.0, arrivals="bursty")
    blocks = arrival_blocks(cfg, np.random.default_rng(4))
    t = np.concatenate([b.t_s for b in blocks])
    assert np.all(np.diff(t) >= 0) and t[0] == 0.0 and t[-1] < 3000.0
    assert len(t) / 3000.0 == pytest.approx(20.0, rel=0.15)
    counts = np.bincount(t.astype(np.int64))
    assert counts.var() / counts.mean() > 3.0  # overdispersed, unlike Poisson
    assert counts.max() > 4 * 20.0 * 0.8  # bursts reach ~burst_factor x the mean


def test_first_arrival_is_at_start_ms(make_cfg: MakeCfg, events_of: EventsOf) -> None:
    for arrivals in ("poisson", "bursty"):
        assert events_of(make_cfg(arrivals=arrivals))[0]["ts_ms"] == T0_MS


def test_replay_follows_the_traces_gaps_and_token_counts(
    make_cfg: MakeCfg, events_of: EventsOf, azure_head_csv: Path
) -> None:
    trace = load_trace(azure_head_csv)
    events = events_of(make_cfg(arrivals="replay", trace=azure_head_csv, duration_s=None))
    assert len(events) == 10
    assert events[0]["ts_ms"] == T0_MS
    want = T0_MS + np.floor(trace.offsets_s * 1000.0)
    assert _ts(events).tolist() == want.astype(np.int64).tolist()
    # 18:15:46.6805900 -> 18:15:50.9951690
    assert events[1]["ts_ms"] - events[0]["ts_ms"] == 4314
    assert [e["input_tokens"] for e in events] == [374, 396, 879, 91, 91, 381, 1313, 388, 242, 209]
    assert [e["output_tokens"] for e in events] == [44, 109, 55, 16, 16, 84, 142, 84, 14, 152]


def test_replay_speedup_compresses_time_and_duration_truncates(
    make_cfg: MakeCfg, events_of: EventsOf, azure_head_csv: Path
) -> None:
    base = _ts(events_of(make_cfg(arrivals="replay", trace=azure_head_csv, duration_s=None)))
    fast = _ts(
        events_of(make_cfg(arrivals="replay", trace=azure_head_csv, duration_s=None, speedup=2.0))
    )
    assert np.abs((fast - T0_MS) * 2 - (base - T0_MS)).max() <= 2
    cut = events_of(make_cfg(arrivals="replay", trace=azure_head_csv, duration_s=5.0))
    assert len(cut) == int(np.sum(base - T0_MS < 5000))


@pytest.mark.skipif(not AZURE_TRACE.is_file(), reason="the shared Azure trace is not here")
def test_replay_of_the_real_azure_trace_keeps_its_first_rows(
    make_cfg: MakeCfg, azure_head_csv: Path
) -> None:
    full = load_trace(AZURE_TRACE)
    head = load_trace(azure_head_csv)
    assert len(full.offsets_s) > 19_000
    assert full.offsets_s[:10].tolist() == pytest.approx(head.offsets_s.tolist(), abs=1e-6)
    assert full.input_tokens[:10].tolist() == head.input_tokens.tolist()
    cfg = make_cfg(arrivals="replay", trace=AZURE_TRACE, duration_s=60.0)
    events = list(generate(cfg))
    assert len(events) == int(np.sum(full.offsets_s < 60.0))
    assert [e["output_tokens"] for e in events[:10]] == head.output_tokens.tolist()


def test_trace_with_a_bad_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,2\nnope,1,2\n")
    with pytest.raises(SimConfigError, match="line 3"):
        load_trace(path)


def test_trace_accepts_seconds_and_sorts_rows(tmp_path: Path) -> None:
    path = tmp_path / "secs.csv"
    path.write_text("GeneratedTokens,TIMESTAMP,ContextTokens,Extra\n5,10.5,7,x\n6,10.0,8,y\n")
    trace = load_trace(path)
    assert trace.offsets_s.tolist() == [0.0, 0.5]
    assert trace.input_tokens.tolist() == [8, 7]
    assert trace.output_tokens.tolist() == [6, 5]
