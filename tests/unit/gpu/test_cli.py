"""``tailguard gpu-sampler``: the no-driver line, simulated output, usage errors."""

import ctypes.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from tailguard.schemas import GpuSample

from tailguard.gpu.cli import EXIT_NO_GPU, gpu_sampler

REPO = Path(__file__).resolve().parents[3]


def test_without_nvml_it_prints_one_line_and_exits_3(make_nvml: Any) -> None:
    fake = make_nvml()
    fake.init_error = fake.module.NVMLError_LibraryNotFound()
    result = CliRunner().invoke(gpu_sampler, ["--print", "--count", "1"])
    assert result.exit_code == EXIT_NO_GPU == 3
    assert result.stdout == ""
    assert result.stderr == (
        "error: no NVIDIA driver found (NVML: NVML Shared Library Not Found): tailguard "
        "gpu-sampler needs an NVIDIA GPU and driver; use --simulate for demo telemetry\n"
    )
    assert "nvmlShutdown" not in fake.calls


def test_with_nvml_but_no_gpu_it_exits_3(make_nvml: Any) -> None:
    make_nvml(count=0)
    result = CliRunner().invoke(gpu_sampler, ["--print", "--count", "1"])
    assert result.exit_code == 3
    assert result.stderr.startswith("error: no NVIDIA GPU found")
    assert result.stderr.count("\n") == 1


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="an NVIDIA driver is installed"
)
def test_the_real_command_on_a_machine_without_a_driver() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "from tailguard.gpu.cli import gpu_sampler; gpu_sampler()",
         "--print", "--count", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 3
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no NVIDIA driver found")
    assert "Traceback" not in proc.stderr


def test_with_nvml_it_prints_one_record_per_gpu(make_nvml: Any) -> None:
    make_nvml()
    result = CliRunner().invoke(gpu_sampler, ["--print", "--count", "1", "--host", "node-7"])
    assert result.exit_code == 0, result.stderr
    samples = [msgspec.json.decode(line, type=GpuSample) for line in result.stdout.splitlines()]
    assert [(s.host, s.gpu) for s in samples] == [("node-7", 0), ("node-7", 1), ("node-7", 2)]


def test_simulate_print_writes_valid_samples() -> None:
    result = CliRunner().invoke(
        gpu_sampler, ["--simulate", "--print", "--count", "2", "--interval", "0.01"]
    )
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 * 2 * 8
    samples = [msgspec.json.decode(line, type=GpuSample) for line in lines]
    assert {s.host for s in samples} == {"gpu-node-01", "gpu-node-02"}


def test_simulate_options_shape_the_fleet() -> None:
    result = CliRunner().invoke(
        gpu_sampler,
        ["--simulate", "--print", "--count", "1", "--hosts", "a,b,c", "--gpus-per-host", "2",
         "--seed", "4", "--pressure", "b:0:60", "--xid", "c:1:0:79"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    samples = [msgspec.json.decode(line, type=GpuSample) for line in result.stdout.splitlines()]
    assert [(s.host, s.gpu) for s in samples] == [(h, g) for h in "abc" for g in (0, 1)]
    assert [s.xid for s in samples] == [None, None, None, None, None, 79]
    assert all(s.util_gpu_pct >= 90 for s in samples if s.host == "b")


@pytest.mark.parametrize(
    "args",
    [
        ["--simulate", "--pressure", "gpu-node-01:60"],
        ["--simulate", "--pressure", "nowhere:1:2"],
        ["--simulate", "--xid", "gpu-node-01:99:1"],
        ["--pressure", "gpu-node-01:1:2"],  # needs --simulate
        ["--count", "0"],
    ],
)
def test_bad_usage_exits_2(args: list[str]) -> None:
    result = CliRunner().invoke(gpu_sampler, [*args, "--print"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_an_unreachable_broker_exits_1_with_one_line() -> None:
    result = CliRunner().invoke(
        gpu_sampler,
        ["--simulate", "--count", "1", "--broker", "127.0.0.1:1", "--connect-timeout", "0.5"],
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot reach the Kafka broker at 127.0.0.1:1")
    assert result.stderr.count("\n") == 1
