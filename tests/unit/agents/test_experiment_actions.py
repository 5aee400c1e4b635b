"""The experiment admin actions without a broker: routing to the owner, waiting for the
guard's confirmation, its refusals and the timeout, get and list.

The guard is a double that answers through the API's result sinks as the real
one does (:mod:`tailguard.agents.experiments`); the broker-backed path, with
the real guard and its per-command idempotency, is
tests/integration/test_experiment_admin.py.
"""

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from tailguard.agents.admin import AdminPlane
from tailguard.agents.admin_actions import register_builtin_actions
from tailguard.agents.breaches import BreachEngine
from tailguard.agents.control import SloBook
from tailguard.agents.experiment_actions import register_experiment_actions
from tailguard.agents.experiments import (
    ControlMsg,
    ControlResult,
    ExperimentsPlane,
    ExperimentStats,
    decode_internal,
    partition_of,
)
from tailguard.agents.settings import Settings
from tailguard.agents.state import SeriesStore
from tailguard.schemas.openslo import default_slos
from tailguard.schemas.signing import signed
from tailguard.streams import RingConfig
from tailguard.streams.experiment_def import ExperimentDef

from tailguard.admin.keys import parse_keyring
from tailguard.admin.registry import register_experiment_stubs

PARTITIONS = 4
SECRETS = {"view": "viewer-secret-0123456789", "ops": "operator-secret-01234567"}
KEYS = "\n".join(
    f'{k}: {{role: {r}, secret: "{SECRETS[k]}"}}'
    for k, r in (("view", "viewer"), ("ops", "operator"))
)
CANARY = {
    "arms": [{"name": "control", "weight": 0.5}, {"name": "treatment", "weight": 0.5}],
    "guardrails": {"ttft_p95": {"max_ratio": 1.1}},
    "min_samples": {"units": 10, "requests": 100},
}


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, int | None]] = []

    async def send(self, records: list[Any], *, partition: int | None = None) -> list[int]:
        for topic, _key, value, _headers in records:
            self.sent.append((topic, None if value is None else json.loads(value), partition))
        return [0] * len(records)

    def on(self, topic: str) -> list[Any]:
        return [body for t, body, _p in self.sent if t == topic]


class FakeGuard:
    """The guard on the owning worker: answers each command through the sinks (or not)."""

    def __init__(self) -> None:
        self.sinks: list[Any] = []
        self.commands: list[ControlMsg] = []
        self.states: dict[str, dict[str, Any]] = {}
        self.silent = False  # a guard that never confirms (backlog, rebalance)
        self.tasks: list[asyncio.Future[None]] = []

    # -- the ExperimentsAPI surface the actions use
    def route(self, experiment: str) -> int:
        return int(partition_of(experiment, PARTITIONS))

    def on_result(self, sink: Any) -> None:
        self.sinks.append(sink)

    def get_local(self, experiment: str) -> dict[str, Any] | None:
        return self.states.get(experiment)

    def list_local(self) -> list[str]:
        return sorted({*self.states, "from-yaml"})

    async def create(self, definition: Any, *, command_id: str, actor: str, ts_ms: int) -> Any:
        defn = ExperimentDef.from_mapping(definition)
        self._apply(ControlMsg(command_id, "create", defn.id, actor, ts_ms, defn.to_mapping()))
        return defn

    async def stop(self, experiment: str, **kw: Any) -> None:
        self._apply(ControlMsg(kw["command_id"], "stop", experiment, kw["actor"], kw["ts_ms"]))

    async def rollback(self, experiment: str, **kw: Any) -> None:
        msg = ControlMsg(
            kw["command_id"], "rollback", experiment, kw["actor"], kw["ts_ms"], None, "", kw["arm"]
        )
        self._apply(msg)

    # -- what the guard agent would do with the record
    def _apply(self, msg: ControlMsg) -> None:
        self.commands.append(msg)
        st = self.states.get(msg.experiment)
        if msg.action == "create" and st is not None and st["status"] == "running":
            res = self._result(msg, False, "exists and is running; stop it first", code="conflict")
        elif msg.action == "create":
            st = self.states[msg.experiment] = {"status": "running", "generation": 1}
            res = self._result(msg, True, "created", st)
        elif st is None:
            res = self._result(msg, False, f"no experiment {msg.experiment!r}", code="not_found")
        elif st["status"] != "running":
            detail = f"experiment {msg.experiment} is {st['status']}; nothing to roll back"
            res = self._result(msg, False, detail, code="conflict")
        else:
            st["status"] = "rolled_back" if msg.action == "rollback" else "stopped"
            res = self._result(msg, True, "done", {**st, "event_id": "rb-1", "arm": msg.arm})
        if not self.silent:
            for sink in self.sinks:  # later, as the guard agent would: after the send returned
                asyncio.get_running_loop().call_later(0.01, self._deliver, sink, res)

    def _deliver(self, sink: Any, res: Any) -> None:
        self.tasks.append(asyncio.ensure_future(sink(res)))

    @staticmethod
    def _result(msg: ControlMsg, ok: bool, detail: str, result: Any = None, code: str = "") -> Any:
        return ControlResult(
            msg.command_id, msg.action, msg.experiment, msg.actor, ok, detail, result or {}, code
        )


