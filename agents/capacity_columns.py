"""What the ingest forwards to the capacity agent: each deployment's requests, as columns.

Per ingest batch and partition of ``tailguard.internal.capacity``, one message
holds the requests of the deployments (``service|model``) hashing to that
partition: per deployment, the fields the capacity agent reads, one column
each, and the input position of every request as runs
(:mod:`~tailguard.streams.input_marks`), so the agent applies a request once
even when the ingest forwards it again after a crash.

MessagePack, a map tagged ``"schema": "tailguard.internal.capacity.columns.v1"``
whose ``deployments`` are arrays of::

    service, model,
    ts_ms (int64), e2e_ms (float64), ttft_ms (float64, NaN: none),
    output_tokens (int64, 0: none), flags (uint8: 1 ok, 2 warm-up)   ← little-endian binary
    runs,
    instance, host, gpu_ids, expert_ids       ← lists, nil when no request has them
                                                 (host and gpu_ids: only requests naming both)
    rag_top1_similarity (float64 binary, NaN: none; nil: none at all), rag_index (list)

The numbers travel as binary arrays: neither end touches them one request at a
time. A message holds at most ``MAX_ROWS`` requests and ``MAX_BYTES`` bytes (a
deployment's requests may span two messages, in order). Messages of older
forwarders (one tuple per request, :mod:`~tailguard.agents.capacity_rows`) still
decode, into the same :class:`CapacityRows`.
"""

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
from tailguard.agents.capacity_rows import Groups, Row
from tailguard.agents.capacity_rows import decode_message as decode_rows_message
from tailguard.streams.input_marks import Run
from tailguard.streams.served import NO_GPUS, ServedGpus

__all__ = [
    "MAX_BYTES",
    "MAX_ROWS",
    "SCHEMA",
    "CapacityRows",
    "Deployments",
    "Group",
    "chunks",
    "decode_message",
    "messages",
    "partition_of",
]

SCHEMA = "tailguard.internal.capacity.columns.v1"
OK, WARM = 1, 2
_I8, _F8 = np.dtype("<i8"), np.dtype("<f8")
#: Requests per forwarded message at most, and bytes at most (a chunk of unusually
#: long instance names is halved until it fits; the broker and the consumers take 1 MiB).
MAX_ROWS = 2_000
MAX_BYTES = 900_000


