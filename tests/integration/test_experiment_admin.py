"""Experiments steered through the signed admin plane, on the real broker.

One worker with an admin keys file and no experiments file:

- ``canary`` is created with ``tailguard admin experiment create --file``; the
  simulator's ``prompt_cache_miss`` canary traffic (the treatment's TTFT rises)
  follows. Exactly one rollback reaches ``tailguard.releases`` with its
  evidence; ``tailguard admin experiment get`` reports the rolled-back state,
  and the worker's dashboard state shows the experiment and the decision.
- ``manual`` is created with a signed command whose forward to the owner is
  then delivered a second time (as after a crash): the same answer, one
  generation. A manual ``tailguard admin rollback`` publishes exactly one
  rollback; a second one is refused with the reason.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from tailguard.agents.experiments import partition_of
from tailguard.schemas.signing import signed

from tailguard.simulator.config import Incident

from .test_experiments import SPAN_S, batches, rollbacks, sim

pytestmark = pytest.mark.integration

MIN = 60_000
SECRETS = {"ops-1": "operator-secret-for-tests-0123", "viewer-1": "viewer-secret-for-tests-0123"}
ROLES = {"ops-1": "operator", "viewer-1": "viewer"}
CANARY = """
apiVersion: tailguard/v1
kind: Experiments
experiments:
  - id: canary
    arms: [{name: control, weight: 0.5}, {name: treatment, weight: 0.5}]
    guardrails:
      ttft_p95: {max_ratio: 1.10}
      itl_p99: {max_ratio: 1.10}
      e2e_p95: {max_ratio: 1.10}
      success_rate: {min: 0.992}
    min_samples: {units: 50, requests: 500}
    evaluate_every_s: 30
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_experiments_are_created_rolled_back_and_read_through_the_signed_admin_plane(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        "keys:\n"
        + "".join(f'  {k}: {{role: {ROLES[k]}, secret: "{v}"}}\n' for k, v in SECRETS.items())
    )
    exp_file = tmp_path / "canary.yaml"
    exp_file.write_text(CANARY)
    port = free_port()
    worker = worker_factory(
        "w1", "--admin-keys", str(keys), "--lateness-ms", "5000", "--web-port", str(port)
    ).start()
    releases = collector("tailguard.releases")
    replies = collector("tailguard.admin.replies")
    env = {
        **os.environ,
        "TAILGUARD_BROKER": namespace.broker,
        "TAILGUARD_TOPIC_PREFIX": namespace.prefix,
        "TG_OPS": SECRETS["ops-1"],
        "TG_VIEWER": SECRETS["viewer-1"],
    }

    def cli(
        *args: str, key: str = "ops-1", timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        secret = "TG_OPS" if key == "ops-1" else "TG_VIEWER"
        base = [sys.executable, "-m", "tailguard.cli", "admin", "--key-id", key]
        base += ["--secret-env", secret, "--actor", "it-ops", "--timeout", str(timeout)]
        done = subprocess.run(
            [*base, *args], env=env, capture_output=True, text=True, timeout=timeout + 60
        )
        assert worker.alive(), worker.log_tail()
        return done

    def ok(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
        assert done.returncode == 0, done.stderr + done.stdout
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    # --- the worker is up and the experiment actions are real -----------------------
    actions = {a["action"]: a for a in ok(cli("actions", key="viewer-1", timeout=180))["actions"]}
    assert actions["experiment.create"]["enabled"] and actions["release.rollback"]["enabled"]

    # --- canary: created through the CLI, then its regressed traffic ---------------
    created = ok(cli("experiment", "create", "canary", "--file", str(exp_file)))
    assert (created["status"], created["generation"]) == ("running", 1), created
    start = int(time.time() * 1000) - 20 * MIN
    start -= start % MIN
    traffic = sim("canary", start, 5, (Incident("prompt_cache_miss", 0.0, SPAN_S),))
    produce(namespace.broker, namespace.topic("tailguard.inference"), batches(traffic, b"canary"))
    releases.wait_for(lambda rs: bool(rollbacks(rs, "canary")), timeout=240, worker=worker)
    rb = rollbacks(releases.records, "canary")[0]
    assert rb["arm"] == "treatment" and rb["weights"] == {"control": 1.0, "treatment": 0.0}
    assert "guardrail_breached:ttft_p95.max_ratio:treatment" in rb["reason_codes"]
    ttft = rb["evidence"]["metrics"]["ttft_p95.max_ratio"]
    assert ttft["status"] == "breached" and ttft["interval"][0] > 1.10
    assert min(ttft["n"].values()) >= 500

    got = ok(cli("experiment", "get", "canary", key="viewer-1"))
    assert (got["status"], got["generation"]) == ("rolled_back", 1), got
    assert got["last_decision"]["decision"] == "rollback"
    assert got["last_decision"]["event_id"] == rb["event_id"]
    assert got["arms"]["treatment"]["requests"] >= 500

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard/state", timeout=10) as resp:
        board = json.loads(resp.read())
    row = next(r for r in board["experiments"] if r["experiment"] == "canary")
    assert (row["status"], row["decision"], row["arm"]) == ("rolled_back", "rollback", "treatment")
    assert rb["event_id"] in {d["event_id"] for d in board["decisions"]}

    # --- manual: a create whose forward is delivered twice creates one generation ---
    queries = collector("tailguard.internal.admin")
    body = {
        "schema": "tailguard.admin.v1",
        "command_id": f"it-{uuid.uuid4().hex[:12]}",
        "ts_ms": int(time.time() * 1000),
        "actor": "it-ops",
        "key_id": "ops-1",
        "action": "experiment.create",
        "args": {
            "experiment": "manual",
            "arms": ["control", "treatment"],
            "guardrails": {"ttft_p95": {"max_ratio": 1.1}},
        },
    }
    doc = signed(body, SECRETS["ops-1"].encode())
    ((_, offset),) = produce(
        namespace.broker, namespace.topic("tailguard.admin"), [(b"it", json.dumps(doc).encode())]
    )

    def answers(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rs if r["origin"]["offset"] == offset]

    replies.wait_for(lambda rs: len(answers(rs)) == 1, timeout=60, worker=worker)
    first = answers(replies.records)[0]
    assert first["ok"] and first["result"]["generation"] == 1, first
    queries.wait_for(
        lambda rs: any(r["command"]["command_id"] == doc["command_id"] for r in rs), 30, worker
    )
    forwarded = next(r for r in queries.records if r["command"]["command_id"] == doc["command_id"])
    assert forwarded["origin"]["offset"] == offset
    owner = partition_of("manual", namespace.partitions)  # the partition it was forwarded to
    assert first["result"]["partition"] == owner
    redeliver = Producer({"bootstrap.servers": namespace.broker})
    redeliver.produce(
        namespace.topic("tailguard.internal.admin"),
        key=doc["command_id"].encode(),
        value=json.dumps(forwarded).encode(),
        partition=owner,
    )
    assert redeliver.flush(30) == 0
    replies.wait_for(lambda rs: len(answers(rs)) == 2, timeout=60, worker=worker)
    again = answers(replies.records)[1]
    assert again["ok"] and again["result"]["generation"] == 1, again
    assert again["event_id"] == first["event_id"], "a re-delivery's reply has the same id"
    assert ok(cli("experiment", "get", "manual", key="viewer-1"))["generation"] == 1

    # --- manual rollback: exactly one; the second is refused with the reason ---------
    rolled = ok(cli("rollback", "manual", "--reason", "bad canary"))
    assert rolled["status"] == "rolled_back" and rolled["arm"] == "treatment", rolled
    refused = cli("rollback", "manual", "--reason", "again")
    assert refused.returncode == 1, refused.stdout
    assert "refused (conflict)" in refused.stderr, refused.stderr
    assert "nothing to roll back" in refused.stderr and rolled["event_id"] in refused.stderr
    releases.wait_for(lambda rs: bool(rollbacks(rs, "manual")), timeout=60, worker=worker)
    releases.poll(3)
    manual = [r for r in releases.records if r["experiment"] == "manual"]
    assert [r["decision"] for r in manual] == ["rollback"], manual
    (mrb,) = manual
    assert mrb["event_id"] == rolled["event_id"] and mrb["actor"] == "it-ops"
    assert mrb["reason_codes"] == ["manual"] and "bad canary" in mrb["reasons"][0]
    assert mrb["weights"] == {"control": 1.0, "treatment": 0.0}
    assert len({r["event_id"] for r in rollbacks(releases.records, "canary")}) == 1

    # --- list: this (only) worker owns every partition, so it knows both states -------
    listed = ok(cli("experiment", "list", key="viewer-1"))
    rows = {r["experiment"]: r for r in listed["experiments"]}
    assert {k: r["status"] for k, r in rows.items()} == {
        "canary": "rolled_back",
        "manual": "rolled_back",
    }, listed
    assert worker.alive()
