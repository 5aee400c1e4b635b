"""What the forwarder has delivered, and how long it waits before trying again.

**The delivery log.** Kafka offsets say what the forwarder has *finished*; they
are committed only after the receiver answered 2xx. A crash between that
answer and the commit would make a restarted forwarder POST the event again.
To close most of that window the forwarder first appends the event id to a
small local state file (written to a temporary file, fsynced, renamed over
the old one), then commits. A restart that finds the id in the file commits
without POSTing::

    consume ──▶ POST … 503 … 503 … 2xx ──▶ log.record(event_id) ──▶ commit(offset + 1)
                └ crash here: not delivered,   └ crash here:          └ crash here:
                  POSTed again (correct)         POSTed again           no POST, only
                                                 (the window left)      the commit

The log keeps the last :data:`KEEP` event ids per (topic, partition): one would
cover the crash window, more also absorbs the worker's own re-sends (after a
worker crash an output may be published again with the same ``event_id``,
on which subscribers deduplicate), which land on the same partition
because breaches are keyed by series.

**Backoff.** Delay before retry *n* (0-based): ``cap = min(max_s, base_s ·
factorⁿ)``, then "equal jitter" — ``cap/2 + U(0, cap/2)`` — so many forwarders
that failed together do not retry together, yet none retries at once (AWS
Architecture Blog, "Exponential Backoff And Jitter", 2015).
"""

import json
import os
import random
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tailguard.alerts.errors import AlertsConfigError, DeliveryStateError

__all__ = ["KEEP", "Backoff", "DeliveryLog"]

#: Event ids remembered per (topic, partition).
KEEP: Final = 256
_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with equal jitter, bounded by ``max_s``."""

    base_s: float = 0.5
    max_s: float = 60.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_s:
            msg = f"backoff needs 0 < base ≤ max seconds, got base {self.base_s}, max {self.max_s}"
            raise AlertsConfigError(msg)
        if self.factor < 1:
            msg = f"backoff factor must be ≥ 1, got {self.factor}"
            raise AlertsConfigError(msg)

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0 = the first)."""
        cap = min(self.max_s, self.base_s * self.factor ** min(attempt, 64))
        return cap / 2 + rng.uniform(0, cap / 2)


@dataclass
class DeliveryLog:
    """Event ids delivered per (topic, partition), persisted in one JSON file.

    File format (version 1)::

        {"version": 1, "partitions": {"<topic>": {"<partition>":
            {"offset": <last delivered offset>, "event_ids": [<oldest>, …, <newest>]}}}}
    """

    path: Path
    keep: int = KEEP
    _ids: dict[tuple[str, int], deque[str]] = field(default_factory=dict)
    _offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, keep: int = KEEP) -> "DeliveryLog":
        """The log in ``path``; empty when the file does not exist yet."""
        log = cls(path=path, keep=keep)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return log
        except OSError as exc:
            msg = f"cannot read the delivery state {path}: {exc.strerror or exc}"
            raise DeliveryStateError(msg) from None
        try:
            data = json.loads(raw)
            if data.get("version") != _VERSION:
                msg = f"version {data.get('version')!r}, this forwarder reads {_VERSION}"
                raise ValueError(msg)
            for topic, parts in data["partitions"].items():
                for partition, entry in parts.items():
                    key = (str(topic), int(partition))
                    ids = [str(x) for x in entry["event_ids"]]
                    log._ids[key] = deque(ids[-keep:], maxlen=keep)
                    log._offsets[key] = int(entry["offset"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            msg = (
                f"the delivery state {path} is not valid ({exc}); move it away to start "
                "afresh (events since the last committed offset may then be POSTed again)"
            )
            raise DeliveryStateError(msg) from None
        return log

    def delivered(self, topic: str, partition: int, event_id: str) -> bool:
        """Whether ``event_id`` was delivered from this partition recently."""
        ids = self._ids.get((topic, partition))
        return ids is not None and event_id in ids

    def last_offset(self, topic: str, partition: int) -> int | None:
        return self._offsets.get((topic, partition))

    def record(self, topic: str, partition: int, offset: int, event_id: str) -> None:
        """Remember a delivery and persist the log before returning."""
        key = (topic, partition)
        self._ids.setdefault(key, deque(maxlen=self.keep)).append(event_id)
        self._offsets[key] = offset
        self._write()

    def _snapshot(self) -> dict[str, Any]:
        parts: dict[str, dict[str, Any]] = {}
        for (topic, partition), ids in sorted(self._ids.items()):
            parts.setdefault(topic, {})[str(partition)] = {
                "offset": self._offsets[(topic, partition)],
                "event_ids": list(ids),
            }
        return {"version": _VERSION, "partitions": parts}

    def _write(self) -> None:
        data = json.dumps(self._snapshot(), separators=(",", ":")).encode()
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=folder)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            msg = f"cannot write the delivery state {self.path}: {exc.strerror or exc}"
            raise DeliveryStateError(msg) from None
