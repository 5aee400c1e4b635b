"""Scenario (b) without a broker: simulator → 1-minute SLI points + KV state → detector.

The SLI points are computed here exactly (numpy percentiles) where the worker
uses t-digests; the KV minutes come from the real :class:`KvState` over the
validated snapshots, fed to the detector two minutes ahead of the SLI points
(the SLI agent's allowed lateness). The broker-backed version is
``tests/integration/test_interference.py``.
"""

from collections import defaultdict
from typing import Any

import msgspec
import numpy as np
import pytest
from tailguard.schemas import decode
from tailguard.streams.interference import Detector, InterferenceTransition, SliPoint
from tailguard.streams.kv import MINUTE_MS, KvMinute, KvState

from tailguard.simulator import Incident, SimConfig, Target, generate
from tailguard.simulator.kv import KvTracker

pytestmark = pytest.mark.slow

T0_MS = 1_699_995_600_000


def points(events: list[dict[str, Any]]) -> list[tuple[tuple[str, str, str, str], SliPoint]]:
    groups: dict[tuple[str, str, str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        end = e["ts_ms"] - e["ts_ms"] % MINUTE_MS + MINUTE_MS
        groups[(e["service"], e["model"], e["variant"], e["tenant"], end)].append(e)

    def p99(values: list[float]) -> float | None:
        return float(np.percentile(values, 99)) if values else None

    out = []
    for (service, model, variant, tenant, end), evs in groups.items():
        ok = [e for e in evs if e["status"] == "ok"]
        ttft = [e["ttft_ms"] for e in ok]
        itl = [g for e in ok for g in e["itl_ms"]]
        e2e = [e["e2e_ms"] for e in evs]
        point = SliPoint(
            end_ms=end,
            count=len(evs),
            errors=len(evs) - len(ok),
            ttft_p99=p99(ttft),
            ttft_n=len(ttft),
            itl_p99=p99(itl),
            itl_n=len(itl),
            e2e_p99=p99(e2e),
            e2e_n=len(e2e),
            compliance=1.0,
        )
        out.append(((service, model, variant, tenant), point))
    out.sort(key=lambda sp: (sp[1].end_ms, sp[0]))
    return out


def detect(cfg: SimConfig) -> list[InterferenceTransition]:
    tracker = KvTracker(cfg)
    events: list[dict[str, Any]] = []
    snaps: list[dict[str, Any]] = []
    for ev in tracker.watch(generate(cfg)):
        events.append(ev)
        snaps.extend(tracker.due())
    snaps.extend(tracker.finish())
    states: dict[str, KvState] = {}
    minutes: list[tuple[str, KvMinute]] = []
    for raw in snaps:  # one message per snapshot, as the producer sends them
        decoded = decode(msgspec.json.encode(raw), "kv", now_ms=T0_MS + 10 * 3_600_000)
        assert not decoded.rejects
        (snap,) = decoded.valid
        state = states.setdefault(snap.instance, KvState(snap.instance))
        minutes.extend((snap.instance, m) for m in state.apply(snap).closed)
    detector = Detector()
    out: list[InterferenceTransition] = []
    i = 0
    for series, point in points(events):
        while i < len(minutes) and minutes[i][1].end_ms <= point.end_ms + 2 * MINUTE_MS:
            detector.offer_kv(*minutes[i])
            i += 1
        out.extend(detector.offer_point(series, point))
    return out


def test_scenario_b_is_caught_and_explained() -> None:
    noisy = Incident(
        "noisy_neighbor", 1200, 1920, Target(tenant="acme", model="llama-3.1-8b-instruct"), 4.0
    )
    cfg = SimConfig(rate=20.0, duration_s=2520.0, seed=7, start_ms=T0_MS, incidents=(noisy,))
    found = detect(cfg)
    assert {(t.victim, t.state) for t in found} >= {
        ("globex", "opened"),
        ("initech", "opened"),
        ("globex", "resolved"),
        ("initech", "resolved"),
    }
    for t in found:
        assert (t.service, t.model) == ("chat", "llama-3.1-8b-instruct")
        assert t.attribution[0]["tenant"] == "acme"
    for t in (t for t in found if t.state == "opened"):
        assert T0_MS + 20 * MINUTE_MS < t.at_ms <= T0_MS + 28 * MINUTE_MS
        ev = t.evidence
        assert all(
            r["instance"].startswith("chat-llama-3.1-8b-instruct-") for r in ev["shared_instances"]
        )
        assert ev["fragmentation_baseline"] < 0.1 and ev["fragmentation"] > 0.2


def test_a_healthy_hour_raises_nothing() -> None:
    assert detect(SimConfig(rate=20.0, duration_s=3600.0, seed=3, start_ms=T0_MS)) == []
