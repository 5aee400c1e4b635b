"""Doubles for the gateway unit tests: an in-memory confluent-kafka Producer (logic only),
and a raw asyncio HTTP server for upstreams the simulator does not play."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest


@dataclass
class FakeProducer:
    """Records produce() calls; poll() delivers them (or fails them while ``down``)."""

    down: bool = False
    sent: list[dict[str, Any]] = field(default_factory=list)
    pending: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)

    def produce(self, topic: str, value: bytes, key: bytes | None = None, headers: Any = None,
                on_delivery: Any = None) -> None:  # fmt: skip
        record = {"topic": topic, "key": key, "value": value, "headers": headers}
        self.pending.append((on_delivery, record))

    def poll(self, timeout: float = 0) -> int:
        if self.down or not self.pending:
            if timeout:
                time.sleep(min(timeout, 0.05))  # like librdkafka: block without the GIL
            return 0
        done, self.pending = self.pending, []
        for cb, record in done:
            self.sent.append(record)
            if cb is not None:
                cb(None, None)
        return len(done)

    def fail_pending(self) -> None:
        done, self.pending = self.pending, []
        for cb, _record in done:
            if cb is not None:
                cb("timed out", None)

    def flush(self, _timeout: float = 0) -> int:
        self.poll()
        return len(self.pending)

    def __len__(self) -> int:
        return len(self.pending)


@pytest.fixture
def producer() -> FakeProducer:
    return FakeProducer()


RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(handler: RawHandler) -> AsyncIterator[int]:
    """A local TCP server whose connections ``handler`` serves; yields its port. On exit
    every connection is closed and every handler ended (no socket outlives the loop)."""
    tasks: set[asyncio.Task[Any]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handler(reader, writer)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
