"""Prompt agents: the registry every worker follows, and SLIs per prompt group.

::

    tailguard.prompts (compacted) ──▶ PromptFollower (thread, every worker)
      key: prompt_version                  │ decode; bad → tailguard.deadletter
                                           ▼
                               PromptRegistry ── PromptGrouper (embeddings)
                                           │ group_of(version)
    ingest ──forward──▶ tailguard.internal.prompts ──▶ prompt SLI agent
      rows (ts, version,   (key: service|model)              │
      outcome, ttft,                                         ├─▶ table tailguard-prompt-sli
      input part, offset)                                    └─▶ tailguard.prompt_sli

**Registry.** Like the control topic (:mod:`tailguard.agents.control`), the
registry is read whole by every worker, outside the consumer group, from its
beginning: records are applied in offset order, and the grouping
(:class:`~tailguard.streams.prompt_groups.PromptGrouper`) is deterministic, so
every worker holds the same groups with the same ids. :meth:`PromptFollower.start`
reads the topic to its end before the worker consumes anything; later records
are applied by the follower's thread as they arrive (embedding a prompt takes
well under a millisecond; the model loads once, ~1 s). A record that is not a
valid ``tailguard.prompt.v1`` (not JSON, a missing field, a key that is not its
``prompt_version``) goes to ``tailguard.deadletter`` and changes nothing. A
version is immutable: a second record of a known version is ignored, and a
tombstone does not remove a version from its group (deleting a version that
founded a group would regroup the versions that joined it on a worker that
starts after compaction — do not delete versions).

Other code asks ``pipeline.prompts.group_of(version)`` (thread-safe).

**Per-group SLIs.** The ingest agent hands every batch of valid events to
:meth:`PromptPlane.forward` (besides the A/B guard and the capacity agent):
events with a ``prompt_version`` (warm-up excluded) become compact rows,
judged against their series' SLO thresholds (the live SLOs of the worker,
:class:`~tailguard.agents.control.SloBook`), and are re-keyed by deployment
(``service|model``) onto an internal topic, so one partition owns all groups of
a deployment. The agent resolves each row's group *when it folds it*: a
version the registry does not know (yet) counts as its own group
``pg-<version>``. State per (service, model, group) is a
:class:`~tailguard.streams.prompt_sli.GroupSli` in the RocksDB table
``tailguard-prompt-sli``, written once per input message and key (every table
write is a changelog record).
A window's final snapshot is published when event time closes it, before its
state is written (a crash re-publishes it, with the same ``event_id``, never
loses it); provisional snapshots of the open windows of the groups that
changed are published every ``snapshot_interval_s``. Replays count once:
each row carries the position ``(partition, offset)`` of the input message
its event came from, and each group state keeps the highest input offset it
applied per input partition (``GroupSli.applied``, stored with the state), so
a batch the ingest agent re-forwards after a crash, or an internal message
re-read after its state was written but before its offset was committed, is
skipped by every group that already holds it. A row a replay resolves to
another group than the first time (its version registered in between) is
counted in both.

Env: ``TAILGUARD_PROMPT_THRESHOLD`` (cosine similarity, default
:data:`~tailguard.streams.prompt_groups.DEFAULT_THRESHOLD`),
``TAILGUARD_PROMPT_WINDOW_S`` (window of the per-group SLIs, default 60);
the allowed lateness is the worker's (``--lateness-ms``).
"""

import asyncio
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import faust
import msgspec
from tailguard.agents.internal import partition_for
from tailguard.agents.outputs import OutputError, Outputs
from tailguard.agents.publish import frame
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import internal_topic, precreate_topics
from tailguard.schemas import DeadLetterReason, InferenceEvent, Reject, dead_letter
from tailguard.schemas.prompts import PROMPT_SLI_SCHEMA, PromptRecord, prompt_or_reject
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.prompt_groups import GROUP_PREFIX, PromptGrouper
from tailguard.streams.prompt_sli import (
    CANCELLED,
    ERROR,
    GOOD,
    SLOW,
    GroupSli,
    Outcome,
    WindowTally,
)
from tailguard.streams.sli import Thresholds, tpot_ms

from tailguard import catalogue as cat

__all__ = [
    "PROMPT_SLI_TABLE",
    "Folded",
    "PromptFollower",
    "PromptPlane",
    "PromptRegistry",
    "PromptStats",
    "Row",
    "fold_rows",
    "group_snapshot",
    "outcome_of",
    "register_prompts",
]

