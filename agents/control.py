"""Worker-wide admin state: the compacted control topic, applied by every worker.

The admin agent runs on one worker (the owner of the single ``tailguard.admin``
partition), but what its commands change — SLOs, silences, breach acks, key
retirements — must reach every worker, survive restarts and agree everywhere.
So the admin agent does not change state itself: it writes the resulting
*state* to ``tailguard.internal.control`` (one partition, compacted, no
time-based deletion), one record per thing::

    key                      value (JSON; null = deleted)
    slos                     {"overrides": {name: full SLO definition}} — every admin
                             override at once, so a change of several SLOs (thresholds
                             kept in step) applies atomically
    silence/<silence_id>     a silence (matchers, start, end, who, why)
    ack/<breach_id>          who acknowledged a breach, when, note
    key/<key_id>             {"retired_ms": …} — a rotated or revoked key
    keys/reload              {"at_ms": …} — every worker re-reads its keys file

Every worker follows the whole topic from its beginning with a small
confluent-kafka consumer outside the consumer group (:class:`ControlFollower`;
a faust ``GlobalTable`` stopped a crash-restarted worker from consuming, see
:mod:`tailguard.agents.gpu`), and applies each record on the event loop, in
offset order, between agent batches: SLO changes swap the live SLO list the
breach engine and the series store read (:class:`SloBook`) and re-resolve the
thresholds of the live series. Compaction keeps the latest value per key, so
a starting worker reads the whole current state before it starts consuming
(:meth:`ControlFollower.start` catches up synchronously).

The admin agent waits until *its own* worker has applied a record before it
replies (so the next command sees it); other workers apply it within their
poll interval (about half a second while the broker is healthy). A worker
that is assigned partitions first applies the control topic up to its end
(:meth:`ControlFollower.sync`), so a series that changes owner is never
judged by SLOs older than the ones its previous owner held.

The same follower also keeps :class:`BreachView`, the open breaches of the
whole deployment read from ``tailguard.breaches`` (every partition, from the
beginning): ``breach list`` and ``breach ack`` are answered from it on
whichever worker runs the admin agent.
"""

import asyncio
import collections
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tailguard.streams.burn import SloSpec, applicable, thresholds_for
from tailguard.streams.errors import ConfigError
from tailguard.streams.sli import Thresholds

from tailguard.admin.silences import Silence
from tailguard.admin.slos import merged, slo_from_dict

__all__ = ["BreachView", "ControlFollower", "ControlState", "SloBook"]

log = logging.getLogger("tailguard.control")


class SloBook:
    """The live SLOs of a worker: base definitions with admin overrides on top.

    ``specs`` is one list object, shared with :class:`~tailguard.agents.breaches.BreachEngine`
    (its ``slos``) and changed in place; ``version`` counts the changes (the
    SLI agent re-resolves a series' SLOs when it moves).
    """

    def __init__(self, base: Sequence[SloSpec]) -> None:
        self.base = tuple(base)
        self.specs: list[SloSpec] = list(base)
        self.overrides: dict[str, SloSpec] = {}
        self.version = 0
        self._warned: set[str] = set()

    def set_overrides(self, overrides: Mapping[str, SloSpec]) -> None:
        """Replace every admin override at once (one version step)."""
        self.overrides = dict(overrides)
        self.specs[:] = merged(self.base, self.overrides)
        self.version += 1

    def thresholds(self, key: str) -> Thresholds:
        """Ingest thresholds of a series key (``service|model|variant|tenant``); never raises.

        Overrides are checked for conflicts before they are accepted, but a
        series can still meet two SLOs that disagree (selectors the check
        could not tell apart): then the base SLOs' thresholds are used and the
        problem is logged once per series.
        """
        service, model, variant, tenant = key.split("|", 3)
        try:
            return thresholds_for(applicable(self.specs, service, model, variant, tenant))
        except ConfigError as exc:
            if key not in self._warned:
                self._warned.add(key)
                log.error(
                    "tailguard: SLO thresholds for %s conflict (%s); using the base", key, exc
                )
        try:
            return thresholds_for(applicable(self.base, service, model, variant, tenant))
        except ConfigError:
            return Thresholds()


