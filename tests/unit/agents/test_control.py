"""Control state: applied in offset order, tombstones delete, a bad record is skipped."""

import json

from tailguard.agents.control import BreachView, ControlState, SloBook
from tailguard.schemas.openslo import default_slos

from tailguard.admin.slos import slo_to_dict


def _ttft(book: SloBook) -> float | None:
    return next(s for s in book.specs if s.name == "ttft-p99").ttft_ms


def test_an_older_record_of_a_key_never_overrides_a_newer_one() -> None:
    book = SloBook(default_slos())
    state = ControlState(book)
    spec = slo_to_dict(book.specs[0])
    state.apply("slos", {"overrides": {"ttft-p99": {**spec, "ttft_ms": 2000.0}}}, offset=5)
    state.apply("slos", {"overrides": {"ttft-p99": {**spec, "ttft_ms": 1000.0}}}, offset=3)
    assert _ttft(book) == 2000.0 and book.version == 1  # the older record came late
    state.apply("slos", {"overrides": {}}, offset=6)
    assert _ttft(book) == 800.0


def test_the_live_list_is_changed_in_place() -> None:
    book = SloBook(default_slos())
    held = book.specs
    override = {**slo_to_dict(book.specs[0]), "target": 0.9}
    ControlState(book).apply("slos", {"overrides": {"ttft-p99": override}}, 1)
    assert held is book.specs and held[0].target == 0.9


def test_a_record_this_worker_cannot_use_is_skipped() -> None:
    book = SloBook(default_slos())
    state = ControlState(book)
    broken = {"name": "ttft-p99", "sli": "ttft_ms", "target": 7}
    state.apply("slos", {"overrides": {"ttft-p99": broken}}, offset=1)
    state.apply("what/ever", {"x": 1}, offset=2)
    assert _ttft(book) == 800.0 and state.applied_offset == 2


def test_keys_and_reloads_reach_their_hooks() -> None:
    seen: list[object] = []
    state = ControlState(
        SloBook(default_slos()),
        on_key=lambda k, at: seen.append((k, at)),
        on_reload=lambda: seen.append("reload"),
    )
    state.apply("key/ops", {"retired_ms": 9}, 1)
    state.apply("keys/reload", {"at_ms": 1}, 2)
    state.apply("key/ops", None, 3)
    assert seen == [("ops", 9), "reload", ("ops", None)]


def test_thresholds_never_raise_even_when_slos_conflict() -> None:
    book = SloBook(default_slos())
    bad = {**slo_to_dict(book.specs[0]), "ttft_ms": 5000.0}  # composite still says 800
    ControlState(book).apply("slos", {"overrides": {"ttft-p99": bad}}, 1)
    assert book.thresholds("chat|m|default|default").ttft_ms == 800.0  # the base set's


def test_the_breach_view_keeps_open_breaches_only() -> None:
    view = BreachView()
    for record in (
        {"breach_id": "a", "state": "opened", "seq": 0, "opened_ms": 2},
        {"breach_id": "b", "state": "opened", "seq": 0, "opened_ms": 1},
        {"breach_id": "a", "state": "updated", "seq": 1, "severity": "page", "opened_ms": 2},
        {"breach_id": "b", "state": "resolved", "seq": 1},
    ):
        view.offer(json.dumps(record).encode())
    view.offer(b"not json")
    assert [(b["breach_id"], b["severity"]) for b in view.open()] == [("a", "page")]
