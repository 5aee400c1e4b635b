"""The rules a type cannot express, checked on every decoded input event, per topic kind.

A typed decode settles JSON types, enumerations and ``Meta`` constraints.
What is left is compared here: ``ts_ms`` at most ``max_future_skew_ms`` ahead
of the consumer's clock, every duration at most ``max_duration_ms``,
``ttft_ms`` present when there is output and at most ``e2e_ms``, at most
``max_itl_len`` ITL gaps, prefix-cache hits within the query, GPU memory used
within the total, free KV blocks within the total and each sequence's tokens
within its blocks. A failure is a dead-letter reason with a detail.

Each kind has a per-event check, which has the last word, and a batch form
that may only err towards "not all ok"; the inference one is the hot loop:
a few comparisons per event, and ``sum(itl_ms) <= max_duration_ms`` bounds
every gap at once (gaps are ≥ 0, checked in C by the type), so the ITL list
is never walked in Python unless the sum is over the limit. ``SPECS`` holds,
per input kind, its schema id, its typed decoders (a record or a batch in one
call; one record) and its two checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec
from tailguard.schemas.errors import DeadLetterReason
from tailguard.schemas.inputs import (
    INPUT_RECORDS,
    AdminCommand,
    EvalScore,
    GpuSample,
    InferenceEvent,
    Interaction,
    KvSnapshot,
)
from tailguard.schemas.limits import Limits
from tailguard.schemas.records import SCHEMA_IDS

__all__ = ["SPECS", "Ctx", "Kind", "KindSpec"]

#: The input topic kinds.
Kind = Literal["inference", "interaction", "gpu", "kv", "eval", "admin"]
_Reason = DeadLetterReason


# --- semantic checks after a typed decode ---------------------------------------

_Problem = tuple[DeadLetterReason, str] | None


class Ctx:
    """Per-call constants of the semantic checks."""

    __slots__ = ("horizon_ms", "limits", "max_itl", "max_ms", "now_ms")

    def __init__(self, now_ms: int, limits: Limits) -> None:
        self.now_ms = now_ms
        self.horizon_ms = now_ms + limits.max_future_skew_ms
        self.max_ms = limits.max_duration_ms
        self.max_itl = limits.max_itl_len
        self.limits = limits


def _future(ts_ms: int, ctx: Ctx) -> _Problem:
    return (
        _Reason.FUTURE_TIMESTAMP,
        f"ts_ms = {ts_ms} is {ts_ms - ctx.now_ms} ms after now ({ctx.now_ms}); more than "
        f"max_future_skew_ms = {ctx.limits.max_future_skew_ms} ahead is refused "
        "(timestamps are Unix epoch milliseconds)",
    )


def _too_long(field: str, value: float, ctx: Ctx) -> _Problem:
    return (
        _Reason.ABSURD_VALUE,
        f"{field} = {value!r} ms is more than max_duration_ms = {ctx.max_ms!r}",
    )


def _check_inference(ev: InferenceEvent, ctx: Ctx) -> _Problem:
    """Rules a type cannot express; comparisons only on the common path."""
    if ev.ts_ms > ctx.horizon_ms:
        return _future(ev.ts_ms, ctx)
    max_ms = ctx.max_ms
    e2e = ev.e2e_ms
    ttft = ev.ttft_ms
    if ttft is None:
        out = ev.output_tokens
        if out is not None and out >= 1:
            return (
                _Reason.INCONSISTENT,
                f"ttft_ms is missing but output_tokens = {out}; ttft_ms is required "
                "when output_tokens >= 1",
            )
    elif ttft > max_ms:
        return _too_long("ttft_ms", ttft, ctx)
    elif ttft > e2e:
        return (_Reason.INCONSISTENT, f"ttft_ms = {ttft!r} is more than e2e_ms = {e2e!r}")
    if e2e > max_ms:
        return _too_long("e2e_ms", e2e, ctx)
    itl = ev.itl_ms
    if itl:
        if len(itl) > ctx.max_itl:
            return (
                _Reason.ABSURD_VALUE,
                f"itl_ms has {len(itl)} gaps, more than max_itl_len = {ctx.max_itl}",
            )
        if sum(itl) > max_ms:  # every gap is >= 0, so this bounds each one
            for i, gap in enumerate(itl):
                if gap > max_ms:
                    return _too_long(f"itl_ms[{i}]", gap, ctx)
    queue = ev.queue_ms
    if queue is not None and queue > max_ms:
        return _too_long("queue_ms", queue, ctx)
    stages = ev.stages_ms
    if stages and sum(stages.values()) > max_ms:
        for stage, ms in stages.items():
            if ms > max_ms:
                return _too_long(f"stages_ms[{stage!r}]", ms, ctx)
    cache = ev.cache
    if cache is not None and cache.prefix_hit_tokens > cache.prefix_query_tokens:
        return (
            _Reason.INCONSISTENT,
            f"cache.prefix_hit_tokens = {cache.prefix_hit_tokens} is more than "
            f"cache.prefix_query_tokens = {cache.prefix_query_tokens}",
        )
    batch = ev.batch
    if batch is not None and batch.wait_ms is not None and batch.wait_ms > max_ms:
        return _too_long("batch.wait_ms", batch.wait_ms, ctx)
    return None


def _all_inference_ok(events: list[InferenceEvent], ctx: Ctx) -> bool:
    """True only if every event passes :func:`_check_inference` (the hot loop).

    One loop over the batch with locals, no call per event for the common
    shape. It may say False for a batch that would pass (the caller then runs
    the full check per event, which has the last word), never the reverse;
    events carrying the rarer optional parts go through the full check.
    """
    horizon = ctx.horizon_ms
    max_ms = ctx.max_ms
    max_itl = ctx.max_itl
    for ev in events:
        e2e = ev.e2e_ms
        if ev.ts_ms > horizon or e2e > max_ms:
            return False
        ttft = ev.ttft_ms
        if ttft is None:
            if ev.output_tokens:  # >= 0 by type, so truthy means >= 1
                return False
        elif ttft > e2e:
            return False
        itl = ev.itl_ms
        if itl and (len(itl) > max_itl or sum(itl) > max_ms):
            return False
        if (
            ev.queue_ms is not None or ev.stages_ms or ev.cache is not None or ev.batch is not None
        ) and _check_inference(ev, ctx) is not None:
            return False
    return True


def _all_ok(check: Callable[[Any, Ctx], _Problem]) -> Callable[[list[Any], Ctx], bool]:
    """The batch form of a per-event check, for kinds without a hand-written one."""

    def all_ok(events: list[Any], ctx: Ctx) -> bool:
        return all(check(ev, ctx) is None for ev in events)

    return all_ok


def _check_timestamp_only(ev: Interaction | EvalScore | AdminCommand, ctx: Ctx) -> _Problem:
    if ev.ts_ms > ctx.horizon_ms:
        return _future(ev.ts_ms, ctx)
    return None


def _check_gpu(ev: GpuSample, ctx: Ctx) -> _Problem:
    if ev.ts_ms > ctx.horizon_ms:
        return _future(ev.ts_ms, ctx)
    used, total = ev.mem_used_mib, ev.mem_total_mib
    if used is not None and total is not None and used > total:
        return (
            _Reason.INCONSISTENT,
            f"mem_used_mib = {used!r} is more than mem_total_mib = {total!r}",
        )
    return None


def _check_kv(ev: KvSnapshot, ctx: Ctx) -> _Problem:
    if ev.ts_ms > ctx.horizon_ms:
        return _future(ev.ts_ms, ctx)
    if ev.free_blocks > ev.total_blocks:
        return (
            _Reason.INCONSISTENT,
            f"free_blocks = {ev.free_blocks} is more than total_blocks = {ev.total_blocks}",
        )
    for i, seq in enumerate(ev.sequences):
        if seq.tokens > seq.blocks * ev.block_size:
            return (
                _Reason.INCONSISTENT,
                f"sequences[{i}] holds {seq.tokens} tokens in {seq.blocks} blocks of "
                f"block_size = {ev.block_size}; they do not fit",
            )
    return None


# --- decoders, one set per topic kind, built once -------------------------------


@dataclass(frozen=True, slots=True)
class KindSpec:
    """The typed decoders and the checks of one input kind."""

    schema_id: str
    fast: msgspec.json.Decoder[Any]  # Record | list[Record], the one-call path
    one: msgspec.json.Decoder[Any]  # Record, for single elements on the slow path
    check: Callable[[Any, Ctx], _Problem]  # one event: the authority
    all_ok: Callable[[list[Any], Ctx], bool]  # a batch: fast, may only err towards False


def _spec(
    kind: Kind,
    check: Callable[[Any, Ctx], _Problem],
    all_ok: Callable[[list[Any], Ctx], bool] | None = None,
) -> KindSpec:
    record = INPUT_RECORDS[kind]
    return KindSpec(
        schema_id=SCHEMA_IDS[kind],
        fast=msgspec.json.Decoder(record | list[record]),  # type: ignore[valid-type]
        one=msgspec.json.Decoder(record),
        check=check,
        all_ok=all_ok or _all_ok(check),
    )


#: Input kind → its decoders and checks.
SPECS: Final[dict[str, KindSpec]] = {
    "inference": _spec("inference", _check_inference, _all_inference_ok),
    "interaction": _spec("interaction", _check_timestamp_only),
    "gpu": _spec("gpu", _check_gpu),
    "kv": _spec("kv", _check_kv),
    "eval": _spec("eval", _check_timestamp_only),
    "admin": _spec("admin", _check_timestamp_only),
}
