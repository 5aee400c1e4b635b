"""The columnar form of tailguard.inference: the same verdict, request by request, as rows."""

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tailguard.schemas import DeadLetterReason, Limits, decode
from tailguard.schemas.columnar import (
    COLUMNS_SCHEMA_ID,
    CONTRACT_DEPTH,
    REQUIRED,
    decode_columns,
    encode_columns,
    events_of,
    is_columnar,
    rows_of,
    without_numbers,
)
from tailguard.schemas.limits import nesting_problem

from tests.unit.schemas.conftest import NOW_MS, TS_MS
from tests.unit.schemas.test_codec_properties import json_values, near_valid_events

SERIES = ("service", "model", "variant", "tenant")
LIMITS = Limits()
#: Fields whose requests the row decoder always judges: left out of the examples,
#: so that the screen on the arrays is what finds the bad requests.
RARE = ("queue_ms", "stages_ms", "cache", "batch")


def common(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in RARE}


def columns_doc(rows: list[dict[str, Any]], order: list[str] | None = None) -> dict[str, Any]:
    """Rows as a columnar message, written out by hand: a column per field any row
    has (None where a row has none), series listed once, gaps concatenated."""
    series: dict[tuple[str, ...], int] = {}
    names = order or sorted({k for r in rows for k in r} - {*SERIES, "itl_ms"})
    req: dict[str, list[Any]] = {"series": [], **{name: [] for name in names}}
    gaps: list[Any] = []
    lengths: list[int] = []
    for row in rows:
        key = tuple(row.get(f, "default") for f in SERIES)
        req["series"].append(series.setdefault(key, len(series)))
        for name in names:
            req[name].append(row.get(name))
        itl = row.get("itl_ms") or []
        lengths.append(len(itl))
        gaps.extend(itl)
    if any(lengths):
        req["itl_len"], req["itl_ms"] = lengths, gaps
    return {"schema": COLUMNS_SCHEMA_ID, "series": [list(k) for k in series], "requests": req}


def raw(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, allow_nan=True, separators=(",", ":")).encode()


def as_row(row: dict[str, Any], order: list[str]) -> bytes:
    """The row object a request of ``columns_doc`` stands for: series first, then its
    columns in the message's order, absent values left out."""
    out = {f: row.get(f, "default") for f in SERIES}
    out.update((name, row[name]) for name in order if row.get(name) is not None)
    if row.get("itl_ms"):
        out["itl_ms"] = row["itl_ms"]
    return json.dumps(out, allow_nan=True, separators=(",", ":")).encode()


def test_encoded_events_come_back_equal_and_smaller(make_event: Any) -> None:
    events = [
        msgspec.convert(make_event("inference", event_id=f"e{i}", tenant=f"t{i % 3}"), Any)
        for i in range(20)
    ]
    rows = decode(raw_rows(events), "inference", now_ms=NOW_MS).valid
    message = encode_columns(rows)
    assert is_columnar(message)
    assert not is_columnar(raw_rows(events))
    decoded = decode_columns(message, now_ms=NOW_MS, limits=LIMITS)
    assert decoded.rejects == []
    assert events_of(decoded) == rows
    assert len(message) < len(raw_rows(events))


def raw_rows(rows: list[dict[str, Any]]) -> bytes:
    return json.dumps(rows, separators=(",", ":")).encode()


def test_a_bad_request_is_dead_lettered_alone_with_the_row_verdict(make_event: Any) -> None:
    good = common(make_event("inference"))
    bad = [
        {**good, "event_id": "future", "ts_ms": NOW_MS + 3_600_000},
        {**good, "event_id": "slow-first-token", "ttft_ms": 900.0, "e2e_ms": 800.0},
        {**good, "event_id": "no-ttft", "ttft_ms": None, "output_tokens": 5},
        {**good, "event_id": "long-gap", "itl_ms": [10.0, 3_700_000.0]},
        {**good, "event_id": "cache", "cache": {"prefix_hit_tokens": 9, "prefix_query_tokens": 1}},
    ]
    rows = [good, *bad, {**good, "event_id": "last"}]
    order = sorted({k for r in rows for k in r} - {*SERIES, "itl_ms"})
    decoded = decode_columns(raw(columns_doc(rows, order)), now_ms=NOW_MS, limits=LIMITS)
    assert [r.index for r in decoded.rejects] == [1, 2, 3, 4, 5]
    for reject, row in zip(decoded.rejects, bad, strict=True):
        alone = decode(as_row(row, order), "inference", now_ms=NOW_MS).rejects[0]
        assert (reject.reason, reject.detail) == (alone.reason, alone.detail)
        assert json.loads(reject.element or b"")["event_id"] == row["event_id"]
    assert [ev.event_id for ev in events_of(decoded)] == ["ev-1", "last"]


