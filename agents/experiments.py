"""Experiment agents: the A/B and gray-release guard on the broker (docs/experiments.md).

::

    tailguard.inference ─▶ ingest agent ─(events with `experiment`, as columns)──┐
    tailguard.interactions ─▶ forwarder ─(decoded, grouped by experiment)────────┤
    tailguard.evals ─▶ forwarder ────────────────────────────────────────────────┤
    ExperimentsAPI (admin plane: create / stop / get / rollback) ────────────────┤
                                                                                 ▼
                         tailguard.internal.experiments  (key: experiment id)
                                                                                 │
       experiment agent: one state per experiment (table tailguard-experiments), ◀┘
       units → first arm (tailguard-experiment-units), interrupted sessions
       (tailguard-experiment-sessions); evaluates at event-time boundaries
                                   │
                                   ├─▶ tailguard.releases  (tailguard.release.v1, key: experiment)
                                   └─▶ tailguard.audit     (tailguard.audit.v1)

Why an internal topic: an experiment's requests arrive on every input
partition (keyed by service/model), its interactions keyed by unit; a faust
table write lands in the partition of the *current event*, so all of one
experiment's input is re-keyed by experiment id onto one partition first.
Operator commands take the same path, so they are applied in order with the
data, in the partition that owns the experiment, and survive a restart.

Exactly-once discipline (cf. :mod:`tailguard.agents.sli`):

- every record on the internal topic carries the input position (partition,
  offset) of what it forwards; the state keeps the highest offset absorbed
  per input partition and skips anything at or below it, so a re-delivery
  (a crash before the commit, a forwarder replaying) adds nothing twice;
- per internal message, decisions are published (librdkafka) and **their
  delivery awaited** before the state that records them is written; faust
  flushes the table changelog before it commits the input offset. A crash
  may therefore re-send a decision — with the same ``event_id`` — but never
  lose one, and never count input twice;
- a rollback's ``event_id`` depends only on (experiment, generation), and the
  state turns ``rolled_back`` when it is recorded: at most one rollback per
  experiment and generation, whatever restarts happen;
- an operator command is applied once per ``command_id``: its result is kept
  (table ``tailguard-experiment-commands``, the latest :data:`COMMANDS_KEPT`
  per experiment) and a re-delivered command — the internal record again, or
  the admin command run again after a crash — is answered with that result
  instead of being applied a second time.

Every published release decision is also shown on the worker's dashboard
(:func:`tailguard.agents.telemetry.record_release`), and every status change of
an experiment (created, stopped, rolled back, first seen, restored) with
:func:`~tailguard.agents.telemetry.record_experiment`. The admin actions over
this API (``experiment.*``, ``release.rollback``) are in
:mod:`tailguard.agents.experiment_actions`.

Decisions are event-time based (:mod:`tailguard.streams.experiment`): a replay
of the same input evaluates the same boundaries with the same counts and so
publishes the same decisions with the same ids.
"""

import asyncio
import hashlib
import logging
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
import msgspec
from faust.types import TP, TopicT
from tailguard.agents import telemetry
from tailguard.agents.deadletters import decode_or_dead_letter
from tailguard.agents.outputs import OutputError, Outputs
from tailguard.agents.publish import frame
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import Topics, internal_topic
from tailguard.schemas import EvalScore, InferenceEvent, Interaction
from tailguard.schemas.experiments import load_experiments
from tailguard.streams.errors import ConfigError, CorruptStateError
from tailguard.streams.experiment import (
    Decision,
    ExperimentInteractions,
    ExperimentRequests,
    ExperimentState,
    _InteractionsWire,
    _RequestsWire,
    decide,
    evaluate,
    evidence,
)
from tailguard.streams.experiment_def import ExperimentDef

from tailguard import catalogue as cat
from tailguard.admin.records import decision_payload

__all__ = [
    "AUDIT_SCHEMA",
    "EXPERIMENTS",
    "RELEASE_SCHEMA",
    "ControlMsg",
    "ControlResult",
    "ExperimentStats",
    "ExperimentsAPI",
    "ExperimentsPlane",
    "audit_payload",
    "decode_internal",
    "register_experiments",
    "release_payload",
    "route_requests",
]

log = logging.getLogger(__name__)

RELEASE_SCHEMA = "tailguard.release.v1"
AUDIT_SCHEMA = "tailguard.audit.v1"
#: Internal: experiment input re-keyed by experiment id (faust declares it).
EXPERIMENTS = "tailguard.internal.experiments"
_SEP = b"\x1f"
#: Budget of one forwarded message (cut only between input messages).
MAX_MESSAGE_BYTES = 900_000
#: Experiment id of blind feedback sent to every partition (see route_interactions).
BLIND = ""
#: Replay-protection source of blind feedback (its input offsets are tracked apart
#: from the same input message's direct interactions).
BLIND_SOURCE = "b"
#: Results of operator commands kept per experiment (a re-delivered command is
#: answered from them instead of being applied again).
COMMANDS_KEPT = 64

