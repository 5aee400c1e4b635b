"""The HTTP port of the forwarder: one POST of one body, and what came of it.

:class:`HttpWebhook` speaks HTTP/1.1 through the standard library's
``http.client`` (a new connection per POST: alerts are few, and a fresh
connection never trips over one the receiver half-closed). Redirects are not
followed — a 3xx is a failed attempt, as for Alertmanager — so a POST is never
silently turned into a GET. :class:`RecordingWebhook` is the in-memory double
for unit tests.

An attempt succeeds only on a 2xx status. Everything else — a connection
error, a timeout, 3xx, 4xx, 5xx — is a failure the forwarder retries; a
``Retry-After`` header (seconds) on a 429 or 503 is passed on.
"""

import http.client
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from tailguard.alerts.errors import AlertsConfigError

__all__ = ["Attempt", "HttpWebhook", "RecordingWebhook", "Webhook", "parse_header"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """The outcome of one POST."""

    ok: bool
    #: HTTP status, or None when no response came (connection refused, timeout).
    status: int | None
    #: One line for the log: the status and the start of the body, or the error.
    detail: str
    retry_after_s: float | None = None


class Webhook(Protocol):
    """Something that POSTs a JSON body (with extra headers) and reports the outcome."""

    def post(self, body: bytes, headers: Mapping[str, str]) -> Attempt: ...


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare for webhooks, the backoff applies
    return seconds if seconds >= 0 else None


def parse_header(text: str) -> tuple[str, str]:
    """``"Authorization: Bearer x"`` → ``("Authorization", "Bearer x")``."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or any(c in name for c in " \t\r\n"):
        msg = f"--header wants NAME: VALUE (e.g. 'Authorization: Bearer …'), got {text!r}"
        raise AlertsConfigError(msg)
    if any(c in value for c in "\r\n"):
        msg = f"--header {name.strip()}: the value must be one line"
        raise AlertsConfigError(msg)
    return name.strip(), value.strip()


@dataclass(frozen=True)
class HttpWebhook:
    """POSTs to ``url`` with ``timeout_s`` for connecting and for each read."""

    url: str
    timeout_s: float = 10.0
    headers: tuple[tuple[str, str], ...] = ()
    user_agent: str = "tailguard-alerts"

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            msg = f"--webhook must be an http:// or https:// URL with a host, got {self.url!r}"
            raise AlertsConfigError(msg)
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            msg = f"--webhook has an invalid port: {self.url!r}"
            raise AlertsConfigError(msg) from None
        if not self.timeout_s > 0:
            msg = f"the webhook timeout must be > 0 seconds, got {self.timeout_s}"
            raise AlertsConfigError(msg)

    def post(self, body: bytes, headers: Mapping[str, str]) -> Attempt:
        parts = urlsplit(self.url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                parts.hostname or "",
                parts.port,
                timeout=self.timeout_s,
                context=ssl.create_default_context(),
            )
        else:
            conn = http.client.HTTPConnection(
                parts.hostname or "", parts.port, timeout=self.timeout_s
            )
        sent = {
            "User-Agent": self.user_agent,
            "Content-Type": "application/json",
            **dict(self.headers),
            **headers,
        }
        try:
            conn.request("POST", path, body=body, headers=sent)
            resp = conn.getresponse()
            text = resp.read(512).decode("utf-8", "replace").strip().replace("\n", " ")
            status = resp.status
            retry_after = _retry_after(resp.getheader("Retry-After"))
        except (OSError, http.client.HTTPException) as exc:
            return Attempt(False, None, f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()
        detail = f"HTTP {status}" + (f" {text[:200]}" if text else "")
        return Attempt(200 <= status < 300, status, detail, retry_after)


@dataclass
class RecordingWebhook:
    """Test double: answers from a script of statuses (then ``then``), records every POST."""

    script: Iterable[int] = ()
    then: int = 200
    posts: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._script = iter(self.script)

    def post(self, body: bytes, headers: Mapping[str, str]) -> Attempt:
        self.posts.append((body, dict(headers)))
        status = next(self._script, self.then)
        return Attempt(200 <= status < 300, status, f"HTTP {status}")