@pytest.fixture
def guard() -> FakeGuard:
    return FakeGuard()


@pytest.fixture
def plane(guard: FakeGuard) -> AdminPlane:
    settings = Settings(partitions=PARTITIONS, topic_prefix="t.")
    book = SloBook(default_slos())
    engine = BreachEngine(slos=book.specs, state_table={}, gpu_table={})
    tables = SimpleNamespace(series_meta={}, series_buckets={})
    store = SeriesStore(tables.series_meta, tables.series_buckets, RingConfig(), book.thresholds)
    admin = AdminPlane(
        app=None,
        settings=settings,
        book=book,
        engine=engine,
        store=store,
        tables=tables,
        outputs=SimpleNamespace(send=lambda *a: None),  # type: ignore[arg-type]
    )
    register_builtin_actions(admin.registry, settings)
    register_experiment_stubs(admin.registry)
    experiments = ExperimentsPlane(
        api=guard,  # type: ignore[arg-type]
        forward=None,  # type: ignore[arg-type]
        definitions={"from-yaml": ExperimentDef.from_mapping({"id": "from-yaml", **CANARY})},
        stats=ExperimentStats(),
    )
    register_experiment_actions(
        admin.registry, experiments, settings, worker="w-test", confirm_s=0.2
    )
    admin.keyring = parse_keyring(KEYS)
    admin.seen = {}
    admin.producer = FakeProducer()  # type: ignore[assignment]
    return admin


_offsets = iter(range(10_000))


def ask(
    plane: AdminPlane, action: str, args: dict[str, Any], key_id: str = "ops"
) -> dict[str, Any]:
    """Send one command as the admin agent gets it; run the forward on the owner; the reply."""
    producer: FakeProducer = plane.producer  # type: ignore[assignment]
    off = next(_offsets)
    body = {
        "command_id": f"c-{off}",
        "ts_ms": int(time.time() * 1000),
        "actor": "alice",
        "key_id": key_id,
        "action": action,
        "args": args,
    }
    raw = json.dumps(signed(body, SECRETS[key_id].encode())).encode()
    origin = {"topic": "t.tailguard.admin", "partition": 0, "offset": off}

    async def run() -> None:
        before = len(producer.sent)
        await plane.on_command(raw, origin)
        for topic, fwd, partition in producer.sent[before:]:
            if topic == plane.queries_topic:
                assert partition == partition_of(args["experiment"], PARTITIONS)
                await plane.on_forwarded(json.dumps(fwd).encode(), partition)

    replies = producer.on("t.tailguard.admin.replies")
    before = len(replies)
    asyncio.run(run())
    replies = producer.on("t.tailguard.admin.replies")
    assert len(replies) == before + 1, "exactly one reply per command"
    reply: dict[str, Any] = replies[-1]
    assert reply["command_id"] == f"c-{off}"
    return reply


