"""The producer flush faust does before each offset commit really drains its buffer."""

import asyncio
from types import SimpleNamespace
from typing import Any

from faust.transport.producer import ProducerBuffer
from tailguard.agents.app import DrainingBuffer


class _Channel:
    """Hands each message over slower than faust's 0.1 s flush patience."""

    def __init__(self) -> None:
        self.published: list[Any] = []

    async def publish_message(self, fut: Any, wait: bool = False) -> None:
        await asyncio.sleep(0.25)
        self.published.append(fut)


def _messages(channel: _Channel, n: int) -> list[Any]:
    return [SimpleNamespace(message=SimpleNamespace(channel=channel), n=i) for i in range(n)]


async def _flushed_after(buffer: ProducerBuffer, channel: _Channel, drain: bool) -> int:
    buffer.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))  # type: ignore[assignment]
    await buffer.start()
    try:
        for fut in _messages(channel, 3):
            buffer.put(fut)
        if drain:
            assert isinstance(buffer, DrainingBuffer)
            await buffer.drain()
        else:
            await buffer.flush()
        return len(channel.published)
    finally:
        while buffer.size:  # faust's stop flushes too, and refuses to leave messages behind
            await asyncio.sleep(0.05)
        await buffer.stop()


def test_fausts_own_flush_returns_with_messages_still_buffered() -> None:
    """Why DrainingBuffer exists: faust committed offsets past unsent table writes."""
    channel = _Channel()
    assert asyncio.run(_flushed_after(ProducerBuffer(), channel, drain=False)) < 3


def test_drain_returns_only_once_every_message_was_handed_over() -> None:
    channel = _Channel()
    assert asyncio.run(_flushed_after(DrainingBuffer(), channel, drain=True)) == 3
    assert [fut.n for fut in channel.published] == [0, 1, 2]


def test_drain_of_an_empty_buffer_returns_at_once() -> None:
    async def run() -> float:
        buffer = DrainingBuffer()
        buffer.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))  # type: ignore[assignment]
        await buffer.start()
        try:
            began = asyncio.get_running_loop().time()
            await buffer.drain()
            return asyncio.get_running_loop().time() - began
        finally:
            await buffer.stop()

    assert asyncio.run(run()) < 0.05
