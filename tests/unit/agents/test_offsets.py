"""InOrderGuard: each partition's records reach a stream in offset order."""

import pytest
from tailguard.agents.offsets import InOrderGuard, Verdict, VerdictKind

D, G, X, S, H = (
    VerdictKind.DELIVER,
    VerdictKind.DELIVER_AFTER_GAP,
    VerdictKind.DROP,
    VerdictKind.SEEK,
    VerdictKind.HOLD,
)


def kinds(guard: InOrderGuard, tp: str, offsets: list[int]) -> list[VerdictKind]:
    return [guard.admit(tp, o).kind for o in offsets]


def test_a_fresh_partition_starts_anywhere_then_goes_on_in_order() -> None:
    guard = InOrderGuard()
    assert kinds(guard, "a", [40, 41, 42]) == [D, D, D]
    assert kinds(guard, "b", [0, 1]) == [D, D]


def test_older_records_are_dropped() -> None:
    guard = InOrderGuard()
    guard.sought("a", 5)
    assert kinds(guard, "a", [3, 4, 5, 5, 6, 2]) == [X, X, D, X, D, X]
    assert guard.dropped == 4


def test_a_hole_asks_for_a_seek_back_and_the_same_hole_again_is_a_gap() -> None:
    guard = InOrderGuard()
    guard.sought("a", 10)
    assert guard.admit("a", 10).kind is D
    assert guard.admit("a", 13) == Verdict(S, seek_to=11)
    guard.sought("a", 11)  # the consumer seeks back
    assert guard.admit("a", 13) == Verdict(G, gap_from=11, gap_to=12)
    assert kinds(guard, "a", [14, 12]) == [D, X]
    assert (guard.holes, guard.gaps) == (1, 1)


def test_a_different_record_after_the_seek_back_is_not_taken_for_a_gap() -> None:
    guard = InOrderGuard()
    guard.sought("a", 10)
    assert guard.admit("a", 15).kind is S
    guard.sought("a", 10)
    assert guard.admit("a", 17).kind is S  # a stale record, not the same hole
    guard.sought("a", 10)
    assert kinds(guard, "a", [10, 11]) == [D, D]


def test_records_are_held_while_the_seek_target_is_looked_up() -> None:
    guard = InOrderGuard()
    guard.sought("a", 100)
    guard.sought("b", 7)
    guard.resync(["a", "b"])
    assert kinds(guard, "a", [120, 77]) == [H, H]
    assert kinds(guard, "c", [3]) == [D]  # not being sought
    again = guard.resynced({"a": 77, "b": 7})
    assert again == ["a"]  # it discarded records: seek it again
    assert kinds(guard, "a", [77, 78]) == [D, D]
    assert kinds(guard, "b", [7]) == [D]


def test_an_unknown_target_accepts_the_first_record() -> None:
    guard = InOrderGuard()
    guard.sought("a", 9)
    guard.resynced({"a": None})
    assert kinds(guard, "a", [0, 1]) == [D, D]


def test_forgotten_partitions_start_fresh() -> None:
    guard = InOrderGuard()
    guard.sought("a", 9)
    guard.resync(["a"])
    guard.forget(["a"])
    assert kinds(guard, "a", [50]) == [D]


@pytest.mark.parametrize("seed", range(20))
def test_any_interleaving_of_stale_and_fresh_fetches_delivers_the_log_in_order(
    seed: int,
) -> None:
    """Simulated fetcher: after each seek, stale records of the old position keep
    coming for a while, mixed in; whatever reaches the stream is the log in order."""
    import random

    rng = random.Random(seed)
    log = [o for o in range(200) if rng.random() > 0.05]  # some offsets hold no record
    guard = InOrderGuard()
    position = 0  # index into log of the next fresh record
    stale: list[int] = []
    delivered: list[int] = []
    seeks = rebalances = 0
    while position < len(log) and seeks < 1_000:
        if stale and rng.random() < 0.5:
            offset = stale.pop(0)
        else:
            offset = log[position]
            position += 1
        verdict = guard.admit("p", offset)
        if verdict.kind in (D, G):
            delivered.append(offset)
        elif verdict.kind is S:
            seeks += 1
            # what the fetcher had read ahead stays in flight; the log is read again
            stale = log[position : position + rng.randint(0, 5)]
            position = next(i for i, o in enumerate(log) if o >= verdict.seek_to)
            guard.sought("p", verdict.seek_to)
        if rebalances < 10 and rng.random() < 0.03:  # a rebalance: back to a "committed" offset
            rebalances += 1
            stale = log[position : position + rng.randint(0, 8)]
            committed = delivered[-1] + 1 if delivered and rng.random() < 0.5 else 0
            position = next((i for i, o in enumerate(log) if o >= committed), len(log))
            guard.sought("p", committed)
    assert seeks < 1_000
    # first deliveries are in order and complete: the log, with replays only of a prefix
    firsts: list[int] = []
    for o in delivered:
        if not firsts or o > firsts[-1]:
            firsts.append(o)
        else:
            assert o in firsts, "a replay must be of something delivered before"
    assert firsts == log[: len(firsts)]
    assert firsts[-1] == log[-1]