log = logging.getLogger("tailguard.prompts")

PROMPT_SLI_TABLE = "tailguard-prompt-sli"
_ERRORS = frozenset({"error", "timeout", "rejected"})

_SEP = "\x1f"


class Row(msgspec.Struct, array_like=True, frozen=True):
    """One request on ``tailguard.internal.prompts``:
    ``[ts_ms, prompt_version, outcome, ttft_ms, part, offset]``.

    ``part``/``offset`` are the input position of the request's event; rows of
    an older forwarder lack them and decode with -1 (counted, never deduplicated).
    """

    ts_ms: int
    version: str
    outcome: int
    ttft_ms: float | None
    part: int = -1
    offset: int = -1


_encode = msgspec.json.Encoder().encode
_decode_rows = msgspec.json.Decoder(list[Row]).decode


@dataclass(slots=True)
class PromptStats:
    """Counters of the prompt agents (logged with the worker's stats line)."""

    registered: int = 0
    rejected: int = 0
    ignored: int = 0
    rows: int = 0
    unregistered_rows: int = 0
    late: int = 0
    published: int = 0
    #: Rows skipped because their group state already held their input message.
    replayed: int = 0

    def line(self) -> str:
        return (
            f"prompts_registered={self.registered} prompts_rejected={self.rejected} "
            f"prompt_rows={self.rows} prompt_rows_unregistered={self.unregistered_rows} "
            f"prompt_late={self.late} prompt_rows_replayed={self.replayed} "
            f"prompt_sli_published={self.published}"
        )


class PromptRegistry:
    """The registry's versions and their groups (thread-safe)."""

    def __init__(
        self,
        grouper: PromptGrouper,
        stats: PromptStats | None = None,
        on_reject: Callable[[Reject, bytes | None, int], None] | None = None,
    ) -> None:
        self.grouper = grouper
        self.stats = stats or PromptStats()
        self.applied_offset = -1
        self.records: dict[str, PromptRecord] = {}
        self._lock = threading.Lock()
        self._on_reject = on_reject

    def apply(self, key: bytes | None, raw: bytes | None, offset: int) -> str | None:
        """Apply one registry record; returns the version's group, None when not applied."""
        self.applied_offset = max(self.applied_offset, offset)
        if raw is None:
            self.stats.ignored += 1  # a tombstone: versions are never removed (module doc)
            return None
        record = prompt_or_reject(raw)
        if isinstance(record, Reject):
            self._reject(record, raw, offset)
            return None
        if key is not None and key.decode("utf-8", "replace") != record.prompt_version:
            detail = f"key {key!r} is not the record's prompt_version {record.prompt_version!r}"
            self._reject(Reject(DeadLetterReason.INCONSISTENT, detail), raw, offset)
            return None
        if record.text is not None:
            self.grouper.warm()  # the first load takes ~1 s: not while holding the lock
        with self._lock:
            if record.prompt_version in self.grouper:
                self.stats.ignored += 1
                return self.grouper.group_of(record.prompt_version)
            group = self.grouper.add(record.prompt_version, record.text, record.parent_version)
            self.records[record.prompt_version] = record
        self.stats.registered += 1
        return group

    def _reject(self, reject: Reject, raw: bytes, offset: int) -> None:
        self.stats.rejected += 1
        log.warning("tailguard: prompt record at offset %d rejected: %s", offset, reject.detail)
        if self._on_reject is not None:
            self._on_reject(reject, raw, offset)

    def group_of(self, version: str) -> str | None:
        """The group of a registered version; None when the registry does not hold it."""
        with self._lock:
            return self.grouper.group_of(version)

    def members(self, group: str) -> list[str]:
        with self._lock:
            return self.grouper.members(group)

    def groups(self) -> dict[str, list[str]]:
        with self._lock:
            return self.grouper.groups()


