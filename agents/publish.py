"""Output framing: JSON payloads with CloudEvents binary-mode headers."""

from typing import Any

import msgspec
from tailguard.schemas import ce_headers

__all__ = ["frame"]

_encode = msgspec.json.Encoder().encode


def frame(payload: dict[str, Any], *, source: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Encode an output event (which carries ``schema``, ``event_id``, ``ts_ms``)
    and its CloudEvents headers."""
    headers = ce_headers(payload["schema"], payload["event_id"], payload["ts_ms"], source=source)
    return _encode(payload), headers
