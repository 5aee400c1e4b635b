"""Factory fixtures for the ``tailguard.schemas`` unit tests.

``make_event(kind, **overrides)`` hands out a valid event of each input kind
as a plain dict (what a producer sends), so a test spells out only the field it
is about; ``to_raw`` turns dicts into message bytes the way a non-Python
producer would (compact, standard JSON). Fixtures are session-scoped because
Hypothesis tests use them too.
"""

import json
from collections.abc import Callable
from typing import Any

import pytest

#: The consumer's clock in the tests (2023-11-14 22:15 UTC).
NOW_MS = 1_700_000_100_000
#: Event time of the example events, 100 s before NOW_MS.
TS_MS = 1_700_000_000_000

_EXAMPLES: dict[str, dict[str, Any]] = {
    "inference": {
        "event_id": "ev-1",
        "ts_ms": TS_MS,
        "service": "chat",
        "model": "llama-3-8b",
        "status": "ok",
        "e2e_ms": 812.5,
        "ttft_ms": 143.2,
        "output_tokens": 20,
        "input_tokens": 512,
        "itl_ms": [35.2] * 19,
        "variant": "b",
        "tenant": "acme",
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "gpu_ids": [0, 1],
        "stages_ms": {"tokenize": 1.5, "prefill": 120.0, "decode": 660.0},
        "cache": {"prefix_hit_tokens": 480, "prefix_query_tokens": 512},
        "batch": {"size": 4, "wait_ms": 12.0, "timed_out": False},
        "flow_control": {"throttled": False, "limit_tokens_per_s": 128.0},
    },
    "interaction": {
        "event_id": "ix-1",
        "ts_ms": TS_MS,
        "service": "chat",
        "kind": "interrupt",
        "unit_id": "user-7",
        "request_event_id": "ev-1",
    },
    "gpu": {
        "ts_ms": TS_MS,
        "host": "node-1",
        "gpu": 0,
        "util_gpu_pct": 87.0,
        "mem_used_mib": 70_000.0,
        "mem_total_mib": 81_559.0,
        "xid": None,
    },
    "kv": {
        "ts_ms": TS_MS,
        "instance": "vllm-0",
        "block_size": 16,
        "total_blocks": 1000,
        "free_blocks": 250,
        "sequences": [{"tenant": "acme", "tokens": 100, "blocks": 7}],
    },
    "eval": {
        "ts_ms": TS_MS,
        "experiment": "exp-1",
        "variant": "b",
        "metric": "rouge_l",
        "value": 0.41,
        "n": 500,
    },
    "admin": {
        "command_id": "cmd-1",
        "ts_ms": TS_MS,
        "actor": "alice",
        "key_id": "k1",
        "action": "silence",
        "args": {"series": "chat/llama", "minutes": 30},
        "signature": "ab" * 32,
    },
}

KINDS = tuple(_EXAMPLES)

MakeEvent = Callable[..., dict[str, Any]]
ToRaw = Callable[[Any], bytes]


@pytest.fixture(scope="session")
def now_ms() -> int:
    """The consumer clock the tests pass to ``decode``."""
    return NOW_MS


@pytest.fixture(scope="session")
def make_event() -> MakeEvent:
    """``make_event(kind="inference", /, *, without=(), **overrides)``: a valid event dict.

    ``overrides`` replace or add fields (a value of None writes JSON null);
    ``without`` names fields to leave out.
    """

    def make(
        kind: str = "inference", /, *, without: tuple[str, ...] = (), **overrides: Any
    ) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(json.dumps(_EXAMPLES[kind]))  # a deep copy
        event.update(overrides)
        for name in without:
            event.pop(name, None)
        return event

    return make


@pytest.fixture(scope="session")
def to_raw() -> ToRaw:
    """Standard compact JSON bytes of a value (NaN and infinity refused)."""

    def raw(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()

    return raw
