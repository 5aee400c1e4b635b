"""``tailguard report``: options, files, and one-line operator errors (no broker needed)."""

import sys
from pathlib import Path
from typing import Any

import pytest

from tailguard import console, kafka_admin
from tailguard.cli import main

from .conftest import SERIES, T0_MS, incident_minutes, snapshot

Run = tuple[int, str, str]


def run_cli(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Run:
    """Run ``tailguard ARGS`` as the entry point does; returns (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["tailguard", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def topics_holding(
    monkeypatch: pytest.MonkeyPatch, sli: list[dict[str, Any]], breaches: list[dict[str, Any]]
) -> None:
    """Stand in for the broker: ``read_to_end`` hands out these records."""

    def read(broker: str, topic: str, *, idle_s: float = 5.0) -> console.TopicRead:
        records = sli if topic.endswith("tailguard.sli") else breaches
        return console.TopicRead(topic, records, undecodable=0, complete=True)

    monkeypatch.setattr(console, "read_to_end", read)


def test_report_prints_the_tables_and_writes_the_heatmap_files(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    topics_holding(monkeypatch, *incident_minutes())

    code, out, err = run_cli(["report", "--out", str(tmp_path / "r")], monkeypatch, capsys)

    assert (code, err) == (0, "")
    assert "tailguard · report · final 1m windows" in out  # the existing SLI table
    assert "tailguard · breaches" in out  # the existing breach table
    assert "time × stage P99 heatmaps of 1 series" in out
    assert "prefill" in out and "heatmap-chat-llama-3.1-8b-default-default.png" in out
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [
        "heatmap-chat-llama-3.1-8b-default-default.png",
        "heatmap.json",
        "index.html",
    ]


def test_series_top_and_last_narrow_the_report(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    snaps, breaches = incident_minutes()
    other = {**SERIES, "service": "search"}
    snaps += [snapshot(T0_MS + m * 60_000, {"prefill": 90.0}, series=other) for m in (1, 2)]
    topics_holding(monkeypatch, snaps, breaches)

    args = ["report", "--out", str(tmp_path), "--series", "chat/*", "--last", "5", "--top", "1"]
    code, _out, _err = run_cli(args, monkeypatch, capsys)

    assert code == 0
    assert [p.name for p in tmp_path.glob("*.png")] == [
        "heatmap-chat-llama-3.1-8b-default-default.png"
    ]
    page = (tmp_path / "index.html").read_text()
    assert "search/" not in page.split("all breaches")[0]
    assert page.count('<th title="') + page.count('<th class="breach"') == 5


def test_no_stage_data_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    topics_holding(monkeypatch, [snapshot(T0_MS, {})], [])

    code, out, err = run_cli(["report", "--out", str(tmp_path / "r")], monkeypatch, capsys)

    assert code == 2
    assert err.startswith("error: no per-stage latency in the final 1m snapshots on tailguard.sli")
    assert "Traceback" not in out + err
    assert not (tmp_path / "r").exists()


def test_an_unreachable_broker_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # the real admin client against a port nobody listens on, with a short timeout
    monkeypatch.setattr(
        console, "ensure_broker", lambda broker: kafka_admin.ensure_broker(broker, timeout_s=1.0)
    )

    args = ["report", "--broker", "127.0.0.1:9", "--out", str(tmp_path / "r")]
    code, out, err = run_cli(args, monkeypatch, capsys)

    assert code == 2
    assert err.startswith("error: no Kafka broker answers at 127.0.0.1:9")
    assert "Traceback" not in out + err
    assert not (tmp_path / "r").exists()


def test_top_must_be_positive(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = run_cli(["report", "--top", "0"], monkeypatch, capsys)

    assert code == 2
    assert "Invalid value for '--top'" in err