@dataclass(slots=True)
class CapacityRows:
    """Requests of one deployment, in input order, as the capacity agent applies them."""

    ts: np.ndarray  # int64 ms
    e2e: np.ndarray  # float64 ms
    ttft: np.ndarray  # float64 ms, NaN: none
    tokens: np.ndarray  # int64 output tokens, 0: none
    ok: np.ndarray  # bool
    warm: np.ndarray  # bool
    instance: Sequence[str | None] | None = None
    #: The GPUs that served each request (only requests naming a host and GPUs).
    gpus: ServedGpus = NO_GPUS
    expert_ids: Sequence[list[int] | None] | None = None
    similarity: np.ndarray | None = None  # float64, NaN: none
    rag_index: Sequence[str | None] | None = None

    def __len__(self) -> int:
        return len(self.ts)

    def __getitem__(self, part: slice) -> "CapacityRows":
        def cut(values: Any) -> Any:
            return None if values is None else values[part]

        return CapacityRows(
            self.ts[part],
            self.e2e[part],
            self.ttft[part],
            self.tokens[part],
            self.ok[part],
            self.warm[part],
            cut(self.instance),
            self.gpus.slice(*part.indices(len(self))[:2]),
            cut(self.expert_ids),
            cut(self.similarity),
            cut(self.rag_index),
        )

    def take(self, ranges: list[tuple[int, int]]) -> "CapacityRows":
        """The requests of the ``[lo, hi)`` ranges (ascending), in order."""
        joined: list[tuple[int, int]] = []
        for lo, hi in ranges:
            if joined and joined[-1][1] == lo:
                joined[-1] = (joined[-1][0], hi)
            elif lo < hi:
                joined.append((lo, hi))
        if joined == [(0, len(self))]:
            return self
        ranges = joined
        parts = [self[lo:hi] for lo, hi in ranges] or [self[0:0]]

        def join(name: str) -> Any:
            values = [getattr(p, name) for p in parts]
            if name == "gpus":
                starts = np.cumsum([0, *map(len, parts[:-1])]).tolist()
                return ServedGpus.join(list(zip(values, starts, strict=True)))
            if values[0] is None:
                return None
            if isinstance(values[0], np.ndarray):
                return np.concatenate(values)
            return [v for vs in values for v in vs]

        return CapacityRows(*(join(name) for name in CapacityRows.__slots__))

    def as_rows(self) -> list[Row]:
        """Each request as the tuple older forwarders sent (absent values as they wrote them)."""
        n = len(self)
        host, gpu_ids = self.gpus.per_request(n)

        def listed(values: Sequence[Any] | None, default: Any) -> list[Any]:
            if values is None:
                return [default] * n
            return [default if v is None else v for v in values]

        def floats(values: np.ndarray | None) -> list[float | None]:
            if values is None:
                return [None] * n
            return [None if v != v else v for v in values.tolist()]

        return list(
            zip(
                self.ts.tolist(),
                self.e2e.tolist(),
                floats(self.ttft),
                self.tokens.tolist(),
                self.ok.tolist(),
                self.warm.tolist(),
                listed(self.instance, ""),
                listed(host, ""),
                listed(gpu_ids, []),
                listed(self.expert_ids, []),
                floats(self.similarity),
                listed(self.rag_index, "default"),
                strict=True,
            )
        )

    @classmethod
    def from_rows(cls, rows: Sequence[Row]) -> "CapacityRows":
        """The requests of a message of an older forwarder (one tuple per request)."""
        cols = list(zip(*rows, strict=True)) if rows else [()] * 12
        ts, e2e, ttft, tokens, ok, warm, instance, host, gpus, experts, sim, index = cols
        return cls(
            np.array(ts, dtype=np.int64),
            np.array(e2e, dtype=np.float64),
            np.array(ttft, dtype=np.float64),
            np.array(tokens, dtype=np.int64),
            np.array(ok, dtype=np.bool_),
            np.array(warm, dtype=np.bool_),
            list(instance),
            ServedGpus.of(host, gpus),
            list(experts),
            np.array(sim, dtype=np.float64),
            list(index),
        )


class _WireDeployment(msgspec.Struct, array_like=True):
    service: str
    model: str
    ts_ms: bytes
    e2e_ms: bytes
    ttft_ms: bytes
    output_tokens: bytes
    flags: bytes
    runs: list[Run]
    instance: list[str | None] | None = None
    host: list[str | None] | None = None
    gpu_ids: list[list[int] | None] | None = None
    expert_ids: list[list[int] | None] | None = None
    rag_top1_similarity: bytes | None = None
    rag_index: list[str | None] | None = None


class Deployments(msgspec.Struct, tag_field="schema", tag=SCHEMA):
    """One forwarded message: the deployments of one internal partition."""

    deployments: list[_WireDeployment]


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Deployments).decode

#: A deployment's requests of one batch with their input positions.
Group = tuple[str, str, CapacityRows, list[Run]]


