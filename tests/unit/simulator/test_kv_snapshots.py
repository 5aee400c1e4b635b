"""KV snapshots of the simulator: consistent with the requests, fragmentation, the P99 effect."""

import json
from collections import defaultdict
from collections.abc import Callable
from importlib import resources
from typing import Any

import msgspec
import numpy as np
import pytest
from click.testing import CliRunner
from tailguard.schemas.columnar import rows_of

from tailguard.simulator import Incident, SimConfig, Target, generate
from tailguard.simulator.cli import simulate
from tailguard.simulator.kv import (
    FRAG_BASE,
    FRAG_PEAK,
    KvTracker,
    fragmentation_level,
    noisy_windows,
)

T0_MS = 1_699_995_600_000
MIN = 60_000
MakeCfg = Callable[..., SimConfig]
NOISY = Incident(
    "noisy_neighbor", 600, 1500, Target(tenant="acme", model="llama-3.1-8b-instruct"), 4.0
)


def run_with_kv(cfg: SimConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tracker = KvTracker(cfg)
    events: list[dict[str, Any]] = []
    snaps: list[dict[str, Any]] = []
    for ev in tracker.watch(generate(cfg)):
        events.append(ev)
        snaps.extend(tracker.due())
    snaps.extend(tracker.finish())
    return events, snaps


def frag(snaps: list[dict[str, Any]]) -> float:
    tokens: int = sum(q["tokens"] for s in snaps for q in s["sequences"])
    cap: int = sum(q["blocks"] * s["block_size"] for s in snaps for q in s["sequences"])
    return 1 - tokens / cap


@pytest.fixture(scope="module")
def noisy_run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cfg = SimConfig(rate=20.0, duration_s=1800.0, seed=5, start_ms=T0_MS, incidents=(NOISY,))
    return run_with_kv(cfg)


def test_a_snapshot_per_instance_every_interval(make_cfg: MakeCfg) -> None:
    cfg = make_cfg(duration_s=30.0)
    _, snaps = run_with_kv(cfg)
    names = [name for name, _, _ in cfg.instance_layout()]
    times = sorted({s["ts_ms"] for s in snaps})
    assert times == list(range(T0_MS, T0_MS + 30_001, 5_000))
    for t in times:
        assert [s["instance"] for s in snaps if s["ts_ms"] == t] == names


def test_sequences_are_the_requests_running_at_that_moment(make_cfg: MakeCfg) -> None:
    events, snaps = run_with_kv(make_cfg(rate=30.0, duration_s=60.0))
    snap = next(s for s in snaps if s["ts_ms"] == T0_MS + 30_000 and s["sequences"])
    t = snap["ts_ms"]
    running = [
        e
        for e in events
        if e["instance"] == snap["instance"]
        and e["status"] in ("ok", "error")
        and e["ts_ms"] + e["stages_ms"]["tokenize"] + e["stages_ms"]["queue"] <= t
        and e["ts_ms"] + e["e2e_ms"] > t
    ]
    assert sorted(q["tenant"] for q in snap["sequences"]) == sorted(e["tenant"] for e in running)
    for q in snap["sequences"]:
        assert q["tokens"] <= q["blocks"] * snap["block_size"]
    assert snap["free_blocks"] == snap["total_blocks"] - sum(q["blocks"] for q in snap["sequences"])


def test_healthy_fragmentation_stays_near_0_08(make_cfg: MakeCfg) -> None:
    _, snaps = run_with_kv(make_cfg(rate=20.0, duration_s=300.0))
    assert frag(snaps) == pytest.approx(FRAG_BASE, abs=0.01)


def test_a_noisy_neighbour_raises_fragmentation_to_about_0_37_on_its_instances(
    noisy_run: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    _, snaps = noisy_run
    hit = "chat-llama-3.1-8b-instruct-"
    late_in = [s for s in snaps if T0_MS + 15 * MIN <= s["ts_ms"] < T0_MS + 25 * MIN]
    before = [s for s in snaps if s["ts_ms"] < T0_MS + 10 * MIN]
    assert frag([s for s in before if s["instance"].startswith(hit)]) == pytest.approx(
        0.08, abs=0.01
    )
    assert frag([s for s in late_in if s["instance"].startswith(hit)]) == pytest.approx(
        FRAG_PEAK, abs=0.015
    )
    others = [s for s in late_in if not s["instance"].startswith(hit)]
    assert frag(others) == pytest.approx(0.08, abs=0.01)
    assert max(s["preemptions"] for s in late_in) > 0, "the flood preempts sequences"


def test_the_victims_p99_roughly_doubles(
    noisy_run: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    events, _ = noisy_run
    model = "llama-3.1-8b-instruct"

    def p99(lo: int, hi: int, tenant: str) -> float:
        per_minute: dict[int, list[float]] = defaultdict(list)
        for e in events:
            if e["model"] == model and e["tenant"] == tenant and e["status"] == "ok":
                m = (e["ts_ms"] - T0_MS) // MIN
                if lo <= m < hi:
                    per_minute[m].append(e["ttft_ms"])
        return float(np.median([np.percentile(v, 99) for v in per_minute.values()]))

    for victim in ("globex", "initech"):
        ratio = p99(15, 25, victim) / p99(0, 10, victim)
        assert 1.7 <= ratio <= 2.5, (victim, ratio)


def test_levels_ramp_up_and_back_down() -> None:
    cfg = SimConfig(duration_s=3000.0, start_ms=T0_MS, incidents=(NOISY,))
    windows = noisy_windows(cfg)
    inst = np.zeros(6, dtype=np.int64)  # chat-llama-3.1-8b-instruct-0
    t = np.array([0.0, 600.0, 690.0, 780.0, 1499.0, 1560.0])
    levels = fragmentation_level(windows, inst, t)
    assert levels[0] == levels[1] == FRAG_BASE
    assert levels[2] == pytest.approx((FRAG_BASE + FRAG_PEAK) / 2)
    assert levels[3] == levels[4] == pytest.approx(FRAG_PEAK)
    assert levels[5] == pytest.approx(FRAG_BASE)
    other = fragmentation_level(windows, np.array([5]), np.array([1000.0]))  # a 70b instance
    assert other[0] == FRAG_BASE


def test_snapshots_are_deterministic_and_valid_kv_records(make_cfg: MakeCfg) -> None:
    from tailguard.schemas import decode

    cfg = make_cfg(duration_s=20.0, incidents=(NOISY,))
    _, a = run_with_kv(cfg)
    _, b = run_with_kv(cfg)
    assert a == b
    decoded = decode(msgspec.json.encode(a), "kv", now_ms=T0_MS + 3_600_000)
    assert not decoded.rejects and len(decoded.valid) == len(a)
    jsonschema = pytest.importorskip("jsonschema")
    path = resources.files("tailguard.schemas") / "jsonschema" / "tailguard.kv.v1.json"
    schema = msgspec.json.decode(path.read_bytes())
    jsonschema.validate(a, schema)


def test_kv_changes_no_inference_event_outside_a_noisy_neighbour(make_cfg: MakeCfg) -> None:
    cfg = make_cfg(duration_s=30.0)
    events, _ = run_with_kv(cfg)
    assert events == list(generate(cfg))


def test_dry_run_with_kv_interleaves_snapshots() -> None:
    result = CliRunner().invoke(
        simulate,
        ["--dry-run", "0", "--duration", "6", "--rate", "5", "--kv", "--start-ms", str(T0_MS)],
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.output.splitlines()]
    kv = [r for r in records if "free_blocks" in r]
    assert kv and any("event_id" in r for r in records)
    assert {r["ts_ms"] for r in kv} == {T0_MS, T0_MS + 5_000}


class _Producer:
    """Records what was produced and delivers at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    def produce(
        self, topic: str, *, value: bytes, key: bytes, on_delivery: Any, headers: Any
    ) -> None:
        self.sent.append((topic, key, value))
        on_delivery(None, None)

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        from types import SimpleNamespace

        names = ("tailguard.inference", "tailguard.kv")
        return SimpleNamespace(topics={t: SimpleNamespace(error=None) for t in names})


def test_the_producer_sends_snapshots_keyed_by_instance_beside_the_events(
    make_cfg: MakeCfg,
) -> None:
    from tailguard.simulator import run

    cfg = make_cfg(duration_s=20.0)
    fake = _Producer()
    stats = run(cfg, broker="fake:9092", pace="max", producer=fake, kv_topic="tailguard.kv")
    kv = [(k, msgspec.json.decode(v)) for t, k, v in fake.sent if t == "tailguard.kv"]
    _, expected = run_with_kv(cfg)
    assert [snap for _, snap in kv] == expected
    assert all(key == snap["instance"].encode() for key, snap in kv)
    assert stats.kv_snapshots == len(expected) and stats.failed_messages == 0
    events = [e for t, _, v in fake.sent if t == "tailguard.inference" for e in rows_of(v)]
    assert sorted(e["event_id"] for e in events) == sorted(e["event_id"] for e in generate(cfg))
