"""The admin plane's dispatch without a broker: one reply and one audit record per
command, refusals, replays, re-deliveries, control state, silences and snapshots.

The producer and the seen table are in-memory doubles; the broker-backed path
is tests/integration/test_admin.py.
"""

import asyncio
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from tailguard.agents.admin import AdminPlane
from tailguard.agents.admin_actions import register_builtin_actions
from tailguard.agents.breaches import BreachEngine
from tailguard.agents.control import SloBook
from tailguard.agents.internal import partition_for, series_key
from tailguard.agents.settings import Settings
from tailguard.agents.state import SeriesStore
from tailguard.schemas import InferenceEvent
from tailguard.schemas.openslo import default_slos
from tailguard.schemas.signing import signed
from tailguard.streams import RingConfig

from tailguard.admin.keys import parse_keyring
from tailguard.admin.registry import Call, register_experiment_stubs

SECRETS = {
    "view": "viewer-secret-0123456789",
    "ops": "operator-secret-01234567",
    "root": "admin-secret-0123456789abc",
}
KEYS = "\n".join(
    f'{k}: {{role: {r}, secret: "{SECRETS[k]}"}}'
    for k, r in (("view", "viewer"), ("ops", "operator"), ("root", "admin"))
)


class FakeProducer:
    """Records sends; control records are handed to the follower as the broker would."""

    def __init__(self, plane: AdminPlane) -> None:
        self.plane = plane
        self.sent: list[tuple[str, bytes | None, Any, int | None]] = []
        self.offsets: dict[str, int] = {}

    async def send(self, records: list[Any], *, partition: int | None = None) -> list[int]:
        out = []
        for topic, key, value, _headers in records:
            offset = self.offsets.get(topic, 0)
            self.offsets[topic] = offset + 1
            body = None if value is None else json.loads(value)
            self.sent.append((topic, key, body, partition))
            if topic == self.plane.control_topic:
                self.plane.follower._queue.append((key.decode(), body, offset))
            out.append(offset)
        return out

    def produce_nowait(
        self, topic: str, key: bytes, value: bytes | None, headers: Any = None
    ) -> None:
        self.sent.append((topic, key, value, None))

    def on(self, topic: str) -> list[Any]:
        return [body for t, _k, body, _p in self.sent if t == topic]


class FakeOutputs:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, Any]]] = []

    def send(self, topic: str, key: bytes, value: bytes, headers: Any) -> None:
        self.sent.append((topic, key, json.loads(value)))


@pytest.fixture
def plane() -> AdminPlane:
    settings = Settings(partitions=4, topic_prefix="t.")
    book = SloBook(default_slos())
    engine = BreachEngine(slos=book.specs, state_table={}, gpu_table={})
    tables = SimpleNamespace(series_meta={}, series_buckets={})
    store = SeriesStore(tables.series_meta, tables.series_buckets, RingConfig(), book.thresholds)
    plane = AdminPlane(
        app=None,
        settings=settings,
        book=book,
        engine=engine,
        store=store,
        tables=tables,
        outputs=FakeOutputs(),  # type: ignore[arg-type]
    )
    register_builtin_actions(plane.registry, settings)
    register_experiment_stubs(plane.registry)
    engine.on_payload = plane.on_breach
    plane.keyring = parse_keyring(KEYS)
    plane.seen = {}
    plane.producer = FakeProducer(plane)  # type: ignore[assignment]
    return plane


Send = Callable[..., dict[str, Any]]


@pytest.fixture
def send(plane: AdminPlane) -> Send:
    """Sign and run one command at the next admin offset; returns its reply."""
    offsets = iter(range(1_000))

    def run(
        action: str,
        key_id: str = "view",
        *,
        args: dict[str, Any] | None = None,
        command_id: str | None = None,
        raw: bytes | None = None,
        offset: int | None = None,
        ts_shift_ms: int = 0,
    ) -> dict[str, Any]:
        import time

        off = next(offsets) if offset is None else offset
        if raw is None:
            body = {
                "command_id": command_id or f"c-{off}",
                "ts_ms": int(time.time() * 1000) + ts_shift_ms,
                "actor": "alice",
                "key_id": key_id,
                "action": action,
                "args": args or {},
            }
            raw = json.dumps(signed(body, SECRETS.get(key_id, "x" * 20).encode())).encode()
        before = len(plane.producer.on("t.tailguard.admin.replies"))  # type: ignore[union-attr]
        origin = {"topic": "t.tailguard.admin", "partition": 0, "offset": off}
        asyncio.run(plane.on_command(raw, origin))
        replies = plane.producer.on("t.tailguard.admin.replies")  # type: ignore[union-attr]
        assert len(replies) == before + 1, "exactly one reply per command"
        return replies[-1]

    return run


