"""The SLI agent's output producer: librdkafka (confluent-kafka) instead of aiokafka.

A worker publishes a snapshot per series and window every closed minute:
tens of thousands of records a minute for 10,000 series. Through faust's
``Topic.send`` every record costs tens of microseconds of Python (faust
buffers, aiokafka batching and framing); librdkafka queues it in C for about
a microsecond. The series tables' changelog records go this way too, in bulk
(:mod:`tailguard.agents.bulk`); other table writes and dead letters stay on
faust's producer.

Delivery is checked at each checkpoint (:meth:`Outputs.flush`): the SLI
agent acknowledges its input only after everything it published for that
input was acknowledged by the broker. A checkpoint waits for what was sent
before it began (:meth:`Outputs.mark`, ``flush(upto=…)``), not for what the
agents send while it waits: under steady load the queue is never empty.
"""

import asyncio
import logging
import threading
import time
from typing import Any

from confluent_kafka import KafkaException, Producer

__all__ = ["Mark", "OutputError", "Outputs"]

log = logging.getLogger(__name__)


class OutputError(RuntimeError):
    """Published records could not be delivered."""


class Mark:
    """The records sent between two :meth:`Outputs.mark` calls: how many the broker
    has not confirmed yet. Its call is their delivery report (confluent-kafka
    calls it from ``poll``, on the thread that polls)."""

    __slots__ = ("failed", "pending")

    def __init__(self, failed: list[str]) -> None:
        self.pending = 0
        self.failed = failed

    def __call__(self, err: Any, msg: Any) -> None:
        self.pending -= 1
        if err is not None:
            self.failed.append(f"{msg.topic()}: {err}")


class Outputs:
    """Fire-and-forget sends, delivery confirmed in bulk by :meth:`flush`."""

    def __init__(self, broker: str, *, linger_ms: int = 20) -> None:
        self._producer = Producer(
            {
                "bootstrap.servers": broker,
                "linger.ms": linger_ms,
                "compression.type": "lz4",
                "enable.idempotence": True,
                "message.max.bytes": 8_000_000,
                "queue.buffering.max.messages": 1_000_000,
                "queue.buffering.max.kbytes": 512 * 1024,
            }
        )
        self._lock = threading.Lock()
        self._failed: list[str] = []
        #: Records sent since each mark not yet reported, oldest first; the last
        #: takes what is sent now.
        self._marks: list[Mark] = [Mark(self._failed)]
        self.sent = 0

    def mark(self) -> Mark:
        """Everything sent so far, to :meth:`flush` up to while more is sent."""
        done = self._marks[-1]
        self._marks.append(Mark(self._failed))
        return done

    def send(self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        report = self._marks[-1]
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=report
                )
                break
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let deliveries drain
        report.pending += 1
        self.sent += 1
        if self.sent % 1000 == 0:
            self._producer.poll(0)

    def send_records(
        self,
        topic: str,
        partition: int,
        records: list[tuple[bytes, bytes | None]],
        newest: list[int],
    ) -> None:
        """Queue ``records`` (``value`` None: a tombstone) on one partition, in order;
        once delivered, ``newest[0]`` holds the offset of the last one (or a later
        one of an earlier call). Delivery is confirmed by :meth:`flush`."""
        if not records:
            return

        report = self._marks[-1]

        def last(err: Any, msg: Any) -> None:
            report(err, msg)
            if err is None and msg.offset() > newest[0]:
                newest[0] = msg.offset()

        producer = self._producer
        final = len(records) - 1
        for i, (key, value) in enumerate(records):
            while True:
                try:
                    producer.produce(
                        topic,
                        value=value,
                        key=key,
                        partition=partition,
                        on_delivery=last if i == final else report,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)  # local queue full: let deliveries drain
            report.pending += 1
        self.sent += len(records)
        producer.poll(0)

    async def flush(self, timeout_s: float = 60.0, *, upto: Mark | None = None) -> None:
        """Wait, yielding to the event loop, until every record sent so far is
        delivered (``upto``: every record sent before that :meth:`mark`, whatever
        is sent meanwhile).

        Polls instead of a blocking ``flush()`` in a thread: nothing else to
        schedule, and a stalled broker cannot pin an executor thread.
        """
        deadline = time.monotonic() + timeout_s
        producer = self._producer
        producer.poll(0)
        if upto is None:
            owed = self._marks
        elif upto in self._marks:
            owed = self._marks[: self._marks.index(upto) + 1]
        else:
            owed = []  # reported in full already, and every mark before it
        while self._left(owed) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            producer.poll(0)
        left = self._left(owed)
        while len(self._marks) > 1 and not self._marks[0].pending:
            del self._marks[0]  # reported in full: nothing left to wait for
        with self._lock:
            failed = self._failed[:]
            self._failed.clear()  # in place: every mark reports into it
        if left or failed:
            msg = f"{left} output records undelivered after {timeout_s}s; failures: {failed[:5]}"
            raise OutputError(msg)

    def _left(self, owed: list[Mark]) -> int:
        """Records of ``owed`` not reported yet (all of the producer's, for every mark)."""
        if owed is self._marks:
            return len(self._producer)
        return sum(m.pending for m in owed)

    def close(self) -> None:
        try:
            self._producer.flush(10)
        except KafkaException as exc:  # pragma: no cover - best effort at shutdown
            log.warning("tailguard: output producer did not flush at shutdown: %s", exc)
