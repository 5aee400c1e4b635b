"""Properties of ``decode``: it never raises, and a batch means the same as its events alone."""

import json
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tailguard.schemas import DeadLetterReason, Limits, decode
from tailguard.schemas.inputs import INPUT_RECORDS, InferenceEvent

NOW_MS = 1_700_000_100_000
KINDS = list(INPUT_RECORDS)
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
# Values a producer plausibly gets wrong: negative, huge, zero, wrong types, nulls.
field_values = (
    json_values
    | st.sampled_from([-1, -0.5, 0, 0.0, 1e400, 3_600_001.0, 2**53, NOW_MS + 10**9, "", "x"])
    | st.lists(st.floats(min_value=-10, max_value=5e6), max_size=25)
)
inference_fields = st.sampled_from([*sorted(InferenceEvent.__struct_fields__), "unknown"])


def _dumps(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True, separators=(",", ":")).encode()


@st.composite
def near_valid_events(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(json.dumps(base))
    for name in draw(st.lists(inference_fields, max_size=3)):
        event[name] = draw(field_values)
    for name in draw(st.lists(st.sampled_from(sorted(event)), max_size=2)):
        event.pop(name, None)
    return event


# Text over JSON's own characters reaches the parser's corners far more often than bytes.
json_ish = st.text(alphabet='[]{}",:0123456789.eE-+ \\ntrufalsNIiy\x00é', max_size=60)


@PROPERTY
@given(raw=st.binary(max_size=400) | json_ish.map(str.encode), kind=st.sampled_from(KINDS))
def test_decode_never_raises_for_arbitrary_bytes(raw: bytes, kind: Any) -> None:
    decoded = decode(raw, kind, now_ms=NOW_MS)
    for reject in decoded.rejects:
        assert isinstance(reject.reason, DeadLetterReason) and reject.detail
        event(reject.reason.value)


@PROPERTY
@given(value=json_values, kind=st.sampled_from(KINDS))
def test_decode_never_raises_for_arbitrary_json(value: Any, kind: Any) -> None:
    decoded = decode(_dumps(value), kind, now_ms=NOW_MS, limits=Limits(max_depth=4))
    for reject in decoded.rejects:
        assert isinstance(reject.reason, DeadLetterReason) and reject.detail
        event(reject.reason.value)


@PROPERTY
@given(data=st.data(), size=st.integers(min_value=1, max_value=6))
def test_a_batch_means_what_its_events_mean_alone(
    make_event: Any, data: st.DataObject, size: int
) -> None:
    events = [data.draw(near_valid_events(make_event())) for _ in range(size)]
    batch = decode(_dumps(events), "inference", now_ms=NOW_MS)
    alone = [decode(_dumps(event), "inference", now_ms=NOW_MS) for event in events]
    assert batch.valid == [record for one in alone for record in one.valid]
    assert [(r.index, r.reason) for r in batch.rejects] == [
        (i, r.reason) for i, one in enumerate(alone) for r in one.rejects
    ]
    assert all(len(one.valid) + len(one.rejects) == 1 for one in alone)
    for reject in batch.rejects:  # each carries the bytes of its own event
        event(reject.reason.value)
        assert reject.element is not None
        assert json.loads(reject.element, parse_constant=float) == json.loads(
            _dumps(events[reject.index or 0]), parse_constant=float
        ) or _has_nan(events[reject.index or 0])


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return value != value  # NaN is never equal to itself, so the comparison above fails
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nan(v) for v in value)
    return False