def audits(plane: AdminPlane) -> list[dict[str, Any]]:
    return plane.producer.on("t.tailguard.audit")  # type: ignore[union-attr]


def test_a_viewer_lists_the_slos(plane: AdminPlane, send: Send) -> None:
    reply = send("slo.list")
    assert reply["ok"] and reply["result"]["slos"][0]["name"] == "ttft-p99"
    (audit,) = audits(plane)
    assert (audit["outcome"], audit["authenticated"], audit["role"]) == ("ok", True, "viewer")
    assert audit["event_id"] != reply["event_id"]


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"raw": b'{"command_id": '}, "malformed"),
        ({"raw": b'{"command_id":"x","actor":"a","action":"slo.list"}'}, "invalid"),
        ({"key_id": "nobody"}, "unknown_key"),
        ({"key_id": "ghost-view"}, "unknown_key"),
        ({"ts_shift_ms": -6 * 60_000}, "stale"),
        ({"ts_shift_ms": 6 * 60_000}, "future"),
    ],
)
def test_refusals_get_a_reply_and_an_audit_record(
    plane: AdminPlane, send: Send, kwargs: dict[str, Any], code: str
) -> None:
    reply = send("slo.list", **kwargs)
    assert not reply["ok"] and reply["error"]["code"] == code and reply["result"] is None
    (audit,) = audits(plane)
    assert audit["outcome"] == "refused" and audit["error"]["code"] == code
    assert audit["authenticated"] is False


def test_unsigned_and_forged_commands_are_refused(plane: AdminPlane, send: Send) -> None:
    body = {"command_id": "u", "ts_ms": 1, "actor": "a", "key_id": "root", "action": "slo.list"}
    assert send("", raw=json.dumps(body).encode())["error"]["code"] == "unsigned"
    forged = signed({**body, "command_id": "f"}, b"not-the-right-secret-at-all")
    assert send("", raw=json.dumps(forged).encode())["error"]["code"] == "bad_signature"


def test_a_viewer_cannot_do_an_operator_action(plane: AdminPlane, send: Send) -> None:
    reply = send("silence.add", "view", args={"service": "chat", "duration": "1h", "reason": "r"})
    assert reply["error"]["code"] == "forbidden" and "operator" in reply["error"]["message"]
    assert audits(plane)[-1]["authenticated"] is True
    assert not plane.state.silences


def test_an_unknown_action_is_refused_with_the_known_ones(plane: AdminPlane, send: Send) -> None:
    reply = send("slo.explode")
    assert reply["error"]["code"] == "unknown_action" and "slo.list" in reply["error"]["message"]


def test_a_replayed_command_id_is_refused_but_a_redelivery_is_not(
    plane: AdminPlane, send: Send
) -> None:
    first = send("slo.list", command_id="same", offset=10)
    again = send("slo.list", command_id="same", offset=10)  # Kafka re-delivery after a crash
    replay = send("slo.list", command_id="same", offset=11)
    assert first["ok"] and again["ok"] and first["event_id"] == again["event_id"]
    assert replay["error"]["code"] == "replayed"


def test_a_failing_handler_is_a_failed_reply_and_the_plane_goes_on(
    plane: AdminPlane, send: Send
) -> None:
    async def boom(call: Call) -> dict[str, Any]:
        raise ZeroDivisionError("nope")

    plane.registry.register("test.boom", boom, role="viewer")
    reply = send("test.boom")
    assert reply["error"]["code"] == "failed" and "ZeroDivisionError" in reply["error"]["message"]
    assert audits(plane)[-1]["outcome"] == "failed"
    assert send("slo.list")["ok"]


