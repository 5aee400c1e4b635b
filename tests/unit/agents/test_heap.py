"""Handing a processed batch's free heap back: at most once a second, never an error."""

import ctypes

import pytest
from tailguard.agents import heap


def test_a_trim_runs_at_most_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(heap, "_libc", [calls.append])
    monkeypatch.setattr(heap, "_last", [0.0])
    assert heap.release_free_heap(now=100.0)
    assert not heap.release_free_heap(now=100.0 + heap.MIN_INTERVAL_S / 2)
    assert heap.release_free_heap(now=100.0 + heap.MIN_INTERVAL_S)
    assert calls == [0, 0]


def test_without_glibc_nothing_is_trimmed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_libc", [None])
    monkeypatch.setattr(heap, "_last", [0.0])
    assert not heap.release_free_heap(now=1e9)


def test_on_this_machine_the_real_trim_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        ctypes.CDLL(None).malloc_trim  # noqa: B018
    except AttributeError:
        pytest.skip("not glibc")
    monkeypatch.setattr(heap, "_libc", [])
    monkeypatch.setattr(heap, "_last", [0.0])
    assert heap.release_free_heap(now=1e9)
