"""Prompt versions in buckets and their ranking as breach evidence (issue 10 item 5)."""

from typing import Any

import msgspec
import numpy as np
import pytest
from tailguard.streams.bucket import Bucket
from tailguard.streams.columns import Columns
from tailguard.streams.prompt_evidence import rank_prompts
from tailguard.streams.prompt_tally import MAX_PROMPTS, OTHER_PROMPT
from tailguard.streams.sli import Thresholds

T0 = 1_700_000_000_000
THRESHOLDS = Thresholds(ttft_ms=800.0, itl_ms=120.0)


def requests(make_event: Any) -> list[Any]:
    """v1: 60 fast; v2: 30 of which 20 slow (TTFT 2 s) and 2 errors; none: 10 slow."""
    out = []
    for i in range(60):
        out.append(make_event(T0 + i, prompt_version="v1", ttft_ms=100.0, trace_id=f"a{i:031x}"))
    for i in range(30):
        slow = i < 20
        out.append(
            make_event(
                T0 + 100 + i,
                prompt_version="v2",
                ttft_ms=2_000.0 if slow else 100.0,
                e2e_ms=3_000.0 + i if slow else 900.0,
                status="error" if i in (28, 29) else "ok",
                trace_id=f"b{i:031x}" if i % 2 == 0 else None,
            )
        )
    for i in range(10):
        out.append(make_event(T0 + 200 + i, ttft_ms=2_000.0, trace_id=f"c{i:031x}"))
    return out


def filled(make_event: Any) -> Bucket:
    bucket = Bucket.empty(T0)
    cols = Columns.from_events(requests(make_event))
    bucket.absorb(cols, np.arange(len(cols)), 100, THRESHOLDS)
    return bucket


def test_a_bucket_counts_requests_bad_requests_and_slowest_traces_per_version(
    make_event: Any,
) -> None:
    bucket = filled(make_event)
    assert set(bucket.prompts) == {"v1", "v2"}
    v1, v2 = bucket.prompts["v1"], bucket.prompts["v2"]
    assert (v1.requests, v1.bad, v1.exemplars) == (60, 0, [])
    # 20 slow + 2 errors (28, 29 are not slow: errors count as bad on their own)
    assert (v2.requests, v2.bad) == (30, 22)
    # the slowest bad requests with a trace (even i only): 18, 16, 14
    assert [t for _, t in v2.exemplars] == [f"b{i:031x}" for i in (18, 16, 14)]


def test_the_ranking_names_the_version_and_group_holding_the_bad_requests(
    make_event: Any,
) -> None:
    bucket = filled(make_event)
    c = bucket.counters
    total_bad = c.requests - c.cancelled - c.good_requests
    assert total_bad == 32  # 22 of v2 and 10 without a version
    groups = {"v1": "pg-v1", "v2": "pg-v1"}
    versions, by_group = rank_prompts(
        bucket.prompts, total_requests=c.requests, total_bad=total_bad, group_of=groups.get
    )
    assert [v["prompt_version"] for v in versions] == ["v2"]  # v1 has no bad request
    top = versions[0]
    assert top["bad"] == 22 and top["bad_share"] == pytest.approx(22 / 32, abs=1e-4)
    assert top["bad_rate"] == pytest.approx(22 / 30, abs=1e-4)
    assert top["lift"] == pytest.approx((22 / 30) / (32 / 100), abs=1e-3)
    assert top["prompt_group"] == "pg-v1"
    assert top["exemplars"] == [f"b{i:031x}" for i in (18, 16, 14)]
    (group,) = by_group
    assert group["prompt_group"] == "pg-v1" and group["registered"]
    assert group["versions"] == ["v1", "v2"]
    assert (group["requests"], group["bad"]) == (90, 22)


def test_unregistered_versions_are_their_own_group_and_the_list_stops_at_the_cover() -> None:
    class T:
        def __init__(self, requests: int, bad: int) -> None:
            self.requests, self.bad, self.exemplars = requests, bad, [(float(bad), f"t{bad}")]

    prompts = {f"v{i}": T(100, bad) for i, bad in enumerate([50, 30, 10, 5, 3, 2, 0])}
    versions, groups = rank_prompts(prompts)
    # 50 + 30 = 80 of 100 bad: the 80 % cover is reached after two versions
    assert [v["prompt_version"] for v in versions] == ["v0", "v1"]
    assert [g["prompt_group"] for g in groups] == ["v0", "v1"]
    assert not groups[0]["registered"] and groups[0]["prompt_group"] is not None
    assert versions[0]["prompt_group"] is None


def test_merging_buckets_sums_the_tallies_whatever_the_order(make_event: Any) -> None:
    events = requests(make_event)
    parts = []
    for lo, hi in ((0, 37), (37, 81), (81, len(events))):
        b = Bucket.empty(T0)
        cols = Columns.from_events(events[lo:hi])
        b.absorb(cols, np.arange(len(cols)), 100, THRESHOLDS)
        parts.append(b)
    whole = filled(make_event)
    for order in (parts, parts[::-1]):
        merged = Bucket.empty(T0)
        for part in order:
            merged.merge(part, 100)
        assert merged.prompts == whole.prompts
    assert Bucket.combine(parts, 100).prompts == whole.prompts
    restored = Bucket.from_bytes(whole.to_bytes())
    assert restored.prompts == whole.prompts


def test_versions_past_the_cap_are_counted_under_other(make_event: Any) -> None:
    events = [make_event(T0 + i, prompt_version=f"v{i:03d}") for i in range(MAX_PROMPTS + 5)]
    bucket = Bucket.empty(T0)
    cols = Columns.from_events(events)
    bucket.absorb(cols, np.arange(len(cols)), 100, THRESHOLDS)
    assert len(bucket.prompts) == MAX_PROMPTS + 1
    assert bucket.prompts[OTHER_PROMPT].requests == 5
    assert sum(t.requests for t in bucket.prompts.values()) == MAX_PROMPTS + 5


def test_columns_carry_prompt_versions_over_the_wire(make_event: Any) -> None:
    cols = Columns.from_events(requests(make_event))
    back = Columns.from_wire(
        msgspec.msgpack.decode(msgspec.msgpack.encode(cols.to_wire()), type=type(cols.to_wire()))
    )
    assert back.prompt_names == ["v1", "v2"]
    assert back.prompt.tolist() == cols.prompt.tolist()
    assert back.prompt.tolist().count(-1) == 10
    wire = cols.to_wire()
    wire.prompt_names = ["v1"]  # an index past the names is refused, not folded
    with pytest.raises(ValueError, match="prompt index"):
        Columns.from_wire(wire)
