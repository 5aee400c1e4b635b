"""The measured path's HTTP/1.1 client: the pure response parser, then the pool on real sockets."""

import asyncio
import gc
import itertools
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.gateway.errors import UpstreamBroken, UpstreamReset, UpstreamUnreachable
from tailguard.gateway.relay import ProtocolError, ResponseParser, UpstreamPool

from .conftest import raw_server


# -- the parser ------------------------------------------------------------------
def _chunked(body_parts: list[bytes], *, ext: bool, trailers: bool) -> bytes:
    out = b""
    for part in body_parts:
        out += b"%x%s\r\n%s\r\n" % (len(part), b";name=value" if ext else b"", part)
    return out + b"0\r\n" + (b"X-Checksum: abc\r\n" if trailers else b"") + b"\r\n"


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.binary(min_size=1, max_size=300), min_size=0, max_size=6),
    framing=st.sampled_from(["chunked", "length", "close"]),
    informational=st.booleans(),
    ext=st.booleans(),
    trailers=st.booleans(),
    connection_close=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=12),
)
def test_any_framing_split_anywhere_gives_back_the_body(
    parts: list[bytes], framing: str, informational: bool, ext: bool, trailers: bool,
    connection_close: bool, cuts: list[int],
) -> None:  # fmt: skip
    body = b"".join(parts)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    if connection_close:
        head += b"Connection: close\r\n"
    if framing == "chunked":
        raw = (
            head
            + b"Transfer-Encoding: chunked\r\n\r\n"
            + _chunked(parts, ext=ext, trailers=trailers)
        )
    elif framing == "length":
        raw = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    else:
        raw = head + b"\r\n" + body
    if informational:
        raw = b"HTTP/1.1 100 Continue\r\n\r\n" + raw
    p = ResponseParser()
    got = b""
    for piece in _split(raw, cuts):
        if piece:
            assert not p.complete  # not before its last byte
        got += p.feed(piece)
    if framing == "close":
        assert not p.complete
        p.eof()
    assert p.complete and got == body
    assert p.head is not None and p.head.status == 200
    assert p.head.content_type == "text/event-stream"
    assert p.keep_alive is (framing != "close" and not connection_close)


