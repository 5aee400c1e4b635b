"""The prompt registry and per-prompt-group SLIs on the real broker (issue 10, parts 1–2).

Prompt versions are registered with ``tailguard prompts add`` (two families of
paraphrased versions, a hash-only version, a bad record), a worker reads the
registry, inference events carrying ``prompt_version`` are sent, and the
worker's ``tailguard.prompt_sli`` snapshots must count paraphrased versions in
one group, with each version's requests and bad requests, while a version the
registry does not know counts as its own group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

MIN = 60_000

PROMPTS = {
    "support-v1": "You are a friendly customer support agent for an online bookstore. Help "
    "customers track orders, process returns and answer questions about shipping. Be polite and "
    "concise.",
    "support-v2": "You are a friendly customer support agent for an online bookstore. Help "
    "customers track orders, process returns and answer questions about shipping and delivery "
    "times. Be polite and concise, and never promise refunds you cannot give.",
    "support-v3": "You are a polite customer service assistant for an online book shop. Help "
    "customers with order tracking, returns and shipping questions. Keep answers short and "
    "friendly.",
    "sql-v1": "Translate the user's question into a single SQL query for a PostgreSQL database. "
    "Use only the tables and columns in the schema below. Return only the SQL, without "
    "explanation.",
    "sql-v2": "Convert the user's request into one PostgreSQL SQL query. Only use tables and "
    "columns from the given schema. Output just the query, no explanation.",
    "poem-v1": "Write a short poem about autumn leaves falling in a quiet park.",
}


def _cli(ns: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TAILGUARD_BROKER": ns.broker, "TAILGUARD_TOPIC_PREFIX": ns.prefix}
    return subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "prompts", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _event(i: int, ts: int, version: str, *, slow: bool = False, model: str = "llama") -> bytes:
    ttft = 1_500.0 if slow else 120.0 + i % 50
    return json.dumps(
        {
            "event_id": f"{version}-{ts}-{i}",
            "ts_ms": ts,
            "service": "chat",
            "model": model,
            "status": "ok",
            "e2e_ms": ttft + 400.0,
            "ttft_ms": ttft,
            "output_tokens": 11,
            "prompt_version": version,
        }
    ).encode()


def test_paraphrased_versions_share_one_group_and_its_slis(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[[str], Any],
    produce: Callable[..., Any],
    tmp_path: Path,
) -> None:
    # -- registry: `tailguard prompts add`
    for version, text in PROMPTS.items():
        path = tmp_path / f"{version}.txt"
        path.write_text(text)
        parent = "support-v1" if version == "support-v2" else None
        args = ["add", str(path), "--owner", "cx"] + (["--parent", parent] if parent else [])
        done = _cli(namespace, *args)
        assert done.returncode == 0, done.stderr
        assert f"registered {version}" in done.stdout
    hashed = tmp_path / "secret.txt"
    hashed.write_text("A private prompt whose text stays with its owner.")
    done = _cli(namespace, "add", str(hashed), "--version", "support-v4", "--hash-only",
                "--parent", "support-v2")  # fmt: skip
    assert done.returncode == 0, done.stderr
    again = _cli(namespace, "add", str(tmp_path / "sql-v1.txt"))
    assert again.returncode == 0 and "already registered" in again.stdout
    changed = _cli(namespace, "add", str(hashed), "--version", "sql-v1")
    assert changed.returncode == 2 and "immutable" in changed.stderr
    assert "Traceback" not in changed.stderr
    # a record no worker can use: dead-lettered, the worker goes on
    produce(namespace.broker, namespace.topic("tailguard.prompts"), [(b"junk", b"{not json")])

    listed = _cli(namespace, "list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:-1]}
    assert rows == {
        "support-v1": "pg-support-v1",
        "support-v2": "pg-support-v1",
        "support-v3": "pg-support-v1",
        "sql-v1": "pg-sql-v1",
        "sql-v2": "pg-sql-v1",
        "poem-v1": "pg-poem-v1",
        "support-v4": "pg-support-v1",
    }

    # -- traffic: one minute of events, then one event a minute later closes it
    worker = worker_factory(
        "w1", "--lateness-ms", "1000"
    )  # TAILGUARD_PROMPT_WINDOW_S defaults to 60
    worker.start()
    t0 = int(time.time() * 1000) - 10 * MIN
    t0 -= t0 % MIN
    plan = [("support-v1", 30, 0), ("support-v2", 20, 6), ("support-v3", 10, 0),
            ("support-v4", 5, 5), ("sql-v1", 20, 0), ("sql-v2", 10, 2), ("poem-v1", 8, 0),
            ("mystery-v1", 4, 1)]  # fmt: skip
    events: list[bytes] = []
    for version, n, slow in plan:
        events += [_event(i, t0 + 1_000 + i * 100, version, slow=i < slow) for i in range(n)]
    batch = b"[" + b",".join(events) + b"]"
    closer = _event(0, t0 + MIN + 5_000, "poem-v1")
    sli = collector("tailguard.prompt_sli")
    deadletters = collector("tailguard.deadletter")
    produce(namespace.broker, namespace.topic("tailguard.inference"), [(b"chat|llama", batch)])
    time.sleep(2)
    produce(namespace.broker, namespace.topic("tailguard.inference"), [(b"chat|llama", closer)])

    def finals(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {
            r["prompt_group"]: r
            for r in records
            if r.get("final") and r["window_start_ms"] == t0 and r["model"] == "llama"
        }

    sli.wait_for(lambda rs: len(finals(rs)) >= 4, timeout=180, worker=worker)
    got = finals(sli.records)
    assert set(got) == {"pg-support-v1", "pg-sql-v1", "pg-poem-v1", "pg-mystery-v1"}

    support = got["pg-support-v1"]
    assert support["members"] == ["support-v1", "support-v2", "support-v3", "support-v4"]
    assert (support["count"], support["bad"], support["errors"]) == (65, 11, 0)
    assert support["versions"] == {
        "support-v1": {"count": 30, "bad": 0},
        "support-v2": {"count": 20, "bad": 6},
        "support-v3": {"count": 10, "bad": 0},
        "support-v4": {"count": 5, "bad": 5},
    }
    assert support["slo_compliance"] == pytest.approx(1 - 11 / 65, abs=1e-6)
    assert support["ttft_ms"]["count"] == 65
    assert support["ttft_ms"]["p99"] == pytest.approx(1_500.0, rel=0.01)
    assert support["window_s"] == 60.0 and support["schema"] == "tailguard.prompt_sli.v1"

    sql = got["pg-sql-v1"]
    assert sql["members"] == ["sql-v1", "sql-v2"]
    assert (sql["count"], sql["bad"]) == (30, 2)
    assert got["pg-poem-v1"]["count"] == 8
    mystery = got["pg-mystery-v1"]
    assert mystery["members"] == ["mystery-v1"] and (mystery["count"], mystery["bad"]) == (4, 1)

    # the bad registry record went to the dead-letter topic, and the worker kept going
    deadletters.wait_for(
        lambda rs: any(r.get("topic") == namespace.topic("tailguard.prompts") for r in rs),
        timeout=30,
        worker=worker,
    )
    bad = next(r for r in deadletters.records if r["topic"] == namespace.topic("tailguard.prompts"))
    assert bad["reason"] == "malformed_json"
    assert worker.alive()
