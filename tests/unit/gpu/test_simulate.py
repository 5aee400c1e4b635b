"""SimulatedReader: valid, deterministic, correlated telemetry with pressure and XIDs."""

import statistics

import msgspec
import pytest
from tailguard.schemas import GpuSample, decode, encode

from tailguard.gpu import GpuConfigError, Pressure, SimulatedReader, XidEvent
from tailguard.gpu.simulate import MEM_TOTAL_MIB, default_hosts
from tailguard.simulator import SimConfig

T0 = 1_700_000_000_000


def _run(reader: SimulatedReader, seconds: int, step_s: int = 1) -> list[list[GpuSample]]:
    return [reader.sample(T0 + k * 1000) for k in range(0, seconds, step_s)]


def _of(rounds: list[list[GpuSample]], host: str, gpu: int) -> list[GpuSample]:
    return [s for r in rounds for s in r if s.host == host and s.gpu == gpu]


def test_samples_validate_against_the_contract() -> None:
    reader = SimulatedReader(
        hosts=3, gpus_per_host=4, seed=5, pressure=[("*", 10, 60)], xids=[("gpu-node-02", 1, 5)]
    )
    for samples in _run(reader, 90, 3):
        raw = encode(samples)
        decoded = decode(raw, "gpu", now_ms=T0 + 100_000)
        assert decoded.rejects == []
        assert decoded.valid == samples
        for s in samples:
            assert msgspec.json.decode(encode(s), type=GpuSample) == s
            assert s.schema == "tailguard.gpu.v1"
            assert 0 <= s.util_gpu_pct <= 100 and 0 <= s.util_mem_pct <= 100
            assert 0 <= s.mem_used_mib <= s.mem_total_mib


def test_the_fleet_has_every_host_and_gpu_once_per_round() -> None:
    (samples,) = _run(SimulatedReader(hosts=2, gpus_per_host=8), 1)
    assert [(s.host, s.gpu) for s in samples] == [
        (h, g) for h in ("gpu-node-01", "gpu-node-02") for g in range(8)
    ]
    assert len({s.uuid for s in samples}) == 16
    assert {s.ts_ms for s in samples} == {T0}


def test_default_hosts_are_the_traffic_simulators_hosts() -> None:
    layout = SimConfig(rate=1, duration_s=1, seed=0).instance_layout()
    hosts = {host for _, host, _ in layout}
    assert hosts <= set(default_hosts(2))


def test_same_seed_same_telemetry_other_seed_other_telemetry() -> None:
    def run(seed: int) -> bytes:
        rounds = _run(SimulatedReader(seed=seed, pressure=[("*", 5, 20)]), 30)
        return bytes(encode([s for r in rounds for s in r]))

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_adding_a_host_leaves_the_others_unchanged() -> None:
    small = _run(SimulatedReader(hosts=["a", "b"], seed=3), 20)
    large = _run(SimulatedReader(hosts=["a", "b", "c"], seed=3), 20)
    assert _of(small, "b", 5) == _of(large, "b", 5)


def test_utilisation_power_and_temperature_are_correlated() -> None:
    (samples,) = _run(SimulatedReader(hosts=8, seed=1), 1)
    util = [s.util_gpu_pct or 0.0 for s in samples]
    power = [s.power_w or 0.0 for s in samples]
    temp = [s.temp_c or 0.0 for s in samples]
    assert statistics.correlation(util, power) > 0.9
    assert statistics.correlation(power, temp) > 0.9


def test_pressure_saturates_throttles_and_heats_only_its_host() -> None:
    reader = SimulatedReader(hosts=2, seed=2, pressure=[Pressure("gpu-node-01", 60, 240)])
    rounds = _run(reader, 300)
    for gpu in range(8):
        series = _of(rounds, "gpu-node-01", gpu)
        before, during, late, after = series[50], series[120], series[235], series[299]
        assert during.util_gpu_pct >= 90
        assert during.mem_used_mib >= 0.98 * MEM_TOTAL_MIB
        assert "sw_power_cap" in during.throttle_reasons
        assert late.temp_c > during.temp_c > before.temp_c
        assert "sw_thermal" in late.throttle_reasons
        assert any("hw_thermal" in s.throttle_reasons for s in series[225:240])
        assert late.sm_clock_mhz < before.sm_clock_mhz
        assert after.util_gpu_pct < 90 and after.temp_c < late.temp_c
    calm = [s for r in rounds for s in r if s.host == "gpu-node-02"]
    assert not any({"sw_thermal", "hw_thermal"} & set(s.throttle_reasons) for s in calm)
    assert max(s.mem_used_mib or 0.0 for s in calm) < 0.95 * MEM_TOTAL_MIB


def test_xid_appears_at_its_time_and_stays() -> None:
    reader = SimulatedReader(hosts=1, gpus_per_host=4, xids=[XidEvent("gpu-node-01", 2, 30, 79)])
    rounds = _run(reader, 60)
    xids = [s.xid for s in _of(rounds, "gpu-node-01", 2)]
    assert xids[:30] == [None] * 30 and xids[30:] == [79] * 30
    assert all(s.xid is None for r in rounds for s in r if s.gpu != 2)
    assert reader.stats.xid_events == 1


def test_start_ms_fixes_the_origin_of_episode_seconds() -> None:
    reader = SimulatedReader(
        hosts=1, gpus_per_host=1, start_ms=T0 - 100_000, xids=[("gpu-node-01", 0, 50)]
    )
    assert reader.sample(T0)[0].xid == 94


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("gpu-node-01:60:240", Pressure("gpu-node-01", 60.0, 240.0)),
        ("*:0:1.5", Pressure("*", 0.0, 1.5)),
    ],
)
def test_pressure_specs_parse(spec: str, expected: Pressure) -> None:
    assert Pressure.parse(spec) == expected


@pytest.mark.parametrize(
    "spec", ["gpu-node-01:60", "h:a:10", "h:20:10", "h:-1:5", ":1:2", "h:0:inf"]
)
def test_bad_pressure_specs_are_refused(spec: str) -> None:
    with pytest.raises(GpuConfigError):
        Pressure.parse(spec)


def test_xid_specs_parse_with_a_default_code() -> None:
    assert XidEvent.parse("n:3:120") == XidEvent("n", 3, 120.0, 94)
    assert XidEvent.parse("n:3:120:48") == XidEvent("n", 3, 120.0, 48)
    with pytest.raises(GpuConfigError, match="HOST:GPU:AT_S"):
        XidEvent.parse("n:3")
    with pytest.raises(GpuConfigError, match="integers"):
        XidEvent.parse("n:x:3")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hosts": 0}, "hosts must be in"),
        ({"hosts": ["a", "a"]}, "unique"),
        ({"hosts": ["*"]}, "host names"),
        ({"gpus_per_host": 0}, "gpus_per_host"),
        ({"pressure": [("nope", 1, 2)]}, "pressure host 'nope' is not simulated"),
        ({"xids": [("gpu-node-01", 8, 1)]}, "XID event on gpu-node-01:8"),
    ],
)
def test_bad_fleets_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(GpuConfigError, match=match):
        SimulatedReader(**kwargs)  # type: ignore[arg-type]
