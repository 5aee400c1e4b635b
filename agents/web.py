"""The worker's HTTP endpoints, on faust's own web server (aiohttp).

Enabled with ``tailguard worker --web-port PORT`` (env ``TAILGUARD_WEB_PORT``;
``--web-bind`` / ``TAILGUARD_WEB_BIND`` to listen beyond 127.0.0.1). faust
starts its web server before the consumer, so ``/metrics`` answers during
table recovery too.

=========================  ===========================================================
``GET /metrics``           Prometheus text exposition (:mod:`tailguard.agents.metrics`)
``GET /dashboard``         live dashboard: one static HTML page, CSS and JS inline, no
                           CDN, no build step (``dashboard.html`` beside this module)
``GET /dashboard/state``   what the page polls every second: :meth:`Telemetry.view` as
                           JSON (``?limit=N`` series, default 200)
=========================  ===========================================================
"""

import asyncio
from importlib import resources
from typing import Any

import faust
import msgspec
from tailguard.agents.metrics import (
    CONTENT_TYPE,
    Collected,
    consumer_lag,
    make_registry,
    order_guard_counts,
    render,
)
from tailguard.agents.telemetry import Telemetry

__all__ = ["DASHBOARD_PATH", "METRICS_PATH", "STATE_PATH", "dashboard_html", "register_web"]

METRICS_PATH = "/metrics"
DASHBOARD_PATH = "/dashboard"
STATE_PATH = "/dashboard/state"

_encode = msgspec.json.Encoder().encode


def dashboard_html() -> str:
    """The dashboard page (read once at registration)."""
    return resources.files("tailguard.agents").joinpath("dashboard.html").read_text("utf-8")


def _limit(request: Any, default: int = 200) -> int:
    raw = request.query.get("limit")
    if raw is None:
        return default
    try:
        return max(0, min(int(raw), 10_000))
    except ValueError:
        return default


def register_web(app: faust.App, telemetry: Telemetry) -> None:
    """Add ``/metrics``, ``/dashboard`` and ``/dashboard/state`` to the app's web server."""
    registry = make_registry(telemetry, lambda: consumer_lag(app), lambda: order_guard_counts(app))
    page = dashboard_html()
    no_store = {"Cache-Control": "no-store"}

    @app.page(METRICS_PATH, name="tailguard-metrics")
    async def metrics(self: Any, request: Any) -> Any:
        collected = Collected(registry)  # on the loop: reads the live registry
        body = await asyncio.get_running_loop().run_in_executor(None, render, collected)
        return self.bytes(body, headers={"Content-Type": CONTENT_TYPE, **no_store})

    @app.page(DASHBOARD_PATH, name="tailguard-dashboard")
    async def dashboard(self: Any, request: Any) -> Any:
        return self.html(page, headers=dict(no_store))

    @app.page(STATE_PATH, name="tailguard-dashboard-state")
    async def state(self: Any, request: Any) -> Any:
        view = telemetry.view(limit=_limit(request), lag=consumer_lag(app))
        # msgspec writes NaN/inf as null, which the browser's JSON.parse accepts.
        return self.bytes(_encode(view), content_type="application/json", headers=dict(no_store))