def test_the_body_of_one_read_comes_back_whole_and_the_next_read_alone() -> None:
    p = ResponseParser()
    assert (
        p.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n") == b"hello"
    )
    assert p.head is not None and not p.complete
    assert p.feed(b"6\r\n world\r\n3\r\n!!!\r\n") == b" world!!!"
    assert p.feed(b"0\r\n\r\n") == b"" and p.complete


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "CRLF"),
        (b"SPDY/3 200 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "status code"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nbad header line\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\nX-Smuggle: a\nInjected: b\r\n\r\n", "control character"),
        (b"HTTP/1.1 200 OK\r\nX-Nul: a\x00b\r\n\r\n", "control character"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 70_000, "head over"),
    ],
)
def test_malformed_responses_are_protocol_errors(raw: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        ResponseParser().feed(raw)


def test_a_connection_closed_mid_body_is_an_error_but_ends_a_close_delimited_body() -> None:
    p = ResponseParser()
    p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    with pytest.raises(ProtocolError, match="mid-response"):
        p.eof()
    q = ResponseParser()
    assert q.feed(b"HTTP/1.0 200 OK\r\n\r\nabc") == b"abc"
    q.eof()
    assert q.complete and not q.keep_alive


@pytest.mark.parametrize("status", [204, 304])
def test_bodiless_statuses_and_head_requests_end_at_the_head(status: int) -> None:
    p = ResponseParser()
    p.feed(b"HTTP/1.1 %d X\r\nContent-Length: 12\r\n\r\n" % status)
    assert p.complete and p.keep_alive
    q = ResponseParser(head_request=True)
    q.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n")
    assert q.complete


def test_bytes_after_the_response_forbid_reusing_the_connection() -> None:
    p = ResponseParser()
    p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
    assert p.complete and not p.keep_alive


# -- the pool on real sockets ---------------------------------------------------------
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


def _serve(handler: Handler, scenario: Callable[[str], Awaitable[Any]]) -> Any:
    """Run ``scenario(url)`` against a raw asyncio server whose connections ``handler`` serves."""

    async def main() -> Any:
        async with raw_server(handler) as port:
            return await scenario(f"http://127.0.0.1:{port}")

    return asyncio.run(main())


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def test_sequential_requests_share_one_keep_alive_connection() -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                seen.append(await _read_request(reader))
            except asyncio.IncompleteReadError:
                break
            writer.write(OK)
            await writer.drain()
        writer.close()

    async def scenario(url: str) -> tuple[int, list[bytes]]:
        pool = UpstreamPool(url + "/v1")
        bodies = []
        for i in range(3):
            ex = await pool.request("POST", pool.target("/v1/chat/completions"),
                                    [("X-Try", str(i))], b"abc")  # fmt: skip
            bodies.append(await ex.read())
            ex.close()
        pool.close()
        return pool.connects, bodies

    connects, bodies = _serve(handler, scenario)
    assert connects == 1 and bodies == [b"{}"] * 3
    assert seen[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"X-Try: 2\r\n" in seen[2] and seen[2].endswith(b"Content-Length: 3\r\n\r\nabc")


def test_a_server_closing_an_idle_connection_costs_nothing() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(OK)  # keep-alive promised, then the server closes it while idle

    async def scenario(url: str) -> tuple[int, int, bytes]:
        pool = UpstreamPool(url)
        ex = await pool.request("POST", "/v1/completions", [], b"")
        await ex.read()
        ex.close()
        await asyncio.sleep(0.1)  # the close reaches the pool: that connection is dropped
        ex = await pool.request("POST", "/v1/completions", [], b"")
        body = await ex.read()
        ex.close()
        pool.close()
        return pool.connects, pool.retries, body

    assert _serve(handler, scenario) == (2, 0, b"{}")


@pytest.mark.parametrize("idempotency_key", [False, True])
def test_a_reused_connection_dying_unanswered_is_retried_only_when_replayable(
    idempotency_key: bool,
) -> None:
    """RFC 9112 §9.3.1: the upstream may have started on the POST; only a request with
    an Idempotency-Key (or an idempotent method) is sent again on a fresh connection."""
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await _read_request(reader))
        writer.write(OK)  # the first request of a connection is answered …
        await writer.drain()
        received.append(await _read_request(reader))  # … the second read, then dropped

    async def scenario(url: str) -> tuple[bytes | str, int]:
        pool = UpstreamPool(url)
        hdr = [("Idempotency-Key", "k-1")] if idempotency_key else []
        try:
            ex = await pool.request("POST", "/v1/completions", hdr, b"")
            await ex.read()
            ex.close()
            try:
                ex = await pool.request("POST", "/v1/completions", hdr, b"")
            except UpstreamUnreachable as exc:
                return str(exc), pool.retries
            body = await ex.read()
            ex.close()
            return body, pool.retries
        finally:
            pool.close()

    got, retries = _serve(handler, scenario)
    if idempotency_key:
        assert (got, retries, len(received)) == (b"{}", 1, 3)
    else:
        assert "not sent again" in str(got) and retries == 0 and len(received) == 2


def test_a_connection_paused_for_a_slow_client_is_never_pooled() -> None:
    class Stuck:  # a client transport whose write buffer never drains
        def is_closing(self) -> bool:
            return False

        def get_write_buffer_size(self) -> int:
            return 1 << 30

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(OK)

    async def scenario(url: str) -> int:
        pool = UpstreamPool(url)
        ex = await pool.request("POST", "/", [], b"")
        await ex.read()
        ex.pause_until_drained(Stuck(), 0)  # type: ignore[arg-type]  # as the last read did
        ex.close()
        idle = pool.idle
        pool.close()
        return idle

    assert _serve(handler, scenario) == 0


def test_a_reset_is_not_the_end_of_a_close_delimited_body() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npart of it")
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    async def scenario(url: str) -> None:
        pool = UpstreamPool(url)
        try:
            ex = await pool.request("POST", "/", [], b"")
            await ex.read()
        finally:
            pool.close()

    with pytest.raises(UpstreamBroken, match="lost mid-response"):
        _serve(handler, scenario)


@pytest.mark.parametrize(
    ("behaviour", "error"),
    [("close", UpstreamUnreachable), ("reset", UpstreamReset), ("garbage", UpstreamBroken)],
)
def test_an_upstream_that_fails_before_answering_raises_what_happened(
    behaviour: str, error: type[Exception]
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        if behaviour == "garbage":
            writer.write(b"NOT HTTP\r\n\r\n")
            await writer.drain()
        elif behaviour == "reset":  # linger 0: close sends RST, not FIN
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
        await writer.wait_closed()

    async def scenario(url: str) -> None:
        pool = UpstreamPool(url)
        try:
            await pool.request("POST", "/v1/completions", [], b"{}")
        finally:
            pool.close()

    with pytest.raises(error):
        _serve(handler, scenario)


def test_nothing_listening_is_unreachable() -> None:
    async def scenario() -> None:
        pool = UpstreamPool("http://127.0.0.1:9")  # discard port: nothing listens
        await pool.request("POST", "/", [], b"")

    with pytest.raises(UpstreamUnreachable, match=r"cannot connect to 127\.0\.0\.1:9"):
        asyncio.run(scenario())


def test_a_stream_reaches_the_sink_read_by_read_and_a_broken_one_fails() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        for i in range(3):
            writer.write(b"9\r\ndata: %d\n\n\r\n" % i)
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.close()  # no last chunk: the response broke off

    async def scenario(url: str) -> list[tuple[bytes, float]]:
        pool = UpstreamPool(url)
        ex = await pool.request("POST", "/v1/chat/completions", [], b"{}")
        head = await ex.head()
        assert head.content_type == "text/event-stream"
        got: list[tuple[bytes, float]] = []
        ex.stream(lambda body, t: got.append((body, t)))
        with pytest.raises(UpstreamBroken, match="mid-response"):
            await ex.finished()
        ex.close()
        pool.close()
        return got

    got = _serve(handler, scenario)
    assert [b for b, _t in got] == [b"data: %d\n\n" % i for i in range(3)]
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(got)]
    assert all(g > 0.01 for g in gaps)  # each read timed when it arrived


def test_idle_connections_are_reaped_after_the_idle_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await _read_request(reader)
            except asyncio.IncompleteReadError:
                break
            writer.write(OK)
            await writer.drain()
        writer.close()

    async def scenario(url: str) -> tuple[int, int]:
        pool = UpstreamPool(url, idle_timeout_s=0.05)
        ex = await pool.request("POST", "/", [], b"")
        await ex.read()
        ex.close()
        before = pool.idle
        await asyncio.sleep(0.1)
        pool.reap()
        after = pool.idle
        pool.close()
        return before, after

    assert _serve(handler, scenario) == (1, 0)


def test_a_finished_exchange_leaves_no_reference_cycle() -> None:
    """Cycles are freed only by the collector, whose pauses are the gateway's tail latency."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def scenario(url: str) -> list[str]:
        pool = UpstreamPool(url)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(3):
                ex = await pool.request("POST", "/", [], b"")
                sink_state: list[bytes] = []
                ex.stream(lambda body, _t, keep=sink_state, ex=ex: keep.append(body))
                await ex.finished()
                ex.close()
                del ex
            gc.collect()
            ours = ("Exchange", "ResponseParser", "_Connection")
            return [type(o).__name__ for o in gc.garbage if type(o).__name__ in ours]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            pool.close()

    assert _serve(handler, scenario) == []
