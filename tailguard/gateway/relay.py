"""The measured path's upstream side: a lean HTTP/1.1 client fed straight from the socket.

The gateway used aiohttp's client for this, and at 200 concurrent streams that
cost ~75 µs of the gateway's one core per relayed chunk: the client's payload
stream, one coroutine wake-up per read and aiohttp's chunked writer on the way
out. Here the upstream socket's ``data_received`` does all of it at once, with
no task switch::

    upstream socket ─ data_received(bytes) ─▶ ResponseParser.feed ─▶ body bytes
                        (clock reading t)                              │
         client socket ◀── transport.write(chunk frame) ◀── sink(body, t)
                                                                 └─▶ Meter.feed(body, t)

:class:`ResponseParser` is pure (bytes in, body bytes and a head out) and takes
every framing HTTP/1.1 allows — ``Transfer-Encoding: chunked`` with extensions
and trailers, ``Content-Length``, close-delimited, informational 1xx heads —
split across reads anywhere. :class:`UpstreamPool` keeps keep-alive connections
to one upstream (most recently used first; one is closed once idle for
``idle_timeout_s`` since its response ended, well under uvicorn's 5 s
keep-alive, so vLLM rarely closes one we are about to reuse). When a *reused*
connection dies before the first byte of its response — the race every
keep-alive client has with a server closing an idle connection — the request is
sent again on a fresh connection only if it may be replayed (RFC 9112 §9.3.1:
an idempotent method, or an ``Idempotency-Key`` header); a completion request
is a POST, and the upstream may already be generating it, so it is not.

Errors (all :class:`~tailguard.gateway.errors.UpstreamError`): could not connect
or closed before answering → :class:`UpstreamUnreachable`; reset before
answering → :class:`UpstreamReset`; a response that breaks off or does not parse
→ :class:`UpstreamBroken`. A connect that takes longer than
``connect_timeout_s`` raises :class:`TimeoutError`.
"""

import asyncio
import re
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any, Final

from tailguard.gateway.errors import (
    UpstreamBroken,
    UpstreamError,
    UpstreamReset,
    UpstreamUnreachable,
)

__all__ = ["Exchange", "Head", "ProtocolError", "ResponseParser", "UpstreamPool"]

#: Longest response head (status line and headers) accepted.
MAX_HEAD_BYTES: Final = 64 * 1024
#: Longest chunk-size or trailer line accepted.
MAX_LINE_BYTES: Final = 8 * 1024

Sink = Callable[[bytes, float], None]


class ProtocolError(ValueError):
    """Bytes that are not an HTTP/1.1 response (the parser's own error; pure)."""


class Head:
    """Status line and headers of a response (header names as sent; lookups ignore case)."""

    __slots__ = ("_index", "headers", "reason", "status", "version")

    def __init__(self, version: str, status: int, reason: str, headers: list[tuple[str, str]]):
        self.version = version
        self.status = status
        self.reason = reason
        self.headers = headers
        self._index: dict[str, str] = {}
        for k, v in headers:
            key = k.lower()
            # Repeated fields join with ", " (RFC 9110 §5.3); fine for the ones read here.
            self._index[key] = f"{self._index[key]}, {v}" if key in self._index else v

    def get(self, name: str) -> str | None:
        return self._index.get(name.lower())

    @property
    def content_type(self) -> str:
        return (self.get("content-type") or "").split(";", 1)[0].strip().lower()

    def tokens(self, name: str) -> set[str]:
        """A header's comma-separated tokens, lower case (``Connection``, ``Transfer-Encoding``)."""
        return {t.strip().lower() for t in (self.get(name) or "").split(",") if t.strip()}


