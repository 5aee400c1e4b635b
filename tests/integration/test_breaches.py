"""Burn-rate breaches on the real broker: lifecycle, GPU join, replay determinism."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.integration

MIN = 60_000
RATE_PER_MIN = 10
HEALTHY_BEFORE_MIN = 120
INCIDENT_MIN = 15
HEALTHY_AFTER_MIN = 400  # the 1× / 6 h ticket rule needs 6 h of clean traffic to let go


def inference_messages(start_ms: int) -> list[tuple[bytes, bytes]]:
    """Three series; ``svc-hot`` is 100 % over the TTFT threshold for 15 minutes."""
    total = HEALTHY_BEFORE_MIN + INCIDENT_MIN + HEALTHY_AFTER_MIN
    messages = []
    for minute in range(total):
        batch = []
        for svc in ("svc-hot", "svc-b", "svc-c"):
            bad = (
                svc == "svc-hot"
                and HEALTHY_BEFORE_MIN <= minute < HEALTHY_BEFORE_MIN + INCIDENT_MIN
            )
            for i in range(RATE_PER_MIN):
                ttft = 2_500.0 if bad else 200.0 + i
                batch.append(
                    {
                        "event_id": f"{svc}-{minute}-{i}",
                        "ts_ms": start_ms + minute * MIN + i * (MIN // RATE_PER_MIN),
                        "service": svc,
                        "model": "m1",
                        "status": "ok",
                        "ttft_ms": ttft,
                        "e2e_ms": ttft + 400.0,
                        "output_tokens": 9,
                        "itl_ms": [50.0] * 8,
                        "trace_id": f"{minute:016x}{i:08x}{len(svc):08x}",
                        "host": "gpu-node-07" if svc == "svc-hot" else "gpu-node-09",
                        "gpu_ids": [0, 1] if svc == "svc-hot" else [3],
                        # 7 of 10 requests use the new prompt version
                        "prompt_version": f"{svc}-v7" if i < 7 else f"{svc}-v6",
                    }
                )
        # One key, so one input partition: Kafka orders records per partition
        # only, and the per-series watermark is the newest event seen — a replay
        # that interleaves two partitions differently may judge lateness
        # differently (follow-up: watermark = min over input partitions).
        messages.append((b"svc-all", json.dumps(batch).encode()))
    return messages


def gpu_messages(now_ms: int) -> list[tuple[bytes, bytes]]:
    out = []
    for host, gpu in (("gpu-node-07", 0), ("gpu-node-07", 1), ("gpu-node-09", 3)):
        sample = {
            "ts_ms": now_ms - 1_000,
            "host": host,
            "gpu": gpu,
            "util_gpu_pct": 97.0,
            "mem_used_mib": 78_000.0,
            "mem_total_mib": 81_559.0,
            "power_w": 690.0,
            "temp_c": 84.0,
            "throttle_reasons": ["sw_thermal"],
        }
        out.append((f"{host}:{gpu}".encode(), json.dumps(sample).encode()))
    return out


def breach_sequence(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            r["breach_id"],
            r["seq"],
            r["state"],
            r["severity"],
            r["slo"],
            r["at_ms"],
            r["series"]["service"],
        )
        for r in records
    ]


def run_once(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[[str], Any],
    produce: Callable[..., Any],
    start_ms: int,
    name: str,
) -> list[dict[str, Any]]:
    now = int(time.time() * 1000)
    produce(namespace.broker, namespace.topic("tailguard.gpu"), gpu_messages(now))
    worker = worker_factory(name, ns=namespace).start()
    time.sleep(8)  # let the GPU table fill before the inference stream arrives
    produce(namespace.broker, namespace.topic("tailguard.inference"), inference_messages(start_ms))
    breaches = collector("tailguard.breaches", ns=namespace)

    def all_resolved(records: list[dict[str, Any]]) -> bool:
        # every breach of svc-hot (one per SLO) has resolved, not just the first one
        opened = {x["breach_id"] for x in records if x["series"]["service"] == "svc-hot"}
        done = {x["breach_id"] for x in records if x["state"] == "resolved"}
        return bool(opened) and opened <= done

    breaches.wait_for(all_resolved, timeout=240, worker=worker)
    time.sleep(5)
    breaches.poll(2)
    worker.stop()
    return breaches.records


def test_one_incident_opens_one_page_that_resolves_and_replays_identically(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[[str], Any],
    produce: Callable[..., Any],
    second_namespace: Any,
) -> None:
    start = (
        int(time.time() * 1000) - (HEALTHY_BEFORE_MIN + INCIDENT_MIN + HEALTHY_AFTER_MIN + 10) * MIN
    )
    records = run_once(namespace, worker_factory, collector, produce, start, "first")

    assert {r["series"]["service"] for r in records} == {"svc-hot"}, "healthy series never breach"
    ttft = [r for r in records if r["slo"] == "ttft-p99"]
    states = [r["state"] for r in ttft]
    assert states.count("opened") == 1 and states.count("resolved") == 1
    assert states[0] == "opened" and states[-1] == "resolved"
    assert len({r["breach_id"] for r in ttft}) == 1
    assert "page" in {r["severity"] for r in ttft}
    opened = ttft[0]
    incident_start = start + HEALTHY_BEFORE_MIN * MIN
    assert incident_start < opened["at_ms"] <= incident_start + INCIDENT_MIN * MIN
    page = next(r for r in ttft if r["severity"] == "page")
    # 14.4x over 1 h at 100 % bad against 99 %: 8.64 min of bad traffic, plus the
    # 2 min of allowed lateness before the minute that crosses it closes.
    assert page["at_ms"] - incident_start <= 12 * MIN
    assert opened["exemplars"], "exemplars name the slowest requests"
    gpus = {(g["host"], g["gpu"]): g for g in opened["gpu"]}
    assert set(gpus) == {("gpu-node-07", 0), ("gpu-node-07", 1)}
    assert all(g["known"] and g["util_gpu_pct"] == 97.0 and g["age_ms"] >= 0 for g in gpus.values())
    assert opened["budget_remaining"] is not None
    # Which prompts the bad requests used, with traces to open (issue 10 item 5).
    versions = [(p["prompt_version"], p["bad_share"]) for p in opened["prompts"]]
    assert versions[0][0] == "svc-hot-v7", versions
    # 7 of 10 requests a minute are v7; the window may cut a minute (v7 requests come
    # first in it), so v7 holds 70 % of the bad requests or a little more
    assert 0.55 <= versions[0][1] <= 0.95, versions
    # versions are listed until they hold 80 % of the bad requests
    expected = ["svc-hot-v7"] if versions[0][1] >= 0.8 else ["svc-hot-v7", "svc-hot-v6"]
    assert [v for v, _ in versions] == expected, versions
    if len(versions) == 2:
        assert versions[0][1] + versions[1][1] == pytest.approx(1.0, abs=1e-3), versions
    for p in opened["prompts"]:
        assert p["exemplars"], p
        # the trace id encodes the request's index i: v7 requests are i < 7
        assert all(
            (int(t[16:24], 16) < 7) == p["prompt_version"].endswith("v7") for t in p["exemplars"]
        )
    assert [g["prompt_group"] for g in opened["prompt_groups"]] == expected

    replay = run_once(second_namespace, worker_factory, collector, produce, start, "replay")
    first, again = breach_sequence(records), breach_sequence(replay)
    assert again == first, "\n".join(map(str, first)) + "\n----\n" + "\n".join(map(str, again))