@pytest.mark.parametrize(
    "trace_id",
    ["0123456789ABCDEF0123456789abcdef", "0123456789abcdef0123456789abcde\n", "é" * 32, "z" * 32],
)
def test_a_trace_id_not_of_lower_case_hex_rejects_its_request_alone(
    make_event: Any, trace_id: str
) -> None:
    good = {**common(make_event("inference")), "trace_id": "0123456789abcdef" * 2}
    bad = {**good, "event_id": "bad-trace", "trace_id": trace_id}
    rows = [
        good,
        {**good, "event_id": "untraced", "trace_id": None},
        bad,
        {**good, "event_id": "z"},
    ]
    order = sorted({k for r in rows for k in r} - {*SERIES, "itl_ms"})
    decoded = decode_columns(raw(columns_doc(rows, order)), now_ms=NOW_MS, limits=LIMITS)
    alone = decode(as_row(bad, order), "inference", now_ms=NOW_MS).rejects[0]
    assert [(r.index, r.reason, r.detail) for r in decoded.rejects] == [
        (2, alone.reason, alone.detail)
    ]
    assert [ev.event_id for ev in events_of(decoded)] == ["ev-1", "untraced", "z"]


def test_a_wrongly_typed_value_rejects_its_request_not_the_message(make_event: Any) -> None:
    good = make_event("inference")
    rows = [good, {**good, "event_id": "neg", "e2e_ms": -5.0}, {**good, "event_id": "ok2"}]
    decoded = decode_columns(raw(columns_doc(rows)), now_ms=NOW_MS, limits=LIMITS)
    assert [(r.index, r.reason) for r in decoded.rejects] == [
        (1, DeadLetterReason.NEGATIVE_DURATION)
    ]
    assert [ev.event_id for ev in events_of(decoded)] == ["ev-1", "ok2"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda d: d["requests"]["ts_ms"].pop(), DeadLetterReason.INCONSISTENT),
        (lambda d: d["requests"]["series"].__setitem__(0, 7), DeadLetterReason.INCONSISTENT),
        (lambda d: d["requests"]["itl_len"].__setitem__(0, 0), DeadLetterReason.INCONSISTENT),
        (lambda d: d.__setitem__("schema", "tailguard.inference.v9"), None),
        (lambda d: d["requests"].pop("event_id"), DeadLetterReason.MISSING_FIELD),
    ],
)
def test_columns_that_disagree_refuse_the_whole_message(
    make_event: Any, change: Any, reason: DeadLetterReason | None
) -> None:
    doc = columns_doc([make_event("inference"), make_event("inference", event_id="b")])
    change(doc)
    decoded = decode_columns(raw(doc), now_ms=NOW_MS, limits=LIMITS)
    assert decoded.message is None
    assert [r.index for r in decoded.rejects] == [None]
    expected = reason or DeadLetterReason.UNKNOWN_SCHEMA_VERSION
    assert decoded.rejects[0].reason == expected


def test_too_many_requests_refuse_the_message(make_event: Any) -> None:
    rows = [make_event("inference", event_id=f"e{i}") for i in range(3)]
    decoded = decode_columns(
        raw(columns_doc(rows)), now_ms=NOW_MS, limits=Limits(max_batch_events=2)
    )
    assert decoded.rejects[0].reason == DeadLetterReason.BATCH_TOO_LARGE