def test_the_experiment_actions_replace_the_stubs(plane: AdminPlane) -> None:
    described = {a["action"]: a for a in plane.registry.describe()}
    for name in ("experiment.create", "experiment.stop", "experiment.get", "release.rollback"):
        assert described[name]["enabled"] and described[name]["routed"], name
    assert described["experiment.list"]["enabled"] and not described["experiment.list"]["routed"]


def test_create_is_run_by_the_owner_and_replies_with_the_guards_result(
    plane: AdminPlane, guard: FakeGuard
) -> None:
    reply = ask(plane, "experiment.create", {"experiment": "canary", "definition": CANARY})
    assert reply["ok"], reply
    result = reply["result"]
    assert (result["experiment"], result["status"], result["generation"]) == (
        "canary",
        "running",
        1,
    )
    assert result["partition"] == partition_of("canary", PARTITIONS)
    assert result["definition"]["guardrails"] == {"ttft_p95": {"max_ratio": 1.1}}
    (sent,) = guard.commands
    assert sent.command_id == reply["command_id"], "the guard's id is the admin command's"


def test_definition_keys_may_be_given_beside_the_experiment(
    plane: AdminPlane, guard: FakeGuard
) -> None:
    assert ask(plane, "experiment.create", {"experiment": "flat", **CANARY})["ok"]
    assert guard.commands[0].definition is not None
    assert guard.commands[0].definition["id"] == "flat"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"experiment": "x", "arms": ["only-one"]}, "at least two arms"),
        ({"experiment": "x", **CANARY, "guardrails": {"ttft_p95": {"min_ratio": 2}}}, "wrong side"),
        ({"experiment": "x", **CANARY, "colour": "red"}, "unknown key"),
        ({"experiment": "x", "definition": {**CANARY, "id": "y"}}, "definition's id"),
        ({"experiment": "x", "definition": "arms"}, "must be an object"),
        ({"experiment": 3}, "args.experiment"),
    ],
)
def test_a_bad_definition_is_refused_at_once_and_nothing_is_enqueued(
    plane: AdminPlane, guard: FakeGuard, args: dict[str, Any], words: str
) -> None:
    reply = ask(plane, "experiment.create", args) if isinstance(args["experiment"], str) else None
    if reply is None:  # no id: refused by the admin agent's route, before any forward
        producer: FakeProducer = plane.producer  # type: ignore[assignment]
        body = {
            "command_id": "no-id",
            "ts_ms": int(time.time() * 1000),
            "actor": "alice",
            "key_id": "ops",
            "action": "experiment.create",
            "args": args,
        }
        raw = json.dumps(signed(body, SECRETS["ops"].encode())).encode()
        origin = {"topic": "t.tailguard.admin", "partition": 0, "offset": 99_999}
        asyncio.run(plane.on_command(raw, origin))
        reply = producer.on("t.tailguard.admin.replies")[-1]
        assert not producer.on(plane.queries_topic)
    assert reply["error"]["code"] == "bad_args" and words in reply["error"]["message"], reply
    assert not guard.commands


def test_the_guards_refusals_keep_their_code_and_message(plane: AdminPlane) -> None:
    assert ask(plane, "experiment.create", {"experiment": "canary", **CANARY})["ok"]
    again = ask(plane, "experiment.create", {"experiment": "canary", **CANARY})
    assert again["error"]["code"] == "conflict" and "stop it first" in again["error"]["message"]
    missing = ask(plane, "release.rollback", {"experiment": "nope", "reason": "r"})
    assert missing["error"]["code"] == "not_found"