class PromptFollower:
    """Follows ``tailguard.prompts`` from its beginning, outside the consumer group."""

    def __init__(self, broker: str, topic: str, registry: PromptRegistry) -> None:
        self._broker = broker
        self._topic = topic
        self._registry = registry
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None

    def start(self, catch_up_s: float = 30.0) -> None:
        """Read the registry to its end (at most ``catch_up_s``), then follow it in a thread."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

        self._consumer = consumer = Consumer(
            {
                "bootstrap.servers": self._broker,
                "group.id": "tailguard-prompts",  # never joined: the partition is assigned
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "log_level": 3,
            }
        )
        try:
            topics = consumer.list_topics(timeout=10).topics
        except KafkaException as exc:
            log.error("tailguard: prompt registry not readable (%s); no prompt groups", exc)
            return
        if self._topic not in topics:
            log.error(
                "tailguard: prompt registry %s does not exist (run `tailguard topics create`): "
                "every prompt version counts as its own group",
                self._topic,
            )
            return
        tp = TopicPartition(self._topic, 0)
        consumer.assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])
        try:
            _low, high = consumer.get_watermark_offsets(tp, timeout=10)
        except KafkaException as exc:
            log.error("tailguard: prompt registry end unknown (%s); not waiting for it", exc)
            high = 0
        deadline = time.monotonic() + catch_up_s
        while high > 0 and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                self._take(msg)
            if consumer.position([tp])[0].offset >= high:  # compaction leaves gaps
                break
        log.info(
            "tailguard: prompt registry loaded: %d versions in %d groups (offset %d of %d)",
            len(self._registry.grouper),
            len(self._registry.grouper.groups()),
            self._registry.applied_offset,
            high,
        )
        self._thread = threading.Thread(target=self._run, name="tailguard-prompts", daemon=True)
        self._thread.start()

    def _take(self, msg: Any) -> None:
        if msg.error() is not None:
            return
        try:
            self._registry.apply(msg.key(), msg.value(), msg.offset())
        except Exception:  # a record must never stop the follower; the log says which
            log.exception("tailguard: prompt record at offset %d not applied", msg.offset())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for msg in self._consumer.consume(100, timeout=0.5):
                    self._take(msg)
            except Exception as exc:  # the follower must outlive broker trouble
                log.warning("tailguard: prompt follower: %s", exc)
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def outcome_of(ev: InferenceEvent, t: Thresholds) -> Outcome:
    """GOOD, SLOW, ERROR or CANCELLED for one request (see :mod:`tailguard.streams.prompt_sli`)."""
    if ev.status == "cancelled":
        return CANCELLED
    if ev.status in _ERRORS:
        return ERROR
    if ev.ttft_ms is not None and ev.ttft_ms > t.ttft_ms:
        return SLOW
    tpot = tpot_ms(ev.e2e_ms, ev.ttft_ms, ev.output_tokens)
    if tpot is not None and tpot > t.itl_ms:
        return SLOW
    if t.e2e_ms is not None and ev.e2e_ms > t.e2e_ms:
        return SLOW
    return GOOD


def _event_id(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:32]


def group_snapshot(
    service: str,
    model: str,
    group: str,
    members: Sequence[str],
    window: WindowTally,
    state: GroupSli,
    *,
    final: bool,
    now_ms: int,
) -> dict[str, Any]:
    """The ``tailguard.prompt_sli.v1`` record of one window of one group."""
    s = window.tally.summary()
    total = state.total
    return {
        "schema": PROMPT_SLI_SCHEMA,
        "event_id": _event_id(service, model, group, window.start_ms, final, s["count"]),
        "ts_ms": now_ms,
        "service": service,
        "model": model,
        "prompt_group": group,
        "members": list(members),
        "window_s": state.window_ms / 1000.0,
        "window_start_ms": window.start_ms,
        "window_end_ms": window.start_ms + state.window_ms,
        "final": final,
        **s,
        "total": {
            "count": total.requests,
            "bad": total.bad,
            "slo_compliance": total.slo_compliance,
            "late": state.late,
        },
    }


@dataclass(slots=True)
class Folded:
    """What one message of rows did to a deployment's groups (nothing written yet)."""

    #: group → its state after the rows (every group loaded: touched or with open windows).
    states: dict[str, GroupSli]
    #: (group, window, state) of each window that closed, oldest first per group.
    closed: list[tuple[str, WindowTally, GroupSli]]
    #: The deployment record to write: (watermark, groups with open windows).
    meta: tuple[int, list[str]]