#: A header name (RFC 9110 §5.6.2 token) and the characters a value must not hold
#: (controls other than tab: a bare CR or LF would smuggle a header downstream).
_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def _parse_head(raw: bytes) -> Head:
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        msg = f"not an HTTP/1.x status line: {lines[0][:80]!r}"
        raise ProtocolError(msg)
    code = parts[1]
    if len(code) != 3 or not code.isdigit():
        msg = f"bad status code {code[:16]!r}"
        raise ProtocolError(msg)
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            msg = f"bad header line {line[:80]!r}"
            raise ProtocolError(msg)
        if _CONTROL.search(value):  # RFC 9112 §5.5: CR, LF, NUL … inside a value
            msg = f"control character in header {name[:40]!r}"
            raise ProtocolError(msg)
        headers.append((name.decode("latin-1"), value.strip().decode("utf-8", "surrogateescape")))
    reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
    return Head(parts[0].decode("latin-1"), int(code), reason, headers)


def _chunk_size(line: bytes) -> int:
    text = line.split(b";", 1)[0].strip()
    if not text or len(text) > 16 or text.strip(b"0123456789abcdefABCDEF"):
        msg = f"bad chunk size line {line[:40]!r}"
        raise ProtocolError(msg)
    return int(text, 16)


_HEAD, _LENGTH, _SIZE, _DATA, _CRLF, _TRAILER, _CLOSE, _DONE = range(8)


class ResponseParser:
    """One HTTP/1.1 response, fed in reads as they come. Pure.

    :meth:`feed` returns the body bytes that read completed (chunk framing
    removed; ``b""`` if none) and sets :attr:`head` once the final head is in;
    :attr:`complete` turns true at the end of the body; :meth:`eof` says the
    connection closed. :attr:`keep_alive` says whether the connection may carry
    the next request once the response is complete.
    """

    __slots__ = ("_buf", "_left", "_mode", "head", "head_request", "keep_alive", "received")

    def __init__(self, *, head_request: bool = False) -> None:
        self.head: Head | None = None
        self.head_request = head_request
        self.keep_alive = False
        #: Any byte of the response seen yet.
        self.received = False
        self._buf = bytearray()
        self._mode = _HEAD
        self._left = 0

    @property
    def complete(self) -> bool:
        return self._mode == _DONE

    def feed(self, data: bytes) -> bytes:
        if data:
            self.received = True
        mode = self._mode
        if mode == _CLOSE:
            return bytes(data)
        if mode == _DONE:
            if data:
                self.keep_alive = False  # bytes after the response: do not reuse the connection
            return b""
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        while True:
            mode = self._mode
            avail = len(buf) - pos
            if mode in (_DATA, _LENGTH):
                if not avail:
                    break
                take = min(avail, self._left)
                out.append(bytes(buf[pos : pos + take]))
                pos += take
                self._left -= take
                if not self._left:
                    if mode == _DATA:
                        self._mode = _CRLF
                    else:
                        self._mode = _DONE
            elif mode == _CRLF:
                if avail < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    msg = "chunk data not followed by CRLF"
                    raise ProtocolError(msg)
                pos += 2
                self._mode = _SIZE
            elif mode in (_SIZE, _TRAILER):
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if avail > MAX_LINE_BYTES:
                        msg = "chunk size or trailer line too long"
                        raise ProtocolError(msg)
                    break
                line = bytes(buf[pos:end])
                pos = end + 2
                if mode == _TRAILER:
                    if not line:
                        self._mode = _DONE
                elif size := _chunk_size(line):
                    self._left = size
                    self._mode = _DATA
                else:
                    self._mode = _TRAILER
            elif mode == _HEAD:
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:
                    if avail > MAX_HEAD_BYTES:
                        msg = f"response head over {MAX_HEAD_BYTES} bytes"
                        raise ProtocolError(msg)
                    break
                head = _parse_head(bytes(buf[pos:end]))
                pos = end + 4
                if 100 <= head.status < 200 and head.status != 101:
                    continue  # informational (100 Continue, 103 Early Hints): the real one follows
                self.head = head
                self._start_body(head)
            elif mode == _CLOSE:
                if avail:
                    out.append(bytes(buf[pos:]))
                    pos = len(buf)
                break
            else:  # _DONE
                if avail:
                    self.keep_alive = False
                    pos = len(buf)
                break
        del buf[:pos]
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)

    def _start_body(self, head: Head) -> None:
        connection = head.tokens("connection")
        if head.version == "HTTP/1.1":
            self.keep_alive = "close" not in connection
        else:
            self.keep_alive = "keep-alive" in connection
        status = head.status
        if self.head_request or status in (204, 304):
            self._mode = _DONE
            return
        if status == 101:
            self._mode, self.keep_alive = _CLOSE, False
            return
        te = head.get("transfer-encoding")
        if te is not None:
            if te.rsplit(",", 1)[-1].strip().lower() == "chunked":
                self._mode = _SIZE
            else:  # RFC 9112 §6.3: not chunked last → read until close
                self._mode, self.keep_alive = _CLOSE, False
            return
        length = head.get("content-length")
        if length is not None:
            values = {v.strip() for v in length.split(",")}
            if len(values) != 1 or not next(iter(values)).isdigit():
                msg = f"bad Content-Length {length[:40]!r}"
                raise ProtocolError(msg)
            self._left = int(values.pop())
            self._mode = _LENGTH if self._left else _DONE
            return
        self._mode, self.keep_alive = _CLOSE, False

    def eof(self) -> None:
        """The connection closed: ends a close-delimited body, else the response is broken."""
        if self._mode == _CLOSE:
            self._mode = _DONE
            return
        if self._mode != _DONE:
            msg = (
                "the connection closed before the response head"
                if self.head is None
                else "the connection closed mid-response"
            )
            raise ProtocolError(msg)


