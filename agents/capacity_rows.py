"""The rows the ingest forwards to the capacity agent (``tailguard.internal.capacity``).

One row per request, positional (to keep the forwarded messages small), with
only the fields the capacity agent reads; a deployment's rows of one ingest
batch travel together, with the input position of every row as runs
(:mod:`~tailguard.streams.input_marks`), so the agent applies a request once
even when the ingest forwards it again after a crash. One message holds the
deployments of one internal partition, at most ``MAX_ROWS`` rows and
``MAX_BYTES`` bytes (a deployment's rows may span two messages, in order).
Messages of older forwarders (no runs; before grouping, a bare list of one
deployment's rows named by the message key) still decode.
"""

import hashlib
from collections.abc import Iterator, Sequence

import msgspec
from tailguard.schemas import InferenceEvent
from tailguard.streams.input_marks import Run

__all__ = [
    "MAX_BYTES",
    "MAX_ROWS",
    "Group",
    "Groups",
    "Row",
    "chunks",
    "decode_message",
    "encode",
    "messages",
    "partition_of",
    "row_of",
    "rows_by_deployment",
]

#: One request as the capacity agent applies it: ts, e2e, ttft, output tokens, ok,
#: warm-up, instance, host, GPU ids, expert ids, RAG similarity, RAG index.
Row = tuple[
    int, float, float | None, int, bool, bool, str, str, list[int], list[int], float | None, str
]
#: Rows per forwarded message at most (~120 bytes a row: ~240 kB), and bytes at
#: most (a chunk of unusually long rows is halved until it fits; the broker and
#: the consumers take 1 MiB).
MAX_ROWS = 2_000
MAX_BYTES = 900_000


class Groups(msgspec.Struct):
    """One forwarded message: the rows of the deployments of one partition, by deployment.

    One message per partition and ingest batch, not one per deployment: with
    thousands of deployments a batch touched each with a row or two, and a
    faust send and a dispatched message per deployment cost more than the rows.
    """

    groups: list[tuple[str, str, list[Row]]]
    #: Per group, the input positions of its rows (:mod:`~tailguard.streams.input_marks`);
    #: absent in messages of older forwarders.
    runs: list[list[Run]] = []


#: MessagePack: a third of the time JSON takes to write the rows' floats.
encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Groups).decode
#: Messages of older forwarders, still in the topic after an upgrade, are JSON:
#: ``Groups``, or ``list[Row]`` (one deployment's rows, named by the message key).
_decode_json = msgspec.json.Decoder(Groups | list[Row]).decode
_JSON_STARTS = frozenset(b"{[ \t\r\n")


def decode_message(value: bytes) -> Groups | list[Row]:
    """A forwarded message, of this version (MessagePack) or an older one (JSON).

    Raises ``msgspec.DecodeError`` for bytes that are neither."""
    if value[:1] and value[0] in _JSON_STARTS:
        return _decode_json(value)  # type: ignore[no-any-return]
    return _decode(value)


def row_of(ev: InferenceEvent) -> Row:
    """The capacity agent's fields of one request.

    On the ingest hot path (every event, before the SLI work): no copies and no
    conversions — a decoded event's durations are floats already and its lists
    are only encoded, never kept (a copy per list made this half the cost).
    """
    return (
        ev.ts_ms,
        ev.e2e_ms,
        ev.ttft_ms,
        ev.output_tokens or 0,
        ev.status == "ok",
        ev.warmup,
        ev.instance or "",
        ev.host or "",
        ev.gpu_ids,
        ev.expert_ids,
        ev.rag_top1_similarity,
        ev.rag_index or "default",
    )


def partition_of(key: str, partitions: int) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big") % partitions


#: A deployment's rows of one batch and their input positions.
Group = tuple[str, str, list[Row], list[Run]]


def chunks(groups: list[Group], max_rows: int) -> Iterator[list[Group]]:
    """``groups`` in messages of at most ``max_rows`` rows (a deployment's rows may
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


def messages(groups: list[Group], max_rows: int, max_bytes: int) -> Iterator[bytes]:
    """The encoded messages of ``groups``: chunks of ``max_rows`` rows, halved until
    each is at most ``max_bytes`` (a single row is sent whatever its size)."""
    for chunk in chunks(groups, max_rows):
        value = encode(Groups([(s, m, r) for s, m, r, _ in chunk], [p for *_, p in chunk]))
        rows = sum(len(r) for _, _, r, _ in chunk)
        if len(value) <= max_bytes or rows == 1:
            yield value
        else:
            yield from messages(chunk, (rows + 1) // 2, max_bytes)


def rows_by_deployment(
    events: Sequence[InferenceEvent], positions: Sequence[tuple[int, int]]
) -> dict[tuple[str, str], tuple[list[Row], list[Run]]]:
    """Each deployment's rows, in input order, with their input positions as runs."""
    out: dict[tuple[str, str], tuple[list[Row], list[Run]]] = {}
    for ev, (part, offset) in zip(events, positions, strict=True):
        rows, runs = out.setdefault((ev.service, ev.model), ([], []))
        rows.append(row_of(ev))
        if runs and runs[-1][0] == part and runs[-1][1] == offset:
            runs[-1] = (part, offset, 0, runs[-1][3] + 1)
        else:
            runs.append((part, offset, 0, 1))
    return out
