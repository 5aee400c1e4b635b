"""The capacity agent's input as older forwarders wrote it: one tuple per request.

Before the columns of :mod:`~tailguard.agents.capacity_columns`, the ingest
forwarded each request as a positional tuple, a deployment's tuples of one
batch together, with their input positions as runs
(:mod:`~tailguard.streams.input_marks`), in MessagePack; earlier still in JSON
(without runs, or a bare list of one deployment's tuples named by the message
key). Such messages may wait in ``tailguard.internal.capacity`` across an
upgrade: they still decode.
"""

import msgspec
from tailguard.streams.input_marks import Run

__all__ = ["Groups", "Row", "decode_message", "encode"]

#: One request as the capacity agent applies it: ts, e2e, ttft, output tokens, ok,
#: warm-up, instance, host, GPU ids, expert ids, RAG similarity, RAG index.
Row = tuple[
    int, float, float | None, int, bool, bool, str, str, list[int], list[int], float | None, str
]


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
