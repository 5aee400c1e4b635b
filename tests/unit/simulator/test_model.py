"""The traffic model: contract fields, latency calibration, incidents, determinism."""

from collections import Counter
from collections.abc import Callable
from importlib import resources
from typing import Any

import msgspec
import numpy as np
import pytest

from tailguard.simulator import Incident, SimConfig, Target, generate, generate_batches

T0_MS = 1_699_995_600_000  # the start_ms of conftest's make_cfg
MakeCfg = Callable[..., SimConfig]
Events = list[dict[str, Any]]
EventsOf = Callable[[SimConfig], Events]

_FLOAT, _INT, _STR, _BOOL = float, int, str, bool
REQUIRED: dict[str, type] = {
    "event_id": _STR,
    "ts_ms": _INT,
    "service": _STR,
    "model": _STR,
    "status": _STR,
    "e2e_ms": _FLOAT,
    "output_tokens": _INT,
    "input_tokens": _INT,
    "itl_ms": list,
    "variant": _STR,
    "experiment": _STR,
    "tenant": _STR,
    "unit_id": _STR,
    "session_id": _STR,
    "trace_id": _STR,
    "instance": _STR,
    "host": _STR,
    "gpu_ids": list,
    "queue_ms": _FLOAT,
    "stages_ms": dict,
    "cache": dict,
    "batch": dict,
    "flow_control": dict,
}
NESTED: dict[str, dict[str, type]] = {
    "stages_ms": {
        "tokenize": _FLOAT,
        "queue": _FLOAT,
        "prefill": _FLOAT,
        "decode": _FLOAT,
        "detokenize": _FLOAT,
    },
    "cache": {"prefix_hit_tokens": _INT, "prefix_query_tokens": _INT},
    "batch": {"size": _INT, "wait_ms": _FLOAT, "timed_out": _BOOL},
    "flow_control": {"throttled": _BOOL, "limit_tokens_per_s": _INT},
}


def _exact(value: object, kind: type) -> bool:
    """``isinstance`` that does not let a bool pass for an int."""
    return type(value) is kind


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _offset_s(ev: dict[str, Any]) -> float:
    return float(ev["ts_ms"] - T0_MS) / 1000.0


def _hit_rate(events: Events) -> float:
    hit: int = sum(e["cache"]["prefix_hit_tokens"] for e in events)
    query: int = sum(e["cache"]["prefix_query_tokens"] for e in events)
    return hit / query


def _non_ok(events: Events) -> float:
    bad: int = sum(e["status"] != "ok" for e in events)
    return bad / len(events)


# --- determinism -------------------------------------------------------------------------


def test_same_config_yields_identical_events(make_cfg: MakeCfg, events_of: EventsOf) -> None:
    inc = (
        Incident("silent_collapse", 10, 30),
        Incident("noisy_neighbor", 5, 20, Target(tenant="acme")),
    )
    assert events_of(make_cfg(incidents=inc)) == events_of(make_cfg(incidents=inc))


def test_another_seed_yields_other_events(make_cfg: MakeCfg, events_of: EventsOf) -> None:
    a, b = events_of(make_cfg(seed=1)), events_of(make_cfg(seed=2))
    assert [e["ts_ms"] for e in a] != [e["ts_ms"] for e in b]
    assert {e["event_id"] for e in a}.isdisjoint(e["event_id"] for e in b)


def test_event_ids_are_unique_and_change_with_start_ms(
    make_cfg: MakeCfg, events_of: EventsOf
) -> None:
    a = events_of(make_cfg(rate=50.0))
    assert len({e["event_id"] for e in a}) == len(a)
    b = events_of(make_cfg(rate=50.0, start_ms=T0_MS + 1))
    assert {e["event_id"] for e in a}.isdisjoint(e["event_id"] for e in b)


def test_silent_collapse_changes_nothing_outside_its_target(
    make_cfg: MakeCfg, events_of: EventsOf
) -> None:
    base = events_of(make_cfg())
    hit = events_of(
        make_cfg(incidents=[Incident("silent_collapse", 20, 40, Target(service="chat"))])
    )
    assert len(base) == len(hit)
    outside = [
        (a, b)
        for a, b in zip(base, hit, strict=True)
        if not (20 <= _offset_s(a) < 40 and a["service"] == "chat")
    ]
    assert outside and all(a == b for a, b in outside)


# --- the contract ------------------------------------------------------------------------


