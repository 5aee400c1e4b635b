"""NvmlReader against a fake pynvml: units, nulls, failures of one GPU, XID events."""

import ctypes.util
import importlib
import logging
import sys
from typing import Any

import msgspec
import pytest
from tailguard.schemas import GpuSample, encode

from tailguard.errors import TailguardError
from tailguard.gpu import NoNvidiaDriver, NoNvidiaGpu, NvmlError, NvmlReader
from tailguard.gpu import nvml as nvml_module

T0 = 1_700_000_000_000
GIB = 2**30


def _valid(sample: GpuSample) -> GpuSample:
    """The sample after a JSON round trip through the contract (validates constraints)."""
    return msgspec.json.decode(encode(sample), type=GpuSample)


def test_values_are_mapped_to_the_contract_units(make_nvml: Any, make_gpu: Any) -> None:
    gpu = make_gpu(
        0,
        name="NVIDIA A100-SXM4-80GB",
        util_gpu=87,
        util_mem=41,
        mem_total_bytes=80 * GIB,
        mem_used_bytes=3 * GIB // 2,
        power_mw=312_456,
        temp_c=71,
        sm_clock_mhz=1410,
        pcie_tx_kbs=2_048,
        pcie_rx_kbs=10_240,
    )
    make_nvml(gpu)
    with NvmlReader("node-a") as reader:
        (sample,) = reader.sample(T0)
    assert _valid(sample) == sample
    assert sample.schema == "tailguard.gpu.v1"
    assert (sample.ts_ms, sample.host, sample.gpu) == (T0, "node-a", 0)
    assert sample.uuid == gpu.uuid
    assert sample.name == "NVIDIA A100-SXM4-80GB"
    assert sample.util_gpu_pct == 87.0
    assert sample.util_mem_pct == 41.0
    assert sample.mem_total_mib == 81920.0  # bytes / 2**20
    assert sample.mem_used_mib == 1536.0
    assert sample.power_w == pytest.approx(312.456)  # mW / 1000
    assert sample.temp_c == 71.0
    assert sample.sm_clock_mhz == 1410.0
    assert sample.pcie_tx_kbps == 2048.0  # KB/s as NVML reports it
    assert sample.pcie_rx_kbps == 10240.0
    assert sample.throttle_reasons == []
    assert sample.xid is None


def test_every_gpu_is_sampled_with_its_index(make_nvml: Any) -> None:
    fake = make_nvml()
    with NvmlReader("node-a") as reader:
        samples = reader.sample(T0)
    assert [s.gpu for s in samples] == [0, 1, 2]
    assert [s.uuid for s in samples] == [g.uuid for g in fake.gpus]


def test_throttle_bitmask_is_decoded_into_names(make_nvml: Any, make_gpu: Any) -> None:
    make_nvml(make_gpu(0, reasons=0x4 | 0x20 | 0x40 | 0x8))
    with NvmlReader("h") as reader:
        (sample,) = reader.sample(T0)
    assert sample.throttle_reasons == ["sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal"]


def test_old_drivers_fall_back_to_the_deprecated_calls(make_nvml: Any, make_gpu: Any) -> None:
    gpu = make_gpu(0, reasons=0x1, temp_c=33)
    fake = make_nvml(gpu, missing={"nvmlDeviceGetTemperatureV"})
    # The new call exists in pynvml but the driver lacks the symbol.
    gpu.fail["nvmlDeviceGetCurrentClocksEventReasons"] = fake.module.NVMLError_FunctionNotFound()
    with NvmlReader("h") as reader:
        first, second = reader.sample(T0)[0], reader.sample(T0 + 1000)[0]
    assert first.throttle_reasons == ["gpu_idle"] == second.throttle_reasons
    assert first.temp_c == 33.0


def test_not_supported_fields_are_null_and_the_rest_still_read(
    make_nvml: Any, make_gpu: Any
) -> None:
    gpu = make_gpu(0)
    fake = make_nvml(gpu)
    nv = fake.module
    for fn in (
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ):
        gpu.fail[fn] = nv.NVMLError_NotSupported()
    gpu.fail["nvmlDeviceGetTemperatureV"] = nv.NVMLError_NoPermission()
    gpu.fail["nvmlDeviceGetTemperature"] = nv.NVMLError_NoPermission()
    with NvmlReader("h") as reader:
        (sample,) = reader.sample(T0)
    assert sample.power_w is None
    assert sample.pcie_tx_kbps is None and sample.pcie_rx_kbps is None
    assert sample.temp_c is None
    assert sample.throttle_reasons == []
    assert sample.util_gpu_pct == 50.0 and sample.mem_used_mib == 60 * 1024.0
    assert reader.stats.skipped == {}
    assert b"power_w" not in encode(sample)  # omitted = null in the contract
    assert _valid(sample).power_w is None


