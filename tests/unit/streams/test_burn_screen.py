"""The short-window screen a minute's close runs over all the series that closed."""

from hypothesis import given
from hypothesis import strategies as st
from tailguard.streams import Counters
from tailguard.streams.burn import BurnPolicy, SloSpec, bad_and_total
from tailguard.streams.burn_windows import fires_each, short_windows_burn

from tests.unit.streams.test_burn import (
    ALL_WINDOWS,
    COMPOSITE,
    COMPOSITE_TTFT_HEAVY,
    ITL,
    SUCCESS,
    TTFT,
)

SPECS = [
    TTFT,
    ITL,
    SloSpec(name="e2e-p99", sli="e2e_ms", target=0.995, e2e_ms=9_000.0),
    SUCCESS,
    SloSpec(name="goodput", sli="goodput", target=0.98),
    COMPOSITE,
    COMPOSITE_TTFT_HEAVY,
]


@st.composite
def counters(draw: st.DrawFn) -> Counters:
    """A window's counters, as a fold counts them: most quiet, some burning."""
    ok = draw(st.integers(0, 3_000))
    errors = draw(st.integers(0, 200))
    cancelled = draw(st.integers(0, 50))
    share = st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.2, 1.0])

    def good(total: int) -> int:
        return total - round(total * draw(share))

    itl_total = draw(st.sampled_from([0, ok * 9]))
    return Counters(
        requests=ok + errors + cancelled,
        errors=errors,
        cancelled=cancelled,
        ttft_total=ok,
        ttft_good=good(ok),
        itl_total=itl_total,
        itl_good=good(itl_total),
        e2e_total=ok,
        e2e_good=good(ok),
        good_requests=good(ok),
    )


def short_burns_one_by_one(specs: list[SloSpec], policy: BurnPolicy, windows: dict) -> bool:
    """Whether a rule's short window burns for one of ``specs``, as
    :func:`fires_each` reckons a rate (composite: exactly, not bounded)."""
    for spec in specs:
        for rule in policy.rules:
            bad, total = bad_and_total(spec, windows[rule.short])
            allowed = round(1.0 - spec.target, 12)
            limit = policy.threshold(rule, spec) * (1.0 + 1e-9)
            if total > 0 and (bad / total) / allowed > limit:
                return True
    return False


@given(
    closes=st.lists(
        st.tuples(
            st.lists(st.sampled_from(SPECS), min_size=0, max_size=4, unique=True),
            st.lists(counters(), min_size=1, max_size=3),
            st.fixed_dictionaries({name: st.integers(0, 2) for name in ALL_WINDOWS}),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_a_close_the_screen_calls_quiet_has_no_slo_that_fires(closes) -> None:
    policy = BurnPolicy()
    rows = [
        (specs, {name: shared[i % len(shared)] for name, i in which.items()})
        for specs, shared, which in closes
    ]
    screened = short_windows_burn(policy, rows)
    assert len(screened) == len(rows)
    for (specs, windows), burns in zip(rows, screened, strict=True):
        if not burns:
            assert not any(fires_each(specs, policy, windows))
        exact = short_burns_one_by_one(specs, policy, windows)
        if not any(spec.sli == "composite" for spec in specs):
            assert burns == exact  # the same rates as fires_each's
        else:
            assert burns or not exact  # a composite's fraction is bounded from above


def test_a_burning_short_window_is_flagged_for_its_close_alone() -> None:
    policy = BurnPolicy()
    healthy = Counters(requests=1_000, ttft_total=1_000, ttft_good=1_000)
    burning = Counters(requests=1_000, ttft_total=1_000, ttft_good=800)
    quiet = {name: healthy for name in ALL_WINDOWS}
    hot = {**quiet, "5m": burning}

    assert short_windows_burn(policy, [([TTFT], quiet), ([TTFT], hot), ([SUCCESS], hot)]) == [
        False,
        True,
        False,  # its SLO reads errors, and there are none
    ]
    assert short_windows_burn(policy, []) == []


def test_a_close_without_slos_is_quiet_and_its_windows_are_not_read() -> None:
    class Unread(dict):
        def __getitem__(self, name: str) -> Counters:
            raise AssertionError(f"window {name} read")

    burning = Counters(requests=1_000, ttft_total=1_000, ttft_good=0)
    hot = {name: burning for name in ALL_WINDOWS}

    assert short_windows_burn(BurnPolicy(), [([], Unread()), ([TTFT], hot), ([], Unread())]) == [
        False,
        True,
        False,
    ]