def test_every_event_has_the_contract_fields_with_their_types(
    make_cfg: MakeCfg, events_of: EventsOf
) -> None:
    events = events_of(make_cfg(incidents=[Incident("error_burst", 10, 20, intensity=0.5)]))
    assert {e["status"] for e in events} == {"ok", "error", "timeout", "rejected"}
    for ev in events:
        rejected = ev["status"] == "rejected"  # never reached the batcher: no "batch"
        for key, kind in REQUIRED.items():
            if key == "batch" and rejected:
                assert key not in ev
                continue
            assert _exact(ev[key], kind), (key, ev[key])
        for key, fields in NESTED.items():
            if key == "batch" and rejected:
                continue
            assert set(ev[key]) == set(fields), key
            for sub, kind in fields.items():
                assert _exact(ev[key][sub], kind), (key, sub, ev[key][sub])
        assert all(_exact(g, float) for g in ev["itl_ms"])
        assert ev["gpu_ids"] and all(_exact(g, int) and 0 <= g < 8 for g in ev["gpu_ids"])
        assert len(ev["trace_id"]) == 32 and int(ev["trace_id"], 16) > 0
        assert ev["e2e_ms"] >= 0 and all(v >= 0 for v in ev["stages_ms"].values())
        if ev["output_tokens"] >= 1:
            assert _exact(ev["ttft_ms"], float)
        else:
            assert "ttft_ms" not in ev and ev["itl_ms"] == []
        assert ("error_type" in ev) == (ev["status"] != "ok")
        assert msgspec.json.decode(msgspec.json.encode(ev)) == ev


def test_events_come_in_arrival_order_from_start_ms(make_cfg: MakeCfg, events_of: EventsOf) -> None:
    ts = [e["ts_ms"] for e in events_of(make_cfg())]
    assert ts[0] == T0_MS
    assert ts == sorted(ts)
    assert ts[-1] < T0_MS + 60_000


def test_itl_stages_and_e2e_add_up(make_cfg: MakeCfg, events_of: EventsOf) -> None:
    events = events_of(make_cfg(incidents=[Incident("silent_collapse", 0, 30)]))
    for ev in events:
        st = ev["stages_ms"]
        assert ev["queue_ms"] == st["queue"]
        assert sum(st.values()) == pytest.approx(ev["e2e_ms"], abs=0.01)
        if "ttft_ms" not in ev:
            continue
        n_gaps = ev["output_tokens"] - 1
        assert len(ev["itl_ms"]) == n_gaps  # one gap per token by default
        assert ev["ttft_ms"] == pytest.approx(
            st["tokenize"] + st["queue"] + st["prefill"], abs=0.01
        )
        assert st["decode"] == pytest.approx(sum(ev["itl_ms"]), abs=0.01)
        assert ev["e2e_ms"] == pytest.approx(
            ev["ttft_ms"] + sum(ev["itl_ms"]) + st["detokenize"], abs=0.01
        )


def test_long_outputs_group_token_gaps_into_64_chunks_in_array_split_order(
    make_cfg: MakeCfg, events_of: EventsOf
) -> None:
    per_token = events_of(make_cfg(max_itl_gaps=None))
    capped = events_of(make_cfg(max_itl_gaps=64))
    long = [(a, b) for a, b in zip(per_token, capped, strict=True) if a["output_tokens"] > 65]
    assert len(long) > 100
    for a, b in long:
        assert len(a["itl_ms"]) == a["output_tokens"] - 1
        chunks = np.array_split(np.asarray(a["itl_ms"]), 64)
        expected = [float(c.sum()) for c in chunks]
        tol = 0.01 * (len(chunks[0]) + 1)
        assert b["itl_ms"] == pytest.approx(expected, abs=tol)
        assert b["e2e_ms"] == pytest.approx(a["e2e_ms"], abs=0.05 * len(chunks[0]))


# --- calibration of the normal state -----------------------------------------------------


@pytest.fixture(scope="module")
def normal_events() -> Events:
    return list(generate(SimConfig(rate=100.0, duration_s=300.0, seed=3, start_ms=T0_MS)))


def test_normal_ttft_median_is_about_180_and_p95_in_the_250_400_band(
    normal_events: Events,
) -> None:
    ttft = [e["ttft_ms"] for e in normal_events if e["status"] == "ok"]
    assert 150 <= _p(ttft, 50) <= 210
    assert 250 <= _p(ttft, 95) <= 400


