"""The gateway: an aiohttp reverse proxy for OpenAI-compatible APIs that measures.

::

    client ──▶ POST /v1/chat/completions ──▶ route: unit → layer hashes → arm → upstream
                           │ forward: same body, same headers (minus hop-by-hop), plus
                           │ traceparent, x-tailguard-experiment / -arm / -prompt-version
                           ▼
    client ◀── each read written at once ◀── upstream (SSE or JSON)
                           │ after each write: Meter.feed(bytes, time of the read)
                           ▼ the response ended (or failed, or the client left)
             one tailguard.inference.v1 event ─▶ EventPublisher.submit (O(1))

Only ``/v1/chat/completions`` and ``/v1/completions`` are measured; any other
path (``/v1/models``, ``/v1/embeddings``, …) is proxied to the primary
upstream untouched. ``GET /gateway/metrics`` (Prometheus text) and
``GET /gateway/state`` (JSON: routing, overrides, publisher) are the gateway's
own; ``GET /gateway/healthz`` answers ``ok``.

Status of an event: ``ok`` (2xx, body complete), ``rejected`` (429: admission or
rate limiting), ``error`` (other non-2xx, ``error_type = http_<code>``; the
upstream unreachable, ``upstream_unreachable``, 502 to the client; an error
inside the stream, ``stream_error``), ``timeout`` (no byte for
``upstream_read_timeout_s``; 504 when nothing was sent yet), ``cancelled`` (the
client went away mid-response).
"""

import asyncio
import collections
import dataclasses
import gc
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import aiohttp
import msgspec
from aiohttp import web
from aiohttp.http_writer import StreamWriter
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tailguard import catalogue as cat
from tailguard.gateway.config import GatewayConfig
from tailguard.gateway.errors import ClientGone, UpstreamBroken, UpstreamReset, UpstreamUnreachable
from tailguard.gateway.meter import Measurement, Meter
from tailguard.gateway.publisher import EventPublisher
from tailguard.gateway.ratings import rating_payload, response_text, sampled, user_messages
from tailguard.gateway.relay import Exchange, UpstreamPool
from tailguard.gateway.releases import DecisionStore, ReleaseFollower
from tailguard.gateway.routing import Override, Router, Selection

__all__ = ["Gateway", "build_event", "new_event_loop", "run_gateway"]

log = logging.getLogger(__name__)

MEASURED: Final = ("/v1/chat/completions", "/v1/completions")
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


class _Request(msgspec.Struct, gc=False):
    model: str | None = None
    user: str | None = None
    stream: bool = False


_decode_request = msgspec.json.Decoder(_Request).decode


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def build_event(
    *,
    ts_ms: int,
    service: str,
    model: str,
    status: str,
    m: Measurement,
    selection: Selection,
    tenant: str | None,
    unit: str | None,
    session: str | None,
    trace_id: str | None,
    instance: str,
    error_type: str | None,
    event_id: str | None = None,
) -> dict[str, Any]:
    """The ``tailguard.inference.v1`` event of one request.

    A request in experiments of several layers: ``experiment``/``variant`` name
    the primary route (:attr:`Selection.primary`), ``experiments`` lists every
    layer's ``{experiment, variant, layer, prompt_version}`` (only when there is
    more than one; consumers that know one experiment ignore it), and
    ``prompt_version`` is the version the request was served with."""
    event: dict[str, Any] = {
        "schema": "tailguard.inference.v1",
        "event_id": event_id or uuid.uuid4().hex,
        "ts_ms": ts_ms,
        "service": service,
        "model": model,
        "status": status,
        "e2e_ms": _ms(m.e2e_s),
        "instance": instance,
    }
    output = m.output_tokens
    if m.ttft_s is not None:
        event["ttft_ms"] = min(_ms(m.ttft_s), event["e2e_ms"])
    elif output:
        output = None  # tokens without a first-token time: the contract wants both or neither
    if output is not None:
        event["output_tokens"] = output
    if m.input_tokens is not None:
        event["input_tokens"] = m.input_tokens
    if m.gaps_s:
        event["itl_ms"] = [round(g * 1000.0, 3) for g in m.gaps_s]
    route = selection.primary
    if route is not None:
        event["experiment"] = route.experiment
        event["variant"] = route.served
        version = selection.prompt_version
        if version is not None:
            event["prompt_version"] = version
        event["unit_id"] = route.unit
        if len(selection.routes) > 1:  # one experiment per layer; consumers may ignore it
            event["experiments"] = selection.tags()
    elif unit:
        event["unit_id"] = unit
    if tenant:
        event["tenant"] = tenant
    if session:
        event["session_id"] = session
    if trace_id:
        event["trace_id"] = trace_id
    if error_type:
        event["error_type"] = error_type
    return event