def test_experiments_are_not_enabled_until_registered(plane: AdminPlane, send: Send) -> None:
    reply = send("experiment.create", "ops", args={"experiment": "exp-1"})
    assert reply["error"]["code"] == "not_enabled"
    assert "experiments are not enabled on this worker" in reply["error"]["message"]


def test_slo_set_changes_the_live_slos_and_the_series_thresholds(
    plane: AdminPlane, send: Send
) -> None:
    key = series_key("chat", "m", "default", "default")
    cached = plane.store.get(key, partition=0)
    assert cached.state.thresholds.ttft_ms == 800.0
    refused = send("slo.set", "ops", args={"name": "ttft-p99", "threshold_ms": 3000})
    assert refused["error"]["code"] == "forbidden"
    reply = send("slo.set", "root", args={"name": "ttft-p99", "threshold_ms": 3000})
    assert reply["ok"], reply
    assert {s["name"] for s in reply["result"]["changed"]} == {"ttft-p99", "composite"}
    assert plane.engine.slo_version == plane.book.version > 0
    spec = next(s for s in plane.engine.slos if s.name == "ttft-p99")
    assert spec.ttft_ms == 3000.0 and spec.source.startswith("admin:")
    assert cached.state.thresholds.ttft_ms == 3000.0
    control = [b for t, k, b, _ in plane.producer.sent if t == plane.control_topic]  # type: ignore[union-attr]
    assert len(control) == 1, "a multi-SLO change is one control record: it applies atomically"
    assert set(control[0]["overrides"]) == {"ttft-p99", "composite"}
    reset = send("slo.reset", "root", args={"name": "ttft-p99"})
    assert reset["ok"] and next(s for s in plane.engine.slos if s.name == "ttft-p99").ttft_ms == 800


def test_silences_mark_matching_breaches_and_every_decision_is_audited(
    plane: AdminPlane, send: Send
) -> None:
    added = send("silence.add", "ops", args={"service": "chat", "duration": "1h", "reason": "fix"})
    assert added["ok"]
    silence_id = added["result"]["silence"]["silence_id"]
    breach = {
        "event_id": "b:0",
        "breach_id": "b",
        "state": "opened",
        "kind": "burn_rate",
        "slo": "ttft-p99",
        "series": {"service": "chat", "model": "m", "variant": "default", "tenant": "default"},
    }
    plane.on_breach(breach)
    assert breach["silenced"] is True and breach["silence_id"] == silence_id
    other = {**breach, "event_id": "c:0", "breach_id": "c", "series": {"service": "search"}}
    plane.on_breach(other)
    assert other["silenced"] is False and other["silence_id"] is None
    decisions = [p for t, _k, p in plane.outputs.sent if t == plane.audit_topic]  # type: ignore[attr-defined]
    assert [(d["kind"], d["action"], d["outcome"]) for d in decisions] == [
        ("decision", "breach.opened", "opened"),
        ("decision", "breach.opened", "opened"),
    ]
    assert send("silence.list")["result"]["silences"][0]["silence_id"] == silence_id
    assert send("silence.remove", "ops", args={"silence_id": silence_id})["ok"]
    assert not plane.state.silences


def test_a_breach_can_be_acked_only_while_open(plane: AdminPlane, send: Send) -> None:
    assert send("breach.ack", "ops", args={"breach_id": "b1"})["error"]["code"] == "not_found"
    plane.view.offer(
        json.dumps({"breach_id": "b1", "state": "opened", "seq": 0, "slo": "x"}).encode()
    )
    reply = send("breach.ack", "ops", args={"breach_id": "b1", "note": "on it"})
    assert reply["ok"] and reply["result"]["acked"]["by"] == "alice"
    listed = send("breach.list")["result"]["open"]
    assert listed[0]["acked"]["note"] == "on it"
    payload = {"event_id": "b1:1", "breach_id": "b1", "state": "updated", "series": {}}
    plane.on_breach(payload)
    assert payload["acked"]["by"] == "alice"