def test_normal_token_gaps_are_25_to_35_ms(normal_events: Events) -> None:
    gaps = [g for e in normal_events if 1 < e["output_tokens"] <= 65 for g in e["itl_ms"]]
    assert 25 <= _p(gaps, 50) <= 35
    assert _p(gaps, 99) < 120  # the default ITL SLO holds in the normal state


def test_normal_error_rate_is_about_0_2_percent(normal_events: Events) -> None:
    assert 0.001 <= _non_ok(normal_events) <= 0.004
    assert {e["status"] for e in normal_events} <= {"ok", "error", "timeout"}


def test_normal_prefix_cache_hit_rate_is_98_7_percent(normal_events: Events) -> None:
    assert _hit_rate(normal_events) == pytest.approx(0.987, abs=0.005)
    assert not any(e["flow_control"]["throttled"] for e in normal_events)
    assert not any(e["batch"]["timed_out"] for e in normal_events)


def test_variants_split_units_evenly_and_each_unit_keeps_its_variant(
    normal_events: Events,
) -> None:
    by_unit: dict[str, set[str]] = {}
    for e in normal_events:
        by_unit.setdefault(e["unit_id"], set()).add(e["variant"])
    assert all(len(v) == 1 for v in by_unit.values())
    units = Counter(next(iter(v)) for v in by_unit.values())
    assert abs(units["control"] - units["treatment"]) <= 3
    share = sum(e["variant"] == "treatment" for e in normal_events) / len(normal_events)
    assert share == pytest.approx(0.5, abs=0.01)
    assert {e["experiment"] for e in normal_events} == {"exp-ttft-1"}


def test_default_fleet_has_two_services_three_tenants_and_tp4_for_70b(
    normal_events: Events,
) -> None:
    pairs = {(e["service"], e["model"]) for e in normal_events}
    assert {s for s, _ in pairs} == {"chat", "search-rag"}
    assert {e["tenant"] for e in normal_events} == {"acme", "globex", "initech"}
    for e in normal_events:
        assert len(e["gpu_ids"]) == (4 if "70b" in e["model"] else 1)
        assert e["instance"].startswith(f"{e['service']}-{e['model']}-")


# --- incidents ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def collapse_events() -> Events:
    cfg = SimConfig(
        rate=80.0,
        duration_s=240.0,
        seed=5,
        start_ms=T0_MS,
        incidents=[Incident("silent_collapse", 120, 240, Target(service="chat"))],
    )
    return list(generate(cfg))


def test_silent_collapse_raises_ttft_p95_past_1200_ms_with_errors_and_qps_normal(
    collapse_events: Events,
) -> None:
    before = [e for e in collapse_events if _offset_s(e) < 120]
    during = [e for e in collapse_events if _offset_s(e) >= 120]
    hit = [e for e in during if e["service"] == "chat"]
    calm = [e for e in before if e["service"] == "chat"]
    assert _p([e["ttft_ms"] for e in calm if e["status"] == "ok"], 95) < 400
    p95 = _p([e["ttft_ms"] for e in hit if e["status"] == "ok"], 95)
    assert 1200 < p95 < 2600  # the article: 320 ms -> 1840 ms
    assert _non_ok(hit) < 0.006 and _non_ok(during) < 0.006
    assert len(during) / len(before) == pytest.approx(1.0, abs=0.06)
    assert len(hit) / len(calm) == pytest.approx(1.0, abs=0.08)
    others = [e["ttft_ms"] for e in during if e["service"] != "chat" and e["status"] == "ok"]
    assert _p(others, 95) < 400


def test_silent_collapse_leaves_its_causes_on_the_events(collapse_events: Events) -> None:
    hit = [e for e in collapse_events if _offset_s(e) >= 120 and e["service"] == "chat"]
    assert _hit_rate(hit) == pytest.approx(0.073, abs=0.02)
    assert all(e["flow_control"]["limit_tokens_per_s"] == 128 for e in hit)
    ok = [e for e in hit if e["status"] == "ok"]
    throttled = sum(e["flow_control"]["throttled"] for e in ok) / len(ok)
    timed_out = [e for e in ok if e["batch"]["timed_out"]]
    assert 0.55 <= throttled <= 0.75
    assert 0.6 <= len(timed_out) / len(ok) <= 0.8
    assert all(e["batch"]["size"] < 4 and e["batch"]["wait_ms"] >= 350 for e in timed_out)
    # the slow requests are the ones the factors touched: an attributor can find them
    slow = [e for e in ok if e["ttft_ms"] > 800]
    assert all(
        e["batch"]["timed_out"]
        or e["flow_control"]["throttled"]
        or e["cache"]["prefix_hit_tokens"] < 0.5 * e["cache"]["prefix_query_tokens"]
        for e in slow
    )