def test_name_and_uuid_not_supported_are_null(make_nvml: Any, make_gpu: Any) -> None:
    gpu = make_gpu(0)
    fake = make_nvml(gpu)
    gpu.fail["nvmlDeviceGetUUID"] = fake.module.NVMLError_NotSupported()
    gpu.fail["nvmlDeviceGetName"] = fake.module.NVMLError_NotSupported()
    with NvmlReader("h") as reader:
        (sample,) = reader.sample(T0)
    assert sample.uuid is None and sample.name is None


def test_an_nvml_error_on_one_gpu_skips_only_that_gpu_this_round(
    make_nvml: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fake = make_nvml()
    sick = fake.gpus[1]
    with NvmlReader("h") as reader:
        assert [s.gpu for s in reader.sample(T0)] == [0, 1, 2]
        sick.fail["nvmlDeviceGetPowerUsage"] = fake.module.NVMLError_GpuIsLost()
        with caplog.at_level(logging.WARNING, logger="tailguard.gpu"):
            assert [s.gpu for s in reader.sample(T0 + 1000)] == [0, 2]
            assert [s.gpu for s in reader.sample(T0 + 2000)] == [0, 2]
            sick.fail.clear()
            assert [s.gpu for s in reader.sample(T0 + 3000)] == [0, 1, 2]
        assert reader.stats.skipped == {1: 2}
        assert reader.stats.lost == {}
        assert reader.gpus == [0, 1, 2]
    skipped = [r for r in caplog.records if "skipped: NVML error" in r.getMessage()]
    assert len(skipped) == 1 and "GPU 1" in skipped[0].getMessage()
    assert any("readable again after 2" in r.getMessage() for r in caplog.records)


def test_an_unknown_error_skips_the_gpu_rather_than_nulling_fields(
    make_nvml: Any,
) -> None:
    fake = make_nvml()
    fake.gpus[0].fail["nvmlDeviceGetMemoryInfo"] = fake.module.NVMLError_Unknown()
    with NvmlReader("h") as reader:
        assert [s.gpu for s in reader.sample(T0)] == [1, 2]


def test_a_gpu_that_disappears_from_the_count_is_dropped_and_reported_once(
    make_nvml: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fake = make_nvml()
    with NvmlReader("h") as reader:
        reader.sample(T0)
        fake.count = 2
        with caplog.at_level(logging.WARNING, logger="tailguard.gpu"):
            for k in range(1, 4):
                assert [s.gpu for s in reader.sample(T0 + k * 1000)] == [0, 1]
        assert reader.gpus == [0, 1]
        assert list(reader.stats.lost) == [2]
    gone = [r for r in caplog.records if "no longer sampled" in r.getMessage()]
    assert len(gone) == 1 and "GPU 2" in gone[0].getMessage()


def test_a_gpu_whose_handle_fails_is_dropped(make_nvml: Any) -> None:
    fake = make_nvml()
    with NvmlReader("h") as reader:
        fake.gpus[0].gone = True
        assert [s.gpu for s in reader.sample(T0)] == [1, 2]
        fake.gpus[0].gone = False  # a dropped GPU does not come back
        assert [s.gpu for s in reader.sample(T0 + 1000)] == [1, 2]
        assert "GPU is lost" in reader.stats.lost[0]


def test_losing_every_gpu_is_an_error_not_an_empty_loop(make_nvml: Any) -> None:
    fake = make_nvml()
    with NvmlReader("h") as reader:
        fake.count = 0
        with pytest.raises(NvmlError, match="every GPU of h was lost"):
            reader.sample(T0)


def test_a_failing_device_count_costs_one_empty_round(make_nvml: Any) -> None:
    fake = make_nvml()
    with NvmlReader("h") as reader:
        fake.count_error = fake.module.NVMLError_Unknown()
        assert reader.sample(T0) == []
        fake.count_error = None
        assert len(reader.sample(T0 + 1000)) == 3
        assert reader.stats.failed_rounds == 1


def test_a_gpu_unusable_at_start_is_left_out(make_nvml: Any) -> None:
    fake = make_nvml()
    fake.gpus[2].gone = True
    with NvmlReader("h") as reader:
        assert reader.gpus == [0, 1]
        assert [s.gpu for s in reader.sample(T0)] == [0, 1]


@pytest.mark.parametrize("error", ["NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded"])
def test_missing_driver_raises_no_nvidia_driver_with_one_line(make_nvml: Any, error: str) -> None:
    fake = make_nvml()
    fake.init_error = getattr(fake.module, error)()
    with pytest.raises(NoNvidiaDriver) as info:
        NvmlReader("h")
    message = str(info.value)
    assert message.startswith("no NVIDIA driver found (NVML: ")
    assert message.endswith(
        "tailguard gpu-sampler needs an NVIDIA GPU and driver; use --simulate for demo telemetry"
    )
    assert "\n" not in message
    assert isinstance(info.value, TailguardError) and isinstance(info.value, RuntimeError)
    assert "nvmlShutdown" not in fake.calls


def test_library_not_found_message_names_the_nvml_reason(make_nvml: Any) -> None:
    fake = make_nvml()
    fake.init_error = fake.module.NVMLError_LibraryNotFound()
    with pytest.raises(NoNvidiaDriver, match=r"^no NVIDIA driver found \(NVML: NVML Shared"):
        NvmlReader("h")


def test_missing_pynvml_module_raises_no_nvidia_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NoNvidiaDriver, match=r"cannot import pynvml.*use --simulate"):
        NvmlReader("h")


def test_other_init_failures_are_nvml_errors_not_missing_drivers(make_nvml: Any) -> None:
    fake = make_nvml()
    fake.init_error = fake.module.NVMLError_NoPermission()
    with pytest.raises(NvmlError, match="Insufficient Permissions") as info:
        NvmlReader("h")
    assert not isinstance(info.value, NoNvidiaDriver)


def test_no_gpu_raises_no_nvidia_gpu_and_shuts_nvml_down(make_nvml: Any) -> None:
    fake = make_nvml()
    fake.count = 0
    with pytest.raises(NoNvidiaGpu, match="no NVIDIA GPU found"):
        NvmlReader("h")
    assert fake.calls[-1] == "nvmlShutdown"


def test_xid_events_surface_in_the_sample_of_their_gpu(make_nvml: Any) -> None:
    fake = make_nvml()
    with NvmlReader("h") as reader:
        assert [s.xid for s in reader.sample(T0)] == [None, None, None]
        fake.xid(1, 79)
        fake.xid(2, 13, event_type=0x1)  # not an XID event: ignored
        assert [s.xid for s in reader.sample(T0 + 1000)] == [None, 79, None]
        # "last XID seen": it stays until another XID replaces it
        assert [s.xid for s in reader.sample(T0 + 2000)] == [None, 79, None]
        fake.xid(1, 48)
        fake.xid(0, 94)
        assert [s.xid for s in reader.sample(T0 + 3000)] == [94, 48, None]
        assert reader.stats.xid_events == 3


def test_xid_registration_not_supported_leaves_xid_null(make_nvml: Any) -> None:
    fake = make_nvml()
    nv = fake.module
    fake.register_fail = {i: nv.NVMLError_NotSupported() for i in range(3)}
    with NvmlReader("h") as reader:
        fake.xid(0, 79)
        assert [s.xid for s in reader.sample(T0)] == [None, None, None]
    assert fake.calls.count("nvmlEventSetFree(event-set)") == 1  # freed at start, not again


def test_close_frees_the_event_set_and_shuts_nvml_down_once(make_nvml: Any) -> None:
    fake = make_nvml()
    reader = NvmlReader("h")
    reader.close()
    reader.close()
    assert fake.calls.count("nvmlShutdown") == 1
    assert "nvmlEventSetFree(event-set)" in fake.calls
    with pytest.raises(NvmlError, match="closed"):
        reader.sample(T0)


def test_nvml_constants_match_the_installed_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    pynvml = importlib.import_module("pynvml")  # importing needs no driver
    assert nvml_module.NVML_TEMPERATURE_GPU == pynvml.NVML_TEMPERATURE_GPU
    assert nvml_module.NVML_CLOCK_SM == pynvml.NVML_CLOCK_SM
    assert nvml_module.NVML_PCIE_UTIL_TX_BYTES == pynvml.NVML_PCIE_UTIL_TX_BYTES
    assert nvml_module.NVML_PCIE_UTIL_RX_BYTES == pynvml.NVML_PCIE_UTIL_RX_BYTES
    assert pynvml.nvmlEventTypeXidCriticalError == nvml_module.NVML_EVENT_TYPE_XID_CRITICAL_ERROR
    for name in (
        "NOT_SUPPORTED",
        "NO_PERMISSION",
        "DRIVER_NOT_LOADED",
        "TIMEOUT",
        "LIBRARY_NOT_FOUND",
        "FUNCTION_NOT_FOUND",
        "NO_DATA",
    ):
        assert getattr(nvml_module, f"NVML_ERROR_{name}") == getattr(pynvml, f"NVML_ERROR_{name}")
    assert pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST).__class__.__name__ == (
        "NVMLError_GpuIsLost"
    )


def test_the_real_nvml_either_samples_or_says_there_is_no_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    if ctypes.util.find_library("nvidia-ml") is None:
        with pytest.raises(NoNvidiaDriver) as info:
            NvmlReader()
        assert str(info.value).startswith("no NVIDIA driver found (NVML: ")
        return
    with NvmlReader() as reader:  # pragma: no cover - only where a GPU is present
        samples = reader.sample(T0)
    assert samples
    for sample in samples:
        assert _valid(sample) == sample
