"""Breach events: the GPU join and the payload of a transition."""

from tailguard.agents.breaches import breach_payload
from tailguard.agents.gpu import gpu_join, gpu_key
from tailguard.schemas import GpuSample, encode
from tailguard.streams.breach import Transition


def _table_with(*samples: GpuSample) -> dict[bytes, bytes]:
    return {gpu_key(s.host, s.gpu).encode(): encode(s) for s in samples}


def test_the_gpu_join_gives_each_known_gpu_its_age_and_flags_unknown_ones() -> None:
    table = _table_with(GpuSample(ts_ms=1_000, host="n1", gpu=0, util_gpu_pct=91.0))
    joined = gpu_join(table, [("n1", 0), ("n1", 1)], now_ms=4_500)
    assert joined[0]["known"] and joined[0]["age_ms"] == 3_500 and joined[0]["util_gpu_pct"] == 91.0
    assert joined[1] == {"host": "n1", "gpu": 1, "known": False}


def test_a_transition_becomes_a_breach_event_with_its_evidence() -> None:
    t = Transition(
        state="opened",
        breach_id="b" * 32,
        seq=0,
        at_ms=60_000,
        series_key="s|m|v|t",
        slo="ttft-p99",
        severity="page",
        opened_ms=60_000,
        resolved_ms=None,
        burn_rates={"1h": 20.0, "5m": 60.0},
        peak_burn_rates={"1h": 20.0, "5m": 60.0},
        sli={"1h": 0.8},
        budget_remaining=0.4,
        rules=("page:14.4x:1h/5m",),
    )
    payload = breach_payload(t, ("s", "m", "v", "t"), exemplars=["e" * 32], gpu=[], now_ms=1)
    assert payload["event_id"] == f"{'b' * 32}:0"
    assert payload["state"] == "opened" and payload["severity"] == "page"
    assert payload["series"] == {"service": "s", "model": "m", "variant": "v", "tenant": "t"}
    assert payload["burn_rates"]["1h"] == 20.0 and payload["exemplars"] == ["e" * 32]
    assert payload["gpu_note"], "an empty GPU join says why"


def test_the_gpu_cache_keeps_the_newest_sample_and_ignores_bad_ones() -> None:
    from tailguard.agents.gpu import GpuCache

    cache = GpuCache("unused:9092", "tailguard.gpu")
    key = gpu_key("n1", 0).encode()
    cache.offer(key, encode(GpuSample(ts_ms=2_000, host="n1", gpu=0, temp_c=70.0)))
    cache.offer(key, encode(GpuSample(ts_ms=1_000, host="n1", gpu=0, temp_c=50.0)))  # older
    cache.offer(key, b"{not json")
    joined = gpu_join(cache, [("n1", 0)], now_ms=2_500)
    assert joined[0]["temp_c"] == 70.0 and joined[0]["age_ms"] == 500
