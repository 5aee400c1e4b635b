"""The KV and interference agents' pure parts: wire records, points, table folding, payload."""

import msgspec
import pytest
from tailguard.agents.interference import interference_payload
from tailguard.agents.interference_wire import (
    KvMsg,
    PointMsg,
    PointsMsg,
    TickMsg,
    decode_internal,
    point_of,
)
from tailguard.agents.kv import KvStats, apply_snapshots
from tailguard.agents.publish import frame
from tailguard.schemas import KvSequence, KvSnapshot
from tailguard.streams import WindowSummary
from tailguard.streams.interference import InterferenceTransition, SliPoint
from tailguard.streams.kv import MINUTE_MS, KvMinute, KvState

T0_MS = 1_699_995_600_000


def summary(**latency: dict[str, float | int | None]) -> WindowSummary:
    rows = {
        "ttft_ms": {"count": 119, "p50": 1.0, "p90": 2.0, "p95": 3.0, "p99": 640.0, "p999": 9.0},
        "tpot_ms": {"count": 110, "p99": 30.0},
        "itl_ms": {"count": 9000, "p99": 90.0},
        "e2e_ms": {"count": 120, "p99": 9000.0},
        **latency,
    }
    return WindowSummary(
        window_ms=60_000,
        count=120,
        errors=1,
        cancelled=0,
        success_rate=119 / 120,
        ttft_compliance=0.99,
        itl_compliance=1.0,
        slo_compliance=0.995,
        goodput_rps=1.9,
        latency=rows,
        exemplars=[c * 32 for c in "abcdefg"],
    )


def test_a_closed_minute_becomes_a_point_keyed_by_deployment() -> None:
    msg = point_of(("chat", "m", "v1", "globex"), T0_MS, summary())
    assert msg.deployment == "chat|m"
    assert (msg.variant, msg.tenant) == ("v1", "globex")
    p = msg.point
    assert (p.end_ms, p.count, p.errors) == (T0_MS, 120, 1)
    assert (p.ttft_p99, p.ttft_n, p.itl_p99, p.itl_n, p.e2e_p99, p.e2e_n) == (
        640.0,
        119,
        90.0,
        9000,
        9000.0,
        120,
    )
    assert p.compliance == 0.995
    assert msg.exemplars == [c * 32 for c in "abcde"]  # five at most


def test_a_metric_without_values_has_no_p99_and_no_count() -> None:
    empty = {"count": 0, "p50": None, "p90": None, "p95": None, "p99": None, "p999": None}
    p = point_of(("chat", "m", "v1", "globex"), T0_MS, summary(ttft_ms=empty)).point
    assert (p.ttft_p99, p.ttft_n) == (None, 0)


def test_internal_records_round_trip_and_garbage_is_refused() -> None:
    point = PointMsg("chat", "m", "v1", "acme", SliPoint(end_ms=T0_MS, count=3), ["t"])
    kv = KvMsg("inst-0", KvMinute(end_ms=T0_MS, tokens=10, block_tokens=16, tenants={}))
    enc = msgspec.msgpack.Encoder()
    assert decode_internal(enc.encode(point)) == point
    assert decode_internal(enc.encode(kv)) == kv
    batch = PointsMsg(
        [point, PointMsg("chat", "m", "v2", "globex", SliPoint(end_ms=T0_MS, count=1))]
    )
    assert decode_internal(enc.encode(batch)) == batch
    tick = TickMsg("chat", "m")
    assert decode_internal(enc.encode(tick)) == tick and tick.deployment == "chat|m"
    with pytest.raises(ValueError, match=r"."):
        decode_internal(b"\x93garbage")


def kv_snap(ts: int, *seqs: tuple[str, int, int], instance: str = "inst-0") -> KvSnapshot:
    return KvSnapshot(
        ts_ms=ts,
        instance=instance,
        block_size=16,
        total_blocks=100,
        free_blocks=90,
        preemptions=0,
        sequences=[KvSequence(tenant=t, tokens=n, blocks=b) for t, n, b in seqs],
    )


def test_snapshots_fold_into_the_table_once_per_instance_and_forward_closed_minutes() -> None:
    table: dict[bytes, bytes] = {}
    stats = KvStats()
    first = [kv_snap(T0_MS + i * 5_000, ("acme", 30, 2)) for i in range(12)]
    first.append(kv_snap(T0_MS, ("globex", 1, 1), instance="inst-1"))
    assert apply_snapshots(table, first, stats) == []
    closed = apply_snapshots(table, [kv_snap(T0_MS + MINUTE_MS, ("acme", 5, 1))], stats)
    assert [(i, m.end_ms, m.snapshots) for i, m in closed] == [("inst-0", T0_MS + MINUTE_MS, 12)]
    assert closed[0][1].fragmentation == 1 - 30 / 32
    state = KvState.from_bytes(table[b"inst-0"])
    assert state.latest is not None and state.latest.ts_ms == T0_MS + MINUTE_MS
    assert set(table) == {b"inst-0", b"inst-1"}
    # a replay of the same message is ignored, counted, and writes nothing
    before = dict(table)
    assert apply_snapshots(table, first, stats) == []
    assert table == before and stats.stale == len(first) and stats.snapshots == 14


def test_a_corrupt_stored_state_is_replaced_and_reported() -> None:
    table = {b"inst-0": b"\x00garbage"}
    seen: list[str] = []
    stats = KvStats()
    apply_snapshots(table, [kv_snap(T0_MS, ("acme", 3, 1))], stats, lambda i, _: seen.append(i))
    assert seen == ["inst-0"] and stats.corrupt_states == 1
    assert KvState.from_bytes(table[b"inst-0"]).latest is not None


def test_the_breach_payload_names_victim_neighbour_and_keeps_the_breach_fields() -> None:
    t = InterferenceTransition(
        state="opened",
        breach_id="b" * 32,
        seq=0,
        at_ms=T0_MS,
        service="chat",
        model="m",
        victim="globex",
        variant="*",
        severity="ticket",
        slo="ttft-p99-jitter",
        opened_ms=T0_MS,
        resolved_ms=None,
        evidence={
            "metric": "ttft_ms",
            "victim_p99_ms": {"ttft_ms": 640.0},
            "victim_p99_baseline_ms": {"ttft_ms": 320.0},
            "victim_p99_ratio": {"ttft_ms": 2.0},
            "victim_load_ratio": 1.0,
            "shared_instances": [{"instance": "i0"}],
            "fragmentation": 0.37,
            "fragmentation_baseline": 0.08,
        },
        attribution=({"tenant": "acme", "share": 1.0, "load_ratio": 4.0, "correlation": 0.9},),
        exemplars=("e" * 32,),
    )
    payload = interference_payload(t, now_ms=1)
    assert payload["kind"] == "interference" and payload["event_id"] == f"{'b' * 32}:0"
    assert payload["series"] == {
        "service": "chat",
        "model": "m",
        "variant": "*",
        "tenant": "globex",
    }
    assert payload["victim"] == "globex" and payload["neighbours"] == ["acme"]
    assert payload["sli"]["fragmentation"] == 0.37 and payload["exemplars"] == ["e" * 32]
    assert payload["burn_rates"] == {} and payload["budget_remaining"] is None
    assert "2.0x its baseline" in payload["summary"] and "0.08 -> 0.37" in payload["summary"]
    value, headers = frame(payload, source="test")
    assert dict(headers)["ce_type"] == b"tailguard.breach.v1"
    assert msgspec.json.decode(value)["attribution"][0]["tenant"] == "acme"