# ----------------------------------------------------------------- the wire


class ReqMsg(msgspec.Struct, tag="r", array_like=True):
    experiment: str
    cols: _RequestsWire


class IntMsg(msgspec.Struct, tag="i", array_like=True):
    experiment: str
    cols: _InteractionsWire


class EvalMsg(msgspec.Struct, tag="e", array_like=True):
    experiment: str
    variant: str
    metric: str
    value: float
    ts_ms: int
    n: int | None = None


class ControlMsg(msgspec.Struct, tag="c", array_like=True):
    """An operator command for one experiment (see :class:`ExperimentsAPI`)."""

    command_id: str
    action: str  # create | stop | rollback | get
    experiment: str
    actor: str
    ts_ms: int
    definition: dict[str, Any] | None = None
    reason: str = ""
    #: rollback: the treatment arm to take out (None: every treatment).
    arm: str | None = None


Internal = ReqMsg | IntMsg | EvalMsg | ControlMsg
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Internal).decode


def decode_internal(data: bytes | None) -> Internal:
    """A record of the internal experiments topic; ``ValueError`` when it does not decode."""
    try:
        return _decode(data or b"")
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(str(exc)) from exc


def partition_of(experiment: str, partitions: int) -> int:
    """The internal partition of an experiment (stable across processes)."""
    return zlib.crc32(experiment.encode()) % partitions


def _by_experiment(
    events: Sequence[Any], positions: Sequence[tuple[int, int]]
) -> dict[str, tuple[list[Any], list[tuple[int, int]]]]:
    """Events grouped by experiment. A request in experiments of several layers
    (``experiments``: one tag per layer, see :mod:`tailguard.gateway.server`)
    goes to each of them, as that experiment's arm and prompt version."""
    groups: dict[str, tuple[list[Any], list[tuple[int, int]]]] = {}
    for ev, pos in zip(events, positions, strict=True):
        if getattr(ev, "warmup", False):
            continue
        exp = ev.experiment
        if exp:
            evs, poss = groups.setdefault(exp, ([], []))
            evs.append(ev)
            poss.append(pos)
        for tag in getattr(ev, "experiments", None) or ():
            if tag.experiment == exp or not tag.experiment:
                continue
            evs, poss = groups.setdefault(tag.experiment, ([], []))
            evs.append(
                msgspec.structs.replace(
                    ev,
                    experiment=tag.experiment,
                    variant=tag.variant,
                    prompt_version=tag.prompt_version or ev.prompt_version,
                )
            )
            poss.append(pos)
    return groups


