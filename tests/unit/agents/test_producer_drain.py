"""The producer flush faust does before each offset commit really drains its buffer."""

import asyncio
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.transport.producer import ProducerBuffer
from tailguard.agents.app import ChangelogWriteError, DrainingBuffer, DrainingProducer

_CONF = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))


class _Fut(asyncio.Future[Any]):
    """A changelog write as faust queues it (a FutureMessage: ``.message.channel``)."""

    def __init__(self, channel: "_Channel", n: int) -> None:
        super().__init__()
        self.message = SimpleNamespace(channel=channel)
        self.n = n


class _Channel:
    """Hands each message over after ``delay`` (faust's flush waits 0.1 s at most)."""

    def __init__(self, delay: float = 0.25, fail_at: int = -1) -> None:
        self.delay, self.fail_at = delay, fail_at
        self.published: list[_Fut] = []

    async def publish_message(self, fut: _Fut, wait: bool = False) -> None:
        await asyncio.sleep(self.delay)
        if fut.n == self.fail_at:
            raise OSError("broker refused")
        self.published.append(fut)


async def _started(buffer: ProducerBuffer) -> ProducerBuffer:
    buffer.app = _CONF  # type: ignore[assignment]
    await buffer.start()
    return buffer


async def _stop(buffer: ProducerBuffer) -> None:
    while buffer.size:  # faust's stop flushes too, and refuses to leave messages behind
        buffer.pending.get_nowait()
    await buffer.stop()


async def _other_agent(buffer: ProducerBuffer, channel: _Channel, stop: asyncio.Event) -> None:
    """Another agent writing tables all along (numbered from 100), as faust lets it."""
    n = 100
    while not stop.is_set():
        await buffer.wait_until_ebb()
        for _ in range(3):
            buffer.put(_Fut(channel, n))  # type: ignore[arg-type]
            n += 1
        await asyncio.sleep(0.001)


def test_fausts_own_flush_returns_with_messages_still_buffered() -> None:
    """Why DrainingBuffer exists: faust committed offsets past unsent table writes."""

    async def run() -> int:
        channel = _Channel()
        buffer = await _started(ProducerBuffer())
        for i in range(3):
            buffer.put(_Fut(channel, i))  # type: ignore[arg-type]
        await buffer.flush()
        sent = len(channel.published)
        await _stop(buffer)
        return sent

    assert asyncio.run(run()) < 3


def test_drain_returns_once_every_message_put_before_it_was_handed_over() -> None:
    async def run() -> list[int]:
        channel = _Channel()
        buffer = await _started(DrainingBuffer())
        assert isinstance(buffer, DrainingBuffer)
        for i in range(3):
            buffer.put(_Fut(channel, i))  # type: ignore[arg-type]
        await buffer.drain()
        sent = [fut.n for fut in channel.published]
        await _stop(buffer)
        return sent

    assert asyncio.run(run()) == [0, 1, 2]


def test_drain_is_not_starved_by_writes_made_after_it_was_called() -> None:
    """Other agents keep writing tables: drain waits for its own messages only."""

    async def run() -> tuple[float, int]:
        channel = _Channel(delay=0.01)
        buffer = await _started(DrainingBuffer())
        assert isinstance(buffer, DrainingBuffer)
        stop = asyncio.Event()
        for i in range(3):
            buffer.put(_Fut(channel, i))  # type: ignore[arg-type]
        writer = asyncio.create_task(_other_agent(buffer, channel, stop))
        began = asyncio.get_running_loop().time()
        await asyncio.wait_for(buffer.drain(), timeout=5.0)
        took = asyncio.get_running_loop().time() - began
        stop.set()
        await writer
        first = sum(1 for fut in channel.published if fut.n < 3)
        await _stop(buffer)
        return took, first

    took, first = asyncio.run(run())
    assert first == 3
    assert took < 1.0


def test_drain_fails_when_a_hand_over_failed() -> None:
    async def run() -> None:
        buffer = await _started(DrainingBuffer())
        assert isinstance(buffer, DrainingBuffer)
        buffer.put(_Fut(_Channel(delay=0.01, fail_at=0), 0))  # type: ignore[arg-type]
        try:
            with pytest.raises(ChangelogWriteError, match="not sent"):
                await buffer.drain()
        finally:
            await _stop(buffer)

    asyncio.run(run())


def test_a_failed_delivery_fails_the_next_flush_once() -> None:
    async def run() -> None:
        app = faust.App("drain-test", broker="kafka://127.0.0.1:1")
        producer = DrainingProducer(app.transport)
        buffer = producer.draining
        assert producer.buffer is buffer
        await buffer.start()
        try:
            channel = _Channel(delay=0.0)
            ok, bad = _Fut(channel, 0), _Fut(channel, 1)
            buffer.put(ok)  # type: ignore[arg-type]
            buffer.put(bad)  # type: ignore[arg-type]
            await producer.flush()  # both handed over; no delivery reported yet
            ok.set_result(None)
            bad.set_exception(OSError("MessageSizeTooLarge"))
            with pytest.raises(ChangelogWriteError, match="1 table changelog write"):
                await producer.flush()
            await producer.flush()  # reported once; nothing new failed
        finally:
            await _stop(buffer)

    asyncio.run(run())


def test_the_producers_flush_is_not_starved_by_writes_made_during_it() -> None:
    """faust's own flush waited for writes made while it ran too: with other agents
    writing tables all along, a checkpoint's flush (and faust's commit, which
    flushes) never ended while they wrote."""

    async def run() -> tuple[float, int]:
        app = faust.App("drain-test", broker="kafka://127.0.0.1:1")
        producer = DrainingProducer(app.transport)
        buffer = producer.draining
        await buffer.start()
        channel = _Channel(delay=0.01)
        stop = asyncio.Event()

        try:
            for i in range(3):
                buffer.put(_Fut(channel, i))  # type: ignore[arg-type]
            writer = asyncio.create_task(_other_agent(buffer, channel, stop))
            began = asyncio.get_running_loop().time()
            await asyncio.wait_for(producer.flush(), timeout=5.0)
            took = asyncio.get_running_loop().time() - began
            stop.set()
            await writer
            return took, sum(1 for fut in channel.published if fut.n < 3)
        finally:
            stop.set()
            await _stop(buffer)

    took, first = asyncio.run(run())
    assert first == 3
    assert took < 1.0
