"""CloudEvents framing of output records: Kafka *binary* content mode.

In binary mode the Kafka message value is the record's JSON itself and the
CloudEvents attributes travel as headers named ``ce_<attribute>`` (CloudEvents
Kafka protocol binding v1.0.2, §3.2), plus ``content-type`` for the data.
Subscribers that know nothing of CloudEvents read the value as plain JSON.

Why not the ``cloudevents`` SDK's Kafka binding: its ``to_binary`` wants a
``CloudEvent`` object built per record (it fills in a random id and the
current time unless told otherwise), re-marshals the data with ``json.dumps``
and returns headers as a dict, while confluent-kafka and aiokafka take a list
of ``(str, bytes)``. What it does for binary mode is exactly the loop below,
so the dependency would add an object per output and a second JSON encoding
for nothing.
"""

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Final

__all__ = ["CONTENT_TYPE", "SPEC_VERSION", "ce_headers", "rfc3339_ms"]

SPEC_VERSION: Final = b"1.0"
CONTENT_TYPE: Final = b"application/json"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def rfc3339_ms(ts_ms: int) -> str:
    """Epoch milliseconds as RFC 3339 UTC with milliseconds: ``2024-05-01T12:00:00.123Z``.

    Integer arithmetic, so no float rounding moves a millisecond.
    """
    moment = _EPOCH + timedelta(milliseconds=ts_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts_ms % 1000:03d}Z"


def ce_headers(
    schema_id: str, event_id: str, ts_ms: int, source: str = "tailguard"
) -> list[tuple[str, bytes]]:
    """Kafka headers that make a record a binary-mode CloudEvent.

    ``ce_type`` is the schema id, ``ce_id`` the record's ``event_id``,
    ``ce_time`` its ``ts_ms``; the list suits confluent-kafka's and aiokafka's
    ``headers=`` arguments.
    """
    return [
        ("ce_specversion", SPEC_VERSION),
        ("ce_id", event_id.encode()),
        _source_header(source),
        _type_header(schema_id),
        ("ce_time", _time_bytes(ts_ms)),
        ("content-type", CONTENT_TYPE),
    ]


# A worker frames tens of thousands of records a minute with a handful of
# sources, types and instants: each header is encoded once.
@lru_cache(maxsize=64)
def _source_header(source: str) -> tuple[str, bytes]:
    return ("ce_source", source.encode())


@lru_cache(maxsize=64)
def _type_header(schema_id: str) -> tuple[str, bytes]:
    return ("ce_type", schema_id.encode())


@lru_cache(maxsize=256)
def _time_bytes(ts_ms: int) -> bytes:
    return rfc3339_ms(ts_ms).encode()