def test_malformed_json_is_refused_whole() -> None:
    decoded = decode_columns(
        b'{"schema": "' + COLUMNS_SCHEMA_ID.encode() + b'", ', now_ms=NOW_MS, limits=LIMITS
    )
    assert [(r.reason, r.index) for r in decoded.rejects] == [
        (DeadLetterReason.MALFORMED_JSON, None)
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), size=st.integers(min_value=1, max_value=5))
def test_each_request_gets_the_verdict_its_row_gets(
    make_event: Any, data: st.DataObject, size: int
) -> None:
    base = common(make_event("inference", ts_ms=TS_MS))
    rows = []
    for i in range(size):
        row = data.draw(near_valid_events(base))
        row.update(service="chat", model=f"m{i % 2}", variant="b", tenant="acme")
        row.pop("schema", None)  # the message's, not a request's
        if not isinstance(row.get("itl_ms"), list):
            row.pop("itl_ms", None)
        rows.append(row)
    order = sorted({k for r in rows for k in r} - {*SERIES, "itl_ms"})
    decoded = decode_columns(raw(columns_doc(rows, order)), now_ms=NOW_MS, limits=LIMITS)
    alone = [decode(as_row(row, order), "inference", now_ms=NOW_MS) for row in rows]
    if decoded.message is None and any(r.index is None for r in decoded.rejects):
        # Refused whole: only when the columns themselves cannot stand — a required
        # column no request has (then every row is refused too), or gaps that are
        # not numbers (their counts cannot be told apart from the gaps).
        no_column = any(all(r.get(name) is None for r in rows) for name in REQUIRED)
        assert no_column or any(
            not all(isinstance(g, int | float) for g in r.get("itl_ms", [])) for r in rows
        )
        assert not no_column or all(verdict.rejects for verdict in alone)
        return
    assert {r.index: r.reason for r in decoded.rejects} == {
        i: verdict.rejects[0].reason for i, verdict in enumerate(alone) if verdict.rejects
    }
    assert events_of(decoded) == [v for verdict in alone for v in verdict.valid]
    # A batch keeps the message without the lists of its numeric columns (arrays
    # hold them): it still reads as the same requests.
    lean = without_numbers(decoded)
    if lean.message is not None:
        assert lean.message.requests.itl_ms is None and not lean.message.requests.e2e_ms
    assert len(lean) == len(decoded)
    assert events_of(lean) == events_of(decoded)


columnar_shapes = st.fixed_dictionaries(
    {"schema": st.just(COLUMNS_SCHEMA_ID)},
    optional={
        "series": json_values,
        "requests": st.dictionaries(
            st.sampled_from(["series", "event_id", "ts_ms", "e2e_ms", "itl_len", "itl_ms", "x"]),
            json_values,
            max_size=6,
        ),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=columnar_shapes | json_values)
def test_decode_columns_never_raises_and_keeps_only_valid_requests(doc: Any) -> None:
    decoded = decode_columns(raw(doc), now_ms=NOW_MS, limits=LIMITS)
    assert all(r.reason in set(DeadLetterReason) for r in decoded.rejects)
    for ev in events_of(decoded):
        assert not decode(msgspec.json.encode(ev), "inference", now_ms=NOW_MS).rejects


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300))
def test_decode_columns_never_raises_for_bytes_that_name_the_schema(data: bytes) -> None:
    message = b'{"schema":"' + COLUMNS_SCHEMA_ID.encode() + b'",' + data
    decode_columns(message, now_ms=NOW_MS, limits=LIMITS)


def test_a_message_is_columnar_wherever_it_names_the_schema(make_event: Any) -> None:
    doc = columns_doc([make_event("inference"), make_event("inference", event_id="b")])
    last = {"series": doc["series"], "requests": doc["requests"], "schema": doc["schema"]}
    message = json.dumps(last, indent=1).encode()
    assert is_columnar(message)
    assert len(decode_columns(message, now_ms=NOW_MS, limits=LIMITS)) == 2
    row = make_event("inference", error_type=COLUMNS_SCHEMA_ID)
    assert not is_columnar(json.dumps(row).encode())
    assert not is_columnar(json.dumps([row]).encode())


