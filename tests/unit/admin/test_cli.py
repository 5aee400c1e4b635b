"""``tailguard admin``: signing on the command line, and one clear line when it cannot send."""

import json
import subprocess
import sys
from pathlib import Path

from tailguard.schemas.signing import verify

SECRET = "cli-secret-0123456789abcdef"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "admin", *args],
        env={**os.environ, "TG_SECRET": SECRET, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_dry_run_prints_a_command_the_worker_can_verify() -> None:
    done = _run(
        "--key-id", "ops", "--secret-env", "TG_SECRET", "--actor", "alice", "--dry-run",
        "silence", "add", "--service", "chat", "--for", "2h", "--reason", "deploy",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    command = json.loads(done.stdout)
    assert command["action"] == "silence.add" and command["actor"] == "alice"
    assert command["args"] == {"service": "chat", "duration": "2h", "reason": "deploy"}
    assert verify(command, SECRET.encode())


def test_the_key_can_come_from_a_keys_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f'keys:\n  mine: {{role: admin, secret: "{SECRET}", actor: bob}}\n')
    done = _run(
        "--keys-file", str(keys), "--dry-run", "slo", "set", "ttft-p99", "--target", "0.995"
    )
    assert done.returncode == 0, done.stderr
    command = json.loads(done.stdout)
    assert (command["key_id"], command["actor"]) == ("mine", "bob")
    assert command["args"] == {"name": "ttft-p99", "target": 0.995}
    assert verify(command, SECRET.encode())


def test_no_key_is_one_clear_line() -> None:
    done = _run("slo", "list", env={"TAILGUARD_ADMIN_KEYS": "", "TAILGUARD_ADMIN_SECRET": ""})
    assert done.returncode == 2
    assert done.stderr.startswith("error: no signing key")


def test_no_broker_is_one_clear_line() -> None:
    done = _run(
        "--broker", "127.0.0.1:1", "--key-id", "k", "--secret-env", "TG_SECRET",
        "--timeout", "2", "slo", "list",
    )  # fmt: skip
    assert done.returncode == 2
    assert "no Kafka broker answers at 127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr


def test_experiment_create_takes_the_definition_from_a_file_and_pairs() -> None:
    canary = Path(__file__).resolve().parents[3] / "infra" / "experiments" / "canary.yaml"
    done = _run(
        "--key-id", "ops", "--secret-env", "TG_SECRET", "--dry-run",
        "experiment", "create", "canary-prompt-v2", "--file", str(canary),
        'min_samples={"units": 10, "requests": 100, "sessions": 10}',
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    command = json.loads(done.stdout)
    assert command["action"] == "experiment.create"
    args = command["args"]
    assert args["experiment"] == "canary-prompt-v2"
    assert args["definition"]["id"] == "canary-prompt-v2"
    assert args["definition"]["guardrails"]["ttft_p95"] == {"max_ratio": 1.1}
    assert args["definition"]["min_samples"] == {"units": 10, "requests": 100, "sessions": 10}
    assert verify(command, SECRET.encode())
    missing = _run(
        "--key-id", "ops", "--secret-env", "TG_SECRET", "--dry-run",
        "experiment", "create", "nope", "--file", str(canary),
    )  # fmt: skip
    assert missing.returncode == 2 and "not 'nope'" in missing.stderr, missing.stderr