class BreachView:
    """Open breaches of every series, from ``tailguard.breaches`` (thread-safe)."""

    def __init__(self) -> None:
        self._open: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.records = 0

    def offer(self, raw: bytes) -> None:
        try:
            record = json.loads(raw)
        except ValueError:
            return
        if not isinstance(record, dict) or not isinstance(record.get("breach_id"), str):
            return
        self.records += 1
        with self._lock:
            if record.get("state") == "resolved":
                self._open.pop(record["breach_id"], None)
                return
            held = self._open.get(record["breach_id"])
            if held is not None and int(held.get("seq") or 0) > int(record.get("seq") or 0):
                return
            self._open[record["breach_id"]] = {
                k: record.get(k)
                for k in (
                    "breach_id",
                    "state",
                    "seq",
                    "kind",
                    "severity",
                    "slo",
                    "series",
                    "at_ms",
                    "opened_ms",
                    "reason",
                    "burn_rates",
                    "budget_remaining",
                    "silenced",
                    "silence_id",
                )
            }

    def get(self, breach_id: str) -> dict[str, Any] | None:
        with self._lock:
            held = self._open.get(breach_id)
            return None if held is None else dict(held)

    def open(self) -> list[dict[str, Any]]:
        with self._lock:
            items = [dict(v) for v in self._open.values()]
        return sorted(items, key=lambda b: (b.get("opened_ms") or 0, b["breach_id"]))


class ControlState:
    """What the control topic says, applied in offset order (on the event loop only)."""

    def __init__(
        self,
        book: SloBook,
        *,
        on_slos: Callable[[], None] | None = None,
        on_key: Callable[[str, int | None], None] | None = None,
        on_reload: Callable[[], None] | None = None,
    ) -> None:
        self.book = book
        self.silences: dict[str, Silence] = {}
        self.acks: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, dict[str, Any]] = {}
        self.applied_offset = -1
        self._offsets: dict[str, int] = {}
        self._on_slos = on_slos
        self._on_key = on_key
        self._on_reload = on_reload

    def apply(self, key: str, value: Mapping[str, Any] | None, offset: int) -> None:
        """Apply one record; an older record of a key already applied is ignored."""
        self.applied_offset = max(self.applied_offset, offset)
        if self._offsets.get(key, -1) >= offset:
            return
        self._offsets[key] = offset
        kind, _, name = key.partition("/")
        try:
            if kind == "slos" and not name:
                given = {} if value is None else dict(value.get("overrides") or {})
                specs = {str(n): slo_from_dict(d) for n, d in given.items()}
                self.book.set_overrides(specs)
                if self._on_slos is not None:
                    self._on_slos()
                log.info(
                    "tailguard: SLOs changed (version %d, overrides %s, control offset %d)",
                    self.book.version,
                    sorted(specs),
                    offset,
                )
            elif kind == "silence":
                if value is None:
                    self.silences.pop(name, None)
                else:
                    self.silences[name] = Silence.from_dict(value)
            elif kind == "ack":
                if value is None:
                    self.acks.pop(name, None)
                else:
                    self.acks[name] = dict(value)
            elif kind == "key":
                retired = None if value is None else value.get("retired_ms")
                if value is None:
                    self.keys.pop(name, None)
                else:
                    self.keys[name] = dict(value)
                if self._on_key is not None:
                    self._on_key(name, None if retired is None else int(retired))
            elif kind == "keys" and name == "reload":
                if value is not None and self._on_reload is not None:
                    self._on_reload()
            else:
                log.warning("tailguard: ignoring control record with unknown key %r", key)
        except (ConfigError, KeyError, TypeError, ValueError) as exc:
            # A record this worker cannot use must not stop the follower (a newer
            # tailguard may have written it): keep the previous state, say so.
            log.error("tailguard: control record %r at offset %d ignored: %s", key, offset, exc)

    def active_silences(self, now_ms: int) -> list[Silence]:
        return sorted(
            (s for s in self.silences.values() if s.active_at(now_ms)),
            key=lambda s: (s.ends_ms, s.silence_id),
        )