def fold_rows(
    table: Any,
    deployment: str,
    rows: Sequence[Row],
    group_of: Callable[[str], str | None],
    load: Callable[[bytes], GroupSli],
    stats: PromptStats,
) -> Folded:
    """Fold one message's rows into the groups of ``deployment`` (``service|model``).

    Reads the deployment record and the group states from ``table`` (``load``
    turns a key into a state, new when absent); the caller publishes the
    closed windows, then writes ``states`` and ``meta``. Event time is the
    deployment's: every group with an open window is advanced to the newest
    ``ts_ms`` of the deployment, so a quiet group's window closes too. Rows a
    group state already applied (by input position) are skipped; they still
    move event time, which they moved the first time too.
    """
    watermark, open_groups = _load_meta(table.get(f"{deployment}{_SEP}".encode()))
    start = watermark
    states: dict[str, GroupSli] = {}
    closed: list[tuple[str, WindowTally, GroupSli]] = []

    def state_of(group: str) -> GroupSli:
        st = states.get(group)
        if st is None:
            st = states[group] = load(f"{deployment}{_SEP}{group}".encode())
            closed.extend((group, w, st) for w in st.advance(start))
        return st

    by_group: dict[str, list[Row]] = {}
    for row in rows:
        group = group_of(row.version)
        if group is None:
            stats.unregistered_rows += 1
            group = GROUP_PREFIX + row.version
        by_group.setdefault(group, []).append(row)
        watermark = max(watermark, row.ts_ms)
    for group, group_rows in by_group.items():
        st = state_of(group)
        late, counted = st.late, st.total.requests
        closed.extend(
            (group, w, st)
            for w in st.add_rows(
                [(r.ts_ms, r.version, r.outcome, r.ttft_ms) for r in group_rows],
                [(r.part, r.offset) for r in group_rows],
            )
        )
        stats.late += st.late - late
        stats.replayed += len(group_rows) - (st.total.requests - counted)
    for group in open_groups:
        state_of(group)
    for group, st in states.items():
        closed.extend((group, w, st) for w in st.advance(watermark))
    stats.rows += len(rows)
    still_open = sorted(g for g, st in states.items() if st.open)
    return Folded(states, closed, (watermark, still_open))


@dataclass(slots=True)
class PromptPlane:
    """What :func:`register_prompts` returns; ``pipeline.prompts``."""

    registry: PromptRegistry
    follower: PromptFollower
    forward: Any
    stats: PromptStats
    agent: Any = None
    #: States changed since the last provisional snapshot: key → (service, model, group, state).
    dirty: dict[str, tuple[str, str, str, GroupSli]] = field(default_factory=dict)

    def group_of(self, version: str) -> str | None:
        """The prompt group of ``version``; None when the registry does not hold it."""
        return self.registry.group_of(version)

    def start(self) -> None:
        self.follower.start()

    def stop(self) -> None:
        self.follower.stop()


def _window_ms() -> int:
    raw = os.environ.get("TAILGUARD_PROMPT_WINDOW_S", "60")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        msg = f"TAILGUARD_PROMPT_WINDOW_S must be a positive number of seconds, got {raw!r}"
        raise ValueError(msg)
    return int(value * 1000)