def test_error_burst_raises_non_ok_statuses_only_in_its_window(
    make_cfg: MakeCfg, events_of: EventsOf
) -> None:
    events = events_of(
        make_cfg(
            rate=50.0,
            incidents=[Incident("error_burst", 20, 40, Target(model="qwen2-7b-instruct"))],
        )
    )
    inside = [e for e in events if 20 <= _offset_s(e) < 40 and e["model"] == "qwen2-7b-instruct"]
    outside = [e for e in events if e not in inside]
    assert _non_ok(inside) == pytest.approx(0.15, abs=0.05)
    assert _non_ok(outside) < 0.01
    assert {"error", "timeout", "rejected"} <= {e["status"] for e in inside}


def test_noisy_neighbor_adds_its_load_and_slows_the_other_tenants(
    make_cfg: MakeCfg, events_of: EventsOf
) -> None:
    noisy = Incident("noisy_neighbor", 0, 60, Target(tenant="initech"), intensity=5.0)
    base = events_of(make_cfg(rate=50.0))
    loud = events_of(make_cfg(rate=50.0, incidents=[noisy]))
    count = Counter(e["tenant"] for e in base)
    loud_count = Counter(e["tenant"] for e in loud)
    assert loud_count["initech"] / count["initech"] == pytest.approx(5.0, rel=0.15)
    assert loud_count["acme"] / count["acme"] == pytest.approx(1.0, abs=0.1)

    def victims(events: Events, q: float) -> float:
        return _p(
            [e["ttft_ms"] for e in events if e["tenant"] == "acme" and e["status"] == "ok"], q
        )

    assert victims(loud, 99) > 1.15 * victims(base, 99)
    assert victims(loud, 50) > victims(base, 50)


def test_slow_treatment_slows_only_the_treatment_arm(
    make_cfg: MakeCfg, events_of: EventsOf
) -> None:
    events = events_of(make_cfg(rate=50.0, incidents=[Incident("slow_treatment", 0, 60)]))

    def median(variant: str) -> float:
        return _p(
            [e["ttft_ms"] for e in events if e["variant"] == variant and e["status"] == "ok"], 50
        )

    assert median("treatment") / median("control") == pytest.approx(1.55, abs=0.15)


# --- batches -----------------------------------------------------------------------------


def test_batches_hold_one_service_model_each_and_every_event_once(make_cfg: MakeCfg) -> None:
    cfg = make_cfg(rate=100.0, duration_s=30.0)
    batches = list(generate_batches(cfg, 50, max_span_ms=1000))
    flat = [e["event_id"] for b in batches for e in b]
    assert sorted(flat) == sorted(e["event_id"] for e in generate(cfg))
    for b in batches:
        assert 1 <= len(b) <= 50
        assert len({(e["service"], e["model"]) for e in b}) == 1
        assert b[-1]["ts_ms"] - b[0]["ts_ms"] <= 1000
        assert [e["ts_ms"] for e in b] == sorted(e["ts_ms"] for e in b)


def test_batch_size_must_be_positive(make_cfg: MakeCfg) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        next(generate_batches(make_cfg(), 0))


# --- the shipped contract ----------------------------------------------------------------


def test_events_validate_against_the_shipped_json_schema(
    make_cfg: MakeCfg, events_of: EventsOf
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    path = resources.files("tailguard.schemas") / "jsonschema" / "tailguard.inference.v1.json"
    if not path.is_file():
        pytest.skip("tailguard.inference.v1.json is not shipped yet")
    schema = msgspec.json.decode(path.read_bytes())
    validator = jsonschema.validators.validator_for(schema)(schema)
    incidents = [
        Incident("error_burst", 0, 20, intensity=0.5),
        Incident("silent_collapse", 10, 30),
        Incident("noisy_neighbor", 0, 20, Target(tenant="acme")),
        Incident("slow_treatment", 0, 60),
    ]
    events = events_of(make_cfg(duration_s=30.0, incidents=incidents))
    assert {e["status"] for e in events} == {"ok", "error", "timeout", "rejected"}
    for ev in events:
        errors = [e.message for e in validator.iter_errors(ev)]
        assert not errors, (ev["event_id"], errors)
