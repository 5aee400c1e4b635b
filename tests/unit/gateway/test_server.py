"""The proxy end to end in one event loop: simulated upstream, gateway, in-memory producer."""

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from tailguard.schemas import decode

from tailguard.gateway.config import GatewayConfig, Routing, canary_routing
from tailguard.gateway.meter import Meter
from tailguard.gateway.publisher import EventPublisher
from tailguard.gateway.routing import Override
from tailguard.gateway.server import Gateway
from tailguard.gateway.upstream import SimUpstream, UpstreamProfile

from .conftest import RawHandler, raw_server

Scenario = Callable[[str, Gateway, aiohttp.ClientSession], Awaitable[None]]


async def _through_gateway(config: GatewayConfig, producer: Any, scenario: Scenario) -> Gateway:
    """Serve ``config``'s gateway on a local port and run ``scenario`` against it."""
    gw = Gateway(config, publisher=EventPublisher("unused:9092", "t.inference", producer=producer))
    server = TestServer(gw.app)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            await scenario(str(server.make_url("")), gw, http)
    finally:
        await server.close()
    return gw


def run(
    tmp_path: Path, producer: Any, scenario: Scenario, *, canary: bool = True,
    read_timeout_s: float = 300.0,
) -> Gateway:  # fmt: skip
    async def main() -> Gateway:
        primary = TestServer(SimUpstream(UpstreamProfile("primary", 30, (5,), 4)).app)
        other = TestServer(SimUpstream(UpstreamProfile("canary", 30, (5,), 4)).app)
        await primary.start_server()
        await other.start_server()
        upstreams = {"primary": str(primary.make_url("/"))}
        if canary:
            upstreams["canary"] = str(other.make_url("/v1"))
        config = GatewayConfig(
            upstreams=upstreams,
            routing=canary_routing("exp", 0.5) if canary else Routing(),
            state_file=tmp_path / "state.json",
            follow_releases=False,
            service="chat",
            upstream_read_timeout_s=read_timeout_s,
        )
        try:
            return await _through_gateway(config, producer, scenario)
        finally:
            await primary.close()
            await other.close()

    return asyncio.run(main())


def events(gw: Gateway, producer: Any) -> list[dict[str, Any]]:
    while gw.publisher.drain():
        pass
    producer.poll()
    out = [e for r in producer.sent for e in json.loads(r["value"])]
    for r in producer.sent:  # every event is valid tailguard.inference.v1
        assert not decode(r["value"], "inference", now_ms=int(time.time() * 1000)).rejects
    return out


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_a_streamed_request_becomes_one_measured_event(tmp_path: Path, producer: Any) -> None:
    got: dict[str, Any] = {}

    async def scenario(base: str, _gw: Gateway, http: aiohttp.ClientSession) -> None:
        headers = {"x-sim-ttft-ms": "60", "x-sim-itl-ms": "20,40", "x-sim-tokens": "4",
                   "x-tailguard-unit": "user-7", "x-tailguard-tenant": "acme"}  # fmt: skip
        for _warm_up in range(2):  # the first request of a process pays for connections
            async with http.post(f"{base}/v1/chat/completions", json=BODY, headers=headers) as r:
                await r.read()
        async with http.post(f"{base}/v1/chat/completions", json=BODY, headers=headers) as r:
            got["status"] = r.status
            got["arm"] = r.headers.get("x-tailguard-arm")
            got["body"] = await r.text()

    gw = run(tmp_path, producer, scenario)
    assert got["status"] == 200 and got["body"].endswith("data: [DONE]\n\n")
    *_, e = events(gw, producer)
    assert e["status"] == "ok" and e["service"] == "chat" and e["tenant"] == "acme"
    # Loose bounds here (a loaded 2-core machine); tests/integration/test_gateway.py holds
    # the gateway to 5 ms of the upstream's own send times.
    assert e["ttft_ms"] == pytest.approx(60, abs=25)
    assert e["itl_ms"] == pytest.approx([20, 40, 20], abs=25)
    assert e["output_tokens"] == 4 and e["experiment"] == "exp" and e["unit_id"] == "user-7"
    assert e["variant"] == got["arm"] and len(e["trace_id"]) == 32


