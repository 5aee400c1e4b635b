"""``decode``: valid messages, each dead-letter reason, batches that keep their good events."""

import json
from collections.abc import Callable
from typing import Any, cast

import msgspec
import pytest
from tailguard.schemas import (
    DEFAULT_LIMITS,
    DeadLetterReason,
    InferenceEvent,
    Limits,
    Reject,
    SchemaError,
    decode,
    encode,
)
from tailguard.schemas.checks import Ctx, _all_inference_ok, _check_inference

R = DeadLetterReason
Build = Callable[[Callable[..., dict[str, Any]], Callable[[Any], bytes]], bytes]

NOW_MS = 1_700_000_100_000


def _one(build_event: Callable[[Callable[..., dict[str, Any]]], dict[str, Any]]) -> Build:
    """A message of one event, built from ``make_event``."""
    return lambda make, raw: raw(build_event(make))


def _batch_with(bad: Callable[[Callable[..., dict[str, Any]]], Any]) -> Build:
    """A batch [good, bad, good]: the bad element sits at index 1."""
    return lambda make, raw: raw([make(event_id="a"), bad(make), make(event_id="c")])


Case = tuple[str, DeadLetterReason, str, Build, int | None, Limits]


def case(
    name: str,
    reason: DeadLetterReason,
    build: Build,
    *,
    kind: str = "inference",
    index: int | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Case:
    """One row: the message ``build`` makes must be refused for ``reason`` at ``index``."""
    return (name, reason, kind, build, index, limits)


def const(raw: bytes) -> Build:
    return lambda make, to_raw: raw


CASES: list[Case] = [
    # --- the whole message ---
    case("too_large", R.TOO_LARGE, _one(lambda m: m()), limits=Limits(max_message_bytes=100)),
    case("not_utf8", R.NOT_UTF8, const(b'{"event_id":"\xff\xfe"}')),
    case("utf8_surrogate", R.NOT_UTF8, const(b'{"a":"\xed\xa0\x80"}')),
    case("too_deep", R.TOO_DEEP, const(b"[" * 17 + b"]" * 17)),
    case("too_deep_inside", R.TOO_DEEP, _one(lambda m: m(x=json.loads("[" * 20 + "]" * 20)))),
    case("malformed", R.MALFORMED_JSON, const(b'{"event_id": ')),
    case("empty", R.MALFORMED_JSON, const(b"")),
    case("trailing_garbage", R.MALFORMED_JSON, lambda m, r: r(m()) + b" x"),
    case("top_level_string", R.NOT_AN_OBJECT, const(b'"hello"')),
    case("top_level_number", R.NOT_AN_OBJECT, const(b" 42 "), kind="gpu"),
    case(
        "batch_too_large",
        R.BATCH_TOO_LARGE,
        lambda m, r: r([m()] * 3),
        limits=Limits(max_batch_events=2),
    ),
    # --- one event: the typed decode ---
    case("element_not_object", R.NOT_AN_OBJECT, _batch_with(lambda m: 7), index=1),
    case(
        "element_is_array",
        R.NOT_AN_OBJECT,
        lambda m, r: r([m("kv"), [m("kv")], m("kv")]),
        kind="kv",
        index=1,
    ),
    case("missing_field", R.MISSING_FIELD, _batch_with(lambda m: m(without=("e2e_ms",))), index=1),
    case("missing_nested", R.MISSING_FIELD, _one(lambda m: m(cache={"prefix_hit_tokens": 3}))),
    case("wrong_type", R.WRONG_TYPE, _batch_with(lambda m: m(e2e_ms="fast")), index=1),
    case("wrong_enum", R.WRONG_TYPE, _one(lambda m: m(status="finished"))),
    case("bool_is_not_number", R.WRONG_TYPE, _one(lambda m: m("eval", value=True)), kind="eval"),
    case("bad_trace_id", R.WRONG_TYPE, _one(lambda m: m(trace_id="xyz"))),
    case("empty_service", R.WRONG_TYPE, _one(lambda m: m(service=""))),
    case(
        "unknown_schema_version",
        R.UNKNOWN_SCHEMA_VERSION,
        _batch_with(lambda m: m(schema="tailguard.inference.v2")),
        index=1,
    ),
    case(
        "schema_of_other_topic",
        R.UNKNOWN_SCHEMA_VERSION,
        _one(lambda m: m("gpu", schema="tailguard.kv.v1")),
        kind="gpu",
    ),
    case(
        "nan_literal",
        R.NAN_OR_INFINITE,
        lambda m, r: json.dumps([m(), m(e2e_ms=float("nan")), m()]).encode(),
        index=1,
    ),
    case(
        "infinity_literal",
        R.NAN_OR_INFINITE,
        lambda m, r: json.dumps(m(itl_ms=[1.0, float("-inf")])).encode(),
    ),
    case(
        "overflowing_number",
        R.NAN_OR_INFINITE,
        lambda m, r: r(m()).replace(b'"e2e_ms":812.5', b'"e2e_ms":1e400'),
    ),
    case("negative_e2e", R.NEGATIVE_DURATION, _batch_with(lambda m: m(e2e_ms=-1)), index=1),
    case("negative_itl_gap", R.NEGATIVE_DURATION, _one(lambda m: m(itl_ms=[3.0, -0.5]))),
    case("negative_stage", R.NEGATIVE_DURATION, _one(lambda m: m(stages_ms={"prefill": -3}))),
    case("negative_queue", R.NEGATIVE_DURATION, _one(lambda m: m(queue_ms=-2))),
    case(
        "negative_batch_wait",
        R.NEGATIVE_DURATION,
        _one(lambda m: m(batch={"size": 4, "wait_ms": -1})),
    ),
    case("negative_tokens", R.ABSURD_VALUE, _one(lambda m: m(output_tokens=-1))),
    case("negative_ts", R.ABSURD_VALUE, _one(lambda m: m(ts_ms=-5))),
    case("unsafe_int", R.ABSURD_VALUE, _one(lambda m: m("kv", total_blocks=2**60)), kind="kv"),
    case("util_over_100", R.ABSURD_VALUE, _one(lambda m: m("gpu", util_gpu_pct=101)), kind="gpu"),
    # --- one event: the semantic checks ---
    case(
        "ttft_over_an_hour",
        R.ABSURD_VALUE,
        _batch_with(lambda m: m(ttft_ms=3_600_001.0, e2e_ms=3_700_000.0)),
        index=1,
    ),
    case("e2e_over_an_hour", R.ABSURD_VALUE, _one(lambda m: m(e2e_ms=3_600_000.5))),
    case("itl_gap_over_an_hour", R.ABSURD_VALUE, _one(lambda m: m(itl_ms=[1.0, 4e6]))),
    case("stage_over_an_hour", R.ABSURD_VALUE, _one(lambda m: m(stages_ms={"queue": 4e6}))),
    case(
        "too_many_gaps",
        R.ABSURD_VALUE,
        _one(lambda m: m(itl_ms=[1.0] * 4)),
        limits=Limits(max_itl_len=3),
    ),
    case(
        "future_ts", R.FUTURE_TIMESTAMP, _batch_with(lambda m: m(ts_ms=NOW_MS + 300_001)), index=1
    ),
    case(
        "future_ts_admin",
        R.FUTURE_TIMESTAMP,
        _one(lambda m: m("admin", ts_ms=NOW_MS + 3_600_000)),
        kind="admin",
    ),
    case(
        "ttft_missing_with_tokens",
        R.INCONSISTENT,
        _batch_with(lambda m: m(without=("ttft_ms",))),
        index=1,
    ),
    case("ttft_null_with_tokens", R.INCONSISTENT, _one(lambda m: m(ttft_ms=None))),
    case("ttft_after_e2e", R.INCONSISTENT, _one(lambda m: m(ttft_ms=900.0, e2e_ms=800.0))),
    case(
        "more_hits_than_queries",
        R.INCONSISTENT,
        _one(lambda m: m(cache={"prefix_hit_tokens": 9, "prefix_query_tokens": 8})),
    ),
    case(
        "gpu_more_used_than_total",
        R.INCONSISTENT,
        _one(lambda m: m("gpu", mem_used_mib=90_000.0)),
        kind="gpu",
    ),
    case(
        "kv_more_free_than_total",
        R.INCONSISTENT,
        _one(lambda m: m("kv", free_blocks=1001)),
        kind="kv",
    ),
    case(
        "kv_tokens_do_not_fit",
        R.INCONSISTENT,
        _one(lambda m: m("kv", sequences=[{"tokens": 113, "blocks": 7}])),
        kind="kv",
    ),
]


@pytest.mark.parametrize(
    ("reason", "kind", "build", "index", "limits"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_bad_input_gets_its_reason(
    make_event: Any,
    to_raw: Any,
    reason: DeadLetterReason,
    kind: Any,
    build: Build,
    index: int | None,
    limits: Limits,
) -> None:
    decoded = decode(build(make_event, to_raw), kind, now_ms=NOW_MS, limits=limits)
    assert [(r.reason, r.index) for r in decoded.rejects] == [(reason, index)]
    assert decoded.rejects[0].detail  # says what was wrong
    if index is None:
        assert decoded.valid == []
    else:  # the good neighbours survive
        assert len(decoded.valid) == 2


def test_every_dead_letter_reason_has_a_concrete_input() -> None:
    assert {case[1] for case in CASES} == set(DeadLetterReason)


def test_a_single_event_decodes_to_its_record(make_event: Any, to_raw: Any) -> None:
    decoded = decode(to_raw(make_event()), "inference", now_ms=NOW_MS)
    assert decoded.rejects == []
    (event,) = decoded.valid
    assert isinstance(event, InferenceEvent)
    assert (event.event_id, event.e2e_ms, event.ttft_ms, len(event.itl_ms)) == (
        "ev-1",
        812.5,
        143.2,
        19,
    )
    assert event.cache is not None and event.cache.prefix_hit_tokens == 480


def test_a_batch_decodes_in_order(make_event: Any, to_raw: Any) -> None:
    events = [make_event(event_id=f"ev-{i}") for i in range(5)]
    decoded = decode(to_raw(events), "inference", now_ms=NOW_MS)
    assert [e.event_id for e in decoded.valid] == [f"ev-{i}" for i in range(5)]
    assert decoded.rejects == []


def test_an_empty_batch_is_neither_valid_nor_rejected() -> None:
    decoded = decode(b" [ ] ", "inference", now_ms=NOW_MS)
    assert (decoded.valid, decoded.rejects) == ([], [])


@pytest.mark.parametrize("kind", ["inference", "interaction", "gpu", "kv", "eval", "admin"])
def test_every_input_kind_decodes_its_example(make_event: Any, to_raw: Any, kind: Any) -> None:
    decoded = decode(to_raw([make_event(kind), make_event(kind)]), kind, now_ms=NOW_MS)
    assert decoded.rejects == []
    assert len(decoded.valid) == 2


def test_defaults_fill_optional_fields(make_event: Any, to_raw: Any) -> None:
    minimal = {k: make_event()[k] for k in ("event_id", "ts_ms", "service", "model", "status")}
    (event,) = decode(to_raw({**minimal, "e2e_ms": 5}), "inference", now_ms=NOW_MS).valid
    assert (event.variant, event.tenant, event.itl_ms, event.warmup) == (
        "default",
        "default",
        [],
        False,
    )
    assert event.e2e_ms == 5.0 and isinstance(event.e2e_ms, float)


def test_unknown_fields_are_ignored(make_event: Any, to_raw: Any) -> None:
    event = make_event(future_field={"nested": [1, 2, {"x": None}]}, another="yes")
    event["cache"]["also_new"] = 1
    decoded = decode(to_raw(event), "inference", now_ms=NOW_MS)
    assert decoded.rejects == []
    assert not hasattr(decoded.valid[0], "future_field")


def test_the_right_schema_id_is_accepted(make_event: Any, to_raw: Any) -> None:
    raw = to_raw(make_event(schema="tailguard.inference.v1"))
    assert len(decode(raw, "inference", now_ms=NOW_MS).valid) == 1


def test_one_bad_event_keeps_the_others_and_carries_its_own_bytes(
    make_event: Any, to_raw: Any
) -> None:
    events = [make_event(event_id=f"ev-{i}") for i in range(6)]
    events[2]["e2e_ms"] = -1.0  # refused by the typed decode
    events[4]["ts_ms"] = NOW_MS + 10**9  # refused by a semantic check
    decoded = decode(to_raw(events), "inference", now_ms=NOW_MS)
    assert [e.event_id for e in decoded.valid] == ["ev-0", "ev-1", "ev-3", "ev-5"]
    assert [(r.reason, r.index) for r in decoded.rejects] == [
        (R.NEGATIVE_DURATION, 2),
        (R.FUTURE_TIMESTAMP, 4),
    ]
    for reject in decoded.rejects:
        assert reject.element is not None
        assert json.loads(reject.element) == events[reject.index or 0]


def test_a_semantic_reject_on_the_fast_path_also_carries_its_bytes(
    make_event: Any, to_raw: Any
) -> None:
    events = [make_event(event_id="a"), make_event(event_id="b", ttft_ms=900.0, e2e_ms=800.0)]
    (reject,) = decode(to_raw(events), "inference", now_ms=NOW_MS).rejects
    assert reject == Reject(R.INCONSISTENT, reject.detail, 1, to_raw(events[1]))


def test_a_single_event_reject_has_no_index_and_no_element(make_event: Any, to_raw: Any) -> None:
    (reject,) = decode(to_raw(make_event(e2e_ms=-3)), "inference", now_ms=NOW_MS).rejects
    assert (reject.index, reject.element) == (None, None)


def test_nan_literals_reject_only_their_event(make_event: Any) -> None:
    raw = json.dumps(
        [
            make_event(event_id="a"),
            make_event(event_id="b", ttft_ms=float("nan")),
            make_event(event_id="c", e2e_ms=-1.0),
        ]
    ).encode()
    decoded = decode(raw, "inference", now_ms=NOW_MS)
    assert [e.event_id for e in decoded.valid] == ["a"]
    assert [(r.reason, r.index) for r in decoded.rejects] == [
        (R.NAN_OR_INFINITE, 1),
        (R.NEGATIVE_DURATION, 2),
    ]
    assert "ttft_ms" in decoded.rejects[0].detail


def test_details_name_the_field_and_the_value(make_event: Any, to_raw: Any) -> None:
    def detail(**overrides: Any) -> str:
        raw = to_raw(make_event(**overrides))
        return str(decode(raw, "inference", now_ms=NOW_MS).rejects[0].detail)

    assert "itl_ms[1] = -0.5" in detail(itl_ms=[1.0, -0.5])
    assert "stages_ms['prefill'] = -3" in detail(stages_ms={"prefill": -3})
    assert "ttft_ms = 3600001.0" in detail(ttft_ms=3_600_001.0, e2e_ms=3_700_000.0)
    assert "'e2e_ms'" in detail(e2e_ms=None) or "e2e_ms" in detail(e2e_ms="x")
    assert "tailguard.inference.v9" in detail(schema="tailguard.inference.v9")


def test_a_long_bad_value_does_not_make_a_long_detail(make_event: Any, to_raw: Any) -> None:
    (reject,) = decode(to_raw(make_event(status="x" * 100_000)), "inference", now_ms=NOW_MS).rejects
    assert reject.reason is R.WRONG_TYPE
    assert len(reject.detail) < 400


def test_limits_are_inclusive(make_event: Any, to_raw: Any) -> None:
    raw = to_raw(
        make_event(ts_ms=NOW_MS + 300_000, e2e_ms=3_600_000.0, ttft_ms=3_600_000.0, itl_ms=[0.0])
    )
    assert decode(raw, "inference", now_ms=NOW_MS).rejects == []


def test_depth_within_the_limit_passes_and_brackets_in_strings_do_not_count(
    make_event: Any, to_raw: Any
) -> None:
    nested = json.loads("[" * 14 + "]" * 14)  # batch [ + event { + 14 = 16 levels
    raw = to_raw([make_event(extra=nested, error_type="[" * 40 + "{" * 40)])
    assert decode(raw, "inference", now_ms=NOW_MS).rejects == []
    too_deep = to_raw([make_event(extra=[nested])])
    assert decode(too_deep, "inference", now_ms=NOW_MS).rejects[0].reason is R.TOO_DEEP


def test_nesting_hidden_from_the_pre_check_is_too_deep_not_a_crash(
    make_event: Any, to_raw: Any
) -> None:
    # A "]" string inside every level pairs with that level's "[" in the
    # bracket count, so the pre-check sees depth 1 while the JSON nests 100 000
    # levels: the decoders' RecursionError must become a reject, not escape.
    hidden = b'["]",' * 100_000 + b"0" + b"]" * 100_000
    for message in (
        to_raw(make_event()).replace(b'"ev-1"', b'"ev-1","x":' + hidden, 1),
        to_raw([make_event()]).replace(b'"ev-1"', b'"ev-1","x":' + hidden, 1),
        hidden,
    ):
        decoded = decode(message, "inference", now_ms=NOW_MS)
        assert [r.reason for r in decoded.rejects] == [R.TOO_DEEP]


def test_bytes_like_values_and_tombstones_are_handled(make_event: Any, to_raw: Any) -> None:
    raw = to_raw(make_event())
    assert len(decode(bytearray(raw), "inference", now_ms=NOW_MS).valid) == 1
    assert len(decode(memoryview(raw), "inference", now_ms=NOW_MS).valid) == 1
    (reject,) = decode(None, "inference", now_ms=NOW_MS).rejects
    assert reject.reason is R.MALFORMED_JSON


def test_an_unknown_kind_is_a_caller_error() -> None:
    with pytest.raises(SchemaError, match="unknown input kind 'sli'"):
        decode(b"{}", cast(Any, "sli"), now_ms=NOW_MS)


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_message_bytes": 0},
        {"max_batch_events": -1},
        {"max_depth": 1.5},
        {"max_depth": 257},
        {"max_future_skew_ms": -1},
        {"max_duration_ms": float("inf")},
        {"max_duration_ms": 0},
    ],
)
def test_impossible_limits_are_refused(overrides: dict[str, Any]) -> None:
    with pytest.raises(SchemaError, match="Limits"):
        Limits(**overrides)


def test_the_batch_check_never_passes_an_event_the_full_check_refuses(
    make_event: Any, to_raw: Any
) -> None:
    ctx = Ctx(NOW_MS, DEFAULT_LIMITS)
    probes: list[dict[str, Any]] = [
        {},
        {"ts_ms": NOW_MS + 10**7},
        {"e2e_ms": 5e6},
        {"ttft_ms": 900.0, "e2e_ms": 800.0},
        {"itl_ms": [4e6]},
        {"queue_ms": 4e6},
        {"stages_ms": {"a": 4e6}},
        {"cache": {"prefix_hit_tokens": 2, "prefix_query_tokens": 1}},
        {"batch": {"size": 1, "wait_ms": 4e6}},
    ]
    for overrides in probes:
        event = msgspec.json.decode(to_raw(make_event(**overrides)), type=InferenceEvent)
        assert _all_inference_ok([event], ctx) == (_check_inference(event, ctx) is None)


def test_encode_writes_records_and_batches(make_event: Any, to_raw: Any) -> None:
    (event,) = decode(to_raw(make_event()), "inference", now_ms=NOW_MS).valid
    again = decode(encode([event, event]), "inference", now_ms=NOW_MS)
    assert again.valid == [event, event]
    with pytest.raises(SchemaError, match=r"msgspec\.Struct"):
        encode(cast(Any, {"not": "a record"}))
