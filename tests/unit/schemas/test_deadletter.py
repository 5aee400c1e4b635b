"""Dead-letter records: origin, reason, the offending bytes, deterministic ids."""

import base64
import json
from typing import Any

from tailguard.schemas import DeadLetterReason, Reject, dead_letter, dead_letter_id, decode

NOW_MS = 1_700_000_100_000
ORIGIN: dict[str, Any] = {"topic": "tailguard.inference", "partition": 3, "offset": 1234}


def test_a_whole_message_reject_keeps_the_whole_message() -> None:
    raw = b'{"event_id": '
    (reject,) = decode(raw, "inference", now_ms=NOW_MS).rejects
    letter = dead_letter(reject, raw, now_ms=NOW_MS, **ORIGIN)
    assert (letter.schema, letter.ts_ms, letter.reason, letter.index) == (
        "tailguard.deadletter.v1",
        NOW_MS,
        DeadLetterReason.MALFORMED_JSON,
        None,
    )
    assert (letter.topic, letter.partition, letter.offset) == ("tailguard.inference", 3, 1234)
    assert base64.b64decode(letter.original_b64) == raw
    assert (letter.original_size, letter.original_truncated) == (len(raw), False)
    assert letter.detail == reject.detail


def test_a_bad_event_of_a_batch_keeps_only_its_own_bytes(make_event: Any, to_raw: Any) -> None:
    events = [make_event(event_id="a"), make_event(event_id="b", e2e_ms=-1)]
    raw = to_raw(events)
    (reject,) = decode(raw, "inference", now_ms=NOW_MS).rejects
    letter = dead_letter(reject, raw, now_ms=NOW_MS, **ORIGIN)
    assert letter.index == 1
    assert json.loads(base64.b64decode(letter.original_b64)) == events[1]
    assert letter.event_id == "tailguard.inference:3:1234:1"


def test_ids_are_deterministic_so_replays_can_be_deduplicated() -> None:
    reject = Reject(DeadLetterReason.TOO_LARGE, "big")
    first = dead_letter(reject, b"x", now_ms=1, **ORIGIN)
    replay = dead_letter(reject, b"x", now_ms=2, **ORIGIN)
    assert first.event_id == replay.event_id == dead_letter_id("tailguard.inference", 3, 1234, None)
    assert dead_letter_id("t", 0, 1, 0) != dead_letter_id("t", 0, 1, None)
    assert dead_letter_id("t", 0, 1, 2) != dead_letter_id("t", 0, 12, None)


def test_a_too_large_original_is_cut() -> None:
    raw = b"[" + b" " * 5000 + b"]"
    reject = Reject(DeadLetterReason.TOO_LARGE, "big")
    letter = dead_letter(reject, raw, now_ms=NOW_MS, max_original_bytes=100, **ORIGIN)
    assert base64.b64decode(letter.original_b64) == raw[:100]
    assert (letter.original_size, letter.original_truncated) == (len(raw), True)


def test_a_tombstone_dead_letters_with_no_bytes() -> None:
    (reject,) = decode(None, "inference", now_ms=NOW_MS).rejects
    letter = dead_letter(reject, None, now_ms=NOW_MS, **ORIGIN)
    assert (letter.original_b64, letter.original_size) == ("", 0)
