"""Blind feedback (no experiment: the rater never saw it) reaches every experiment partition."""

from tailguard.agents.experiments import BLIND, IntMsg, decode_internal, route_interactions
from tailguard.schemas import Interaction


def test_blind_feedback_goes_to_every_partition_and_named_feedback_to_its_own() -> None:
    events = [
        Interaction(event_id="f1", ts_ms=1, service="chat", kind="feedback",
                    label="hallucination", rater="ann", request_event_id="r1"),
        Interaction(event_id="f2", ts_ms=2, service="chat", kind="feedback", label="correct",
                    rater="bob", request_event_id="r2", experiment="exp", variant="control"),
        Interaction(event_id="f3", ts_ms=3, service="chat", kind="feedback", rater="bob"),
    ]  # fmt: skip
    out = route_interactions(events, [(0, 5)] * 3, partitions=4)
    blind = [(p, decode_internal(v)) for p, _k, v in out if decode_internal(v).experiment == BLIND]
    named = [decode_internal(v) for _p, _k, v in out if decode_internal(v).experiment == "exp"]
    assert sorted(p for p, _ in blind) == [0, 1, 2, 3]
    for _, msg in blind:
        assert isinstance(msg, IntMsg) and msg.cols.label == bytes([3])  # f1 only
    assert len(named) == 1 and isinstance(named[0], IntMsg)
