"""The GPUs that served requests, as pairs: every step gives what the request lists give."""

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams.served import NO_GPUS, ServedGpus

Requests = tuple[list[str | None], list[list[int] | None]]


@st.composite
def requests(draw: Any, max_size: int = 12) -> Requests:
    """Hosts and GPU lists as a batch has them: absent, empty, repeated, huge."""
    n = draw(st.integers(0, max_size))
    host = st.one_of(st.none(), st.just(""), st.sampled_from(["h0", "h1", "h2"]))
    gpu = st.one_of(st.integers(0, 9), st.integers(2**40, 2**53))
    ids = st.one_of(st.none(), st.lists(gpu, max_size=3))
    return [draw(host) for _ in range(n)], [draw(ids) for _ in range(n)]


def pairs(served: ServedGpus) -> list[tuple[int, str, int]]:
    return [
        (a, served.hosts[h], g)
        for a, h, g in zip(
            served.at.tolist(), served.host.tolist(), served.gpu.tolist(), strict=True
        )
    ]


def expected(
    hosts: list[str | None], gpu_ids: list[list[int] | None]
) -> list[tuple[int, str, int]]:
    """Request by request: a request counts with a host and GPUs."""
    return [
        (i, h, g)
        for i, (h, ids) in enumerate(zip(hosts, gpu_ids, strict=True))
        if h and ids
        for g in ids
    ]


@given(requests())
def test_pairs_are_each_requests_host_and_gpus_in_order(reqs: Requests) -> None:
    served = ServedGpus.of(*reqs)
    assert pairs(served) == expected(*reqs)
    assert len(served) == len(expected(*reqs))


@given(requests(), st.randoms(use_true_random=False))
def test_reordered_is_the_pairs_of_the_reordered_requests(reqs: Requests, rnd: Any) -> None:
    hosts, gpu_ids = reqs
    order = list(range(len(hosts)))
    rnd.shuffle(order)
    moved = ServedGpus.of(*reqs).reordered(np.array(order, dtype=np.int64))
    assert pairs(moved) == expected([hosts[i] for i in order], [gpu_ids[i] for i in order])


@given(requests(), st.integers(0, 14), st.integers(0, 14))
def test_slice_and_gpus_of_a_range(reqs: Requests, lo: int, hi: int) -> None:
    hosts, gpu_ids = reqs
    served = ServedGpus.of(*reqs)
    assert pairs(served.slice(lo, hi)) == expected(hosts[lo:hi], gpu_ids[lo:hi])
    assert served.gpus(lo, hi) == {(h, g) for _, h, g in expected(hosts[lo:hi], gpu_ids[lo:hi])}


@given(st.lists(requests(max_size=5), max_size=4))
def test_joined_parts_are_the_pairs_of_all_requests(parts: list[Requests]) -> None:
    starts = np.cumsum([0, *(len(h) for h, _ in parts)]).tolist()
    joined = ServedGpus.join(
        [(ServedGpus.of(*p), start) for p, start in zip(parts, starts, strict=False)]
    )
    hosts = [h for p in parts for h in p[0]]
    gpu_ids = [g for p in parts for g in p[1]]
    assert pairs(joined) == expected(hosts, gpu_ids)


@settings(max_examples=50)
@given(requests())
def test_per_request_lists_give_the_same_pairs_back(reqs: Requests) -> None:
    served = ServedGpus.of(*reqs)
    hosts, gpu_ids = served.per_request(len(reqs[0]))
    assert pairs(ServedGpus.of(hosts, gpu_ids)) == pairs(served)


def test_no_gpus_serve_nothing() -> None:
    assert not NO_GPUS and NO_GPUS.gpus(0, 10) == set()
    assert NO_GPUS.per_request(2) == ([None, None], [None, None])