def test_a_columnar_message_validates_against_its_shipped_schema(make_event: Any) -> None:
    import jsonschema
    from tailguard.schemas.generate import SCHEMA_DIR

    schema = json.loads((SCHEMA_DIR / f"{COLUMNS_SCHEMA_ID}.json").read_text())
    rows = [make_event("inference", event_id=f"e{i}", tenant=f"t{i % 2}") for i in range(4)]
    jsonschema.validate(json.loads(encode_columns(rows)), schema)
    broken = json.loads(encode_columns(rows))
    broken["requests"]["e2e_ms"][1] = -1.0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_rows_of_reads_either_form_back_as_the_rows_sent(make_event: Any) -> None:
    rows = [
        common(make_event("inference", event_id="a")),
        {**common(make_event("inference", event_id="b")), "itl_ms": []},
    ]
    rows[1].pop("itl_ms")
    message = encode_columns(rows)
    back = rows_of(message)
    assert [r["event_id"] for r in back] == ["a", "b"]
    assert back[0]["itl_ms"] == rows[0]["itl_ms"] and "itl_ms" not in back[1]
    assert rows_of(json.dumps(rows).encode()) == rows


def test_gap_counts_of_zero_without_the_gaps_column_mean_no_gaps(make_event: Any) -> None:
    rows = [common(make_event(event_id=f"z{i}", itl_ms=[])) for i in range(3)]
    doc = columns_doc(rows)
    doc["requests"]["itl_len"] = [0, 0, 0]  # and no itl_ms column at all
    decoded = decode_columns(raw(doc), now_ms=NOW_MS, limits=LIMITS)
    assert not decoded.rejects and decoded.numbers is not None
    assert decoded.numbers.itl_ms.shape == (0,)
    assert decoded.numbers.itl_len.tolist() == [0, 0, 0]


def test_a_message_of_every_column_nests_as_deep_as_the_contract_says(make_event: Any) -> None:
    # The nesting scan is skipped for messages of the contract's fields: its depth
    # bound must hold for the deepest of them (experiment tags, cache objects...).
    event = make_event(experiments=[{"experiment": "e", "variant": "b", "layer": "l"}])
    raw = encode_columns(decode(json.dumps([event]).encode(), "inference", now_ms=NOW_MS).valid)
    assert nesting_problem(raw, Limits(max_depth=CONTRACT_DEPTH)) is None
    assert nesting_problem(raw, Limits(max_depth=CONTRACT_DEPTH - 1)) is not None


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("an unknown column", ',"extra":{deep}'),
        (
            "a cache object",
            ',"cache":[{{"prefix_hit_tokens":1,"prefix_query_tokens":2,"x":{deep}}}]',
        ),
        ("an experiment tag", ',"experiments":[[{{"experiment":"e","variant":"v","x":{deep}}}]]'),
    ],
)
def test_nesting_hidden_where_the_decoder_skips_fields_is_still_refused(
    where: str, value: str
) -> None:
    deep = "[" * 40 + "]" * 40
    doc = (
        '{"schema":"tailguard.inference.columns.v1","series":[["a","b","c","d"]],'
        f'"requests":{{"series":[0],"event_id":["x"],"ts_ms":[{TS_MS}],"status":["ok"],'
        f'"e2e_ms":[1.0]{value.format(deep=deep)}}}}}'
    )
    decoded = decode_columns(doc.encode(), now_ms=NOW_MS, limits=LIMITS)
    assert [r.reason for r in decoded.rejects] == [DeadLetterReason.TOO_DEEP], where


def test_a_message_decodes_the_same_with_a_column_the_contract_does_not_name(
    make_event: Any,
) -> None:
    rows = [common(make_event(event_id=f"u{i}", ts_ms=TS_MS + i)) for i in range(4)]
    plain = columns_doc(rows)
    extra = json.loads(json.dumps(plain))
    extra["requests"]["x_note"] = [1, 2, 3, 4]
    a = decode_columns(raw(plain), now_ms=NOW_MS, limits=LIMITS)
    b = decode_columns(raw(extra), now_ms=NOW_MS, limits=LIMITS)
    assert not a.rejects and not b.rejects
    assert events_of(a) == events_of(b)
    assert a.numbers is not None and b.numbers is not None
    assert a.numbers.itl_ms.tolist() == b.numbers.itl_ms.tolist()