def _decode(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    value = json.loads(raw)
    if not isinstance(value, dict):
        msg = "a control value is a JSON object"
        raise ValueError(msg)
    return value


class ControlFollower:
    """Follows the control topic (and the breaches topic) outside the consumer group.

    A thread consumes; records are handed to the event loop (:meth:`drain`,
    called by a timer) so that state changes never race the agents. At
    :meth:`start`, before the worker consumes anything, the control topic is
    read up to its end and applied synchronously.
    """

    def __init__(
        self,
        broker: str,
        control_topic: str,
        breaches_topic: str,
        state: ControlState,
        view: BreachView,
    ) -> None:
        self._broker = broker
        self._control = control_topic
        self._breaches = breaches_topic
        self._state = state
        self._view = view
        self._queue: collections.deque[tuple[str, dict[str, Any] | None, int]] = collections.deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._meta: Any = None

    # -- lifecycle

    def start(self, catch_up_s: float = 20.0) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

        self._consumer = consumer = Consumer(
            {
                "bootstrap.servers": self._broker,
                "group.id": "tailguard-control",  # never joined: partitions are assigned
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "log_level": 3,
            }
        )
        wanted = [TopicPartition(self._control, 0, OFFSET_BEGINNING)]
        try:
            meta = consumer.list_topics(timeout=10).topics
        except KafkaException as exc:
            log.error("tailguard: control topic not readable yet (%s); following it later", exc)
            meta = {}
        if self._control not in meta:
            log.error(
                "tailguard: control topic %s does not exist (run `tailguard topics create`): "
                "admin changes will not reach this worker",
                self._control,
            )
            wanted = []
        breaches = meta.get(self._breaches)
        if breaches is not None and breaches.partitions:
            wanted += [
                TopicPartition(self._breaches, p, OFFSET_BEGINNING) for p in breaches.partitions
            ]
        consumer.assign(wanted)
        if any(tp.topic == self._control for tp in wanted):
            self._catch_up(consumer, catch_up_s)
        self._thread = threading.Thread(target=self._run, name="tailguard-control", daemon=True)
        self._thread.start()

    def _catch_up(self, consumer: Any, timeout_s: float) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(self._control, 0), timeout=10
            )
        except KafkaException as exc:
            log.error("tailguard: control topic end unknown (%s); not waiting for it", exc)
            return
        deadline = time.monotonic() + timeout_s
        while self._state.applied_offset < high - 1 and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                self._take(msg)
            self.drain()
            # Compaction leaves gaps: the position, not the last offset seen, says "done".
            pos = consumer.position([TopicPartition(self._control, 0)])[0].offset
            if pos >= high:
                break
        self.drain()
        log.info(
            "tailguard: control state loaded (offset %d of %d)", self._state.applied_offset, high
        )

    def sync(self, timeout_s: float = 10.0) -> bool:
        """Apply the control topic up to its current end, *blocking* (at most ``timeout_s``).

        Called when partitions are assigned: a worker that takes over a series
        must apply the latest SLOs before it folds a single event of it. It
        blocks the event loop on purpose — faust resumes the new partitions
        from another task once table recovery is done, which then cannot run
        before this returns. Returns whether the end was reached.
        """
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        if self._thread is None:
            return False
        if self._meta is None:
            self._meta = Consumer(
                {
                    "bootstrap.servers": self._broker,
                    "group.id": "tailguard-control-meta",
                    "enable.auto.commit": False,
                    "log_level": 3,
                }
            )
        try:
            _low, high = self._meta.get_watermark_offsets(
                TopicPartition(self._control, 0), timeout=min(5.0, timeout_s), cached=False
            )
        except KafkaException as exc:
            log.warning("tailguard: control topic end unknown at assignment: %s", exc)
            return False
        deadline = time.monotonic() + timeout_s
        while True:
            self.drain()
            if self._state.applied_offset >= high - 1:
                return True
            if time.monotonic() > deadline:
                log.warning(
                    "tailguard: control topic not applied to its end (%d of %d) at assignment",
                    self._state.applied_offset,
                    high,
                )
                return False
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        if self._meta is not None:
            self._meta.close()
            self._meta = None
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- consuming

    def _take(self, msg: Any) -> None:
        if msg.error() is not None:
            return
        if msg.topic() == self._breaches:
            if msg.value():
                self._view.offer(msg.value())
            return
        key = msg.key()
        if not key:
            return
        try:
            value = _decode(msg.value())
        except ValueError as exc:
            log.error("tailguard: control record at offset %d is not JSON: %s", msg.offset(), exc)
            return
        self._queue.append((key.decode("utf-8", "replace"), value, msg.offset()))

    def _run(self) -> None:
        consumer = self._consumer
        while not self._stop.is_set():
            try:
                for msg in consumer.consume(500, timeout=0.5):
                    self._take(msg)
            except Exception as exc:  # the follower must outlive broker trouble
                log.warning("tailguard: control follower: %s", exc)
                self._stop.wait(1.0)

    def drain(self) -> int:
        """Apply what the thread received, in order (call on the event loop)."""
        n = 0
        while self._queue:
            key, value, offset = self._queue.popleft()
            self._state.apply(key, value, offset)
            n += 1
        return n

    async def wait_applied(self, offset: int, timeout_s: float = 10.0) -> bool:
        """Wait until the control record at ``offset`` has been applied here."""
        deadline = time.monotonic() + timeout_s
        while self._state.applied_offset < offset:
            self.drain()
            if self._state.applied_offset >= offset:
                break
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True
