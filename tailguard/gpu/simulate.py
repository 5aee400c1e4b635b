"""Plausible GPU telemetry for demos and tests: a fleet of simulated H100s.

:class:`SimulatedReader` has the same ``sample(now_ms)`` interface as
:class:`~tailguard.gpu.nvml.NvmlReader`. The default fleet, ``gpu-node-01``
and ``gpu-node-02`` with 8 GPUs each, is the one the traffic simulator
(``tailguard simulate``) places its serving instances on, so breach events can
join these samples by ``host``/``gpu_ids``.

The model, per GPU (each GPU draws from its own ``random.Random`` seeded by
``(seed, host, gpu)``, so a run is a pure function of the seed and the
sequence of ``now_ms`` values, and adding hosts does not change the others)::

    load   x   Ornstein-Uhlenbeck around the GPU's mean m (40-75 %, ~3 % for an
               idle GPU, 98 % under pressure), time constant 20 s
    util_gpu   = clip(x, 0, 100)                     util_mem ≈ 0.6·util_gpu
    power      demand = 70 W + 630 W·(util/100)^1.1 (+8 % under pressure);
               capped at the 700 W limit → "sw_power_cap"
    temp       first-order lag (τ = 45 s) towards 28 °C + 0.075 °C/W·power,
               plus up to +16 °C of heat soak over a pressure episode
               ≥ 87 °C → "sw_thermal"; ≥ 90 °C → "hw_thermal", "hw_slowdown"
    SM clock   1980 MHz·(limit/demand)^0.4 when power-capped, ×0.92 sw_thermal,
               ×0.7 hw_thermal; 345 MHz and "gpu_idle" below 5 % utilisation
    memory     ~90 % of 81559 MiB used (vLLM pre-allocates its KV cache);
               98.5-99.5 % under pressure; ~0.5 % on an idle GPU
    PCIe       rx ≈ util·(8-15 KB/s per %), tx ≈ 0.3·rx; doubled under pressure
    xid        null until an XidEvent's time, then its code (the last XID seen)

A pressure episode, ``Pressure(host, start_s, end_s)`` (``host="*"``: every
host), covers seconds after the reader's origin (``start_ms``, default the
first ``now_ms`` it is asked for)::

    util   ~55 ───┐▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁┌─── ~55      (98 %)
    temp   ~70 ───╱‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾‾╲__ ~70      (climbs to ~92 °C, then cools)
                start_s          end_s
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Self

from tailguard.gpu.errors import GpuConfigError
from tailguard.gpu.reader import ReaderStats
from tailguard.gpu.throttle import THROTTLE_REASONS
from tailguard.schemas import SCHEMA_IDS, GpuSample

__all__ = [
    "DEFAULT_XID",
    "GPU_NAME",
    "MEM_TOTAL_MIB",
    "POWER_LIMIT_W",
    "Pressure",
    "SimulatedReader",
    "XidEvent",
    "default_hosts",
]

GPU_NAME: Final = "NVIDIA H100 80GB HBM3"
MEM_TOTAL_MIB: Final = 81559.0
POWER_LIMIT_W: Final = 700.0
#: XID 94: contained ECC error (an application is killed, the GPU keeps running).
DEFAULT_XID: Final = 94
ALL_HOSTS: Final = "*"

_SCHEMA: Final = SCHEMA_IDS["gpu"]
_IDLE_W: Final = 70.0
_MAX_SM_MHZ: Final = 1980.0
_IDLE_SM_MHZ: Final = 345.0
_TAU_LOAD_S: Final = 20.0
_TAU_TEMP_S: Final = 45.0
_SOAK_C: Final = 16.0
_SW_THERMAL_C: Final = 87.0
_HW_THERMAL_C: Final = 90.0
_MAX_GPUS: Final = 64


def default_hosts(n: int) -> list[str]:
    """``gpu-node-01`` … the host names the traffic simulator uses."""
    return [f"gpu-node-{i:02d}" for i in range(1, n + 1)]


def _number(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        msg = f"{what} must be a number of seconds in {spec!r}, got {text!r}"
        raise GpuConfigError(msg) from None
    if not math.isfinite(value):
        msg = f"{what} must be finite in {spec!r}, got {text!r}"
        raise GpuConfigError(msg)
    return value


@dataclass(frozen=True, slots=True)
class Pressure:
    """A pressure episode on ``host`` (or ``"*"``: every host) from ``start_s`` to ``end_s``.

    Seconds count from the reader's origin. During the episode every GPU of the
    host runs near 100 %, its memory nearly full, power-capped, and heats up
    until it throttles thermally.
    """

    host: str
    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        if not self.host:
            msg = "a pressure episode needs a host name (or '*' for every host)"
            raise GpuConfigError(msg)
        if not (0 <= self.start_s < self.end_s) or not math.isfinite(self.end_s):
            msg = (
                f"a pressure episode needs 0 <= START_S < END_S, got "
                f"{self.start_s:g}..{self.end_s:g} on {self.host}"
            )
            raise GpuConfigError(msg)

    @classmethod
    def parse(cls, spec: str) -> Pressure:
        """``"HOST:START_S:END_S"``, e.g. ``"gpu-node-01:60:240"`` or ``"*:30:90"``."""
        parts = spec.rsplit(":", 2)
        if len(parts) != 3:
            msg = (
                f"a pressure episode is HOST:START_S:END_S (e.g. gpu-node-01:60:240), got {spec!r}"
            )
            raise GpuConfigError(msg)
        host, start, end = parts
        return cls(host, _number(start, "START_S", spec), _number(end, "END_S", spec))

    def covers(self, host: str, t_s: float) -> bool:
        """True when ``host`` is under pressure ``t_s`` seconds after the origin."""
        return self.host in (host, ALL_HOSTS) and self.start_s <= t_s < self.end_s

    def soak(self, t_s: float) -> float:
        """Heat soak in [0, 1]: how far into the episode ``t_s`` lies."""
        return min(1.0, max(0.0, (t_s - self.start_s) / (self.end_s - self.start_s)))


@dataclass(frozen=True, slots=True)
class XidEvent:
    """XID ``code`` on GPU ``gpu`` of ``host`` at ``at_s`` seconds after the origin."""

    host: str
    gpu: int
    at_s: float
    code: int = DEFAULT_XID

    def __post_init__(self) -> None:
        if not self.host or self.gpu < 0 or self.at_s < 0 or self.code < 0:
            msg = (
                f"an XID event needs a host, GPU >= 0, AT_S >= 0 and CODE >= 0, got "
                f"{self.host}:{self.gpu}:{self.at_s:g}:{self.code}"
            )
            raise GpuConfigError(msg)

    @classmethod
    def parse(cls, spec: str) -> XidEvent:
        """``"HOST:GPU:AT_S[:CODE]"``, e.g. ``"gpu-node-01:3:120:79"`` (code default 94)."""
        parts = spec.split(":")
        if len(parts) not in (3, 4):
            msg = f"an XID event is HOST:GPU:AT_S[:CODE] (e.g. gpu-node-01:3:120:79), got {spec!r}"
            raise GpuConfigError(msg)
        try:
            gpu = int(parts[1])
            code = int(parts[3]) if len(parts) == 4 else DEFAULT_XID
        except ValueError:
            msg = f"GPU and CODE must be integers in {spec!r}"
            raise GpuConfigError(msg) from None
        return cls(parts[0], gpu, _number(parts[2], "AT_S", spec), code)


@dataclass(slots=True)
class _SimGpu:
    host: str
    index: int
    rng: random.Random
    uuid: str
    mean_load: float
    idle: bool
    load: float = 0.0
    temp: float = 0.0
    last_ms: int | None = None
    xid: int | None = None
    xids: list[XidEvent] = field(default_factory=list)


def _clip(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


class SimulatedReader:
    """A deterministic fleet of simulated GPUs (see the module docstring).

    ``hosts``: a number of hosts (named ``gpu-node-01``, …) or the names.
    ``pressure``: episodes as :class:`Pressure` or ``(host, start_s, end_s)``.
    ``xids``: :class:`XidEvent` or ``(host, gpu, at_s[, code])``.
    ``start_ms``: the origin of those seconds (default: the first ``now_ms``).
    """

    def __init__(
        self,
        hosts: int | Sequence[str] = 2,
        gpus_per_host: int = 8,
        seed: int = 0,
        pressure: Sequence[Pressure | tuple[str, float, float]] = (),
        xids: Sequence[XidEvent | tuple[str, int, float] | tuple[str, int, float, int]] = (),
        start_ms: int | None = None,
    ) -> None:
        names = self._hosts(hosts)
        if isinstance(gpus_per_host, bool) or not 1 <= gpus_per_host <= _MAX_GPUS:
            msg = f"gpus_per_host must be an integer in 1..{_MAX_GPUS}, got {gpus_per_host!r}"
            raise GpuConfigError(msg)
        self.hosts = names
        self.gpus_per_host = gpus_per_host
        self.seed = seed
        self.pressure = tuple(p if isinstance(p, Pressure) else Pressure(*p) for p in pressure)
        self.xids = tuple(x if isinstance(x, XidEvent) else XidEvent(*x) for x in xids)
        self.start_ms = start_ms
        self.stats = ReaderStats()
        known = set(names)
        for p in self.pressure:
            if p.host != ALL_HOSTS and p.host not in known:
                msg = f"pressure host {p.host!r} is not simulated; hosts: {', '.join(names)} or '*'"
                raise GpuConfigError(msg)
        for x in self.xids:
            if x.host not in known or x.gpu >= gpus_per_host:
                msg = (
                    f"XID event on {x.host}:{x.gpu}, but the simulated GPUs are "
                    f"{', '.join(names)} with indices 0..{gpus_per_host - 1}"
                )
                raise GpuConfigError(msg)
        self._gpus = [self._make_gpu(host, i) for host in names for i in range(gpus_per_host)]

    @staticmethod
    def _hosts(hosts: int | Sequence[str]) -> list[str]:
        if isinstance(hosts, bool):
            msg = f"hosts must be a count >= 1 or host names, got {hosts!r}"
            raise GpuConfigError(msg)
        if isinstance(hosts, int):
            if not 1 <= hosts <= 1000:
                msg = f"hosts must be in 1..1000, got {hosts}"
                raise GpuConfigError(msg)
            return default_hosts(hosts)
        names = [hosts] if isinstance(hosts, str) else list(hosts)
        if not names or any(not isinstance(h, str) or not h or h == ALL_HOSTS for h in names):
            msg = f"hosts must be a count >= 1 or non-empty host names (not '*'), got {hosts!r}"
            raise GpuConfigError(msg)
        if len(set(names)) != len(names):
            msg = f"host names must be unique, got {names}"
            raise GpuConfigError(msg)
        return names

    def _make_gpu(self, host: str, index: int) -> _SimGpu:
        rng = random.Random(f"tailguard.gpu:{self.seed}:{host}:{index}")
        gpu_uuid = f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}"
        idle = rng.random() < 0.1
        mean = 3.0 if idle else rng.uniform(40.0, 75.0)
        xids = sorted(
            (x for x in self.xids if x.host == host and x.gpu == index), key=lambda x: x.at_s
        )
        return _SimGpu(host, index, rng, gpu_uuid, mean, idle, xids=xids)

    # --- GpuReader ------------------------------------------------------------

    def sample(self, now_ms: int) -> list[GpuSample]:
        """One sample of every simulated GPU at ``now_ms``."""
        if self.start_ms is None:
            self.start_ms = now_ms
        t_s = (now_ms - self.start_ms) / 1000.0
        self.stats.rounds += 1
        out = [self._step(gpu, now_ms, t_s) for gpu in self._gpus]
        self.stats.samples += len(out)
        return out

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- the model ------------------------------------------------------------

    def _episode(self, host: str, t_s: float) -> Pressure | None:
        return next((p for p in self.pressure if p.covers(host, t_s)), None)

    def _step(self, gpu: _SimGpu, now_ms: int, t_s: float) -> GpuSample:
        rng = gpu.rng
        episode = self._episode(gpu.host, t_s)
        hot = episode is not None
        mean, sd = (98.0, 1.5) if hot else (gpu.mean_load, 2.0 if gpu.idle else 8.0)

        first = gpu.last_ms is None
        dt = 0.0 if gpu.last_ms is None else max(0.0, (now_ms - gpu.last_ms) / 1000.0)

        # Load: exact Ornstein-Uhlenbeck step over dt; the first round starts the
        # process in its stationary distribution.
        if first:
            gpu.load = mean + sd * rng.gauss(0.0, 1.0)
        else:
            keep = math.exp(-dt / _TAU_LOAD_S)
            gpu.load = (
                mean
                + (gpu.load - mean) * keep
                + sd * math.sqrt(1.0 - keep * keep) * rng.gauss(0.0, 1.0)
            )
        util = round(_clip(gpu.load, 0.0, 100.0))
        util_mem = round(_clip((0.9 if hot else 0.6) * util + rng.gauss(0.0, 3.0), 0.0, 100.0))

        # Power: demand grows with load; the board caps it at the limit.
        demand = _IDLE_W + (POWER_LIMIT_W - _IDLE_W) * (util / 100.0) ** 1.1
        demand = demand * (1.08 if hot else 1.0) + rng.gauss(0.0, 8.0)
        reasons: set[str] = set()
        if demand >= 0.98 * POWER_LIMIT_W:
            power = POWER_LIMIT_W - abs(rng.gauss(0.0, 4.0))
            reasons.add("sw_power_cap")
        else:
            power = max(_IDLE_W * 0.8, demand)

        # Temperature: first-order lag towards a power-dependent target, plus
        # heat soak during a pressure episode.
        target = 28.0 + 0.075 * power + (_SOAK_C * episode.soak(t_s) if episode else 0.0)
        if first:
            gpu.temp = target
        else:
            gpu.temp = target + (gpu.temp - target) * math.exp(-dt / _TAU_TEMP_S)
        temp = round(gpu.temp + rng.gauss(0.0, 0.3))
        if temp >= _SW_THERMAL_C:
            reasons.add("sw_thermal")
        if temp >= _HW_THERMAL_C:
            reasons.update(("hw_thermal", "hw_slowdown"))

        # SM clock.
        if util < 5:
            clock = _IDLE_SM_MHZ
            reasons.add("gpu_idle")
        else:
            clock = _MAX_SM_MHZ
            if "sw_power_cap" in reasons:
                clock *= min(1.0, POWER_LIMIT_W / max(demand, 1.0)) ** 0.4 * 0.97
            if "sw_thermal" in reasons:
                clock *= 0.92
            if "hw_thermal" in reasons:
                clock *= 0.7
            clock = 15.0 * round(clock / 15.0)

        # Memory: pre-allocated KV cache; nearly full under pressure.
        if hot:
            used = MEM_TOTAL_MIB * rng.uniform(0.985, 0.995)
        elif gpu.idle:
            used = MEM_TOTAL_MIB * 0.005 + abs(rng.gauss(0.0, 20.0))
        else:
            used = MEM_TOTAL_MIB * 0.9 + rng.gauss(0.0, 40.0)

        rx = util * rng.uniform(8.0, 15.0) * (2.0 if hot else 1.0)
        tx = rx * rng.uniform(0.25, 0.35)

        while gpu.xids and gpu.xids[0].at_s <= t_s:
            gpu.xid = gpu.xids.pop(0).code
            self.stats.xid_events += 1

        gpu.last_ms = now_ms
        return GpuSample(
            schema=_SCHEMA,
            ts_ms=now_ms,
            host=gpu.host,
            gpu=gpu.index,
            uuid=gpu.uuid,
            name=GPU_NAME,
            util_gpu_pct=float(util),
            util_mem_pct=float(util_mem),
            mem_used_mib=round(_clip(used, 0.0, MEM_TOTAL_MIB), 1),
            mem_total_mib=MEM_TOTAL_MIB,
            power_w=round(power, 1),
            temp_c=float(temp),
            sm_clock_mhz=clock,
            pcie_tx_kbps=float(round(tx)),
            pcie_rx_kbps=float(round(rx)),
            throttle_reasons=[r for r in THROTTLE_REASONS.values() if r in reasons],
            xid=gpu.xid,
        )
