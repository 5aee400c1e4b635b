"""The NVML throttle-reason bitmask and its names."""

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailguard.gpu.throttle import (
    THROTTLE_REASONS,
    decode_throttle_reasons,
    encode_throttle_reasons,
)


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0x0, []),
        (0x1, ["gpu_idle"]),
        (0x2, ["applications_clocks"]),
        (0x4, ["sw_power_cap"]),
        (0x8, ["hw_slowdown"]),
        (0x10, ["sync_boost"]),
        (0x20, ["sw_thermal"]),
        (0x40, ["hw_thermal"]),
        (0x80, ["hw_power_brake"]),
        (0x100, ["display_clocks"]),
        (0x4 | 0x8 | 0x40, ["sw_power_cap", "hw_slowdown", "hw_thermal"]),
        (0x1000, ["unknown_0x1000"]),
    ],
)
def test_mask_decodes_to_names_in_bit_order(mask: int, names: list[str]) -> None:
    assert decode_throttle_reasons(mask) == names


def test_a_negative_mask_is_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        decode_throttle_reasons(-1)


def test_an_unknown_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown throttle reason 'too_hot'"):
        encode_throttle_reasons(["too_hot"])


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_encode_inverts_decode(mask: int) -> None:
    assert encode_throttle_reasons(decode_throttle_reasons(mask)) == mask


def test_bits_match_the_installed_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    import pynvml

    by_name = {
        "gpu_idle": "GpuIdle",
        "applications_clocks": "ApplicationsClocksSetting",
        "sw_power_cap": "SwPowerCap",
        "hw_slowdown": "HwSlowdown",
        "sync_boost": "SyncBoost",
        "sw_thermal": "SwThermalSlowdown",
        "hw_thermal": "HwThermalSlowdown",
        "hw_power_brake": "HwPowerBrakeSlowdown",
        "display_clocks": "DisplayClockSetting",
        "board_limit": "BoardLimit",
        "reliability": "Reliability",
    }
    for bit, name in THROTTLE_REASONS.items():
        assert getattr(pynvml, f"nvmlClocksThrottleReason{by_name[name]}") == bit
