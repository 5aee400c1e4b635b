"""The ``simulate`` click command."""

from pathlib import Path

import msgspec
from click.testing import CliRunner

from tailguard.simulator.cli import simulate


def test_dry_run_prints_n_events_as_json_lines() -> None:
    result = CliRunner().invoke(simulate, ["--dry-run", "5", "--seed", "3"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 5
    events = [msgspec.json.decode(line) for line in lines]
    assert all(e["status"] in {"ok", "error", "timeout"} for e in events)


def test_dry_run_without_a_count_prints_ten() -> None:
    result = CliRunner().invoke(simulate, ["--dry-run"])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 10


def test_dry_run_replays_a_trace_with_incidents(azure_head_csv: Path) -> None:
    args = [
        "--trace", str(azure_head_csv), "--start-ms", "1700000000000", "--dry-run", "0",
        "--incident", "silent_collapse:0:100:service=chat",
    ]  # fmt: skip
    result = CliRunner().invoke(simulate, args)
    assert result.exit_code == 0, result.output
    events = [msgspec.json.decode(line) for line in result.stdout.splitlines()]
    assert len(events) == 10 and events[0]["ts_ms"] == 1_700_000_000_000
    assert [e["input_tokens"] for e in events][:3] == [374, 396, 879]


def test_bad_incident_is_a_usage_error() -> None:
    result = CliRunner().invoke(simulate, ["--dry-run", "--incident", "meltdown:0:10"])
    assert result.exit_code == 2
    assert "incident kind must be one of" in result.output


def test_bad_config_is_a_usage_error() -> None:
    result = CliRunner().invoke(simulate, ["--dry-run", "--rate", "0"])
    assert result.exit_code == 2
    assert "rate (requests/s) must be > 0" in result.output


def test_unreachable_broker_exits_1_with_advice_not_a_traceback() -> None:
    args = ["--broker", "127.0.0.1:1", "--connect-timeout", "1", "--duration", "1", "--quiet"]
    result = CliRunner().invoke(simulate, args)
    assert result.exit_code == 1
    assert "make kafka-up" in result.output
    assert "Traceback" not in result.output


def test_help_credits_the_azure_trace() -> None:
    result = CliRunner().invoke(simulate, ["--help"])
    assert result.exit_code == 0
    assert "Splitwise" in result.output and "CC-BY 4.0" in result.output