def partition_of(key: str, partitions: int) -> int:
    """The internal partition of a deployment (``service|model``)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big") % partitions


def _wire(service: str, model: str, rows: CapacityRows, runs: list[Run]) -> _WireDeployment:
    def listed(values: Sequence[Any] | None) -> list[Any] | None:
        return None if values is None else list(values)

    flags = rows.ok.astype(np.uint8) * OK | rows.warm.astype(np.uint8) * WARM
    host, gpu_ids = rows.gpus.per_request(len(rows)) if len(rows.gpus) else (None, None)
    return _WireDeployment(
        service,
        model,
        rows.ts.astype(_I8).tobytes(),
        rows.e2e.astype(_F8).tobytes(),
        rows.ttft.astype(_F8).tobytes(),
        rows.tokens.astype(_I8).tobytes(),
        flags.tobytes(),
        runs,
        listed(rows.instance),
        host,
        gpu_ids,
        listed(rows.expert_ids),
        None if rows.similarity is None else rows.similarity.astype(_F8).tobytes(),
        listed(rows.rag_index),
    )


def _rows(d: _WireDeployment) -> CapacityRows:
    n = len(d.flags)
    numbers = (d.ts_ms, d.e2e_ms, d.ttft_ms, d.output_tokens)
    similarity = d.rag_top1_similarity
    lists = (d.instance, d.host, d.gpu_ids, d.expert_ids, d.rag_index)
    if (
        any(len(c) != 8 * n for c in numbers)
        or (similarity is not None and len(similarity) != 8 * n)
        or any(v is not None and len(v) != n for v in lists)
    ):
        msg = f"columns of {d.service}|{d.model} disagree in length"
        raise msgspec.ValidationError(msg)
    flags = np.frombuffer(d.flags, dtype=np.uint8)

    def floats(raw: bytes) -> np.ndarray:
        return np.frombuffer(raw, dtype=_F8).astype(np.float64)

    return CapacityRows(
        np.frombuffer(d.ts_ms, dtype=_I8).astype(np.int64),
        floats(d.e2e_ms),
        floats(d.ttft_ms),
        np.frombuffer(d.output_tokens, dtype=_I8).astype(np.int64),
        (flags & OK).astype(np.bool_),
        (flags & WARM).astype(np.bool_),
        d.instance,
        ServedGpus.of(d.host or [None] * n, d.gpu_ids or [None] * n),
        d.expert_ids,
        None if similarity is None else floats(similarity),
        d.rag_index,
    )


def decode_message(value: bytes, key: bytes | None = None) -> list[Group]:
    """A forwarded message's deployments: this version's, or an older forwarder's.

    ``key`` names the deployment of the oldest messages (one deployment's rows,
    named by the message key). Raises ``msgspec.DecodeError`` for bytes that are
    none of these."""
    try:
        message = _decode(value)
    except msgspec.DecodeError:
        old = decode_rows_message(value)
        if isinstance(old, Groups):
            runs = old.runs + [[]] * (len(old.groups) - len(old.runs))
            return [
                (service, model, CapacityRows.from_rows(rows), run)
                for (service, model, rows), run in zip(old.groups, runs, strict=False)
            ]
        service, _, model = (key or b"").decode().partition("|")
        return [(service, model, CapacityRows.from_rows(old), [])]
    return [(d.service, d.model, _rows(d), d.runs) for d in message.deployments]


def messages(groups: list[Group], max_rows: int, max_bytes: int) -> Iterator[bytes]:
    """The encoded messages of ``groups``: chunks of ``max_rows`` requests, halved
    until each is at most ``max_bytes`` (a single request is sent whatever its size)."""
    for chunk in chunks(groups, max_rows):
        value = _encode(Deployments([_wire(*group) for group in chunk]))
        rows = sum(len(r) for _, _, r, _ in chunk)
        if len(value) <= max_bytes or rows == 1:
            yield value
        else:
            yield from messages(chunk, (rows + 1) // 2, max_bytes)


def chunks(groups: list[Group], max_rows: int) -> Iterator[list[Group]]:
    """``groups`` in messages of at most ``max_rows`` requests (a deployment's may
    span two, in order: the later message has the higher offset; a run of rows
    cut in two continues at its next row index)."""
    chunk: list[Group] = []
    room = max_rows
    for service, model, rows, runs in groups:
        pending = list(runs)
        while rows:
            take, rows = rows[:room], rows[room:]
            taken: list[Run] = []
            need = len(take)
            while need and pending:
                part, offset, first, count = pending[0]
                used = min(count, need)
                taken.append((part, offset, first, used))
                need -= used
                if used == count:
                    pending.pop(0)
                else:
                    pending[0] = (part, offset, first + used, count - used)
            chunk.append((service, model, take, taken))
            room -= len(take)
            if room == 0:
                yield chunk
                chunk, room = [], max_rows
    if chunk:
        yield chunk
