"""The SLI agent's checkpoint pacing: every interval, unless that would take too much time."""

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


def test_cheap_checkpoints_keep_the_interval():
    c = CheckpointCadence(5.0, max_share=0.2)
    c.due(0, 0.0)
    c.done(0, started=5.0, ended=5.1)  # 0.1 s: 0.5 s paced, under the 5 s interval
    assert c.gap() == 5.0
    assert not c.due(0, 10.0)
    assert c.due(0, 10.1)


def test_costly_checkpoints_stretch_the_period_to_the_share():
    c = CheckpointCadence(5.0, max_share=0.2, max_interval_s=60.0)
    c.done(0, started=0.0, ended=2.0)  # 2 s each: 10 s apart keeps them at 20 %
    assert c.gap() == pytest.approx(10.0)
    assert not c.due(0, 11.9)
    assert c.due(0, 12.0)


def test_the_share_counts_every_owned_partition():
    # Four partitions of 1 s each: together 4 s per round, so each waits 20 s.
    c = CheckpointCadence(5.0, max_share=0.2, max_interval_s=60.0)
    for p in range(4):
        c.done(p, started=float(p), ended=float(p) + 1.0)
    assert c.gap() == pytest.approx(20.0)
    # A partition that moves away stops counting.
    c.forget({2, 3})
    assert c.gap() == pytest.approx(10.0)
    assert c.partitions() == {0, 1}


def test_the_period_never_exceeds_the_maximum():
    c = CheckpointCadence(5.0, max_share=0.1, max_interval_s=30.0)
    c.done(0, started=0.0, ended=9.0)  # would pace to 90 s
    assert c.gap() == 30.0
    assert c.due(0, 39.0)


def test_a_maximum_below_the_interval_is_the_interval():
    c = CheckpointCadence(60.0, max_interval_s=30.0)
    assert c.gap() == 60.0


def test_a_deferred_checkpoint_waits_a_gap_and_keeps_the_old_duration():
    c = CheckpointCadence(5.0, max_share=0.5, max_interval_s=60.0)
    c.done(0, started=0.0, ended=4.0)  # 8 s gap
    c.deferred(0, now=20.0)
    assert not c.due(0, 27.9)
    assert c.due(0, 28.0)


@pytest.mark.parametrize(("interval", "share"), [(0.0, 0.2), (-1.0, 0.2), (5.0, 0.0), (5.0, 1.5)])
def test_nonsense_is_refused(interval, share):
    with pytest.raises(ValueError, match="checkpoint"):
        CheckpointCadence(interval, max_share=share)


@pytest.mark.parametrize("share", [0.0, -0.1, 1.01])
def test_settings_refuse_a_share_outside_zero_to_one(share):
    with pytest.raises(SettingsError, match="checkpoint_max_share"):
        Settings(checkpoint_max_share=share)


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
    costs=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=200),
)
def test_checkpoints_take_at_most_the_share_unless_capped(interval, share, cap, costs):
    """Simulated: one partition, checkpoints as often as the cadence allows; over any
    run the time spent checkpointing is within the share (of the time between the
    first checkpoint's start and the last's end), or every gap was at the cap."""
    c = CheckpointCadence(interval, max_share=share, max_interval_s=cap)
    now = 0.0
    c.due(0, now)
    spent = 0.0
    capped = False
    first_start = None
    for cost in costs:
        gap = c.gap()
        capped = capped or gap >= c.max_interval_s
        now += gap + 1e-9  # (float sums: a hair past the due time)
        assert c.due(0, now)
        first_start = now if first_start is None else first_start
        c.done(0, started=now, ended=now + cost)
        spent += cost
        now += cost
        # The next one waits its gap from this one's end, which depends on its cost only.
        assert c.gap() >= min(cost / share, c.max_interval_s) - 1e-9
        assert c.gap() >= interval - 1e-9
    if len(costs) > 1 and not capped:
        # Each checkpoint after the first followed a gap ≥ the previous cost / share.
        assert spent - costs[-1] <= share * (now - costs[-1] - first_start) + 1e-6