def test_rollback_override_sends_canary_units_to_the_primary(tmp_path: Path, producer: Any) -> None:
    arms: list[str] = []

    async def scenario(base: str, gw: Gateway, http: aiohttp.ClientSession) -> None:
        gw._set_overrides({"exp": Override("exp", "rollback", "canary", 1, 1, "ev")})
        for i in range(40):
            hdr = {"x-tailguard-unit": f"u{i}", "x-sim-tokens": "1", "x-sim-ttft-ms": "1"}
            async with http.post(f"{base}/v1/chat/completions", json=BODY, headers=hdr) as r:
                body = await r.text()
                arms.append(r.headers["x-tailguard-arm"])
                assert "tg-sim-primary" in body

    gw = run(tmp_path, producer, scenario)
    assert set(arms) == {"control"}
    assigned = {a for (_e, a, _s) in gw.routed}
    assert assigned == {"control", "canary"}  # units keep their assignment


def test_upstream_status_maps_to_event_status(tmp_path: Path, producer: Any) -> None:
    async def scenario(base: str, _gw: Gateway, http: aiohttp.ClientSession) -> None:
        for code in ("429", "500"):
            hdr = {"x-sim-status": code}
            async with http.post(f"{base}/v1/completions", json={"model": "m"}, headers=hdr) as r:
                assert r.status == int(code)

    gw = run(tmp_path, producer, scenario, canary=False)
    got = [(e["status"], e["error_type"]) for e in events(gw, producer)]
    assert got == [("rejected", "http_429"), ("error", "http_500")]


def test_an_unreachable_upstream_is_a_502_and_an_error_event(tmp_path: Path, producer: Any) -> None:
    async def scenario(base: str, gw: Gateway, http: aiohttp.ClientSession) -> None:
        gw._bases["primary"] = "http://127.0.0.1:9"  # discard port: nothing listens
        async with http.post(f"{base}/v1/chat/completions", json=BODY) as r:
            assert r.status == 502
            assert "unreachable" in (await r.json())["error"]["message"]

    gw = run(tmp_path, producer, scenario, canary=False)
    (e,) = events(gw, producer)
    assert (e["status"], e["error_type"]) == ("error", "upstream_unreachable")


def test_a_client_leaving_mid_stream_is_a_cancelled_event(tmp_path: Path, producer: Any) -> None:
    async def scenario(base: str, _gw: Gateway, http: aiohttp.ClientSession) -> None:
        hdr = {"x-sim-ttft-ms": "10", "x-sim-itl-ms": "50", "x-sim-tokens": "40"}
        async with http.post(f"{base}/v1/chat/completions", json=BODY, headers=hdr) as r:
            await r.content.readuntil(b"tok1")
            r.close()
        await asyncio.sleep(0.5)

    gw = run(tmp_path, producer, scenario, canary=False)
    (e,) = events(gw, producer)
    assert e["status"] == "cancelled" and e["output_tokens"] < 40


