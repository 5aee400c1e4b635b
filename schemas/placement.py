"""Where an inference event belongs: its series key and the series' home partition.

A series is ``service|model|variant|tenant`` (absent ``variant`` and ``tenant``
are ``default``). Its *home partition* is where its window state lives::

    home = crc32(series_key.encode("utf-8")) % partitions      (zlib's CRC-32, IEEE)

It is also the partition librdkafka's default partitioner (``consistent_random``)
picks for a message whose key is the series key, so a producer on any
librdkafka client gets it by keying each message with the series key of its
events. A worker folds an event that arrives on its series' home partition of
``tailguard.inference`` in place (one broker hop); any other placement still
works, through one more hop (``tailguard.internal.series``). A message may
batch many series, as long as they share a home partition.

Java clients partition by murmur2, not CRC-32: pass the partition explicitly
(this function's result) rather than relying on their default partitioner.
"""

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "by_home_partition",
    "home_partition",
    "series_key",
    "series_key_of",
    "series_of_key",
]


def series_key(service: str, model: str, variant: str, tenant: str) -> str:
    """The key of a series: ``service|model|variant|tenant``."""
    return f"{service}|{model}|{variant}|{tenant}"


def series_of_key(key: str) -> tuple[str, str, str, str]:
    """The ``(service, model, variant, tenant)`` of a series key (see :func:`series_key`)."""
    service, model, variant, tenant = key.split("|", 3)
    return service, model, variant, tenant


def series_key_of(event: Mapping[str, Any]) -> str:
    """The series key of an inference event given as a JSON object (a dict)."""
    return series_key(
        str(event.get("service")),
        str(event.get("model")),
        str(event.get("variant") or "default"),
        str(event.get("tenant") or "default"),
    )


def home_partition(key: str, partitions: int) -> int:
    """The home partition of series ``key`` among ``partitions`` (stable across
    processes, releases and client libraries)."""
    return zlib.crc32(key.encode()) % partitions


def by_home_partition(
    events: Iterable[Mapping[str, Any]], partitions: int
) -> dict[int, tuple[str, list[Mapping[str, Any]]]]:
    """Events grouped by home partition, in order: ``partition → (key, events)``,
    with ``key`` the series key of the group's first event (a message key that
    librdkafka's default partitioner maps to that same partition)."""
    out: dict[int, tuple[str, list[Mapping[str, Any]]]] = {}
    homes: dict[str, int] = {}
    for event in events:
        key = series_key_of(event)
        home = homes.get(key)
        if home is None:
            home = homes[key] = home_partition(key, partitions)
        group = out.get(home)
        if group is None:
            out[home] = (key, [event])
        else:
            group[1].append(event)
    return out
