"""Checkpoints taken at once and written while the folder goes on; outputs flushed up to a mark."""

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from tailguard.agents.checkpoints import Checkpointer
from tailguard.agents.outputs import OutputError, Outputs
from tailguard.agents.settings import Settings
from tailguard.agents.state import SeriesStore
from tailguard.agents.stats import WorkerStats
from tailguard.streams import RingConfig

T0 = 1_700_000_000_000


class _Ev:
    def __init__(self, i: int) -> None:
        self.event_id = f"e{i}"
        self.ts_ms = T0 + i * 1_000
        self.status = "ok"
        self.e2e_ms = 500.0
        self.ttft_ms = 100.0
        self.output_tokens = 5
        self.itl_ms = [20.0, 20.0]
        self.trace_id = None
        self.warmup = False


class _Held:
    """An input event as faust holds it (the folder makes it the current event)."""

    def __init__(self, offset: int) -> None:
        self.offset = offset


class _Stream:
    def __init__(self) -> None:
        self.acked: list[str] = []

    async def ack(self, event: _Held) -> None:
        self.acked.append(f"offset {event.offset}")


class _Outputs:
    """Outputs whose delivery the test lets through (``open``) or refuses (``refuse``)."""

    def __init__(self) -> None:
        self.marks = 0
        self.open = asyncio.Event()
        self.refuse = False
        self.waited_for: list[Any] = []

    def mark(self) -> int:
        self.marks += 1
        return self.marks

    async def flush(self, timeout_s: float = 60.0, *, upto: Any = None) -> None:
        self.waited_for.append(upto)
        await self.open.wait()
        if self.refuse:
            raise OutputError("broker away")


class _Engine:
    """Breach states: one per partition and checkpoint, to see what is written."""

    def __init__(self) -> None:
        self.unsaved: dict[int, list[tuple[bytes, bytes]]] = {}
        self.written: list[tuple[int, bytes]] = []

    def take(self, partition: int) -> list[tuple[bytes, bytes]]:
        return self.unsaved.pop(partition, [])

    def untake(self, partition: int, puts: list[tuple[bytes, bytes]]) -> None:
        self.unsaved[partition] = puts + self.unsaved.get(partition, [])

    def write(self, partition: int, puts: list[tuple[bytes, bytes]]) -> int:
        self.written.extend((partition, key) for key, _ in puts)
        return len(puts)


def _world() -> tuple[Checkpointer, SeriesStore, dict[str, bytes], dict[str, bytes], Any]:
    meta: dict[str, bytes] = {}
    buckets: dict[str, bytes] = {}
    store = SeriesStore(meta, buckets, RingConfig())

    async def producer_flush() -> None:
        return None

    app = SimpleNamespace(log=logging.getLogger("test"), producer=SimpleNamespace())
    app.producer.flush = producer_flush
    outputs, engine = _Outputs(), _Engine()
    pending: dict[int, list[tuple[Any, Any]]] = {}
    settings = Settings()
    checkpointer = Checkpointer(
        app,
        outputs,  # type: ignore[arg-type]
        engine,  # type: ignore[arg-type]
        store,
        WorkerStats(),
        settings.checkpoint_cadence(),
        pending,
        {0},
    )
    return checkpointer, store, meta, buckets, (outputs, engine, pending)


def _fold(store: SeriesStore, stream: _Stream, pending: Any, events: range) -> None:
    cached = store.get("s", partition=0)
    cached.state.add([_Ev(i) for i in events], [(0, i) for i in events])
    store.mark_unsaved("s", 0)
    pending.setdefault(0, []).extend((stream, _Held(i)) for i in events)


def _restored_requests(meta: dict[str, bytes], buckets: dict[str, bytes]) -> int:
    state = SeriesStore(meta, buckets, RingConfig()).get("s", partition=0).state
    return state.counters(3_600_000, T0 + 600_000).requests


