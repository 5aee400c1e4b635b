"""Decoding breach and release records, and the subscribers' filters."""

import json
from typing import Any

import pytest

from tailguard.alerts.errors import BadEvent
from tailguard.alerts.events import EventFilter, decode_event


def _bytes(record: Any) -> bytes:
    return json.dumps(record).encode()


def test_a_breach_decodes_with_its_severity_service_and_kind(make_breach: Any) -> None:
    event = decode_event(_bytes(make_breach()), "breach")
    assert (event.kind, event.event_id, event.severity) == ("breach", "b1:0", "page")
    assert (event.service, event.breach_kind, event.decision) == ("chat", "burn_rate", None)
    assert not event.resolved
    assert decode_event(_bytes(make_breach(state="resolved")), "breach").resolved


def test_a_release_takes_its_severity_from_the_decision(make_release: Any) -> None:
    event = decode_event(_bytes(make_release(decision="hold")), "release")
    assert (event.kind, event.severity, event.decision, event.service) == (
        "release",
        "ticket",
        "hold",
        None,
    )
    unknown = decode_event(_bytes(make_release(decision="pause", service="chat")), "release")
    assert (unknown.severity, unknown.service) == ("info", "chat")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (None, "not a JSON object"),
        (_bytes({"breach_id": "b"}), "without a event_id"),
        (_bytes({"event_id": "e", "breach_id": "b", "state": "closed"}), "state 'closed'"),
    ],
)
def test_what_is_not_a_breach_says_why(value: bytes | None, reason: str) -> None:
    with pytest.raises(BadEvent, match=reason):
        decode_event(value, "breach")


def test_a_breach_without_a_series_service_is_bad(make_breach: Any) -> None:
    with pytest.raises(BadEvent, match=r"series\.service"):
        decode_event(_bytes(make_breach(series={"model": "m"})), "breach")


def test_a_release_without_an_experiment_is_bad(make_release: Any) -> None:
    with pytest.raises(BadEvent, match="experiment"):
        decode_event(_bytes(make_release(experiment=None)), "release")


def test_an_empty_filter_lets_everything_through(make_breach: Any, make_release: Any) -> None:
    keep = EventFilter()
    assert keep.matches(decode_event(_bytes(make_breach()), "breach"))
    assert keep.matches(decode_event(_bytes(make_release()), "release"))


def test_filters_by_severity_service_glob_kind_and_decision(
    make_breach: Any, make_release: Any
) -> None:
    chat_page = decode_event(_bytes(make_breach()), "breach")
    ticket = decode_event(_bytes(make_breach(severity="ticket")), "breach")
    silent = decode_event(_bytes(make_breach(kind="silent_degradation")), "breach")
    rollback = decode_event(_bytes(make_release()), "release")
    promote = decode_event(_bytes(make_release(decision="promote")), "release")

    pages = EventFilter.of(severities=["page"])
    assert [pages.matches(e) for e in (chat_page, ticket, rollback, promote)] == [
        True,
        False,
        True,
        False,
    ]
    assert EventFilter.of(services=["ch*"]).matches(chat_page)
    assert not EventFilter.of(services=["search"]).matches(chat_page)
    assert not EventFilter.of(services=["chat"]).matches(rollback)  # names no service
    burn = EventFilter.of(kinds=["burn_rate"])
    assert burn.matches(chat_page)
    assert not burn.matches(silent)
    assert not burn.matches(rollback)
    rollbacks = EventFilter.of(decisions=["rollback"])
    assert rollbacks.matches(rollback)
    assert not rollbacks.matches(promote)
    assert not rollbacks.matches(chat_page)


def test_without_send_resolved_resolved_transitions_are_dropped(make_breach: Any) -> None:
    no_resolved = EventFilter.of(send_resolved=False)
    assert no_resolved.matches(decode_event(_bytes(make_breach()), "breach"))
    assert not no_resolved.matches(decode_event(_bytes(make_breach(state="resolved")), "breach"))


def test_a_silenced_breach_is_muted_only_when_silences_are_excluded(make_breach: Any) -> None:
    silenced = decode_event(_bytes(make_breach(silenced=True, silence_id="s1")), "breach")
    plain = decode_event(_bytes(make_breach(silenced=False, silence_id=None)), "breach")
    assert silenced.silenced and not plain.silenced
    assert EventFilter().matches(silenced), "an empty filter lets silenced events through"
    no_silenced = EventFilter.of(include_silenced=False)
    assert not no_silenced.matches(silenced) and no_silenced.mutes(silenced)
    assert no_silenced.matches(plain) and not no_silenced.mutes(plain)


def test_a_silenced_resolved_transition_still_closes_the_alert(make_breach: Any) -> None:
    resolved = decode_event(_bytes(make_breach(state="resolved", silenced=True)), "breach")
    assert EventFilter.of(include_silenced=False).matches(resolved)
    assert not EventFilter.of(include_silenced=False, send_resolved=False).matches(resolved)


def test_only_breaches_are_silenced(make_release: Any) -> None:
    release = decode_event(_bytes(make_release(silenced=True)), "release")
    assert not release.silenced
    assert EventFilter.of(include_silenced=False).matches(release)
