"""The close's floor stands in for the worker: its records must be what a close publishes."""

from pathlib import Path

import msgspec

from bench.close_floor import snapshot_records
from bench.common import worker_counters
from bench.kafka_io import read_snapshot


def test_the_floor_publishes_three_final_windows_a_series_as_a_close_does() -> None:
    records = snapshot_records(4, 1_800_000_000_000)
    assert len(records) == 12
    windows = sorted((key, read_snapshot(value).window) for key, value, _ in records)
    keys = sorted({key for key, _ in windows})
    assert len(keys) == 4
    assert windows == sorted((key, w) for key in keys for w in ("1m", "5m", "1h"))
    for _, value, headers in records:
        snapshot = read_snapshot(value)
        assert snapshot.final
        assert 900 < len(value) < 1400  # the size of a close's snapshot
        names = dict(headers)
        assert names["ce_type"] == b"tailguard.sli.v1"
        assert names["ce_id"] == snapshot.event_id.encode()
        assert msgspec.json.decode(value)["schema"] == "tailguard.sli.v1"


def test_the_counters_come_from_the_last_line_of_a_log_longer_than_what_is_read(
    tmp_path: Path,
) -> None:
    log = tmp_path / "worker.log"
    filler = b"x" * 200 + b"\n"
    log.write_bytes(b"applied=1 late=0\n" + filler * 2_000 + b"applied=7 late=3\n" + filler)
    assert worker_counters(log) == (7, 3)
    log.write_bytes(filler * 2_000)
    assert worker_counters(log) == (0, 0)