def test_a_manual_rollback_is_confirmed_once_and_a_second_is_refused(plane: AdminPlane) -> None:
    assert ask(plane, "experiment.create", {"experiment": "canary", **CANARY})["ok"]
    first = ask(plane, "release.rollback", {"experiment": "canary", "reason": "bad", "arm": "t"})
    assert first["ok"] and first["result"]["status"] == "rolled_back"
    assert first["result"]["event_id"] == "rb-1" and first["result"]["arm"] == "t"
    second = ask(plane, "release.rollback", {"experiment": "canary", "reason": "again"})
    assert second["error"]["code"] == "conflict"
    assert "nothing to roll back" in second["error"]["message"]


def test_no_confirmation_in_time_is_a_failed_reply_that_says_so(
    plane: AdminPlane, guard: FakeGuard
) -> None:
    guard.silent = True
    reply = ask(plane, "experiment.stop", {"experiment": "canary"})
    assert reply["error"]["code"] == "failed"
    message = reply["error"]["message"]
    assert "did not confirm within 0.2 s" in message and "experiment get canary" in message
    assert len(guard.commands) == 1, "the command was enqueued once"


def test_unknown_arguments_are_refused(plane: AdminPlane) -> None:
    reply = ask(plane, "experiment.stop", {"experiment": "canary", "reasn": "typo"})
    assert reply["error"]["code"] == "bad_args" and "reasn" in reply["error"]["message"]


def test_get_is_answered_by_the_owner_from_its_state(plane: AdminPlane, guard: FakeGuard) -> None:
    missing = ask(plane, "experiment.get", {"experiment": "canary"}, key_id="view")
    assert missing["error"]["code"] == "not_found"
    guard.states["canary"] = {"status": "rolled_back", "generation": 2, "last_decision": None}
    got = ask(plane, "experiment.get", {"experiment": "canary"}, key_id="view")
    assert got["ok"] and got["result"]["status"] == "rolled_back"
    assert got["result"]["partition"] == partition_of("canary", PARTITIONS)
    assert got["result"]["worker"] == "w-test"
    assert not guard.commands, "a get is not queued behind the experiment's events"


def test_list_says_what_this_worker_knows(plane: AdminPlane, guard: FakeGuard) -> None:
    guard.states["canary"] = {"status": "running", "generation": 1, "last_decision": None}
    producer: FakeProducer = plane.producer  # type: ignore[assignment]
    body = {
        "command_id": "list-1",
        "ts_ms": int(time.time() * 1000),
        "actor": "alice",
        "key_id": "view",
        "action": "experiment.list",
        "args": {},
    }
    raw = json.dumps(signed(body, SECRETS["view"].encode())).encode()
    asyncio.run(plane.on_command(raw, {"topic": "t.tailguard.admin", "partition": 0, "offset": 7}))
    reply = producer.on("t.tailguard.admin.replies")[-1]
    assert reply["ok"], reply
    rows = {r["experiment"]: r for r in reply["result"]["experiments"]}
    assert rows["canary"]["status"] == "running" and not rows["canary"]["in_experiments_file"]
    assert rows["from-yaml"]["in_experiments_file"]
    assert "this worker" in reply["result"]["scope"]


def test_control_results_round_trip_and_old_control_records_still_decode() -> None:
    msg = ControlMsg("c1", "rollback", "canary", "alice", 1, None, "why", "treatment")
    res = ControlResult("c1", "rollback", "canary", "alice", False, "no", {"a": 1}, "conflict")
    assert (
        ControlResult.from_wire(msg, msgspec.msgpack.decode(msgspec.msgpack.encode(res.to_wire())))
        == res
    )
    encoder = msgspec.msgpack.Encoder()
    old = encoder.encode(["c", "c0", "stop", "canary", "alice", 1, None, ""])  # before `arm`
    decoded = decode_internal(old)
    assert isinstance(decoded, ControlMsg) and decoded.arm is None
    assert decode_internal(encoder.encode(msg)) == msg
