"""The SLI agent's payload honours the shipped contract."""

import json
from dataclasses import dataclass
from importlib import resources

import jsonschema
import msgspec
import pytest
from tailguard.agents.sli import snapshot_payload
from tailguard.schemas import SliSnapshot
from tailguard.streams import WINDOWS, SeriesWindows

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