def _consume(fut: "asyncio.Future[Any]") -> None:
    """Mark a future's exception retrieved (it is raised where awaited, if it ever is)."""
    if not fut.cancelled():
        fut.exception()


class _Stale(UpstreamError):
    """A reused connection closed before the first byte of a replayable request's
    response: send it again on a fresh connection."""


#: Methods RFC 9110 §9.2.2 calls idempotent: safe to send again.
IDEMPOTENT: Final = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})


class Exchange:
    """One request and its response on one upstream connection.

    ``await head()``, then either :meth:`stream` the body to a sink and
    ``await finished()``, or ``await read()`` it whole. :meth:`close` always at the
    end: it returns a cleanly finished keep-alive connection to the pool and closes
    any other.
    """

    __slots__ = ("_conn", "_done", "_drain", "_head", "_held", "_sink", "parser", "replayable")

    def __init__(
        self, conn: "_Connection", parser: ResponseParser, *, replayable: bool = False
    ) -> None:
        loop = asyncio.get_running_loop()
        self._conn = conn
        self.parser = parser
        #: May be sent again if a reused connection dies before answering.
        self.replayable = replayable
        self._head: asyncio.Future[Head] = loop.create_future()
        self._done: asyncio.Future[None] = loop.create_future()
        self._head.add_done_callback(_consume)
        self._done.add_done_callback(_consume)
        self._sink: Sink | None = None
        self._held: list[tuple[bytes, float]] = []
        self._drain: asyncio.Task[None] | None = None

    # -- the handler's side ----------------------------------------------------
    async def head(self) -> Head:
        return await asyncio.shield(self._head)

    def stream(self, sink: Sink) -> None:
        """From now on, call ``sink(body, t)`` for each read (at once for any read already in).

        An exception from the sink fails the exchange with it (``finished`` raises it)."""
        self._sink = sink
        held, self._held = self._held, []
        for body, t in held:
            if not self._deliver(body, t):
                return
        self._maybe_done()

    async def finished(self) -> None:
        await asyncio.shield(self._done)

    async def read(self) -> bytes:
        parts: list[bytes] = []
        self.stream(lambda body, _t: parts.append(body))
        await self.finished()
        return b"".join(parts)

    @property
    def paused(self) -> bool:
        """Reading the upstream is paused until the client's socket drains."""
        return self._drain is not None

    def pause_until_drained(self, transport: asyncio.BaseTransport, low_water: int) -> None:
        """Stop reading the upstream until ``transport``'s write buffer is under ``low_water``."""
        if self._drain is not None or self._conn.transport is None:
            return
        self._conn.transport.pause_reading()
        self._conn.pool.pauses += 1
        self._drain = asyncio.get_running_loop().create_task(self._resume(transport, low_water))

    async def _resume(self, transport: asyncio.BaseTransport, low_water: int) -> None:
        while (
            not transport.is_closing() and transport.get_write_buffer_size() > low_water  # type: ignore[attr-defined]
        ):
            await asyncio.sleep(0.005)
        self._drain = None
        if self._conn.transport is not None and not self._conn.closed:
            self._conn.transport.resume_reading()

    def close(self) -> None:
        paused = self._drain is not None  # reading stopped for back-pressure: never pool it
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None
        # The sink closes over this exchange: drop it, or every request leaves a reference
        # cycle for the garbage collector (whose pauses are the gateway's latency tail).
        self._sink = None
        self._held = []
        conn = self._conn
        if conn.exchange is not self:
            return
        conn.exchange = None
        if self.parser.complete and self.parser.keep_alive and not conn.closed and not paused:
            conn.pool._release(conn)
        else:
            conn.close()
        if not self._done.done():
            self._done.cancel()
        if not self._head.done():
            self._head.cancel()

    # -- the connection's side ---------------------------------------------------
    def _received(self, data: bytes) -> None:
        t = time.perf_counter()
        try:
            body = self.parser.feed(data)
        except ProtocolError as exc:
            self._fail(UpstreamBroken(f"upstream response broken: {exc}"))
            return
        if not self._head.done() and self.parser.head is not None:
            self._head.set_result(self.parser.head)
        if body:
            if self._sink is None:
                self._held.append((body, t))
            elif not self._deliver(body, t):
                return
        self._maybe_done()

    def _maybe_done(self) -> None:
        # Done once the body is complete *and* handed to a sink (a read held for a sink
        # not attached yet may still fail in it).
        if self.parser.complete:
            if not self._conn.idle_since:
                self._conn.idle_since = time.monotonic()  # the upstream's keep-alive starts now
            if self._sink is not None and not self._done.done():
                self._done.set_result(None)

    def _deliver(self, body: bytes, t: float) -> bool:
        assert self._sink is not None
        try:
            self._sink(body, t)
        except Exception as exc:  # the sink's verdict (ClientGone) or its bug: end this exchange
            self._fail(exc)
            return False
        return True

    def _lost(self, exc: BaseException | None) -> None:
        if self._done.done():
            return
        parser = self.parser
        if exc is not None and parser.head is not None and not parser.complete:
            # Also for a close-delimited body: a reset is not its end.
            self._fail(UpstreamBroken(f"upstream connection lost mid-response: {exc}"))
            return
        try:
            parser.eof()
        except ProtocolError as err:
            if not parser.received and self._conn.reused and self.replayable:
                self._fail(_Stale(str(err)))
            elif not parser.received and self._conn.reused:
                msg = (
                    "upstream closed a kept-alive connection before answering; not sent "
                    "again, as it may have started on it (no Idempotency-Key)"
                )
                self._fail(UpstreamUnreachable(msg))
            elif not parser.received and isinstance(exc, ConnectionResetError):
                self._fail(UpstreamReset(f"upstream reset the connection: {exc}"))
            elif not parser.received:
                reason = f": {exc}" if exc else ""
                self._fail(UpstreamUnreachable(f"upstream closed the connection{reason}"))
            else:
                self._fail(UpstreamBroken(f"upstream response broken: {err}"))
            return
        self._received(b"")  # a close-delimited body ended

    def _fail(self, exc: BaseException) -> None:
        for fut in (self._head, self._done):
            if not fut.done():
                fut.set_exception(exc)
        self._conn.close()