def test_other_paths_are_proxied_unmeasured(tmp_path: Path, producer: Any) -> None:
    async def scenario(base: str, _gw: Gateway, http: aiohttp.ClientSession) -> None:
        async with http.get(f"{base}/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "sim-model"
        async with http.get(f"{base}/gateway/state") as r:
            assert (await r.json())["publisher"]["submitted"] == 0
        async with http.get(f"{base}/gateway/metrics") as r:
            assert "tailguard_gateway_events_dropped_total 0.0" in await r.text()

    gw = run(tmp_path, producer, scenario, canary=False)
    assert events(gw, producer) == []


def test_an_upstream_that_goes_quiet_is_a_timeout(tmp_path: Path, producer: Any) -> None:
    async def scenario(base: str, _gw: Gateway, http: aiohttp.ClientSession) -> None:
        hdr = {"x-sim-ttft-ms": "10", "x-sim-itl-ms": "5000", "x-sim-tokens": "3"}
        t0 = time.monotonic()
        async with http.post(f"{base}/v1/chat/completions", json=BODY, headers=hdr) as r:
            assert r.status == 200
            await r.read()
        assert time.monotonic() - t0 < 4.0
        async with http.post(f"{base}/v1/chat/completions", json=BODY,
                             headers={"x-sim-ttft-ms": "5000"}) as r:  # fmt: skip
            assert r.status == 200  # headers came at once; the first token never did
            await r.read()

    gw = run(tmp_path, producer, scenario, canary=False, read_timeout_s=0.6)
    got = [(e["status"], e["error_type"], e.get("output_tokens")) for e in events(gw, producer)]
    assert got == [("timeout", "upstream_timeout", 1), ("timeout", "upstream_timeout", 0)]


# -- upstreams the simulator does not play: raw sockets ------------------------------
def run_raw(
    tmp_path: Path, producer: Any, handler: RawHandler, scenario: Scenario,
    *, read_timeout_s: float = 300.0,
) -> Gateway:  # fmt: skip
    """Like :func:`run`, with the primary upstream a raw asyncio server served by ``handler``."""

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the request head; its small body is never read
        await handler(reader, writer)

    async def main() -> Gateway:
        async with raw_server(upstream) as port:
            config = GatewayConfig(
                upstreams={"primary": f"http://127.0.0.1:{port}"},
                routing=Routing(),
                state_file=tmp_path / "state.json",
                follow_releases=False,
                upstream_read_timeout_s=read_timeout_s,
            )
            return await _through_gateway(config, producer, scenario)

    return asyncio.run(main())


def _sse(i: int) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i


def test_a_close_delimited_event_stream_is_relayed_and_measured(
    tmp_path: Path, producer: Any
) -> None:
    async def upstream(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        for i in range(3):
            await asyncio.sleep(0.03)
            writer.write(_sse(i))
            await writer.drain()
        writer.write(b"data: [DONE]\n\n")

    got: dict[str, Any] = {}

    async def scenario(base: str, _gw: Gateway, http: aiohttp.ClientSession) -> None:
        async with http.post(f"{base}/v1/chat/completions", json=BODY) as r:
            got["body"] = await r.read()

    gw = run_raw(tmp_path, producer, upstream, scenario)
    assert got["body"] == b"".join(_sse(i) for i in range(3)) + b"data: [DONE]\n\n"
    (e,) = events(gw, producer)
    assert e["status"] == "ok" and e["output_tokens"] == 3
    assert e["ttft_ms"] >= 25 and len(e["itl_ms"]) == 2


def test_an_upstream_breaking_off_mid_stream_is_an_upstream_payload_error(
    tmp_path: Path, producer: Any
) -> None:
    async def upstream(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        for i in range(2):
            data = _sse(i)
            writer.write(b"%x\r\n%b\r\n" % (len(data), data))
            await writer.drain()
        # … and closes without the last chunk

    got: dict[str, Any] = {}

    async def scenario(base: str, _gw: Gateway, http: aiohttp.ClientSession) -> None:
        async with http.post(f"{base}/v1/chat/completions", json=BODY) as r:
            got["status"] = r.status
            got["body"] = await r.read()

    gw = run_raw(tmp_path, producer, upstream, scenario)
    assert got["status"] == 200 and got["body"] == _sse(0) + _sse(1)
    (e,) = events(gw, producer)
    assert (e["status"], e["error_type"], e["output_tokens"]) == ("error", "upstream_payload", 2)


def test_requests_through_the_gateway_leave_no_reference_cycles(
    tmp_path: Path, producer: Any
) -> None:
    """A cycle per request would be freed only by the collector, whose full passes
    stalled every stream for tens of ms (bench/gateway.py)."""
    ours = {"Exchange", "ResponseParser", "_Connection", "Meter", "_Watch", "Rating"}
    left: list[str] = []

    async def scenario(base: str, _gw: Gateway, http: aiohttp.ClientSession) -> None:
        hdr = {"x-sim-ttft-ms": "1", "x-sim-itl-ms": "1", "x-sim-tokens": "3"}
        async with http.post(f"{base}/v1/chat/completions", json=BODY, headers=hdr) as r:
            await r.read()  # warm: the pool's connection
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(5):
                async with http.post(f"{base}/v1/chat/completions", json=BODY, headers=hdr) as r:
                    await r.read()
            gc.collect()
            left.extend(type(o).__name__ for o in gc.garbage if type(o).__name__ in ours)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()

    gw = run(tmp_path, producer, scenario, canary=False)
    assert len(events(gw, producer)) == 6
    assert left == []


def test_a_slow_client_pauses_the_upstream_instead_of_buffering_the_stream(
    tmp_path: Path, producer: Any
) -> None:
    piece = b"data: " + b"x" * 65_000 + b"\n\n"
    n = 400  # 26 MB: far more than the sockets' buffers hold

    async def upstream(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        for _ in range(n):
            writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    got: dict[str, Any] = {}

    async def scenario(base: str, gw: Gateway, http: aiohttp.ClientSession) -> None:
        async with http.post(f"{base}/v1/chat/completions", json=BODY) as r:
            await asyncio.sleep(1.0)  # not reading: the gateway's write buffer fills
            got["pauses"] = sum(p.pauses for p in gw._pools.values())
            got["size"] = len(await r.read())
        async with http.get(f"{base}/gateway/metrics") as r:
            got["metrics"] = await r.text()

    # The client stalls for longer than the upstream read timeout: time spent waiting
    # for the client is not the upstream going quiet.
    gw = run_raw(tmp_path, producer, upstream, scenario, read_timeout_s=0.4)
    assert got["pauses"] >= 1 and got["size"] == n * len(piece)
    assert (
        'tailguard_gateway_upstream_connections_opened_total{upstream="primary"} 1.0'
        in (got["metrics"])
    )
    assert (
        'tailguard_gateway_upstream_backpressure_pauses_total{upstream="primary"}'
        in (got["metrics"])
    )
    (e,) = events(gw, producer)
    assert e["status"] == "ok"


def test_an_unforeseen_failure_still_records_an_event_and_frees_the_request(
    tmp_path: Path, producer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_self: Meter, _data: bytes, _t: float) -> None:
        msg = "a bug in the meter"
        raise RuntimeError(msg)

    monkeypatch.setattr(Meter, "feed", broken)
    got: dict[str, Any] = {}

    async def scenario(base: str, gw: Gateway, http: aiohttp.ClientSession) -> None:
        hdr = {"x-sim-ttft-ms": "1", "x-sim-itl-ms": "1", "x-sim-tokens": "2"}
        with contextlib.suppress(aiohttp.ClientPayloadError):  # the stream was cut short
            async with http.post(f"{base}/v1/chat/completions", json=BODY, headers=hdr) as r:
                await r.read()
        got["watches"] = len(gw._watches)

    gw = run(tmp_path, producer, scenario, canary=False)
    (e,) = events(gw, producer)
    assert (e["status"], e["error_type"]) == ("error", "gateway_error")
    assert got["watches"] == 0


def test_a_client_hanging_up_after_done_is_a_complete_request(
    tmp_path: Path, producer: Any
) -> None:
    """The openai client stops at ``data: [DONE]`` and closes; the upstream's last chunk
    frame may come after that. The client had the whole answer: ``ok``, not cancelled."""

    async def upstream(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        for data in (_sse(0), _sse(1), b"data: [DONE]\n\n"):
            writer.write(b"%x\r\n%b\r\n" % (len(data), data))
            await writer.drain()
        await asyncio.sleep(0.3)  # the client has gone by now
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def scenario(base: str, _gw: Gateway, http: aiohttp.ClientSession) -> None:
        async with http.post(f"{base}/v1/chat/completions", json=BODY) as r:
            await r.content.readuntil(b"[DONE]\n\n")
            r.close()
        await asyncio.sleep(0.6)

    gw = run_raw(tmp_path, producer, upstream, scenario)
    (e,) = events(gw, producer)
    assert (e["status"], e["output_tokens"]) == ("ok", 2)
