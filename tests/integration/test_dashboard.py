"""The worker's web server on the real broker: /metrics under promtool, the dashboard in Chromium.

Both tests start a worker with ``--web-port``, replay 45 minutes of history
in which ``svc-hot`` breaks its TTFT SLO for 15 minutes (a page opens), and
look at what the worker serves:

- ``/metrics`` passes ``promtool check metrics`` (Debian ``prometheus``) and
  carries the open breach, burn rates, counters, dead letters and lag;
- ``/dashboard`` in headless Chromium (Debian ``chromium``, driven through
  the DevTools protocol by the small client below) shows the series and the
  open breach with its GPUs, and keeps updating from the JSON endpoint while
  live traffic flows, without a reload. A screenshot goes to
  ``bench/results/dashboard.png``.

``make test`` installs both tools (``make tools``); a missing tool fails the
test with the command to install it rather than skipping it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "bench" / "results" / "dashboard.png"
MIN = 60_000
RATE = 10  # requests per minute and series
HEALTHY_MIN = 30
INCIDENT_MIN = 15
SERVICES = ("svc-hot", "svc-b", "svc-c")


def require(tool: str, package: str) -> str:
    """Path of ``tool``; fails (never skips) with how to install it."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(
            f"{tool} is not installed: `make tools` installs it "
            f"(apt-get install -y --no-install-recommends {package}); `make test` runs that first"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def minute_batch(start_ms: int, minute: int, *, bad: bool) -> list[dict[str, Any]]:
    batch = []
    for svc in SERVICES:
        hot = bad and svc == "svc-hot"
        for i in range(RATE):
            ttft = 2_500.0 if hot else 200.0 + i
            batch.append(
                {
                    "event_id": f"{svc}-{minute}-{i}",
                    "ts_ms": start_ms + minute * MIN + i * (MIN // RATE),
                    "service": svc,
                    "model": "m1",
                    "status": "ok",
                    "ttft_ms": ttft,
                    "e2e_ms": ttft + 400.0,
                    "output_tokens": 9,
                    "itl_ms": [50.0] * 8,
                    "trace_id": f"{minute:016x}{i:08x}{len(svc):08x}",
                    "host": "gpu-node-07" if svc == "svc-hot" else "gpu-node-09",
                    "gpu_ids": [0, 1] if svc == "svc-hot" else [3],
                    "stages_ms": {"queue": ttft * 0.6, "prefill": ttft * 0.4},
                    # the article's chain: a prefix-cache miss storm and batches
                    # that wait out their timeout (cause attribution)
                    "cache": {"prefix_hit_tokens": 73 if hot else 987, "prefix_query_tokens": 1000},
                    "batch": {
                        "size": 1 if hot else 4,
                        "wait_ms": 350.0 if hot else 5.0,
                        "timed_out": hot,
                    },
                }
            )
    return batch


def history(start_ms: int) -> list[tuple[bytes, bytes]]:
    """Healthy minutes, then ``svc-hot`` 100 % over the TTFT threshold; one key, one partition."""
    return [
        (b"svc-all", json.dumps(minute_batch(start_ms, m, bad=m >= HEALTHY_MIN)).encode())
        for m in range(HEALTHY_MIN + INCIDENT_MIN)
    ]


def gpu_samples(now_ms: int) -> list[tuple[bytes, bytes]]:
    out = []
    for host, gpu in (("gpu-node-07", 0), ("gpu-node-07", 1), ("gpu-node-09", 3)):
        sample = {
            "ts_ms": now_ms - 1_000,
            "host": host,
            "gpu": gpu,
            "util_gpu_pct": 97.0,
            "mem_used_mib": 78_000.0,
            "mem_total_mib": 81_559.0,
            "power_w": 690.0,
            "temp_c": 84.0,
            "throttle_reasons": ["sw_thermal"],
        }
        out.append((f"{host}:{gpu}".encode(), json.dumps(sample).encode()))
    return out


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def wait_http(url: str, worker: Any, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not worker.alive():
            raise AssertionError(f"worker died:\n{worker.log_tail()}")
        try:
            http_get(url, timeout=2)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    raise AssertionError(f"{url} never answered\n{worker.log_tail()}")


def start_with_incident(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[[str], Any],
    produce: Callable[..., Any],
    name: str,
) -> tuple[Any, int, int]:
    """A worker with its web server, the incident replayed, its page open: (worker, port, start)."""
    now = int(time.time() * 1000)
    produce(namespace.broker, namespace.topic("tailguard.gpu"), gpu_samples(now))
    port = free_port()
    worker = worker_factory(name, "--web-port", str(port)).start()
    wait_http(f"http://127.0.0.1:{port}/metrics", worker)
    time.sleep(3)  # the GPU join cache reads the telemetry topic from a few minutes back
    start = now - 120 * MIN
    inference = namespace.topic("tailguard.inference")
    produce(namespace.broker, inference, [(b"bad", b"{not json")])
    produce(namespace.broker, inference, history(start))
    breaches = collector("tailguard.breaches")
    breaches.wait_for(
        lambda r: any(x["state"] == "opened" and x["series"]["service"] == "svc-hot" for x in r),
        timeout=180,
        worker=worker,
    )
    return worker, port, start


@contextmanager
def live_traffic(
    broker: str, topic: str, start_ms: int, produce: Callable[..., Any]
) -> Iterator[None]:
    """One more (healthy) minute of event time per wall-clock second, until the block ends."""
    stop = threading.Event()

    def run() -> None:
        minute = HEALTHY_MIN + INCIDENT_MIN
        while not stop.is_set() and minute < 110:
            batch = minute_batch(start_ms, minute, bad=False)
            produce(broker, topic, [(b"svc-all", json.dumps(batch).encode())])
            minute += 1
            stop.wait(1.0)

    thread = threading.Thread(target=run, name="live-traffic", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def test_metrics_pass_promtool_and_carry_slis_burn_rates_breaches_and_lag(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[[str], Any],
    produce: Callable[..., Any],
) -> None:
    promtool = require("promtool", "prometheus")
    worker, port, _ = start_with_incident(namespace, worker_factory, collector, produce, "metrics")
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 60
    text = ""
    while time.monotonic() < deadline:
        text = http_get(url).decode()
        if "tailguard_breach_open{" in text and "tailguard_consumer_lag_messages{" in text:
            break
        time.sleep(1)
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60
    )
    problems = (checked.stdout + checked.stderr).decode()
    assert checked.returncode == 0 and not problems.strip(), problems

    def samples(name: str) -> list[tuple[str, float]]:
        return [
            (line[len(name) :].rsplit(" ", 1)[0], float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")
        ]

    hot = [v for labels, v in samples("tailguard_breach_open") if 'service="svc-hot"' in labels]
    assert hot and all(v == 1 for v in hot), "the open page is exported"
    assert not [lb for lb, _ in samples("tailguard_breach_open") if 'service="svc-b"' in lb]
    burn = [
        v
        for labels, v in samples("tailguard_slo_burn_rate")
        if 'service="svc-hot"' in labels and 'slo="ttft-p99"' in labels and 'window="1h"' in labels
    ]
    assert burn and burn[0] > 1.0, "svc-hot burns its TTFT budget"
    state = [
        v
        for labels, v in samples("tailguard_slo_breach_state")
        if 'service="svc-hot"' in labels and 'slo="ttft-p99"' in labels
    ]
    assert state and state[0] >= 1
    p99 = [
        v
        for labels, v in samples("tailguard_sli_latency_seconds")
        if 'service="svc-b"' in labels
        and 'metric="ttft"' in labels
        and 'percentile="p99"' in labels
    ]
    assert p99 and all(0.15 < v < 0.25 for v in p99), p99
    (processed,) = [v for _, v in samples("tailguard_events_processed_total")]
    assert processed >= (HEALTHY_MIN + INCIDENT_MIN) * RATE * len(SERVICES) * 0.9
    assert sum(v for _, v in samples("tailguard_deadletters_total")) >= 1
    lag = [labels for labels, _ in samples("tailguard_consumer_lag_messages")]
    assert any(namespace.topic("tailguard.inference") in labels for labels in lag), lag
    assert worker.stop() == 0


# --------------------------------------------------------------------------- Chromium


class DevTools:
    """The least of the Chrome DevTools Protocol: one page target over a websocket (aiohttp)."""

    def __init__(self, ws_url: str) -> None:
        self.ws_url = ws_url
        self.loop = asyncio.new_event_loop()
        self._id = 0
        self.session: Any = None
        self.ws: Any = None
        self.loop.run_until_complete(self._connect())

    async def _connect(self) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(self.ws_url, max_msg_size=64 * 1024 * 1024)

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._id += 1
        ident = self._id
        await self.ws.send_json({"id": ident, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), timeout=60)
            if msg.get("id") == ident:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.loop.run_until_complete(self._call(method, params))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        async def shut() -> None:
            await self.ws.close()
            await self.session.close()

        self.loop.run_until_complete(shut())
        self.loop.close()


@contextmanager
def chromium(tmp: Path) -> Iterator[DevTools]:
    """Headless Chromium with remote debugging on a free port; yields its first page."""
    binary = require("chromium", "chromium")
    profile = tmp / "chromium-profile"
    log_file = (tmp / "chromium.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            "--headless=new",
            "--no-sandbox",  # tests may run as root
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "--remote-allow-origins=*",
            "--window-size=1440,1800",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log_file,
    )
    tools: DevTools | None = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (tmp / "chromium.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"chromium did not start (exit {proc.poll()}):\n{log}")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(http_get(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in targets if t.get("type") == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        yield tools
    finally:
        if tools is not None:
            tools.close()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log_file.close()


READ_DOM = """(() => document.getElementById('c-events') === null ? null : ({
  series: [...document.querySelectorAll('tr.series-row')].map(r => r.dataset.key),
  breachedRows: [...document.querySelectorAll('tr.series-row.breached')].map(r => r.dataset.key),
  breaches: [...document.querySelectorAll('.breach')].map(b => b.innerText),
  gpus: [...document.querySelectorAll('.breach tr.gpu')].map(r => r.innerText),
  events: document.getElementById('c-events').textContent,
  polls: Number(document.getElementById('polls').textContent),
  status: document.getElementById('status').textContent,
  experiments: document.getElementById('experiments').innerText,
  marker: window.__tgMarker || null,
}))()"""


def wait_dom(
    page: DevTools, predicate: Callable[[dict[str, Any]], bool], timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    dom: dict[str, Any] = {}
    while time.monotonic() < deadline:
        dom = page.evaluate(READ_DOM) or {}  # None until the dashboard has loaded
        if dom and predicate(dom):
            return dom
        time.sleep(0.5)
    raise AssertionError(f"dashboard never showed it: {json.dumps(dom)[:3000]}")


def test_dashboard_shows_the_series_and_the_open_breach_and_updates_live(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[[str], Any],
    produce: Callable[..., Any],
    tmp_path: Path,
) -> None:
    require("chromium", "chromium")
    worker, port, start = start_with_incident(
        namespace, worker_factory, collector, produce, "dashboard"
    )
    inference = namespace.topic("tailguard.inference")
    with live_traffic(namespace.broker, inference, start, produce), chromium(tmp_path) as page:
        page.call(
            "Emulation.setDeviceMetricsOverride",
            width=1440,
            height=1800,
            deviceScaleFactor=1,
            mobile=False,
        )
        page.call("Page.enable")
        page.call("Page.navigate", url=f"http://127.0.0.1:{port}/dashboard")
        first = wait_dom(
            page,
            lambda d: (
                len(d["series"]) == 3
                and any("svc-hot" in b and "page" in b.lower() for b in d["breaches"])
            ),
            timeout=60,
        )
        assert first["status"] == "live"
        assert {k.split("|")[0] for k in first["series"]} == set(SERVICES)
        assert [k.split("|")[0] for k in first["breachedRows"]] == ["svc-hot"]
        cards = [b for b in first["breaches"] if "svc-hot" in b]
        assert len(cards) == len(first["breaches"]), "only svc-hot breaches"
        assert any("ttft-p99" in b and "page" in b.lower() for b in cards), cards
        assert all("prefix_cache_miss" in b and "batch_wait" in b for b in cards), cards
        assert any("gpu-node-07:0" in g and "97 %" in g for g in first["gpus"]), first["gpus"]
        assert "no experiment reported yet" in first["experiments"]

        # Same page, no reload: the marker survives while the numbers move.
        page.evaluate("window.__tgMarker = 'loaded-once'")
        events_before = int(first["events"].replace(",", ""))
        later = wait_dom(
            page,
            lambda d: (
                d["polls"] >= first["polls"] + 3
                and int(d["events"].replace(",", "") or 0) > events_before
            ),
            timeout=60,
        )
        assert later["marker"] == "loaded-once", "the page updated without a reload"
        time.sleep(1.5)
        shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.write_bytes(base64.b64decode(shot["data"]))
    assert SCREENSHOT.stat().st_size > 10_000
    assert worker.stop() == 0
