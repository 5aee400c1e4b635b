"""CloudEvents binary-mode headers of output records."""

from tailguard.schemas import ce_headers
from tailguard.schemas.cloudevents import rfc3339_ms


def test_headers_frame_a_record_as_a_binary_mode_cloudevent() -> None:
    headers = ce_headers("tailguard.sli.v1", "sli-42", 1_714_564_800_123)
    assert headers == [
        ("ce_specversion", b"1.0"),
        ("ce_id", b"sli-42"),
        ("ce_source", b"tailguard"),
        ("ce_type", b"tailguard.sli.v1"),
        ("ce_time", b"2024-05-01T12:00:00.123Z"),
        ("content-type", b"application/json"),
    ]
    assert all(isinstance(k, str) and isinstance(v, bytes) for k, v in headers)


def test_source_can_be_named_and_ids_may_be_unicode() -> None:
    headers = dict(ce_headers("tailguard.deadletter.v1", "id-é", 0, source="tailguard/worker-1"))
    assert headers["ce_source"] == b"tailguard/worker-1"
    assert headers["ce_id"] == "id-é".encode()
    assert headers["ce_time"] == b"1970-01-01T00:00:00.000Z"


def test_times_are_rfc3339_utc_with_exact_milliseconds() -> None:
    assert rfc3339_ms(1_700_000_000_999) == "2023-11-14T22:13:20.999Z"
    assert rfc3339_ms(1_700_000_001_000) == "2023-11-14T22:13:21.000Z"
