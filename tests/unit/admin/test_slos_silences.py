"""slo set edits (in-step thresholds, conflicts) and silences (matching, expiry)."""

from dataclasses import replace

import pytest
from tailguard.schemas.openslo import default_slos
from tailguard.streams.burn import Selector

from tailguard.admin.errors import CommandError
from tailguard.admin.silences import silence_from_args
from tailguard.admin.slos import edit_slos, merged, slo_from_dict, slo_to_dict

NOW = 1_750_000_000_000


def test_an_slo_survives_the_round_trip_through_its_dict() -> None:
    for spec in default_slos():
        assert slo_from_dict(slo_to_dict(spec)) == spec


def test_a_target_change_touches_only_that_slo() -> None:
    (changed,) = edit_slos(default_slos(), {"name": "ttft-p99", "target": 0.995}, source="t")
    assert (changed.name, changed.target, changed.source) == ("ttft-p99", 0.995, "t")


def test_a_threshold_change_keeps_slos_in_step() -> None:
    changed = edit_slos(default_slos(), {"name": "ttft-p99", "threshold_ms": 3000}, source="t")
    assert {s.name: s.ttft_ms for s in changed} == {"ttft-p99": 3000.0, "composite": 3000.0}


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ({"name": "nope", "target": 0.9}, "not_found"),
        ({"name": "ttft-p99"}, "bad_args"),
        ({"name": "ttft-p99", "target": 1.5}, "bad_args"),
        ({"name": "ttft-p99", "target": "high"}, "bad_args"),
        ({"name": "ttft-p99", "colour": "red"}, "bad_args"),
        ({"name": "success-rate", "threshold_ms": 5}, "bad_args"),
        ({"target": 0.9}, "bad_args"),
        ({"openslo": "not: [valid"}, "bad_args"),
    ],
)
def test_wrong_slo_changes_are_refused(args: dict[str, object], code: str) -> None:
    with pytest.raises(CommandError) as caught:
        edit_slos(default_slos(), args, source="t")
    assert caught.value.code == code


def test_a_change_that_would_disagree_with_an_overlapping_slo_is_a_conflict() -> None:
    base = [*default_slos()]
    chat = replace(base[0], name="chat-ttft", selector=Selector(service=("chat",)))
    with pytest.raises(CommandError) as caught:
        edit_slos([*base, chat], {"name": "chat-ttft", "threshold_ms": 500}, source="t")
    assert caught.value.code == "conflict"
    assert "'chat-ttft'" in caught.value.message and "'ttft-p99'" in caught.value.message


def test_slos_on_disjoint_series_may_differ() -> None:
    chat = replace(default_slos()[0], name="chat-ttft", selector=Selector(service=("chat",)))
    search = replace(chat, name="search-ttft", selector=Selector(service=("search",)))
    (changed,) = edit_slos([chat, search], {"name": "chat-ttft", "threshold_ms": 500}, source="t")
    assert (changed.name, changed.ttft_ms) == ("chat-ttft", 500.0)


def test_openslo_text_adds_slos() -> None:
    text = """
apiVersion: openslo/v1
kind: SLO
metadata: {name: chat-e2e}
spec:
  service: chat
  indicator:
    metadata: {name: e2e}
    spec:
      thresholdMetric:
        metricSource: {type: tailguard, spec: {sli: e2e_ms}}
  timeWindow: [{duration: 30d, isRolling: true}]
  budgetingMethod: Occurrences
  objectives: [{op: lte, value: 5000, target: 0.99}]
"""
    (added,) = edit_slos(default_slos(), {"openslo": text}, source="admin:c-1")
    assert added.name == "chat-e2e" and added.e2e_ms == 5000.0
    assert [s.name for s in merged(default_slos(), {added.name: added})][-1] == "chat-e2e"


def test_a_silence_matches_by_labels_slo_and_kind() -> None:
    silence = silence_from_args(
        {"service": "chat*", "slo": "ttft-p99", "duration": "2h", "reason": "deploy"},
        actor="alice",
        command_id="c-1",
        now_ms=NOW,
    )
    breach = {
        "series": {"service": "chat-eu", "model": "m"},
        "slo": "ttft-p99",
        "kind": "burn_rate",
    }
    assert silence.matches(breach)
    assert not silence.matches({**breach, "slo": "itl-p99"})
    assert not silence.matches({**breach, "series": {"service": "search"}})
    assert silence.active_at(NOW) and silence.active_at(NOW + 7_199_999)
    assert not silence.active_at(NOW + 7_200_000)


def test_silence_ids_are_derived_from_the_command() -> None:
    args = {"service": "chat", "duration": "1h", "reason": "r"}
    one = silence_from_args(args, actor="a", command_id="c-1", now_ms=NOW)
    again = silence_from_args(args, actor="a", command_id="c-1", now_ms=NOW)
    other = silence_from_args(args, actor="a", command_id="c-2", now_ms=NOW)
    assert one.silence_id == again.silence_id != other.silence_id


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"duration": "1h", "reason": "r"}, "at least one matcher"),
        ({"service": "chat", "duration": "1h"}, "reason"),
        ({"service": "chat", "reason": "r"}, "exactly one of duration or until_ms"),
        ({"service": "chat", "duration": "31d", "reason": "r"}, "at most 30 days"),
        ({"service": "chat", "duration": "soon", "reason": "r"}, "duration must be like"),
        ({"service": "chat", "until_ms": NOW - 1, "reason": "r"}, "not in the future"),
        ({"service": "chat", "duration": "1h", "reason": "r", "colour": 1}, "does not take"),
    ],
)
def test_wrong_silences_are_refused(args: dict[str, object], needle: str) -> None:
    with pytest.raises(CommandError, match=needle):
        silence_from_args(args, actor="a", command_id="c", now_ms=NOW)


def test_a_global_silence_needs_all_true() -> None:
    silence = silence_from_args(
        {"all": True, "duration": "10m", "reason": "maintenance"},
        actor="a",
        command_id="c",
        now_ms=NOW,
    )
    assert silence.matches({"series": {"service": "x"}, "slo": "y", "kind": "z"})
