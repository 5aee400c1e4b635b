"""The benchmarks' CPU clock: a process's own CPU seconds, read from /proc."""

import os
import time
from pathlib import Path

from bench.common import broker_pids, cpu_seconds


def test_cpu_seconds_grow_with_work_and_a_gone_process_counts_nothing() -> None:
    me = [os.getpid()]
    before = cpu_seconds(me)
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # spin: CPU, not wall time
        pass
    assert cpu_seconds(me) - before >= 0.2
    assert cpu_seconds([2**22 + 7]) == 0.0  # above the default pid_max: never a process


def test_broker_pids_are_only_java_processes_running_kafka() -> None:
    for pid in broker_pids():
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b"kafka.Kafka" in cmdline
