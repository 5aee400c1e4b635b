"""The internal wire format of ``tailguard.internal.series``.

The ingest agent validates input once and forwards, per series, the events of
a batch of input messages together with the input position of each event, so
the SLI agent can apply every input message exactly once (see
:mod:`tailguard.agents.sli`). MessagePack with typed decoding keeps the second
decode as cheap as the first.
"""

import msgspec
from tailguard.schemas import InferenceEvent

__all__ = ["SeriesBatch", "decode_batch", "encode_batch", "series_key"]


class SeriesBatch(msgspec.Struct, array_like=True):
    """Events of one series, in input order, with their input positions."""

    series: tuple[str, str, str, str]
    events: list[InferenceEvent]
    #: ``(input partition, input offset)`` of each event, parallel to ``events``.
    positions: list[tuple[int, int]]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SeriesBatch)


def series_key(service: str, model: str, variant: str, tenant: str) -> str:
    """The key of a series: ``service|model|variant|tenant``."""
    return f"{service}|{model}|{variant}|{tenant}"


def encode_batch(batch: SeriesBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(data: bytes) -> SeriesBatch:
    return _decoder.decode(data)