class _Connection(asyncio.Protocol):
    """One upstream connection; carries one :class:`Exchange` at a time."""

    def __init__(self, pool: "UpstreamPool") -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # bytes on an idle connection: it cannot carry a request any more
            self.close()
            return
        ex._received(data)

    def eof_received(self) -> bool:
        return False  # close; connection_lost ends the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        ex = self.exchange
        if ex is not None:
            ex._lost(exc)

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()
            self.pool._forget(self)


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to one upstream (``http://`` or ``https://`` URL).

    The URL's path is the base the request paths go under; a base ending in
    ``/v1`` takes ``/v1/...`` paths without doubling it (``--upstream
    http://vllm:8000/v1``)."""

    def __init__(
        self, url: str, *, connect_timeout_s: float = 10.0, idle_timeout_s: float = 2.0
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            msg = f"upstream URL {url!r} is not http(s)://host[:port][/path]"
            raise ValueError(msg)
        self.url = url
        self.host = parts.hostname
        default = 443 if parts.scheme == "https" else 80
        self.port = parts.port or default
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = host if self.port == default else f"{host}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        #: Connections opened; requests retried after a stale keep-alive; back-pressure pauses.
        self.connects = 0
        self.retries = 0
        self.pauses = 0

    def target(self, path_qs: str) -> str:
        base = self.base_path
        if base.endswith("/v1") and path_qs.startswith("/v1"):
            base = base[:-3]
        return base + path_qs if path_qs.startswith("/") else f"{base}/{path_qs}"

    def encode_request(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> bytes:
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {self.authority}\r\n"]
        for k, v in headers:
            if "\r" in v or "\n" in v:  # never let a value start a header of its own
                v = v.replace("\r", " ").replace("\n", " ")
            lines.append(f"{k}: {v}\r\n")
        lines.append(f"Content-Length: {len(body)}\r\n\r\n")
        return "".join(lines).encode("utf-8", "surrogateescape") + body

    async def request(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> Exchange:
        """Send one request; returns its exchange once the response head is in."""
        headers = list(headers)
        raw = self.encode_request(method, target, headers, body)
        verb = method.upper()
        head_request = verb == "HEAD"
        replayable = verb in IDEMPOTENT or any(k.lower() == "idempotency-key" for k, _ in headers)
        conn = self._take_idle()
        if conn is not None:
            ex = self._start(conn, raw, head_request, replayable)
            try:
                await ex.head()
            except _Stale:
                ex.close()
                self.retries += 1
            except BaseException:
                ex.close()
                raise
            else:
                return ex
        conn = await self._connect()
        ex = self._start(conn, raw, head_request, replayable)
        try:
            await ex.head()
        except BaseException:
            ex.close()
            raise
        return ex

    def _start(
        self, conn: _Connection, raw: bytes, head_request: bool, replayable: bool
    ) -> Exchange:
        ex = Exchange(conn, ResponseParser(head_request=head_request), replayable=replayable)
        conn.exchange = ex
        conn.idle_since = 0.0
        assert conn.transport is not None
        conn.transport.write(raw)
        return ex

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > self.idle_timeout_s:
                conn.close()
                continue
            conn.reused = True
            return conn
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _t, conn = await loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
        except OSError as exc:
            msg = f"cannot connect to {self.authority}: {exc}"
            raise UpstreamUnreachable(msg) from exc
        self.connects += 1
        self._open.add(conn)
        return conn

    def _release(self, conn: _Connection) -> None:
        if not conn.idle_since:
            conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._open.discard(conn)

    @property
    def idle(self) -> int:
        return sum(1 for c in self._idle if not c.closed)

    def reap(self) -> None:
        """Close connections idle longer than ``idle_timeout_s`` (call now and then)."""
        now = time.monotonic()
        keep: list[_Connection] = []
        for conn in self._idle:
            if conn.closed:
                continue
            if now - conn.idle_since > self.idle_timeout_s:
                conn.close()
            else:
                keep.append(conn)
        self._idle = keep

    def close(self) -> None:
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