def register_prompts(
    app: faust.App,
    settings: Settings,
    stats: WorkerStats,
    *,
    thresholds: Callable[[str], Thresholds],
    grouper: PromptGrouper | None = None,
) -> PromptPlane:
    """Declare the registry follower, the internal topic, the table and the SLI agent.

    ``thresholds(series_key)`` gives the live SLO thresholds of a series
    (``SloBook.thresholds``).
    """
    from tailguard.prompts import prompt_threshold

    pstats = PromptStats()
    outputs = Outputs(settings.broker)
    deadletter_topic = settings.topic_prefix + cat.DEADLETTER
    registry_topic = settings.topic_prefix + cat.PROMPTS
    out_topic = settings.topic_prefix + cat.PROMPT_SLI
    internal_name = settings.topic_prefix + cat.INTERNAL_PROMPTS
    window_ms = _window_ms()

    def reject(rej: Reject, raw: bytes | None, offset: int) -> None:
        record = dead_letter(
            rej, raw, topic=registry_topic, partition=0, offset=offset, now_ms=_now_ms()
        )
        stats.deadletters[str(rej.reason)] += 1
        value, headers = frame(msgspec.to_builtins(record), source=settings.source)
        outputs.send(deadletter_topic, str(offset).encode(), value, headers)

    registry = PromptRegistry(grouper or PromptGrouper(prompt_threshold()), pstats, reject)
    follower = PromptFollower(settings.broker, registry_topic, registry)

    internal = internal_topic(app, settings, internal_name)
    precreate_topics(settings, [internal_name], [PROMPT_SLI_TABLE])
    table = app.Table(
        PROMPT_SLI_TABLE,
        default=None,
        partitions=settings.partitions,
        key_type=bytes,
        value_type=bytes,
        options=settings.rocksdb_options(),
        help="SLI windows per (service, model, prompt group)",
    )

    async def forward(
        events: Sequence[InferenceEvent], positions: Sequence[tuple[int, int]]
    ) -> None:
        rows: dict[str, list[Row]] = {}
        limits: dict[str, Thresholds] = {}
        for ev, (part, offset) in zip(events, positions, strict=True):
            if not ev.prompt_version or ev.warmup:
                continue
            series = f"{ev.service}|{ev.model}|{ev.variant}|{ev.tenant}"
            t = limits.get(series)
            if t is None:
                t = limits[series] = thresholds(series)
            ttft = None if ev.ttft_ms is None else float(ev.ttft_ms)
            row = Row(ev.ts_ms, ev.prompt_version, outcome_of(ev, t), ttft, part, offset)
            rows.setdefault(f"{ev.service}|{ev.model}", []).append(row)
        for key, batch in rows.items():
            await internal.send(
                key=key.encode(),
                value=_encode(batch),
                partition=partition_for(key, settings.partitions),
            )

    plane = PromptPlane(registry, follower, forward, pstats)

    def load(key: bytes) -> GroupSli:
        raw = table.get(key)
        if raw is not None:
            try:
                return GroupSli.from_bytes(raw)
            except CorruptStateError as exc:
                app.log.error("tailguard: prompt SLI state %r discarded: %s", key, exc)
        return GroupSli(window_ms, settings.allowed_lateness_ms)

    async def flush() -> None:
        while True:
            try:
                await outputs.flush(timeout_s=30.0)
                return
            except OutputError as exc:
                app.log.warning("tailguard: prompt SLI records not delivered yet: %s", exc)
                await asyncio.sleep(1.0)

    def publish(
        service: str, model: str, group: str, w: WindowTally, st: GroupSli, final: bool
    ) -> None:
        members = registry.members(group) or [group.removeprefix(GROUP_PREFIX)]
        payload = group_snapshot(
            service, model, group, members, w, st, final=final, now_ms=_now_ms()
        )
        value, headers = frame(payload, source=settings.source)
        outputs.send(out_topic, f"{service}|{model}|{group}".encode(), value, headers)
        pstats.published += 1

    @app.agent(internal, name="tailguard.prompt_sli")
    async def prompt_sli(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            deployment = (event.key or b"").decode()
            service, _, model = deployment.partition("|")
            try:
                batch = _decode_rows(event.value)
            except msgspec.DecodeError as exc:  # written by our own forwarder: a bug
                app.log.error("tailguard: undecodable prompt rows on %s: %s", deployment, exc)
                continue
            folded = fold_rows(table, deployment, batch, registry.group_of, load, pstats)
            for group, window, st in folded.closed:
                publish(service, model, group, window, st, True)
            if folded.closed:
                await flush()  # final snapshots out before the state that closed them
            for group, st in folded.states.items():
                key = f"{deployment}{_SEP}{group}"
                table[key.encode()] = st.to_bytes()
                plane.dirty[key] = (service, model, group, st)
            table[f"{deployment}{_SEP}".encode()] = _encode_meta(folded.meta)

    plane.agent = prompt_sli

    async def provisional() -> None:
        dirty, plane.dirty = plane.dirty, {}
        for service, model, group, st in dirty.values():
            for w in list(st.open.values()):
                publish(service, model, group, w, st, False)
        if dirty:
            await flush()

    if settings.snapshot_interval_s > 0:
        app.timer(settings.snapshot_interval_s, name="tailguard.prompt_sli.snapshots")(provisional)

    @app.timer(settings.stats_interval_s, name="tailguard.prompts.stats")  # type: ignore[untyped-decorator]
    async def log_prompt_stats() -> None:
        app.log.info("tailguard %s", pstats.line())

    return plane


# The deployment record (key ``service|model␟``): its event-time watermark and the
# groups that have open windows, so a quiet group's last window closes too.
_encode_meta = msgspec.msgpack.Encoder().encode
_decode_meta = msgspec.msgpack.Decoder(tuple[int, list[str]]).decode


def _load_meta(raw: bytes | None) -> tuple[int, list[str]]:
    if raw is None:
        return -1, []
    try:
        return _decode_meta(raw)
    except msgspec.DecodeError as exc:
        log.error("tailguard: prompt SLI deployment record discarded: %s", exc)
        return -1, []


def _now_ms() -> int:
    return int(time.time() * 1000)
