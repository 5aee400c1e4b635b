"""The HTTP port: one POST against a loopback server, and option checks."""

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tailguard.alerts.errors import AlertsConfigError
from tailguard.alerts.webhook import HttpWebhook, RecordingWebhook, parse_header


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self.server.seen.append((self.path, dict(self.headers), self.rfile.read(length)))
        status, extra = self.server.answers.pop(0) if self.server.answers else (200, {})
        self.send_response(status)
        for k, v in extra.items():
            self.send_header(k, v)
        body = b"nope\n" if status >= 300 else b""
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Any]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.seen = []  # type: ignore[attr-defined]
    srv.answers = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_a_2xx_is_a_delivery_and_headers_are_sent(server: Any) -> None:
    hook = HttpWebhook(
        f"http://127.0.0.1:{server.server_port}/hook?team=llm",
        headers=(("Authorization", "Bearer t"),),
    )
    outcome = hook.post(b'{"a":1}', {"Idempotency-Key": "b1:0"})
    assert (outcome.ok, outcome.status) == (True, 200)
    [(path, headers, body)] = server.seen
    assert path == "/hook?team=llm"
    assert body == b'{"a":1}'
    assert headers["Idempotency-Key"] == "b1:0"
    assert headers["Authorization"] == "Bearer t"
    assert headers["Content-Type"] == "application/json"


def test_5xx_3xx_and_4xx_are_failures_and_retry_after_is_passed_on(server: Any) -> None:
    server.answers += [
        (503, {"Retry-After": "7"}),
        (307, {"Location": "http://elsewhere/"}),
        (400, {}),
    ]
    hook = HttpWebhook(f"http://127.0.0.1:{server.server_port}/")
    first, second, third = (hook.post(b"{}", {}) for _ in range(3))
    assert (first.ok, first.status, first.retry_after_s) == (False, 503, 7.0)
    assert first.detail == "HTTP 503 nope"
    assert (second.ok, second.status) == (False, 307)  # never followed
    assert (third.ok, third.status) == (False, 400)
    assert len(server.seen) == 3


def test_no_server_is_a_failure_without_status() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outcome = HttpWebhook(f"http://127.0.0.1:{port}/", timeout_s=2).post(b"{}", {})
    assert (outcome.ok, outcome.status) == (False, None)
    assert "ConnectionRefusedError" in outcome.detail


@pytest.mark.parametrize("url", ["ftp://x/", "http:///path", "localhost:9095", "http://h:99999/"])
def test_a_bad_webhook_url_is_refused(url: str) -> None:
    with pytest.raises(AlertsConfigError, match="--webhook"):
        HttpWebhook(url)


def test_headers_parse_and_bad_ones_are_refused() -> None:
    assert parse_header("Authorization: Bearer a:b") == ("Authorization", "Bearer a:b")
    for bad in ("no colon", ": v", "Bad Name: v"):
        with pytest.raises(AlertsConfigError, match="NAME: VALUE"):
            parse_header(bad)


def test_the_recording_double_follows_its_script() -> None:
    hook = RecordingWebhook(script=[503, 500])
    assert [hook.post(b"x", {}).ok for _ in range(3)] == [False, False, True]
    assert len(hook.posts) == 3
