"""The SLI agent's checkpoint pacing: every interval, unless that would take too much time."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.agents.cadence import CheckpointCadence
from tailguard.agents.settings import Settings, SettingsError


def test_a_new_partition_waits_one_interval():
    c = CheckpointCadence(5.0)
    assert not c.due(0, now=100.0)  # first sight starts the clock
    assert not c.due(0, now=104.9)
    assert c.due(0, now=105.0)


def test_the_most_overdue_partition_is_the_one_due_longest():
    c = CheckpointCadence(5.0)
    for partition, seen in ((0, 3.0), (1, 1.0), (2, 2.0), (3, 9.0)):
        c.due(partition, seen)
    assert c.most_overdue([0, 1, 2, 3], now=8.5) == 1
    assert c.most_overdue([0, 2, 3], now=8.5) == 2
    assert c.most_overdue([3], now=8.5) is None, "seen at 9.0: not due"
    c.done(1, started=8.5, ended=8.6)
    assert c.most_overdue([0, 1, 2, 3], now=8.7) == 2, "just checkpointed: no longer due"


def test_cheap_checkpoints_keep_the_interval():
    c = CheckpointCadence(5.0, max_share=0.2)
    c.due(0, 0.0)
    c.done(0, started=5.0, ended=5.1)  # 0.1 s: 0.5 s paced, under the 5 s interval
    assert c.gap(5.1) == 5.0
    assert not c.due(0, 10.0)
    assert c.due(0, 10.1)


def test_costly_checkpoints_stretch_the_period_to_the_share():
    c = CheckpointCadence(5.0, max_share=0.2, max_interval_s=60.0)
    c.done(0, started=0.0, ended=2.0)  # 2 s each: 10 s apart keeps them at 20 %
    assert c.gap(2.0) == pytest.approx(10.0)
    assert not c.due(0, 11.9)
    assert c.due(0, 12.0)


def test_the_share_counts_every_owned_partition():
    # Four partitions of 1 s each: together 4 s per round, so each waits 20 s.
    c = CheckpointCadence(5.0, max_share=0.2, max_interval_s=60.0)
    for p in range(4):
        c.done(p, started=float(p), ended=float(p) + 1.0)
    assert c.gap(4.0) == pytest.approx(20.0)
    # A partition that moves away stops counting.
    c.forget({2, 3})
    assert c.gap(4.0) == pytest.approx(10.0)
    assert c.partitions() == {0, 1}


def test_a_partition_gone_quiet_stops_slowing_the_others():
    # Found in review: partition 1's one costly checkpoint (say the first after a
    # restore) kept partition 0's cheap ones 25 s apart for as long as 1 stayed quiet.
    c = CheckpointCadence(5.0, max_share=0.2, max_interval_s=30.0)
    c.done(1, started=0.0, ended=5.0)
    c.done(0, started=5.0, ended=5.01)
    assert c.gap(10.0) == pytest.approx(25.05)  # 1 may still recur: it counts
    now = 5.01
    for _ in range(10):  # partition 0 goes on; 1 holds no input, so never checkpoints
        now += c.gap(now) + 1e-9
        assert c.due(0, now)
        c.done(0, started=now, ended=now + 0.01)
        now += 0.01
    assert now - 5.0 > 60.0
    assert c.gap(now) == 5.0  # 1 has been quiet for twice the longest period


def test_the_period_never_exceeds_the_maximum():
    c = CheckpointCadence(5.0, max_share=0.1, max_interval_s=30.0)
    c.done(0, started=0.0, ended=9.0)  # would pace to 90 s
    assert c.gap(9.0) == 30.0
    assert c.due(0, 39.0)


def test_a_maximum_below_the_interval_is_the_interval():
    c = CheckpointCadence(60.0, max_interval_s=30.0)
    assert c.gap(0.0) == 60.0


def test_a_deferred_checkpoint_waits_a_gap_and_keeps_the_old_duration():
    c = CheckpointCadence(5.0, max_share=0.5, max_interval_s=60.0)
    c.done(0, started=0.0, ended=4.0)  # 8 s gap
    c.deferred(0, now=20.0)
    assert not c.due(0, 27.9)
    assert c.due(0, 28.0)


@pytest.mark.parametrize(
    ("interval", "share", "longest"),
    [(0.0, 0.2, 30.0), (-1.0, 0.2, 30.0), (math.inf, 0.2, 30.0), (5.0, 0.0, 30.0), (5.0, 1.5, 30.0)]
    + [(5.0, 0.2, bad) for bad in (math.nan, math.inf, 0.0, -5.0)],
)
def test_nonsense_is_refused(interval, share, longest):
    with pytest.raises(ValueError, match="checkpoint"):
        CheckpointCadence(interval, max_share=share, max_interval_s=longest)


@pytest.mark.parametrize("share", [0.0, -0.1, 1.01])
def test_settings_refuse_a_share_outside_zero_to_one(share):
    with pytest.raises(SettingsError, match="checkpoint_max_share"):
        Settings(checkpoint_max_share=share)


@pytest.mark.parametrize("interval", [0.0, -5.0, math.nan, math.inf])
def test_settings_refuse_a_checkpoint_interval_that_is_not_a_positive_number(interval):
    with pytest.raises(SettingsError, match="checkpoint_interval_s"):
        Settings(checkpoint_interval_s=interval)


@pytest.mark.parametrize("longest", [math.nan, math.inf, 0.0, -1.0])
def test_settings_refuse_a_longest_period_that_is_no_bound(longest):
    # NaN or infinity would silently remove the bound on what a crash replays.
    with pytest.raises(SettingsError, match="checkpoint_max_interval_s"):
        Settings(checkpoint_max_interval_s=longest)


def test_settings_read_the_pacing_from_the_environment(monkeypatch):
    monkeypatch.setenv("TAILGUARD_CHECKPOINT_SHARE", "0.3")
    monkeypatch.setenv("TAILGUARD_CHECKPOINT_MAX_S", "45")
    s = Settings.from_env()
    assert (s.checkpoint_max_share, s.checkpoint_max_interval_s) == (0.3, 45.0)


@settings(max_examples=300, deadline=None)
@given(
    interval=st.floats(0.5, 20.0),
    share=st.floats(0.05, 1.0),
    cap=st.floats(0.5, 120.0),
    partitions=st.integers(1, 4),
    costs=st.lists(st.floats(0.0, 10.0), min_size=2, max_size=200),
    data=st.data(),
)
def test_busy_partitions_checkpoint_within_the_share_or_at_the_cap(
    interval, share, cap, partitions, costs, data
):
    """Simulated agent: partitions with input checkpoint, one at a time, whenever the
    cadence says so (costs drawn). Every gap a partition waits is at least the
    interval, at most the cap, and — unless it is the cap — at least the owned
    partitions' latest costs over the share: so over a round, checkpointing takes
    at most the share of the time unless the cap bounds it."""
    c = CheckpointCadence(interval, max_share=share, max_interval_s=cap)
    now = 0.0
    for p in range(partitions):
        c.due(p, now)
    for cost in costs:
        gap = c.gap(now)
        assert interval - 1e-9 <= gap <= max(cap, interval) + 1e-9
        latest = sum(c._took.values())  # every partition here is busy: all recur
        if gap < c.max_interval_s - 1e-9:
            assert gap >= latest / share - 1e-9
        # The partition due soonest goes next (the agent runs one checkpoint at a time).
        p = min(range(partitions), key=lambda q: c._since[q])
        now = max(now, c._since[p] + gap) + 1e-9
        assert c.due(p, now)
        c.done(p, started=now, ended=now + cost)
        now += cost
        if data.draw(st.booleans(), label="other partition checks in"):
            q = data.draw(st.integers(0, partitions - 1))
            c.due(q, now)  # asking never moves a known partition's clock
            assert c._since[q] <= now