def test_what_is_folded_while_a_checkpoint_waits_on_the_broker_is_the_next_ones() -> None:
    checkpointer, store, meta, buckets, (outputs, engine, pending) = _world()
    stream = _Stream()

    async def run() -> None:
        _fold(store, stream, pending, range(4))
        engine.unsaved[0] = [(b"breach-1", b"state-1")]
        cut = checkpointer.cut([0])
        assert cut is not None and pending == {}
        writing = asyncio.ensure_future(checkpointer.write(cut))
        await asyncio.sleep(0)
        assert outputs.waited_for == [1], "waits for the outputs sent before the cut"
        # The folder goes on meanwhile: two more requests, one more breach state.
        _fold(store, stream, pending, range(4, 6))
        engine.unsaved[0] = [(b"breach-2", b"state-2")]
        assert meta == {} and stream.acked == [], "nothing stored before the outputs are out"
        outputs.open.set()
        await writing
        assert _restored_requests(meta, buckets) == 4, "the state at the cut, not after"
        assert stream.acked == [f"offset {i}" for i in range(4)]
        assert [event.offset for _, event in pending[0]] == [4, 5]
        assert engine.written == [(0, b"breach-1")]
        # The next checkpoint stores and acknowledges the rest.
        cut = checkpointer.cut([0])
        assert cut is not None
        await checkpointer.write(cut)
        assert _restored_requests(meta, buckets) == 6
        assert stream.acked == [f"offset {i}" for i in range(6)] and pending == {}
        assert engine.written == [(0, b"breach-1"), (0, b"breach-2")]

    asyncio.run(run())


def test_a_checkpoint_the_broker_refuses_gives_its_cut_back_whole() -> None:
    checkpointer, store, meta, buckets, (outputs, engine, pending) = _world()
    stream = _Stream()

    async def run() -> None:
        _fold(store, stream, pending, range(3))
        engine.unsaved[0] = [(b"breach-1", b"state-1")]
        cut = checkpointer.cut([0])
        assert cut is not None
        writing = asyncio.ensure_future(checkpointer.write(cut))
        await asyncio.sleep(0)
        _fold(store, stream, pending, range(3, 5))
        outputs.refuse = True
        outputs.open.set()
        await writing
        assert meta == {} and buckets == {} and stream.acked == []
        # Held again, in the order it came, ahead of what came since.
        assert [event.offset for _, event in pending[0]] == list(range(5))
        assert engine.unsaved[0] == [(b"breach-1", b"state-1")]
        outputs.refuse = False
        cut = checkpointer.cut([0])
        assert cut is not None
        await checkpointer.write(cut)
        assert _restored_requests(meta, buckets) == 5
        assert stream.acked == [f"offset {i}" for i in range(5)]
        assert engine.written == [(0, b"breach-1")]

    asyncio.run(run())


class _Producer:
    """confluent-kafka's producer as :class:`Outputs` uses it; the test delivers."""

    def __init__(self) -> None:
        self.queued: list[tuple[bytes, Any]] = []
        self.deliverable: set[bytes] = set()

    def produce(self, topic: str, value: bytes, key: bytes, **kw: Any) -> None:
        self.queued.append((value, kw["on_delivery"]))

    def poll(self, _timeout: float) -> int:
        ready = [(v, report) for v, report in self.queued if v in self.deliverable]
        self.queued = [(v, r) for v, r in self.queued if v not in self.deliverable]
        for value, report in ready:
            report(None, SimpleNamespace(topic=lambda: "t", offset=lambda value=value: 0))
        return len(ready)

    def __len__(self) -> int:
        return len(self.queued)


def test_a_flush_up_to_a_mark_waits_for_what_was_sent_before_it_only() -> None:
    outputs = Outputs("127.0.0.1:9")
    producer = outputs._producer = _Producer()  # type: ignore[assignment]

    async def run() -> None:
        outputs.send("t", b"k", b"before", [])
        mark = outputs.mark()
        outputs.send("t", b"k", b"after", [])
        with pytest.raises(OutputError, match="1 output records undelivered"):
            await outputs.flush(0.05, upto=mark)
        producer.deliverable.add(b"before")
        await outputs.flush(1.0, upto=mark)  # "after" is still queued
        assert len(producer) == 1
        with pytest.raises(OutputError):
            await outputs.flush(0.05)  # everything: "after" too
        producer.deliverable.add(b"after")
        await outputs.flush(1.0)
        await outputs.flush(1.0, upto=mark)  # reported in full long ago

    asyncio.run(run())
