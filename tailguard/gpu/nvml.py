"""Read real GPUs through NVML (the ``pynvml`` module of ``nvidia-ml-py``).

One :meth:`NvmlReader.sample` call reads, for every GPU still present:

==================  ============================================  ==========================
field               NVML call                                     unit conversion
==================  ============================================  ==========================
``util_gpu_pct``    ``nvmlDeviceGetUtilizationRates().gpu``       %
``util_mem_pct``    ``nvmlDeviceGetUtilizationRates().memory``    % (memory bus busy time)
``mem_used_mib``    ``nvmlDeviceGetMemoryInfo().used``            bytes / 2**20
``mem_total_mib``   ``nvmlDeviceGetMemoryInfo().total``           bytes / 2**20
``power_w``         ``nvmlDeviceGetPowerUsage``                   mW / 1000
``temp_c``          ``nvmlDeviceGetTemperatureV`` (or the         °C
                    deprecated ``nvmlDeviceGetTemperature``)
``sm_clock_mhz``    ``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)``  MHz
``throttle_…``      ``nvmlDeviceGetCurrentClocksEventReasons``    bitmask → names
                    (or ``…ThrottleReasons`` before R535)         (:mod:`.throttle`)
``pcie_tx_kbps``    ``nvmlDeviceGetPcieThroughput(h, TX)``        KB/s, as NVML reports it
``pcie_rx_kbps``    ``nvmlDeviceGetPcieThroughput(h, RX)``        KB/s
``uuid``, ``name``  read once when the reader starts
``xid``             XID critical-error events (below)             the last XID seen, or null
==================  ============================================  ==========================

XID errors: the reader registers every GPU for ``nvmlEventTypeXidCriticalError``
in one event set and, at the start of each round, drains it without blocking
(``nvmlEventSetWait_v2(set, 0)`` returns at once, raising
``NVMLError_Timeout`` when nothing is pending). A GPU's ``xid`` is the last
XID seen since the reader started (``tailguard.gpu.v1`` defines ``xid`` as the
"last XID error"), so a sample taken after an XID still shows it.

Failure policy (a sampler on a sick GPU must keep reporting the healthy ones)::

    field raises NotSupported / NoPermission / NoData /      that field is null
        FunctionNotFound (old driver)
    any other NVMLError while reading one GPU (GpuIsLost,    that GPU is skipped this
        Unknown, Timeout, …)                                  round, counted, logged
                                                              (first failure of a streak
                                                              and the recovery)
    nvmlDeviceGetCount now lower than a GPU's index, or      the GPU is dropped for good
        nvmlDeviceGetHandleByIndex fails for it               and reported once
    every GPU dropped                                        NvmlError (nothing left)
    nvmlDeviceGetCount itself fails                          the round is empty, counted

GPUs that appear after the start are not picked up: restart the sampler.

The NVML constants below are the enum values of ``nvml.h`` (part of NVML's
ABI); a unit test checks them against the installed ``pynvml``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any, Final, Self

from tailguard.gpu.errors import NoNvidiaDriver, NoNvidiaGpu, NvmlError
from tailguard.gpu.reader import ReaderStats
from tailguard.gpu.throttle import decode_throttle_reasons
from tailguard.schemas import SCHEMA_IDS, GpuSample

__all__ = ["NO_DRIVER_HINT", "NvmlReader"]

_log = logging.getLogger("tailguard.gpu")

#: What the user should do when NVML is missing (ends the NoNvidiaDriver line).
NO_DRIVER_HINT: Final = (
    "tailguard gpu-sampler needs an NVIDIA GPU and driver; use --simulate for demo telemetry"
)

# nvml.h enum values.
NVML_TEMPERATURE_GPU: Final = 0
NVML_CLOCK_SM: Final = 1
NVML_PCIE_UTIL_TX_BYTES: Final = 0
NVML_PCIE_UTIL_RX_BYTES: Final = 1
NVML_EVENT_TYPE_XID_CRITICAL_ERROR: Final = 0x8

NVML_ERROR_NOT_SUPPORTED: Final = 3
NVML_ERROR_NO_PERMISSION: Final = 4
NVML_ERROR_DRIVER_NOT_LOADED: Final = 9
NVML_ERROR_TIMEOUT: Final = 10
NVML_ERROR_LIBRARY_NOT_FOUND: Final = 12
NVML_ERROR_FUNCTION_NOT_FOUND: Final = 13
NVML_ERROR_NO_DATA: Final = 21

#: Errors that mean "this value is not available here": the field is null.
_FIELD_UNAVAILABLE: Final = frozenset(
    {NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION, NVML_ERROR_NO_DATA,
     NVML_ERROR_FUNCTION_NOT_FOUND}
)  # fmt: skip
#: Errors of nvmlInit that mean "no usable NVIDIA driver on this machine".
_NO_DRIVER: Final = frozenset(
    {NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_FUNCTION_NOT_FOUND}
)
#: XID events drained per round at most (a storm must not stall sampling).
_MAX_EVENTS_PER_ROUND: Final = 256
_MIB: Final = float(2**20)
_SCHEMA: Final = SCHEMA_IDS["gpu"]


@dataclass(slots=True)
class _Gpu:
    index: int
    uuid: str | None
    name: str | None
    xid: int | None = None
    failing_since_round: int | None = None


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        msg = (
            f"no NVIDIA driver found (NVML: cannot import pynvml: {exc}; "
            f"install nvidia-ml-py): {NO_DRIVER_HINT}"
        )
        raise NoNvidiaDriver(msg) from None
    module: ModuleType = pynvml
    return module


class NvmlReader:
    """Samples every GPU of this host through NVML (see the module docstring).

    ``NvmlReader()`` initialises NVML and enumerates the GPUs; it raises
    :class:`NoNvidiaDriver` when the library or driver is missing,
    :class:`NoNvidiaGpu` when NVML sees no GPU and :class:`NvmlError` for any
    other start-up failure. Use it as a context manager, or call
    :meth:`close`, so that ``nvmlShutdown`` runs.

    ``nvml`` replaces the ``pynvml`` module (tests pass a fake);
    ``watch_xid=False`` skips the XID event set.
    """

    def __init__(
        self,
        host: str | None = None,
        *,
        nvml: ModuleType | None = None,
        watch_xid: bool = True,
    ) -> None:
        self.host = host or socket.gethostname()
        self.stats = ReaderStats()
        self._nv: Any = nvml if nvml is not None else _import_pynvml()
        self._missing: set[str] = set()
        self._event_set: Any = None
        self._closed = True
        self._init()
        self._closed = False
        try:
            self._gpus = self._enumerate()
            if watch_xid:
                self._event_set = self._watch_xid()
        except BaseException:
            self.close()
            raise

    # --- public ---------------------------------------------------------------

    @property
    def gpus(self) -> list[int]:
        """Indices of the GPUs still sampled."""
        return sorted(self._gpus)

    def sample(self, now_ms: int) -> list[GpuSample]:
        """One sample per GPU still present, stamped ``now_ms``.

        Never raises for one GPU's trouble; raises :class:`NvmlError` only
        when every GPU has been dropped.
        """
        if self._closed:
            msg = "this NvmlReader is closed: create a new one to sample again"
            raise NvmlError(msg)
        nv = self._nv
        self.stats.rounds += 1
        self._drain_xid()
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            self.stats.failed_rounds += 1
            _log.warning("NVML cannot count the GPUs this round (%s); round skipped", exc)
            return []
        out: list[GpuSample] = []
        for gpu in list(self._gpus.values()):
            if gpu.index >= count:
                self._drop(gpu, f"NVML now reports {count} GPU(s)")
                continue
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(gpu.index)
            except nv.NVMLError as exc:
                self._drop(gpu, f"nvmlDeviceGetHandleByIndex failed: {exc}")
                continue
            try:
                record = self._read(gpu, handle, now_ms)
            except nv.NVMLError as exc:
                self._skip(gpu, exc)
                continue
            if gpu.failing_since_round is not None:
                _log.warning(
                    "GPU %d (%s) readable again after %d skipped round(s)",
                    gpu.index,
                    gpu.uuid,
                    self.stats.rounds - gpu.failing_since_round,
                )
                gpu.failing_since_round = None
            out.append(record)
        self.stats.samples += len(out)
        if not self._gpus:
            lost = "; ".join(f"GPU {i}: {why}" for i, why in sorted(self.stats.lost.items()))
            msg = (
                f"every GPU of {self.host} was lost ({lost}): check `nvidia-smi` and the "
                "kernel log for XID errors, then restart the sampler"
            )
            raise NvmlError(msg)
        return out

    def close(self) -> None:
        """Free the XID event set and shut NVML down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        nv = self._nv
        if self._event_set is not None:
            try:
                nv.nvmlEventSetFree(self._event_set)
            except nv.NVMLError as exc:
                _log.debug("nvmlEventSetFree failed: %s", exc)
            self._event_set = None
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            _log.debug("nvmlShutdown failed: %s", exc)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- start-up -------------------------------------------------------------

    def _init(self) -> None:
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            if _code(exc) in _NO_DRIVER:
                msg = f"no NVIDIA driver found (NVML: {exc}): {NO_DRIVER_HINT}"
                raise NoNvidiaDriver(msg) from None
            msg = (
                f"NVML failed to start ({exc}): check that the driver works "
                "(`nvidia-smi`) and that this user may open /dev/nvidia*"
            )
            raise NvmlError(msg) from None

    def _enumerate(self) -> dict[int, _Gpu]:
        nv = self._nv
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            msg = f"NVML cannot count the GPUs ({exc}): check `nvidia-smi`"
            raise NvmlError(msg) from None
        if count == 0:
            msg = (
                f"no NVIDIA GPU found (NVML reports 0 devices on {self.host}): "
                "use --simulate for demo telemetry"
            )
            raise NoNvidiaGpu(msg)
        gpus: dict[int, _Gpu] = {}
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = self._field(("nvmlDeviceGetUUID",), handle)
                name = self._field(("nvmlDeviceGetName",), handle)
            except nv.NVMLError as exc:
                self.stats.lost[index] = f"unusable at start: {exc}"
                _log.warning("GPU %d is unusable (%s); it will not be sampled", index, exc)
                continue
            gpus[index] = _Gpu(
                index=index,
                uuid=None if uuid is None else _text(uuid),
                name=None if name is None else _text(name),
            )
        if not gpus:
            msg = (
                f"none of the {count} GPU(s) NVML reports can be opened: check `nvidia-smi` "
                "and the kernel log for XID errors"
            )
            raise NvmlError(msg)
        return gpus

    def _watch_xid(self) -> Any:
        nv = self._nv
        if not hasattr(nv, "nvmlEventSetCreate"):
            return None
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            _log.info("XID events unavailable (%s); xid stays null", exc)
            return None
        watched = 0
        for gpu in self._gpus.values():
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(gpu.index)
                nv.nvmlDeviceRegisterEvents(handle, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
            except nv.NVMLError as exc:
                _log.info("XID events unavailable for GPU %d (%s)", gpu.index, exc)
                continue
            watched += 1
        if watched == 0:
            try:
                nv.nvmlEventSetFree(event_set)
            except nv.NVMLError as exc:
                _log.debug("nvmlEventSetFree failed: %s", exc)
            return None
        return event_set

    # --- one round ------------------------------------------------------------

    def _call(self, names: tuple[str, ...], *args: Any) -> Any:
        """Call the first of ``names`` this NVML has; ``None`` when it has none."""
        nv = self._nv
        for name in names:
            if name in self._missing:
                continue
            fn: Callable[..., Any] | None = getattr(nv, name, None)
            if fn is None:
                self._missing.add(name)
                continue
            try:
                return fn(*args)
            except nv.NVMLError as exc:
                if _code(exc) == NVML_ERROR_FUNCTION_NOT_FOUND:
                    self._missing.add(name)
                    continue
                raise
        return None

    def _field(self, names: tuple[str, ...], *args: Any) -> Any:
        """Like :meth:`_call`, but a value NVML cannot give here is ``None``."""
        try:
            return self._call(names, *args)
        except self._nv.NVMLError as exc:
            if _code(exc) in _FIELD_UNAVAILABLE:
                return None
            raise

    def _read(self, gpu: _Gpu, handle: Any, now_ms: int) -> GpuSample:
        util = self._field(("nvmlDeviceGetUtilizationRates",), handle)
        memory = self._field(("nvmlDeviceGetMemoryInfo",), handle)
        power_mw = self._field(("nvmlDeviceGetPowerUsage",), handle)
        temp = self._field(
            ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"), handle, NVML_TEMPERATURE_GPU
        )
        sm_clock = self._field(("nvmlDeviceGetClockInfo",), handle, NVML_CLOCK_SM)
        reasons = self._field(
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
            handle,
        )
        tx = self._field(("nvmlDeviceGetPcieThroughput",), handle, NVML_PCIE_UTIL_TX_BYTES)
        rx = self._field(("nvmlDeviceGetPcieThroughput",), handle, NVML_PCIE_UTIL_RX_BYTES)
        return GpuSample(
            schema=_SCHEMA,
            ts_ms=now_ms,
            host=self.host,
            gpu=gpu.index,
            uuid=gpu.uuid,
            name=gpu.name,
            util_gpu_pct=None if util is None else float(util.gpu),
            util_mem_pct=None if util is None else float(util.memory),
            mem_used_mib=None if memory is None else memory.used / _MIB,
            mem_total_mib=None if memory is None else memory.total / _MIB,
            power_w=None if power_mw is None else power_mw / 1000.0,
            temp_c=None if temp is None else float(temp),
            sm_clock_mhz=None if sm_clock is None else float(sm_clock),
            pcie_tx_kbps=None if tx is None else float(tx),
            pcie_rx_kbps=None if rx is None else float(rx),
            throttle_reasons=[] if reasons is None else decode_throttle_reasons(int(reasons)),
            xid=gpu.xid,
        )

    def _skip(self, gpu: _Gpu, exc: BaseException) -> None:
        self.stats.skipped[gpu.index] = self.stats.skipped.get(gpu.index, 0) + 1
        if gpu.failing_since_round is None:
            gpu.failing_since_round = self.stats.rounds
            _log.warning(
                "GPU %d (%s) skipped: NVML error %s; the other GPUs are still sampled",
                gpu.index,
                gpu.uuid,
                exc,
            )
        else:
            _log.debug("GPU %d still failing: %s", gpu.index, exc)

    def _drop(self, gpu: _Gpu, why: str) -> None:
        del self._gpus[gpu.index]
        self.stats.lost[gpu.index] = why
        _log.warning("GPU %d (%s) is gone and no longer sampled: %s", gpu.index, gpu.uuid, why)

    def _drain_xid(self) -> None:
        if self._event_set is None:
            return
        nv = self._nv
        for _ in range(_MAX_EVENTS_PER_ROUND):
            try:
                data = self._call(("nvmlEventSetWait_v2", "nvmlEventSetWait"), self._event_set, 0)
            except nv.NVMLError as exc:
                if _code(exc) != NVML_ERROR_TIMEOUT:
                    _log.debug("nvmlEventSetWait failed: %s", exc)
                return
            if data is None:
                return
            if not int(data.eventType) & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                continue
            gpu = self._gpu_of(data.device)
            if gpu is None:
                _log.warning("XID %d on a GPU that is no longer sampled", int(data.eventData))
                continue
            gpu.xid = int(data.eventData)
            self.stats.xid_events += 1
            _log.warning("GPU %d (%s): XID %d", gpu.index, gpu.uuid, gpu.xid)

    def _gpu_of(self, device: Any) -> _Gpu | None:
        """The sampled GPU behind an event's device handle (matched by UUID, else index)."""
        nv = self._nv
        try:
            uuid = self._call(("nvmlDeviceGetUUID",), device)
        except nv.NVMLError:
            uuid = None
        if uuid is not None:
            uuid = _text(uuid)
            for gpu in self._gpus.values():
                if gpu.uuid == uuid:
                    return gpu
        try:
            index = self._call(("nvmlDeviceGetIndex",), device)
        except nv.NVMLError:
            return None
        return None if index is None else self._gpus.get(int(index))
