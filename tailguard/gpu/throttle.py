"""Clock throttle ("clocks event") reasons: NVML's bitmask ↔ tailguard's names.

``nvmlDeviceGetCurrentClocksEventReasons`` (``…ThrottleReasons`` before R535)
returns a bitmask of why the SM clock is below its maximum. The bit values are
part of NVML's ABI (``nvml.h``, ``nvmlClocksEventReason*``); they are spelled
out here so that decoding needs neither the driver nor ``pynvml``:

======  ==========================  =============================================
bit     name                        meaning
======  ==========================  =============================================
0x001   ``gpu_idle``                nothing runs; clocks parked
0x002   ``applications_clocks``     application clocks set below maximum
0x004   ``sw_power_cap``            software power limit reached
0x008   ``hw_slowdown``             hardware slowdown (thermal or power brake)
0x010   ``sync_boost``              clocks held down to match a sync-boost group
0x020   ``sw_thermal``              software thermal slowdown (GPU/memory temp)
0x040   ``hw_thermal``              hardware thermal slowdown
0x080   ``hw_power_brake``          external power brake assertion
0x100   ``display_clocks``          display clock setting
0x200   ``board_limit``             board limit (older NVML only)
0x400   ``reliability``             reliability voltage limit (older NVML only)
======  ==========================  =============================================

A set bit outside the table decodes as ``"unknown_0x…"`` rather than vanish.
"""

from typing import Final

__all__ = ["THROTTLE_REASONS", "decode_throttle_reasons", "encode_throttle_reasons"]

#: Bit → name, in bit order (the order of the decoded list).
THROTTLE_REASONS: Final[dict[int, str]] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal",
    0x040: "hw_thermal",
    0x080: "hw_power_brake",
    0x100: "display_clocks",
    0x200: "board_limit",
    0x400: "reliability",
}
_BY_NAME: Final[dict[str, int]] = {name: bit for bit, name in THROTTLE_REASONS.items()}


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the bits set in ``mask``, lowest bit first; ``0`` → ``[]``."""
    if mask < 0:
        msg = f"a throttle-reason mask is a non-negative integer, got {mask}"
        raise ValueError(msg)
    out: list[str] = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            out.append(THROTTLE_REASONS.get(bit, f"unknown_{bit:#x}"))
        bit <<= 1
    return out


def encode_throttle_reasons(names: list[str]) -> int:
    """The mask of ``names`` (the inverse of :func:`decode_throttle_reasons`)."""
    mask = 0
    for name in names:
        if name.startswith("unknown_0x"):
            mask |= int(name.removeprefix("unknown_"), 16)
        elif name in _BY_NAME:
            mask |= _BY_NAME[name]
        else:
            msg = f"unknown throttle reason {name!r}; known: {', '.join(_BY_NAME)}"
            raise ValueError(msg)
    return mask