def _cuts(positions: list[tuple[int, int]], costs: list[int], budget: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` slices of at most ``budget`` cost, cut only where the input message changes."""
    out, lo, used = [], 0, 0
    for i, cost in enumerate(costs):
        if i > lo and used + cost > budget and positions[i] != positions[i - 1]:
            out.append((lo, i))
            lo, used = i, 0
        used += cost
    out.append((lo, len(costs)))
    return out


def route_requests(
    events: Sequence[InferenceEvent],
    positions: Sequence[tuple[int, int]],
    partitions: int,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> list[tuple[int, bytes, bytes]]:
    """Requests that name an experiment (warm-up ones left out), as ``(partition, key,
    message)`` per experiment, each message under ``max_bytes`` where possible."""
    out = []
    for exp, (evs, poss) in _by_experiment(events, positions).items():
        costs = [160 + 8 * len(ev.itl_ms) for ev in evs]  # 160: with a 32-hex trace id
        for lo, hi in _cuts(poss, costs, max_bytes):
            cols = ExperimentRequests.from_events(evs[lo:hi], poss[lo:hi])
            out.append(
                (
                    partition_of(exp, partitions),
                    exp.encode(),
                    _encode(ReqMsg(experiment=exp, cols=cols.to_wire())),
                )
            )
    return out


def route_interactions(
    events: Sequence[Interaction], positions: Sequence[tuple[int, int]], partitions: int
) -> list[tuple[int, bytes, bytes]]:
    """Interactions per experiment, to the experiment's partition. Blind feedback —
    ``kind: feedback`` with a ``label`` and a ``request_event_id`` but no
    ``experiment`` (the rater never saw it) — goes to *every* partition with
    experiment ``""``: there each experiment that knows the rated request takes it
    (:data:`BLIND`)."""
    out = []
    blind = [
        (ev, pos)
        for ev, pos in zip(events, positions, strict=True)
        if not ev.experiment and ev.kind == "feedback" and ev.label and ev.request_event_id
    ]
    if blind:
        cols = ExperimentInteractions.from_events([e for e, _ in blind], [p for _, p in blind])
        value = _encode(IntMsg(experiment=BLIND, cols=cols.to_wire()))
        out += [(p, b"", value) for p in range(partitions)]
    for exp, (evs, poss) in _by_experiment(events, positions).items():
        cols = ExperimentInteractions.from_events(evs, poss)
        out.append(
            (
                partition_of(exp, partitions),
                exp.encode(),
                _encode(IntMsg(experiment=exp, cols=cols.to_wire())),
            )
        )
    return out


# ----------------------------------------------------------------- payloads


def _hid(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def release_payload(
    d: Decision,
    defn: ExperimentDef,
    *,
    with_p_values: bool = True,
    group_of: Callable[[str], str | None] | None = None,
) -> dict[str, Any]:
    """The ``tailguard.release.v1`` event of one decision.

    ``ts_ms`` is the decision's event time (the evaluation boundary), so a
    replay publishes identical bytes. ``evidence.metrics`` has, per guardrail,
    both arms' values with their confidence sequences and sample sizes, the
    difference, the effect's interval, the anytime-valid p-value and ``n``;
    ``evidence.prompts`` / ``evidence.prompt_groups`` the prompt versions and
    groups (``group_of``: the prompt registry's) holding most of each arm's bad
    requests, with exemplar trace ids.
    """
    ev = d.evaluation
    return {
        "schema": RELEASE_SCHEMA,
        "event_id": d.event_id,
        "ts_ms": d.at_ms,
        "experiment": d.experiment,
        "generation": d.generation,
        "seq": d.seq,
        "decision": d.decision,
        "arm": d.arm,
        "control": defn.control,
        "reasons": list(d.reasons),
        "reason_codes": list(d.codes),
        "evidence": (
            evidence(defn, ev, with_p_values=with_p_values, group_of=group_of)
            if ev is not None
            else {}
        ),
        "weights": {k: round(v, 6) for k, v in d.weights.items()},
        "planned_weights": {k: round(v, 6) for k, v in defn.weights.items()},
        "actor": d.actor,
        "decided_at_ms": d.at_ms,
        "method": (
            "anytime-valid confidence sequences (beta-binomial mixtures; quantiles: Howard & "
            "Ramdas 2022), SRM: chi-square and Dirichlet-multinomial sequential test (Lindon & "
            f"Malek 2022); family-wise alpha {defn.alpha:g} over guardrails x treatments"
        ),
    }


def audit_payload(d: Decision, weights: Mapping[str, float], *, worker: str) -> dict[str, Any]:
    """The ``tailguard.audit.v1`` record of a release decision (the admin plane's
    decision format, :func:`tailguard.admin.records.decision_payload`); its
    ``event_id`` derives from the decision's, so a re-send is audited once."""
    return decision_payload(
        f"release.{d.decision}",
        {
            "experiment": d.experiment,
            "arm": d.arm,
            "weights": dict(weights),
            "release_event_id": d.event_id,
            "reason_codes": list(d.codes),
        },
        d.decision,
        seed=d.event_id,
        now_ms=d.at_ms,
        worker=worker,
        summary="; ".join(d.reasons)[:2000],
        actor=d.actor,
    )


# ----------------------------------------------------------------- control API


@dataclass(frozen=True, slots=True)
class ControlResult:
    """What became of one command, reported by the worker that owns the experiment.

    ``code`` says why a command was refused (``ok`` false), as the admin
    plane's reply codes: ``bad_args`` (an invalid definition or arm),
    ``not_found`` (no such experiment), ``conflict`` (the experiment's state
    does not allow it: already running, already stopped or rolled back).
    """

    command_id: str
    action: str
    experiment: str
    actor: str
    ok: bool
    detail: str
    result: dict[str, Any] = field(default_factory=dict)
    code: str = ""

    def to_wire(self) -> list[Any]:
        return [self.action, self.ok, self.code, self.detail, self.result]

    @classmethod
    def from_wire(cls, msg: ControlMsg, wire: list[Any]) -> "ControlResult":
        action, ok, code, detail, result = wire
        return cls(msg.command_id, action, msg.experiment, msg.actor, ok, detail, result, code)


#: Called with every command's result: the admin plane turns it into its reply.
ResultSink = Callable[[ControlResult], Awaitable[None]]


class ExperimentsAPI:
    """What the admin plane calls for operator commands on experiments (docs/experiments.md).

    Every method validates at once — an invalid definition raises
    :class:`~tailguard.streams.errors.ConfigError` with a message naming the
    field — and then enqueues the command on the internal topic, keyed by
    the experiment, so the worker owning that experiment applies it in order
    with its data. The outcome (``ok``, ``detail``, and for ``get`` the
    experiment's definition, status, counts and last decision) is reported
    to every sink registered with :meth:`on_result` (the admin plane writes the
    one reply and audit record of each command itself), on the worker owning the
    experiment, after the decisions it caused were delivered; a refusal carries
    a ``code`` (``bad_args``, ``not_found``, ``conflict``). A command whose
    ``command_id`` was applied before is not applied again: the sinks get its
    first result once more. A manual
    rollback is a release decision like any other (one per experiment,
    audited, on ``tailguard.releases``) with the operator as ``actor``.

    Must be awaited inside the worker's event loop (e.g. from the admin agent).
    """

    def __init__(self, topic: TopicT, partitions: int) -> None:
        self._topic = topic
        self._partitions = partitions
        self.sinks: list[ResultSink] = []
        self._reader: Callable[[str], dict[str, Any] | None] | None = None
        self._lister: Callable[[], list[str]] | None = None

    def route(self, experiment: str) -> int:
        """The partition that owns ``experiment`` (internal experiments topic; it has the
        partition count of ``tailguard.internal.series``, so the admin plane's routed
        queries for that partition number run on the same worker)."""
        return partition_of(experiment, self._partitions)

    def get_local(self, experiment: str) -> dict[str, Any] | None:
        """Definition, status, per-arm counts and last decision of ``experiment`` as this
        worker holds it (call it on the worker owning :meth:`route`); None if unknown."""
        return self._reader(experiment) if self._reader is not None else None

    def list_local(self) -> list[str]:
        """Experiments defined in YAML plus those whose state this worker holds."""
        return self._lister() if self._lister is not None else []

    def on_result(self, sink: ResultSink) -> None:
        """Register a coroutine called with each :class:`ControlResult`."""
        self.sinks.append(sink)

    async def _send(self, msg: ControlMsg) -> None:
        await self._topic.send(
            key=msg.experiment.encode(),
            value=_encode(msg),
            partition=partition_of(msg.experiment, self._partitions),
        )

    async def create(
        self, definition: Mapping[str, Any], *, command_id: str, actor: str, ts_ms: int
    ) -> ExperimentDef:
        """Define a new experiment (or a new generation of a stopped / rolled-back one)."""
        defn = ExperimentDef.from_mapping(definition)
        await self._send(ControlMsg(command_id, "create", defn.id, actor, ts_ms, defn.to_mapping()))
        return defn

    async def stop(
        self, experiment: str, *, command_id: str, actor: str, ts_ms: int, reason: str = ""
    ) -> None:
        """Stop guarding: no more decisions for this generation."""
        await self._send(ControlMsg(command_id, "stop", experiment, actor, ts_ms, None, reason))

    async def rollback(
        self,
        experiment: str,
        *,
        command_id: str,
        actor: str,
        ts_ms: int,
        reason: str = "",
        arm: str | None = None,
    ) -> None:
        """Publish a manual rollback (refused if this generation already rolled back).

        ``arm``: the treatment to take out of traffic (its weight goes to 0, the
        others keep their planned shares); None: every treatment (all traffic to
        the control)."""
        await self._send(
            ControlMsg(command_id, "rollback", experiment, actor, ts_ms, None, reason, arm)
        )

    async def get(self, experiment: str, *, command_id: str, actor: str, ts_ms: int) -> None:
        """Report the experiment's definition, status, per-arm counts and last decision."""
        await self._send(ControlMsg(command_id, "get", experiment, actor, ts_ms))


# ----------------------------------------------------------------- books


class _Book:
    """A set of per-experiment keys in a table, cached in memory.

    Unit book: unit hash → arm name; session book: session hash → interrupted.
    """

    def __init__(self, table: Any, prefix: bytes, cache: dict[int, str]) -> None:
        self._table = table
        self._prefix = prefix
        self._cache = cache

    def _key(self, item: int) -> bytes:
        return self._prefix + item.to_bytes(8, "big")

    def arm_of(self, unit: int) -> str | None:
        hit = self._cache.get(unit)
        if hit is not None:
            return hit or None
        raw = self._table.get(self._key(unit))
        value = raw.decode() if raw else ""
        self._cache[unit] = value
        return value or None

    def remember(self, unit: int, arm: str) -> None:
        self._cache[unit] = arm
        self._table[self._key(unit)] = arm.encode()

    # requests (blind feedback's join): a key one byte longer than a unit's
    def request(self, event: int) -> tuple[str, str] | None:
        raw = self._table.get(self._prefix + b"r" + event.to_bytes(8, "big"))
        if not raw:
            return None
        arm, _, version = raw.decode().partition("\x1f")
        return arm, version

    def remember_request(self, event: int, arm: str, prompt_version: str) -> None:
        key = self._prefix + b"r" + event.to_bytes(8, "big")
        self._table[key] = f"{arm}\x1f{prompt_version}".encode()

    # sessions
    def interrupted(self, session: int) -> bool:
        return self.arm_of(session) is not None

    def mark_interrupted(self, session: int) -> None:
        if not self.interrupted(session):
            self.remember(session, "1")

    def forget(self, session: int) -> None:
        if self._cache.get(session):
            self._cache[session] = ""
            key = self._key(session)
            if self._table.get(key) is not None:
                del self._table[key]


# ----------------------------------------------------------------- the agent


@dataclass(slots=True)
class ExperimentStats:
    """Counters of the experiment agents (logged with the worker's stats)."""

    requests_forwarded: int = 0
    interactions_forwarded: int = 0
    evals_forwarded: int = 0
    messages: int = 0
    undefined: int = 0
    evaluations: int = 0
    decisions: int = 0
    rollbacks: int = 0
    controls: int = 0
    controls_repeated: int = 0
    corrupt_states: int = 0
    internal_errors: int = 0

    def line(self) -> str:
        return " ".join(f"exp_{k}={getattr(self, k)}" for k in self.__dataclass_fields__)


@dataclass(slots=True)
class ExperimentsPlane:
    """What :func:`register_experiments` returns to the pipeline."""

    api: ExperimentsAPI
    forward: Callable[[Sequence[InferenceEvent], Sequence[tuple[int, int]]], Awaitable[None]]
    definitions: dict[str, ExperimentDef]
    stats: ExperimentStats
    agent: Any = None


def _load_definitions(files: Iterable[Path]) -> dict[str, ExperimentDef]:
    out: dict[str, ExperimentDef] = {}
    for path in files:
        for exp_id, defn in load_experiments(path).items():
            if exp_id in out:
                msg = f"{path}: experiment {exp_id!r} is also defined in another file"
                raise ConfigError(msg)
            out[exp_id] = defn
    return out


def _table(app: faust.App, settings: Settings, name: str, help_: str) -> Any:
    return app.Table(
        name,
        default=None,
        partitions=settings.partitions,
        key_type=bytes,
        value_type=bytes,
        options=settings.rocksdb_options(),
        help=help_,
    )


def register_experiments(
    app: faust.App,
    topics: Topics,
    settings: Settings,
    stats: WorkerStats,
    *,
    outputs: Outputs | None = None,
    stratum_of: Callable[[str], str | None] | None = None,
) -> ExperimentsPlane:
    """Declare the experiment topics and tables and attach the agents.

    ``stratum_of``: the hallucination guardrail's stratum of a prompt version
    (e.g. its prompt group); default: the version itself. The release records'
    prompt evidence names the same groups."""
    definitions = _load_definitions(getattr(settings, "experiments_files", ()) or ())
    estats = ExperimentStats()
    internal = internal_topic(app, settings, settings.topic_prefix + EXPERIMENTS)

    def raw_topic(name: str) -> TopicT:
        return app.topic(
            settings.topic_prefix + name,
            key_serializer="raw",
            value_serializer="raw",
            allow_empty=True,
        )

    interactions_topic = raw_topic(cat.INTERACTIONS)
    evals_topic = raw_topic(cat.EVALS)
    releases = settings.topic_prefix + cat.RELEASES
    audit = settings.topic_prefix + cat.AUDIT
    states = _table(app, settings, "tailguard-experiments", "A/B guard state per experiment")
    units_table = _table(
        app, settings, "tailguard-experiment-units", "experiment unit → first arm (SRM)"
    )
    sessions_table = _table(
        app, settings, "tailguard-experiment-sessions", "experiment sessions interrupted, not ended"
    )
    commands_table = _table(
        app, settings, "tailguard-experiment-commands", "results of the latest operator commands"
    )
    api = ExperimentsAPI(internal, settings.partitions)
    out = outputs or Outputs(settings.broker)
    lateness = settings.allowed_lateness_ms

    async def send_all(records: list[tuple[str, bytes, dict[str, Any]]]) -> None:
        """Send and wait until delivered; on a broker outage keep re-sending (same ids)."""
        while True:
            for topic, key, payload in records:
                value, headers = frame(payload, source=settings.source)
                out.send(topic, key, value, headers)
            try:
                await out.flush(timeout_s=30.0)
            except OutputError as exc:
                app.log.warning("tailguard: experiment decisions not delivered yet: %s", exc)
                await asyncio.sleep(1.0)
                continue
            for topic, _key, payload in records:
                if topic == releases:  # the dashboard's Release decisions (idempotent per id)
                    telemetry.record_release(payload)
            return

    def show(st: ExperimentState, defn: ExperimentDef | None) -> None:
        """The experiment's status on the dashboard (on status changes, not per event)."""
        info: dict[str, Any] = {"status": st.status, "generation": st.generation}
        if defn is not None:
            info.update(
                arms=list(defn.arm_names),
                control=defn.control,
                planned_weights={k: round(v, 6) for k, v in defn.weights.items()},
                source="admin" if st.definition is not None else "yaml",
            )
        telemetry.record_experiment(st.experiment, **info)

    async def forward(
        events: Sequence[InferenceEvent], positions: Sequence[tuple[int, int]]
    ) -> None:
        for partition, key, value in route_requests(events, positions, settings.partitions):
            await internal.send(key=key, value=value, partition=partition)
            estats.requests_forwarded += 1

    # -- forwarders of the other inputs ----------------------------------
    @app.agent(interactions_topic, name="tailguard.experiments.interactions")
    async def forward_interactions(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            valid: list[Interaction] = await decode_or_dead_letter(
                event, "interaction", topic=topics.deadletter, stats=stats, source=settings.source
            )
            if not valid:
                continue
            pos = [(event.message.partition, event.message.offset)] * len(valid)
            for partition, key, value in route_interactions(valid, pos, settings.partitions):
                await internal.send(key=key, value=value, partition=partition)
                estats.interactions_forwarded += 1

    @app.agent(evals_topic, name="tailguard.experiments.evals")
    async def forward_evals(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            scores: list[EvalScore] = await decode_or_dead_letter(
                event, "eval", topic=topics.deadletter, stats=stats, source=settings.source
            )
            for s in scores:
                msg = EvalMsg(s.experiment, s.variant, s.metric, float(s.value), s.ts_ms, s.n)
                await internal.send(
                    key=s.experiment.encode(),
                    value=_encode(msg),
                    partition=partition_of(s.experiment, settings.partitions),
                )
                estats.evals_forwarded += 1

    # -- the guard -------------------------------------------------------
    cache: dict[str, ExperimentState] = {}
    unit_caches: dict[tuple[str, int], dict[int, str]] = {}
    session_caches: dict[tuple[str, int], dict[int, str]] = {}

    def load(exp: str) -> ExperimentState | None:
        st = cache.get(exp)
        if st is not None:
            return st
        raw = states.get(exp.encode())
        if raw is None:
            return None
        try:
            st = ExperimentState.from_bytes(raw)
        except CorruptStateError as exc:
            estats.corrupt_states += 1
            app.log.error("tailguard: experiment state of %s discarded: %s", exp, exc)
            return None
        cache[exp] = st
        try:
            show(st, definition(st, exp))
        except ConfigError:  # a stored definition this version refuses: shown without it
            show(st, None)
        return st

    parsed: dict[tuple[str, int], ExperimentDef] = {}

    def definition(st: ExperimentState | None, exp: str) -> ExperimentDef | None:
        if st is not None and st.definition is not None:
            key = (exp, st.generation)
            if key not in parsed:
                parsed[key] = ExperimentDef.from_mapping(st.definition)
            return parsed[key]
        return definitions.get(exp)

    def books(st: ExperimentState) -> tuple[_Book, _Book]:
        prefix = st.experiment.encode() + _SEP + str(st.generation).encode() + _SEP
        ukey = (st.experiment, st.generation)
        return (
            _Book(units_table, prefix, unit_caches.setdefault(ukey, {})),
            _Book(sessions_table, prefix, session_caches.setdefault(ukey, {})),
        )

    def decision_records(
        d: Decision, defn: ExperimentDef, command_id: str | None = None
    ) -> list[tuple[str, bytes, dict[str, Any]]]:
        payload = release_payload(d, defn, group_of=stratum_of)
        note = audit_payload(d, payload["weights"], worker=settings.source)
        if command_id is not None:
            note["command_id"] = command_id
        estats.decisions += 1
        estats.rollbacks += d.decision == "rollback"
        key = d.experiment.encode()
        return [(releases, key, payload), (audit, key, note)]

    def judge(st: ExperimentState, defn: ExperimentDef) -> list[tuple[str, bytes, dict[str, Any]]]:
        records: list[tuple[str, bytes, dict[str, Any]]] = []
        for boundary in st.close_ready(defn, lateness):
            if st.status != "running":
                break
            estats.evaluations += 1
            d = decide(defn, evaluate(defn, st, boundary))
            if st.record(d):
                records += decision_records(d, defn)
        return records

    def control(
        msg: ControlMsg,
    ) -> tuple[list[tuple[str, bytes, dict[str, Any]]], ControlResult]:
        """Apply one operator command: the records to publish and the command's result."""
        estats.controls += 1
        exp = msg.experiment
        st = load(exp)
        records: list[tuple[str, bytes, dict[str, Any]]] = []
        ok, code, detail, result = True, "", "", {}
        if msg.action == "create":
            try:
                defn = ExperimentDef.from_mapping(msg.definition or {})
            except ConfigError as exc:
                ok, code, detail = False, "bad_args", str(exc)
            else:
                if st is not None and st.status == "running":
                    ok, code = False, "conflict"
                    detail = (
                        f"experiment {exp} exists and is running (generation {st.generation}); "
                        "stop it first"
                    )
                else:
                    gen = st.generation + 1 if st is not None else 1
                    st = ExperimentState(exp, definition=defn.to_mapping(), generation=gen)
                    cache[exp] = st
                    detail = f"experiment {exp} created (generation {gen})"
                    result = {"status": st.status, "generation": gen}
                    show(st, defn)
        elif st is None and exp not in definitions:
            ok, code = False, "not_found"
            detail = (
                f"no experiment {exp!r}: not created through the admin plane and not in the "
                "workers' experiments files"
            )
        else:
            if st is None:
                st = ExperimentState(exp)
                cache[exp] = st
            defn_ = definition(st, exp)
            assert defn_ is not None
            if msg.action == "stop":
                if st.status != "running":
                    ok, code = False, "conflict"
                    detail = f"experiment {exp} is already {st.status} (generation {st.generation})"
                else:
                    st.status = "stopped"
                    detail = f"experiment {exp} stopped"
                    result = {"status": st.status, "generation": st.generation}
                    show(st, defn_)
            elif msg.action == "rollback":
                if st.status != "running":
                    ok, code = False, "conflict"
                    detail = (
                        f"experiment {exp} is {st.status} (generation {st.generation}); nothing "
                        "to roll back"
                        + (
                            f": its rollback is {st.last.event_id}"
                            if st.last is not None and st.last.decision == "rollback"
                            else ""
                        )
                    )
                elif msg.arm is not None and msg.arm not in defn_.treatments:
                    ok, code = False, "bad_args"
                    detail = (
                        f"arm {msg.arm!r} is not a treatment of {exp}; its treatments: "
                        f"{', '.join(defn_.treatments)} (the control cannot be rolled back)"
                    )
                else:
                    d = manual_rollback(msg, st, defn_)
                    st.record(d)
                    records += decision_records(d, defn_, msg.command_id)
                    detail = f"rollback published ({d.event_id})"
                    result = {
                        "status": st.status,
                        "generation": st.generation,
                        "event_id": d.event_id,
                        "arm": d.arm,
                        "weights": dict(d.weights),
                    }
                    show(st, defn_)
            elif msg.action == "get":
                result = summary(st, defn_)
            else:
                ok, code, detail = False, "bad_args", f"unknown action {msg.action!r}"
        res = ControlResult(msg.command_id, msg.action, exp, msg.actor, ok, detail, result, code)
        (app.log.info if ok else app.log.warning)(
            "tailguard: experiment command %s %s %s: %s", msg.command_id, msg.action, exp, detail
        )
        return records, res

    def manual_rollback(msg: ControlMsg, st: ExperimentState, defn: ExperimentDef) -> Decision:
        at = st.closed_ms or st.watermark or msg.ts_ms
        planned = defn.weights
        if msg.arm is None:
            weights = {a: (1.0 if a == defn.control else 0.0) for a in defn.arm_names}
            arm = defn.treatments[0] if len(defn.treatments) == 1 else None
        else:
            kept = sum(w for a, w in planned.items() if a != msg.arm)
            weights = {a: (0.0 if a == msg.arm else w / kept) for a, w in planned.items()}
            arm = msg.arm
        return Decision(
            experiment=st.experiment,
            decision="rollback",
            arm=arm,
            reasons=[f"manual rollback by {msg.actor}" + (f": {msg.reason}" if msg.reason else "")],
            codes=["manual"],
            weights=weights,
            at_ms=at,
            evaluation=evaluate(defn, st, at) if st.total else None,
            actor=msg.actor,
        )

    def remembered(msg: ControlMsg) -> ControlResult | None:
        """The result of an earlier delivery of the same command (None: it is new)."""
        raw = commands_table.get(msg.experiment.encode())
        if raw is None:
            return None
        for command_id, wire in msgspec.msgpack.decode(raw):
            if command_id == msg.command_id:
                return ControlResult.from_wire(msg, wire)
        return None

    def remember(res: ControlResult) -> None:
        key = res.experiment.encode()
        raw = commands_table.get(key)
        held = [] if raw is None else msgspec.msgpack.decode(raw)
        held = [*held[-(COMMANDS_KEPT - 1) :], [res.command_id, res.to_wire()]]
        commands_table[key] = msgspec.msgpack.encode(held)

    async def report(res: ControlResult) -> None:
        for sink in api.sinks:
            await sink(res)

    def summary(st: ExperimentState, defn: ExperimentDef) -> dict[str, Any]:
        last = st.last
        return {
            "definition": defn.to_mapping(),
            "status": st.status,
            "generation": st.generation,
            "watermark_ms": st.watermark,
            "evaluated_until_ms": st.closed_ms,
            "arms": {
                a: {
                    "requests": st.arm(a).requests,
                    "units": st.arm(a).units,
                    "sessions": st.arm(a).sessions,
                }
                for a in defn.arm_names
            },
            "counters": dict(st.counters),
            "last_decision": None
            if last is None
            else {
                "decision": last.decision,
                "arm": last.arm,
                "event_id": last.event_id,
                "at_ms": last.at_ms,
            },
        }

    def read(exp: str) -> dict[str, Any] | None:
        st = load(exp)
        defn = definition(st, exp)
        if defn is None:
            return None
        return summary(st or ExperimentState(exp), defn)

    def listing() -> list[str]:
        held = {k.decode() for k in states.keys()}  # noqa: SIM118 - faust tables iterate partitions
        return sorted(held | set(definitions) | set(cache))

    api._reader, api._lister = read, listing

    def has_ratings(defn: ExperimentDef | None) -> bool:
        return defn is not None and any(g.metric == "hallucination_rate" for g in defn.guardrails)

    async def blind_feedback(msg: "IntMsg", partition: int) -> None:
        """Blind feedback on this partition: every running experiment of it with a
        hallucination guardrail takes the ratings of the requests it knows."""
        try:
            rows = ExperimentInteractions.from_wire(msg.cols)
        except ValueError as exc:
            estats.internal_errors += 1
            app.log.error("tailguard: bad blind feedback columns: %s", exc)
            return
        for exp in listing():
            if partition_of(exp, settings.partitions) != partition:
                continue
            st = load(exp)
            defn = definition(st, exp)
            if not has_ratings(defn) or (st is not None and st.status != "running"):
                continue
            assert defn is not None
            if st is None:
                st = ExperimentState(exp)
                cache[exp] = st
                show(st, defn)
            units, sessions = books(st)
            before = st.counters.get("ratings", 0)
            unknown = st.counters.get("interactions_unknown_arm", 0)
            st.absorb_interactions(
                defn, rows, units, sessions, units, stratum_of, source=BLIND_SOURCE
            )
            # feedback on requests of other experiments is not "unknown" here
            st.count(
                "blind_feedback_other", st.counters.get("interactions_unknown_arm", 0) - unknown
            )
            if unknown:
                st.counters["interactions_unknown_arm"] = unknown
            else:
                st.counters.pop("interactions_unknown_arm", None)
            if st.counters.get("ratings", 0) == before:
                continue
            records = judge(st, defn)
            if records:
                await send_all(records)
                show(st, defn)
            states[exp.encode()] = st.to_bytes()

    @app.agent(internal, name="tailguard.experiments")
    async def guard(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            estats.messages += 1
            try:
                msg = decode_internal(event.value)
            except ValueError as exc:
                estats.internal_errors += 1
                app.log.error("tailguard: skipping undecodable experiment record: %s", exc)
                continue
            records: list[tuple[str, bytes, dict[str, Any]]] = []
            if isinstance(msg, ControlMsg):
                held = remembered(msg)
                if held is not None:  # a re-delivery: the same answer, nothing applied twice
                    estats.controls_repeated += 1
                    await report(held)
                    continue
                records, res = control(msg)
                if records:
                    await send_all(records)  # delivered before the state that records them
                if msg.experiment in cache:
                    states[msg.experiment.encode()] = cache[msg.experiment].to_bytes()
                if msg.action != "get":
                    remember(res)
                await report(res)
                continue
            if isinstance(msg, IntMsg) and msg.experiment == BLIND:
                await blind_feedback(msg, event.message.partition)
                continue
            exp = msg.experiment
            st = load(exp)
            defn = definition(st, exp)
            if defn is None:
                estats.undefined += 1
                continue
            if st is None:
                st = ExperimentState(exp)
                cache[exp] = st
                show(st, defn)
            if st.status != "running":
                continue
            if isinstance(msg, ReqMsg):
                try:
                    cols = ExperimentRequests.from_wire(msg.cols)
                except ValueError as exc:
                    estats.internal_errors += 1
                    app.log.error("tailguard: bad experiment request columns: %s", exc)
                    continue
                units, _ = books(st)
                st.absorb_requests(defn, cols, units, units if has_ratings(defn) else None)
            elif isinstance(msg, IntMsg):
                try:
                    rows = ExperimentInteractions.from_wire(msg.cols)
                except ValueError as exc:
                    estats.internal_errors += 1
                    app.log.error("tailguard: bad experiment interaction columns: %s", exc)
                    continue
                units, sessions = books(st)
                st.absorb_interactions(defn, rows, units, sessions, units, stratum_of)
            else:
                st.absorb_eval(msg.variant, msg.metric, msg.ts_ms, msg.value, msg.n)
            records = judge(st, defn)
            if records:
                await send_all(records)  # delivered before the state that records them
                show(st, defn)
            states[exp.encode()] = st.to_bytes()

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        # The tables are the truth (written after every message): drop the caches
        # so an experiment that moved here is read from its restored table.
        cache.clear()
        unit_caches.clear()
        session_caches.clear()

    @app.timer(settings.stats_interval_s, name="tailguard.experiments.stats")  # type: ignore[untyped-decorator]
    async def log_stats() -> None:
        app.log.info("tailguard %s", estats.line())

    return ExperimentsPlane(
        api=api, forward=forward, definitions=definitions, stats=estats, agent=guard
    )
