"""The SLI agent's payload honours the shipped contract."""

import json
from dataclasses import dataclass
from importlib import resources

import jsonschema
import msgspec
import pytest
from tailguard.agents.publish import frame
from tailguard.agents.sli import snapshot_payload
from tailguard.agents.sli_payload import SnapshotFramer, payload_of
from tailguard.schemas import SliSnapshot
from tailguard.streams import WINDOWS, SeriesWindows, summarize_many

T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000


@dataclass
class Ev:
    event_id: str
    ts_ms: int
    status: str = "ok"
    e2e_ms: float = 900.0
    ttft_ms: float | None = 200.0
    output_tokens: int | None = 11
    itl_ms: list[float] | None = None
    trace_id: str | None = None
    warmup: bool = False


@pytest.fixture
def sli_schema() -> dict[str, object]:
    path = resources.files("tailguard.schemas") / "jsonschema" / "tailguard.sli.v1.json"
    return dict(json.loads(path.read_text()))


@pytest.fixture
def state() -> SeriesWindows:
    s = SeriesWindows()
    s.add(
        [
            Ev(f"e{i}", T0 + i * 1000, ttft_ms=100.0 + i, itl_ms=[30.0] * 10, trace_id=f"{i:032x}")
            for i in range(120)
        ]
    )
    return s


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_snapshot_validates_against_the_shipped_json_schema(
    state: SeriesWindows, sli_schema: dict[str, object], window: str
) -> None:
    end = state.default_end()
    assert end is not None
    payload = snapshot_payload(
        ("chat", "m1", "control", "acme"), state, window, end, final=False, now_ms=T0
    )
    jsonschema.validate(payload, sli_schema)
    decoded = msgspec.json.decode(msgspec.json.encode(payload), type=SliSnapshot)
    assert decoded.series.tenant == "acme"
    assert decoded.window == window


def test_snapshot_counts_and_percentiles_describe_the_window(state: SeriesWindows) -> None:
    payload = snapshot_payload(
        ("chat", "m1", "control", "acme"), state, "1m", T0 + 60_000, final=True, now_ms=T0
    )
    assert payload["count"] == 60  # events 0..59 fall in the first minute
    assert payload["ttft_ms"]["count"] == 60
    assert payload["ttft_ms"]["p50"] == pytest.approx(129.5, abs=1.0)
    assert payload["itl_ms"]["count"] == 600
    assert payload["window_s"] == 60 and payload["window_end_ms"] == T0 + 60_000
    assert len(payload["exemplars"]) == 5


def test_final_snapshot_ids_are_deterministic_and_provisional_ones_track_the_count(
    state: SeriesWindows,
) -> None:
    series = ("chat", "m1", "control", "acme")
    a = snapshot_payload(series, state, "5m", T0 + 60_000, final=True, now_ms=1)
    b = snapshot_payload(series, state, "5m", T0 + 60_000, final=True, now_ms=2)
    assert a["event_id"] == b["event_id"]
    p = snapshot_payload(series, state, "5m", T0 + 60_000, final=False, now_ms=1)
    assert p["event_id"] != a["event_id"]
    state.add([Ev("late-but-open", T0 + 119_500)])
    q = snapshot_payload(series, state, "5m", T0 + 180_000, final=False, now_ms=1)
    assert q["event_id"] != p["event_id"]


def test_attached_digests_load_into_the_reference_tdigest(state: SeriesWindows) -> None:
    import tdigest

    payload = snapshot_payload(
        ("chat", "m1", "control", "acme"),
        state,
        "5m",
        state.default_end() or 0,
        final=False,
        now_ms=T0,
        with_digests=True,
    )
    ref = tdigest.TDigest()
    ref.update_from_dict(payload["digests"]["ttft_ms"])
    assert ref.percentile(50) == pytest.approx(payload["ttft_ms"]["p50"], rel=0.02)


@dataclass
class StagedEv(Ev):
    stages_ms: dict[str, float] | None = None


def _young_and_old() -> dict[tuple[str, str, str, str], SeriesWindows]:
    """Two series: one with an hour of history and per-stage timings, one young
    (its windows hold the same buckets), and a window of each with nothing in it."""
    old, young = SeriesWindows(), SeriesWindows()
    old.add(
        [
            StagedEv(
                f"o{i}",
                T0 + i * 20_000,
                ttft_ms=80.0 + i % 17,
                itl_ms=[20.0 + i % 5] * 4,
                status="error" if i % 11 == 0 else "ok",
                trace_id=f"{i:032x}",
                stages_ms={"prefill": 5.0 + i % 7, "queue": 1.5 * (i % 3)},
            )
            for i in range(180)
        ]
    )
    young.add([Ev(f"y{i}", T0 + 3_540_000 + i * 500, ttft_ms=300.0 + i) for i in range(30)])
    young.duplicates = 2
    return {("chat", "m1", "control", "acme"): old, ('ch"at', "m1", "b", "t\u00e9"): young}


@pytest.mark.parametrize("final", [True, False])
@pytest.mark.parametrize("with_digests", [False, True])
def test_the_framer_gives_the_bytes_and_headers_of_the_payload_framed(
    final: bool, with_digests: bool
) -> None:
    states = _young_and_old()
    end = T0 + 3_600_000
    reads = [
        (series, state, window, at, state.window(WINDOWS[window], at))
        for series, state in states.items()
        for at in (end, end + 7_200_000)  # the later end: windows with nothing in them
        for window in ("1m", "5m", "1h")
    ]
    summaries = summarize_many(
        [(merged, WINDOWS[w], state.thresholds) for _, state, w, _, merged in reads],
        with_digests=with_digests,
    )
    framer = SnapshotFramer("tg-test", final=final, now_ms=T0 + 5)
    for (series, state, window, at, _), summary in zip(reads, summaries, strict=True):
        payload = payload_of(series, state, window, at, summary, final=final, now_ms=T0 + 5)
        assert framer.frame(series, state, window, at, summary) == frame(payload, source="tg-test")
        assert framer.record_key == "|".join(series).encode()
    assert any(s.stages for s in summaries) and any(s.count == 0 for s in summaries)


def test_the_framer_does_not_take_one_buckets_parts_for_anothers() -> None:
    """Windows of one series holding different buckets get their own rows."""
    series, state = next(iter(_young_and_old().items()))
    end = T0 + 3_600_000
    merged = [state.window(WINDOWS[w], end) for w in ("1m", "1h")]
    short, long = summarize_many(
        [(m, WINDOWS[w], state.thresholds) for m, w in zip(merged, ("1m", "1h"), strict=True)]
    )
    framer = SnapshotFramer("tg-test", final=True, now_ms=1)
    a = msgspec.json.decode(framer.frame(series, state, "1m", end, short)[0])
    b = msgspec.json.decode(framer.frame(series, state, "1h", end, long)[0])
    assert a["ttft_ms"] == short.latency["ttft_ms"] != b["ttft_ms"] == long.latency["ttft_ms"]
    assert a["stages_ms"] == short.stages != b["stages_ms"] == long.stages
