"""A fake ``pynvml`` for the ``tailguard.gpu`` unit tests (no GPU on the build machines).

:class:`FakeNvml` builds a module object with the NVML functions and the
``NVMLError`` classes :class:`~tailguard.gpu.nvml.NvmlReader` uses, over a list
of :class:`FakeGpu` whose readings each test sets. Errors mirror the real
module: ``NVMLError(value)`` carries the NVML return code in ``.value`` and
``NVMLError_NotSupported`` & co. are subclasses with a fixed code.

Fixtures: ``make_gpu(**overrides)`` and ``make_nvml(*gpus, **kw)``; the
latter also installs the fake as ``sys.modules["pynvml"]``.
"""

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

NOT_SUPPORTED = 3
NO_PERMISSION = 4
INVALID_ARGUMENT = 2
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
UNKNOWN = 999

_STRINGS = {
    INVALID_ARGUMENT: "Invalid Argument",
    NOT_SUPPORTED: "Not Supported",
    NO_PERMISSION: "Insufficient Permissions",
    DRIVER_NOT_LOADED: "Driver Not Loaded",
    TIMEOUT: "Timeout",
    LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    FUNCTION_NOT_FOUND: "Function Not Found",
    GPU_IS_LOST: "GPU is lost",
    UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """As in pynvml: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML error {self.value}")


def _error_class(name: str, code: int) -> Any:
    def init(self: NVMLError, *_args: Any) -> None:
        NVMLError.__init__(self, code)

    return type(name, (NVMLError,), {"__init__": init})


NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NO_PERMISSION)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", INVALID_ARGUMENT)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", DRIVER_NOT_LOADED)
NVMLError_Timeout = _error_class("NVMLError_Timeout", TIMEOUT)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class("NVMLError_FunctionNotFound", FUNCTION_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", GPU_IS_LOST)
NVMLError_Unknown = _error_class("NVMLError_Unknown", UNKNOWN)

GIB = 2**30


@dataclass
class FakeGpu:
    """One fake GPU: its readings and, per NVML function name, an error to raise."""

    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    name: str = "NVIDIA H100 80GB HBM3"
    util_gpu: int = 50
    util_mem: int = 30
    mem_total_bytes: int = 80 * GIB
    mem_used_bytes: int = 60 * GIB
    power_mw: int = 350_000
    temp_c: int = 60
    sm_clock_mhz: int = 1755
    reasons: int = 0
    pcie_tx_kbs: int = 1_000
    pcie_rx_kbs: int = 4_000
    fail: dict[str, NVMLError] = field(default_factory=dict)
    gone: bool = False  # nvmlDeviceGetHandleByIndex fails with GpuIsLost


@dataclass
class FakeNvml:
    """The fake's state and the module object (``module``) that exposes it."""

    gpus: list[FakeGpu]
    init_error: NVMLError | None = None
    count_error: NVMLError | None = None
    count: int | None = None  # overrides len(gpus) (a GPU that disappears)
    register_fail: dict[int, NVMLError] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)  # functions this "driver" lacks
    events: list[SimpleNamespace] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    module: ModuleType = field(init=False)

    def __post_init__(self) -> None:
        self.module = self._build()

    def xid(self, index: int, code: int, event_type: int = 0x8) -> None:
        """Queue an XID event of GPU ``index``."""
        self.events.append(
            SimpleNamespace(device=self.gpus[index], eventType=event_type, eventData=code)
        )

    def _build(self) -> ModuleType:
        mod = ModuleType("pynvml")
        mod.NVMLError = NVMLError  # type: ignore[attr-defined]
        for cls in (
            NVMLError_NotSupported,
            NVMLError_NoPermission,
            NVMLError_InvalidArgument,
            NVMLError_DriverNotLoaded,
            NVMLError_Timeout,
            NVMLError_LibraryNotFound,
            NVMLError_FunctionNotFound,
            NVMLError_GpuIsLost,
            NVMLError_Unknown,
        ):
            setattr(mod, cls.__name__, cls)
        fns: dict[str, Callable[..., Any]] = {
            "nvmlInit": self._init,
            "nvmlShutdown": lambda: self.calls.append("nvmlShutdown"),
            "nvmlDeviceGetCount": self._count,
            "nvmlDeviceGetHandleByIndex": self._handle,
            "nvmlDeviceGetUUID": lambda h: self._get(h, "nvmlDeviceGetUUID", h.uuid),
            "nvmlDeviceGetName": lambda h: self._get(h, "nvmlDeviceGetName", h.name),
            "nvmlDeviceGetIndex": lambda h: self.gpus.index(h),
            "nvmlDeviceGetUtilizationRates": lambda h: self._get(
                h,
                "nvmlDeviceGetUtilizationRates",
                SimpleNamespace(gpu=h.util_gpu, memory=h.util_mem),
            ),
            "nvmlDeviceGetMemoryInfo": lambda h: self._get(
                h,
                "nvmlDeviceGetMemoryInfo",
                SimpleNamespace(
                    total=h.mem_total_bytes,
                    used=h.mem_used_bytes,
                    free=h.mem_total_bytes - h.mem_used_bytes,
                ),
            ),
            "nvmlDeviceGetPowerUsage": lambda h: self._get(
                h, "nvmlDeviceGetPowerUsage", h.power_mw
            ),
            "nvmlDeviceGetTemperature": lambda h, sensor: self._get(
                h, "nvmlDeviceGetTemperature", h.temp_c if sensor == 0 else -1
            ),
            "nvmlDeviceGetTemperatureV": lambda h, sensor: self._get(
                h, "nvmlDeviceGetTemperatureV", h.temp_c if sensor == 0 else -1
            ),
            "nvmlDeviceGetClockInfo": lambda h, kind: self._get(
                h, "nvmlDeviceGetClockInfo", h.sm_clock_mhz if kind == 1 else -1
            ),
            "nvmlDeviceGetCurrentClocksEventReasons": lambda h: self._get(
                h, "nvmlDeviceGetCurrentClocksEventReasons", h.reasons
            ),
            "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: self._get(
                h, "nvmlDeviceGetCurrentClocksThrottleReasons", h.reasons
            ),
            "nvmlDeviceGetPcieThroughput": lambda h, counter: self._get(
                h,
                "nvmlDeviceGetPcieThroughput",
                h.pcie_tx_kbs if counter == 0 else h.pcie_rx_kbs,
            ),
            "nvmlEventSetCreate": lambda: "event-set",
            "nvmlDeviceRegisterEvents": self._register,
            "nvmlEventSetWait_v2": self._wait,
            "nvmlEventSetFree": lambda es: self.calls.append(f"nvmlEventSetFree({es})"),
        }
        for name, fn in fns.items():
            if name not in self.missing:
                setattr(mod, name, fn)
        return mod

    def _init(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error

    def _count(self) -> int:
        if self.count_error is not None:
            raise self.count_error
        return len(self.gpus) if self.count is None else self.count

    def _handle(self, index: int) -> FakeGpu:
        if index >= self._count():
            raise NVMLError_InvalidArgument()
        gpu = self.gpus[index]
        if gpu.gone:
            raise NVMLError_GpuIsLost()
        return gpu

    def _get(self, handle: FakeGpu, fn: str, value: Any) -> Any:
        error = handle.fail.get(fn)
        if error is not None:
            raise error
        return value

    def _register(self, handle: FakeGpu, event_types: int, event_set: str) -> None:
        assert event_types == 0x8
        assert event_set == "event-set"
        error = self.register_fail.get(self.gpus.index(handle))
        if error is not None:
            raise error

    def _wait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0, "the reader must poll, never block"
        if not self.events:
            raise NVMLError_Timeout()
        return self.events.pop(0)


MakeGpu = Callable[..., FakeGpu]
MakeNvml = Callable[..., FakeNvml]


@pytest.fixture
def make_gpu() -> MakeGpu:
    """``make_gpu(i, **overrides)``: a :class:`FakeGpu` with a UUID derived from ``i``."""

    def make(i: int = 0, **overrides: Any) -> FakeGpu:
        overrides.setdefault("uuid", f"GPU-{i:08d}-0000-0000-0000-000000000000")
        return FakeGpu(**overrides)

    return make


@pytest.fixture
def make_nvml(monkeypatch: pytest.MonkeyPatch, make_gpu: MakeGpu) -> MakeNvml:
    """``make_nvml(*gpus, **kw)``: a :class:`FakeNvml` installed as ``sys.modules["pynvml"]``.

    With no GPUs given it has three default ones.
    """

    def make(*gpus: FakeGpu, **kw: Any) -> FakeNvml:
        fake = FakeNvml(list(gpus) or [make_gpu(i) for i in range(3)], **kw)
        monkeypatch.setitem(sys.modules, "pynvml", fake.module)
        return fake

    return make