def _trace(headers: Mapping[str, str]) -> tuple[str, str | None]:
    """The W3C trace id of the request and a ``traceparent`` to send upstream.

    The incoming ``traceparent`` is forwarded as it is; without one the gateway
    starts a trace, so the upstream's spans (vLLM's ``llm_request``) share the
    event's ``trace_id`` — the exemplar link."""
    parent = headers.get("traceparent")
    if parent:
        parts = parent.split("-")
        if len(parts) >= 4 and len(parts[1]) == 32:
            tid = parts[1].lower()
            if tid != "0" * 32 and all(c in "0123456789abcdef" for c in tid):
                return tid, None
    tid = uuid.uuid4().hex
    return tid, f"00-{tid}-{uuid.uuid4().hex[:16]}-01"


class Rating:
    """A request sampled for blind rating: its body and the response bytes read so far."""

    __slots__ = ("body", "raw", "streaming")

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.raw = bytearray()
        self.streaming = False

    def feed(self, data: bytes, *, streaming: bool) -> None:
        self.streaming = streaming
        if len(self.raw) < 4 * 1024 * 1024:
            self.raw += data

    def payload(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """The ``tailguard.rating.v1`` record (no arm: :mod:`tailguard.gateway.ratings`)."""
        return rating_payload(
            event,
            messages=user_messages(self.body),
            response=response_text(bytes(self.raw), self.streaming),
        )


#: A client write buffer above this pauses reading the upstream until it is under LOW_WATER.
HIGH_WATER: Final = 1024 * 1024
LOW_WATER: Final = 256 * 1024


def _relay(
    transport: asyncio.Transport | None,
    chunked: bool,
    ex: Exchange,
    meter: Meter,
    watch: "_Watch",
    rating: Rating | None,
) -> Callable[[bytes, float], None]:
    """The sink of one streamed response: each upstream read goes to the client's socket
    at once (one chunk frame when the response is chunked), then to the meter."""

    def sink(data: bytes, t: float) -> None:
        watch.last = t
        if transport is None or transport.is_closing():
            msg = "the client closed its connection"
            raise ClientGone(msg)
        transport.write(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)
        meter.feed(data, t)
        if rating is not None:
            rating.feed(data, streaming=True)
        if transport.get_write_buffer_size() > HIGH_WATER:
            ex.pause_until_drained(transport, LOW_WATER)

    return sink


class _Watch:
    """When a request last heard from its upstream (read by the idle watchdog)."""

    __slots__ = ("exchange", "expired", "last", "task")

    def __init__(self, last: float, task: "asyncio.Task[Any]") -> None:
        self.last = last
        self.task = task
        self.expired = False
        #: The upstream exchange once the request is sent (paused: waiting for the client).
        self.exchange: Exchange | None = None


class Gateway:
    """One gateway process: the aiohttp app, the publisher and the release follower."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        publisher: EventPublisher | None = None,
        ratings: EventPublisher | None = None,
    ) -> None:
        self.config = config
        prefix = config.topic_prefix
        self.publisher = publisher or EventPublisher(
            config.broker,
            prefix + cat.INFERENCE,
            buffer_events=config.buffer_events,
            batch_events=config.batch_events,
            linger_ms=config.linger_ms,
            columns=True,
        )
        #: Blind rating hand-off (tailguard.ratings): a sample of the finished requests.
        self.ratings: EventPublisher | None = ratings
        if ratings is None and config.rating_rate > 0.0:
            self.ratings = EventPublisher(
                config.broker,
                prefix + cat.RATINGS,
                key=lambda e: str(e["request_event_id"]),
                buffer_events=config.buffer_events,
                batch_events=config.batch_events,
                linger_ms=config.linger_ms,
            )
        self.store = DecisionStore(config.state_file)
        overrides = self.store.load()
        self.router: Router = config.routing.router.with_overrides(overrides)
        self.follower: ReleaseFollower | None = None
        if config.follow_releases:
            self.follower = ReleaseFollower(
                config.broker,
                prefix + cat.RELEASES,
                prefix + cat.AUDIT,
                store=self.store,
                overrides=overrides,
                experiments=lambda: self.router.experiments,
                on_change=self._set_overrides,
                instance=config.instance_id,
                source=config.source,
            )
        self.requests: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.routed: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.unrouted = 0
        #: Clients gone before their request body arrived (no upstream call, no event).
        self.aborted = 0
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        #: The measured path's upstream connections, one pool per upstream URL.
        self._pools: dict[str, UpstreamPool] = {}
        self._watches: set[_Watch] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._bases = {name: url.rstrip("/") for name, url in config.upstreams.items()}
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Metrics(self))
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_get("/gateway/healthz", self._healthz)
        self.app.router.add_get("/gateway/metrics", self._metrics)
        self.app.router.add_get("/gateway/state", self._state)
        for path in MEASURED:
            self.app.router.add_post(path, self._measured)
        self.app.router.add_route("*", "/{tail:.*}", self._plain)
        self.app.on_startup.append(self._on_startup)
        self.app.on_cleanup.append(self._on_cleanup)

    def _set_overrides(self, overrides: dict[str, Override]) -> None:
        # Called on the follower thread: one reference assignment, atomic for readers.
        self.router = self.router.with_overrides(overrides)

    # -- lifecycle -----------------------------------------------------------
    async def _on_startup(self, _app: web.Application) -> None:
        cfg = self.config
        # No sock_read timeout: aiohttp would re-arm a timer on every chunk read.
        # One watchdog task times out idle upstreams for all requests instead.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.upstream_connect_timeout_s)
        for name in self._bases:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
            self._sessions[name] = aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=False
            )
        self.publisher.start()
        if self.ratings is not None:
            self.ratings.start()
        if self.follower is not None:
            self.follower.start()
        self._watchdog = asyncio.create_task(self._watch_idle())

    async def _on_cleanup(self, _app: web.Application) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        for s in self._sessions.values():
            await s.close()
        for pool in self._pools.values():
            pool.close()
        loop = asyncio.get_running_loop()
        if self.follower is not None:
            await loop.run_in_executor(None, self.follower.close)
        await loop.run_in_executor(None, self.publisher.close)
        if self.ratings is not None:
            await loop.run_in_executor(None, self.ratings.close)

    async def _watch_idle(self) -> None:
        """Cancel requests whose upstream sent nothing for ``upstream_read_timeout_s``."""
        limit = self.config.upstream_read_timeout_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            for pool in self._pools.values():
                pool.reap()
            now = time.perf_counter()
            for w in list(self._watches):
                if w.exchange is not None and w.exchange.paused:
                    w.last = now  # waiting for a slow client, not for the upstream
                    continue
                if not w.expired and now - w.last > limit:
                    w.expired = True
                    w.task.cancel()

    # -- helpers -------------------------------------------------------------
    def _url(self, upstream: str, path_qs: str) -> str:
        base = self._bases[upstream]
        if base.endswith("/v1") and path_qs.startswith("/v1"):
            base = base[:-3]
        return base + path_qs

    def _pool(self, upstream: str) -> UpstreamPool:
        base = self._bases[upstream]
        pool = self._pools.get(base)
        if pool is None:
            pool = UpstreamPool(base, connect_timeout_s=self.config.upstream_connect_timeout_s)
            self._pools[base] = pool
        return pool

    @staticmethod
    def _end_to_end(items: "Iterable[tuple[str, str]]") -> CIMultiDict[str]:
        """The headers of a request or response less the hop-by-hop ones (RFC 9110 §7.6.1)."""
        out: CIMultiDict[str] = CIMultiDict()
        for k, v in items:
            if k.lower() not in _HOP_BY_HOP:
                out.add(k, v)
        return out

    # -- handlers ------------------------------------------------------------
    async def _measured(self, request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        ts_ms = int(time.time() * 1000)
        cfg = self.config
        try:
            body = await request.read()
        except ConnectionResetError:  # the client left before sending its whole request
            self.aborted += 1
            return web.Response(status=400)
        try:
            info = _decode_request(body)
        except msgspec.DecodeError:
            info = _Request()
        headers_in = request.headers
        unit = headers_in.get(cfg.routing.unit_header) or info.user
        session = headers_in.get(cfg.session_header)
        selection = self.router.select(unit, session)
        upstream = selection.upstream
        headers = self._end_to_end(request.headers.items())
        trace_id, traceparent = _trace(headers_in)
        if traceparent is not None:
            headers["traceparent"] = traceparent
        route = selection.primary
        if route is None:
            self.unrouted += 1
        for r in selection.routes:
            self.routed[(r.experiment, r.assigned, r.served)] += 1
        if route is not None:
            headers["x-tailguard-experiment"] = route.experiment
            headers["x-tailguard-arm"] = route.served
            if selection.prompt_version is not None:
                headers["x-tailguard-prompt-version"] = selection.prompt_version
        meter = Meter(t0, info.stream)
        event_id = uuid.uuid4().hex
        rating = Rating(body) if sampled(event_id, cfg.rating_rate) else None
        task = asyncio.current_task()
        assert task is not None
        watch = _Watch(t0, task)
        self._watches.add(watch)
        status, error_type, http_status = "error", None, 502
        out: web.StreamResponse | None = None
        model = info.model
        pool = self._pool(upstream)
        ex: Exchange | None = None
        try:
            ex = await pool.request(
                request.method, pool.target(request.path_qs), headers.items(), body
            )
            watch.exchange = ex
            head = await ex.head()
            http_status = head.status
            streaming = head.content_type == "text/event-stream"
            meter.streaming = streaming
            rheaders = self._end_to_end(head.headers)
            if route is not None:
                rheaders["x-tailguard-experiment"] = route.experiment
                rheaders["x-tailguard-arm"] = route.served
            if streaming:
                out = web.StreamResponse(status=head.status, headers=rheaders)
                writer = await out.prepare(request)
                assert isinstance(writer, StreamWriter)
                # The relay writes the body to the socket itself, so the head must be out
                # first: aiohttp ≥ 3.10 holds it back to send with the first write.
                send_headers = getattr(writer, "send_headers", None)
                if send_headers is not None:
                    send_headers()
                ex.stream(_relay(request.transport, writer.chunked, ex, meter, watch, rating))
                await ex.finished()
                await out.write_eof()
            else:
                data = await ex.read()
                meter.feed(data, time.perf_counter())
                if rating is not None:
                    rating.feed(data, streaming=False)
                out = web.Response(status=head.status, body=data, headers=rheaders)
            status, error_type = self._status(http_status)
        except (ClientGone, ConnectionResetError) as exc:
            if out is not None and out.prepared and meter.saw_done:
                # The client read ``[DONE]`` and hung up before the last chunk frame (the
                # openai client does): it had the whole answer.
                status, error_type = self._status(http_status)
            elif out is not None and out.prepared:
                status, error_type = "cancelled", "client_disconnected"
            else:
                status, error_type = "error", "upstream_reset"
                out = self._fail(502, f"upstream connection reset: {exc}")
        except UpstreamReset as exc:
            status, error_type = "error", "upstream_reset"
            out = self._fail(502, str(exc))
        except UpstreamBroken as exc:
            status, error_type = "error", "upstream_payload"
            if out is None or not out.prepared:
                out = self._fail(502, str(exc))
        except UpstreamUnreachable as exc:
            status, error_type = "error", "upstream_unreachable"
            out = self._fail(502, f"upstream {upstream} unreachable: {exc}")
        except asyncio.CancelledError:
            if not watch.expired:  # the client went away (aiohttp cancels its handler)
                self._watches.discard(watch)
                status, error_type = "cancelled", "client_disconnected"
                if meter.saw_done:  # … after ``[DONE]``: it had the whole answer
                    status, error_type = self._status(http_status)
                self._record(ts_ms, model, status, error_type, meter, selection, headers_in,
                             unit, session, trace_id, upstream, http_status, event_id,
                             None)  # fmt: skip
                raise
            task.uncancel()  # our watchdog's cancel: the upstream went quiet
            status, error_type = "timeout", "upstream_timeout"
            if out is None or not out.prepared:
                out = self._fail(504, "upstream did not answer in time")
        except TimeoutError:
            status, error_type = "timeout", "upstream_timeout"
            if out is None or not out.prepared:
                out = self._fail(504, "upstream did not answer in time")
        except Exception as exc:  # unforeseen (a bug): the request still gets its event
            log.exception("tailguard gateway: %s %s failed", request.method, request.path)
            status, error_type = "error", "gateway_error"
            if out is None or not out.prepared:
                out = self._fail(502, f"gateway error: {type(exc).__name__}")
        finally:
            if ex is not None:
                ex.close()
        self._watches.discard(watch)
        self._record(ts_ms, model, status, error_type, meter, selection, headers_in, unit,
                     session, trace_id, upstream, http_status, event_id, rating)  # fmt: skip
        assert out is not None
        return out

    @staticmethod
    def _status(http_status: int) -> tuple[str, str | None]:
        if 200 <= http_status < 300:
            return "ok", None
        if http_status == 429:
            return "rejected", "http_429"
        return "error", f"http_{http_status}"

    @staticmethod
    def _fail(code: int, message: str) -> web.Response:
        err = {"error": {"message": message, "type": "gateway_error", "code": code}}
        return web.json_response(err, status=code)

    def _record(
        self,
        ts_ms: int,
        model: str | None,
        status: str,
        error_type: str | None,
        meter: Meter,
        selection: Selection,
        headers: Mapping[str, str],
        unit: str | None,
        session: str | None,
        trace_id: str,
        upstream: str,
        http_status: int,
        event_id: str | None = None,
        rating: "Rating | None" = None,
    ) -> None:
        m = meter.finish(time.perf_counter())
        if status == "ok" and m.stream_error is not None:
            status, error_type = "error", m.stream_error
        cfg = self.config
        event = build_event(
            ts_ms=ts_ms,
            service=headers.get("x-tailguard-service") or cfg.service,
            model=model or m.model or "unknown",
            status=status,
            m=m,
            selection=selection,
            tenant=headers.get(cfg.tenant_header),
            unit=unit,
            session=session,
            trace_id=trace_id,
            instance=upstream,
            error_type=error_type,
            event_id=event_id,
        )
        self.requests[(upstream, status, str(http_status))] += 1
        self.publisher.submit(event)
        if rating is not None and self.ratings is not None and status == "ok":
            self.ratings.submit(rating.payload(event))

    async def _plain(self, request: web.Request) -> web.StreamResponse:
        """Anything else: proxied to the primary upstream, not measured."""
        if request.path.startswith("/gateway/"):
            raise web.HTTPNotFound()
        body = await request.read()
        try:
            async with self._sessions["primary"].request(
                request.method,
                self._url("primary", request.path_qs),
                data=body,
                headers=self._end_to_end(request.headers.items()),
            ) as resp:
                data = await resp.read()
                return web.Response(
                    status=resp.status, body=data, headers=self._end_to_end(resp.headers.items())
                )
        except aiohttp.ClientError as exc:
            return self._fail(502, f"upstream primary unreachable: {exc}")

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    def state(self) -> dict[str, Any]:
        p = self.publisher
        f = self.follower
        router = self.router
        return {
            "upstreams": dict(self._bases),
            "experiments": {
                e.id: {
                    "arms": {
                        a.name: {
                            "weight": w,
                            "upstream": a.upstream,
                            "prompt_version": a.prompt_version,
                        }
                        for a, w in zip(e.arms, e.weights.values(), strict=True)
                    },
                    "control": e.control,
                    "traffic": e.traffic,
                    "unit": e.unit,
                }
                for e in router.experiments.values()
            },
            "layers": {layer.name: [e.id for e in layer.experiments] for layer in router.layers},
            "overrides": {k: dataclasses.asdict(v) for k, v in router.overrides.items()},
            "publisher": {
                "submitted": p.stats.submitted,
                "published": p.stats.published,
                "dropped": p.stats.dropped,
                "buffered": p.buffered,
                "queued": p.queued,
                "in_flight": p.in_flight,
                "requeued": p.stats.requeued,
                "oversize": p.stats.oversize,
                "broker_up": p.stats.broker_up,
            },
            "releases": None
            if f is None
            else {"seen": f.seen, "applied": f.applied, "bad": f.bad, "assigned": f.assigned},
            "requests": sum(self.requests.values()),
            "unrouted": self.unrouted,
            "aborted": self.aborted,
            "routed": [
                {"experiment": e, "assigned": a, "served": s, "requests": n}
                for (e, a, s), n in sorted(self.routed.items())
            ],
        }

    async def _state(self, _request: web.Request) -> web.Response:
        return web.json_response(self.state())


class _Metrics:
    """Prometheus families of one gateway, rendered on scrape from its counters."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    def collect(self) -> Any:
        gw = self.gw
        req = CounterMetricFamily(
            "tailguard_gateway_requests",
            "Measured requests by upstream, event status and HTTP status.",
            labels=["upstream", "status", "code"],
        )
        for (up, st, code), n in sorted(gw.requests.items()):
            req.add_metric([up, st, code], n)
        yield req
        routed = CounterMetricFamily(
            "tailguard_gateway_routed_requests",
            "Requests per experiment, assigned arm and the arm that served them.",
            labels=["experiment", "assigned", "served"],
        )
        for (e, a, s), n in sorted(gw.routed.items()):
            routed.add_metric([e, a, s], n)
        yield routed
        stats = gw.publisher.stats
        for name, help_, value in (
            ("events_submitted", "Inference events produced by the gateway.", stats.submitted),
            ("events_published", "Events the broker acknowledged.", stats.published),
            ("events_dropped", "Events dropped: buffer full while Kafka was away.", stats.dropped),
            ("events_requeued", "Events put back after a failed delivery.", stats.requeued),
            ("events_oversize", "Events too large for one message (not sent).", stats.oversize),
        ):
            fam = CounterMetricFamily(f"tailguard_gateway_{name}", help_)
            fam.add_metric([], value)
            yield fam
        buffered = GaugeMetricFamily(
            "tailguard_gateway_events_buffered", "Events accepted, not yet acknowledged by Kafka."
        )
        buffered.add_metric([], gw.publisher.buffered)
        yield buffered
        kafka = GaugeMetricFamily(
            "tailguard_gateway_kafka_up", "1 when the last delivery succeeded."
        )
        kafka.add_metric([], 1.0 if stats.broker_up else 0.0)
        yield kafka
        overrides = GaugeMetricFamily(
            "tailguard_gateway_release_override",
            "1 per experiment whose routing a release decision changed.",
            labels=["experiment", "decision", "arm"],
        )
        for exp, o in sorted(gw.router.overrides.items()):
            if o.decision in ("rollback", "promote"):
                overrides.add_metric([exp, o.decision, o.arm or ""], 1.0)
        yield overrides
        names = {url: name for name, url in gw._bases.items()}
        for attr, name, help_ in (
            ("connects", "upstream_connections_opened",
             "Connections the measured path opened to each upstream (keep-alive churn)."),
            ("retries", "upstream_resends",
             "Replayable requests sent again after a reused connection died unanswered."),
            ("pauses", "upstream_backpressure_pauses",
             "Times a slow client paused reading its upstream response."),
        ):  # fmt: skip
            fam = CounterMetricFamily(f"tailguard_gateway_{name}", help_, labels=["upstream"])
            for url, pool in sorted(gw._pools.items()):
                fam.add_metric([names.get(url, url)], getattr(pool, attr))
            yield fam


def run_gateway(config: GatewayConfig, *, loglevel: str = "info") -> int:
    """Serve until SIGINT/SIGTERM; returns the exit status."""
    logging.basicConfig(
        level=getattr(logging, loglevel.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    gw = Gateway(config)
    gw.app.on_startup.append(_freeze_heap)
    log.warning(
        "tailguard gateway on http://%s:%d (upstreams %s; events → %s%s at %s; state %s; pid %d)",
        config.host,
        config.port,
        ", ".join(f"{k}={v}" for k, v in config.upstreams.items()),
        config.topic_prefix,
        cat.INFERENCE,
        config.broker,
        config.state_file,
        os.getpid(),
    )
    web.run_app(
        gw.app, host=config.host, port=config.port, print=None, access_log=None,
        shutdown_timeout=10.0, loop=new_event_loop(),
    )  # fmt: skip
    return 0


async def _freeze_heap(_app: web.Application) -> None:
    """Move everything alive after start-up out of the garbage collector's sight.

    A full collection walks every tracked object, and the gateway's ~54,000 from its
    imports took 40 ms a walk (measured with ``gc.callbacks``) — every stream's chunk
    waiting behind it. Frozen, they are never walked again; what the requests allocate
    is freed by reference counting (the relay leaves no cycles: see
    ``tests/unit/gateway/test_relay.py``), so collections stay short."""
    gc.collect()
    gc.freeze()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed, else asyncio's;
    ``TAILGUARD_EVENT_LOOP=asyncio`` forces asyncio's. (Measured with bench/gateway.py,
    50 streams of 40 chunks: 7.0 ms of gateway CPU per request on uvloop, 7.6 on asyncio.)"""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        uvloop = None
    if uvloop is None or os.environ.get("TAILGUARD_EVENT_LOOP") == "asyncio":
        loop = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    return loop
