"""``tailguard prompts``: the record it builds, and one clear line when it cannot send."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tailguard.schemas.prompts import PromptRecord, prompt_or_reject

from tailguard.prompts import (
    PromptError,
    build_record,
    prompt_threshold,
    prompts,
    read_text,
)

TEXT = "You are a helpful assistant. Answer concisely.\n"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "prompts", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_record_carries_text_hash_owner_and_parent() -> None:
    rec = build_record(TEXT, "assist-v2", owner="ops", parent="assist-v1", now_ms=1_700_000_000_000)
    decoded = prompt_or_reject(__import__("json").dumps(rec).encode())
    assert isinstance(decoded, PromptRecord)
    assert decoded.prompt_version == "assist-v2"
    assert decoded.text == TEXT
    assert decoded.text_sha256 == hashlib.sha256(TEXT.encode()).hexdigest()
    assert (decoded.owner, decoded.parent_version) == ("ops", "assist-v1")
    assert rec["event_id"] == build_record(TEXT, "assist-v2", now_ms=1)["event_id"]


def test_hash_only_record_has_no_text() -> None:
    rec = build_record(TEXT, "secret-v1", hash_only=True, parent="assist-v1")
    assert rec["text"] is None
    assert rec["text_sha256"] == hashlib.sha256(TEXT.encode()).hexdigest()


def test_a_version_too_long_is_refused_with_the_reason() -> None:
    with pytest.raises(PromptError, match="cannot be registered"):
        build_record(TEXT, "v" * 300)


def test_read_text_says_what_is_wrong_with_the_file(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match="does not exist"):
        read_text(tmp_path / "missing.txt")
    with pytest.raises(PromptError, match="is a directory"):
        read_text(tmp_path)
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(PromptError, match="is empty"):
        read_text(tmp_path / "empty.txt")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(PromptError, match="not UTF-8"):
        read_text(tmp_path / "latin1.txt")


def test_threshold_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILGUARD_PROMPT_THRESHOLD", "0.8")
    assert prompt_threshold() == 0.8
    monkeypatch.setenv("TAILGUARD_PROMPT_THRESHOLD", "high")
    with pytest.raises(PromptError, match="cosine similarity"):
        prompt_threshold()


def test_add_parses_its_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The version defaults to the file's stem; the options reach the record."""
    sent: list[dict[str, Any]] = []

    def fake_publish(broker: str, record: dict[str, Any], **_: Any) -> Any:
        from tailguard.prompts import Registered

        sent.append({"broker": broker, **record})
        return Registered(record["prompt_version"], record["text_sha256"], True, 0, 7)

    monkeypatch.setattr("tailguard.prompts.publish_prompt", fake_publish)
    from click.testing import CliRunner

    path = tmp_path / "support-v3.txt"
    path.write_text(TEXT)
    runner = CliRunner()
    done = runner.invoke(prompts, ["add", str(path), "--owner", "cx", "--broker", "b:1"])
    assert done.exit_code == 0, done.output
    assert "registered support-v3" in done.output and "offset 7" in done.output
    assert sent[-1]["prompt_version"] == "support-v3" and sent[-1]["owner"] == "cx"
    assert sent[-1]["broker"] == "b:1" and sent[-1]["text"] == TEXT
    done = runner.invoke(
        prompts, ["add", str(path), "--version", "x9", "--parent", "x8", "--hash-only"]
    )
    assert done.exit_code == 0, done.output
    assert sent[-1]["prompt_version"] == "x9" and sent[-1]["parent_version"] == "x8"
    assert sent[-1]["text"] is None


def test_missing_file_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    done = _run("add", str(tmp_path / "nope.txt"))
    assert done.returncode == 2
    assert "does not exist" in done.stderr
    assert "Traceback" not in done.stderr


def test_unreachable_broker_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text(TEXT)
    done = _run("add", str(path), "--broker", "127.0.0.1:9")
    assert done.returncode == 2
    assert "no Kafka broker answers at 127.0.0.1:9" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_end_offset_is_retried_while_a_new_topic_elects_its_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from confluent_kafka import KafkaError, KafkaException

    from tailguard import prompts as module

    monkeypatch.setattr(module.time, "sleep", lambda _s: None)

    class Settling:
        calls = 0

        def get_watermark_offsets(self, _tp: object, timeout: float) -> tuple[int, int]:
            self.calls += 1
            if self.calls < 3:
                raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
            return 0, 7

    consumer = Settling()
    assert module._high_watermark(consumer, None) == 7 and consumer.calls == 3

    class Broken:
        def get_watermark_offsets(self, _tp: object, timeout: float) -> tuple[int, int]:
            raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    with pytest.raises(KafkaException):  # not transient: said at once
        module._high_watermark(Broken(), None)