def test_a_series_snapshot_is_forwarded_to_the_owner_which_replies(
    plane: AdminPlane, send: Send
) -> None:
    key = series_key("chat", "m", "default", "default")
    cached = plane.store.get(key, partition=partition_for(key, 4))
    events = [
        InferenceEvent(
            event_id=f"e{i}",
            ts_ms=1_700_000_000_000 + i * 1_000,
            service="chat",
            model="m",
            status="ok",
            e2e_ms=900.0,
            ttft_ms=2_000.0 if i % 2 else 100.0,
            output_tokens=3,
            itl_ms=[20.0, 30.0],
        )
        for i in range(120)
    ]
    cached.state.add(events, [(0, i) for i in range(120)])
    before = len(plane.producer.on("t.tailguard.admin.replies"))  # type: ignore[union-attr]
    origin = {"topic": "t.tailguard.admin", "partition": 0, "offset": 500}
    args = {"service": "chat", "model": "m", "windows": ["1m", "5m"]}
    doc = signed(
        {
            "command_id": "snap",
            "ts_ms": int(__import__("time").time() * 1000),
            "actor": "alice",
            "key_id": "view",
            "action": "series.snapshot",
            "args": args,
        },
        SECRETS["view"].encode(),
    )
    asyncio.run(plane.on_command(json.dumps(doc).encode(), origin))
    sent = [(b, p) for t, _k, b, p in plane.producer.sent if t == plane.queries_topic]  # type: ignore[union-attr]
    assert len(sent) == 1 and sent[0][1] == partition_for(key, 4)
    assert len(plane.producer.on("t.tailguard.admin.replies")) == before  # the owner replies
    asyncio.run(plane.on_forwarded(json.dumps(sent[0][0]).encode(), sent[0][1]))
    reply = plane.producer.on("t.tailguard.admin.replies")[-1]  # type: ignore[union-attr]
    assert reply["ok"] and reply["command_id"] == "snap" and reply["origin"] == origin
    result = reply["result"]
    assert set(result["windows"]) == {"1m", "5m"}
    ttft = next(s for s in result["slos"] if s["slo"] == "ttft-p99")
    assert ttft["burn_rates"]["5m"] > 14.4 and ttft["open_breach"] is None
    missing = {**doc, "command_id": "snap2", "args": {"service": "nope", "model": "m"}}
    asyncio.run(
        plane.on_forwarded(json.dumps({**sent[0][0], "command": missing}).encode(), sent[0][1])
    )
    assert plane.producer.on("t.tailguard.admin.replies")[-1]["error"]["code"] == "not_found"  # type: ignore[union-attr]


def test_key_revocation_refuses_the_key_from_then_on(plane: AdminPlane, send: Send) -> None:
    assert send("key.revoke", "ops", args={"key_id": "view"})["error"]["code"] == "forbidden"
    assert send("key.revoke", "root", args={"key_id": "view"})["ok"]
    assert send("slo.list", "view")["error"]["code"] == "key_expired"
    listed = send("key.list", "root")["result"]["keys"]
    assert {k["key_id"]: k["usable"] for k in listed} == {"ops": True, "root": True, "view": False}
    assert not any(s in repr(plane.producer.sent) for s in SECRETS.values())  # type: ignore[union-attr]


def test_key_rotation_needs_the_replacement_in_the_file_then_retires_after_the_grace(
    plane: AdminPlane, send: Send, tmp_path: Any
) -> None:
    import dataclasses

    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS + "\n")
    plane.settings = dataclasses.replace(plane.settings, admin_keys_file=keys)
    refused = send("key.rotate", "root", args={"key_id": "root"})
    assert refused["error"]["code"] == "conflict" and "replacement" in refused["error"]["message"]
    keys.write_text(KEYS + '\nroot-2: {role: admin, secret: "admin-secret-2-0123456789"}\n')
    reply = send("key.rotate", "root", args={"key_id": "root", "grace_s": 0})
    assert reply["ok"] and reply["result"]["replacements"] == ["root-2"]
    assert send("slo.list", "root")["error"]["code"] == "key_expired"
    SECRETS["root-2"] = "admin-secret-2-0123456789"
    try:
        assert send("key.list", "root-2")["ok"]
    finally:
        del SECRETS["root-2"]
