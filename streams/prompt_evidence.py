"""Which prompt versions (and prompt groups) the bad requests came from, with exemplars.

Chapter 4 of the article: most LLM releases are prompt changes, so a breach or
a release decision must say *which prompts* its bad requests used, and give
trace ids to open. Buckets count requests per ``prompt_version``
(:class:`~tailguard.streams.prompt_tally.PromptTally`: requests, bad requests, the
slowest bad ones that had a trace); this module ranks them::

    window bucket ── prompts {version: (requests, bad, exemplars)}
            │
            ▼ rank by bad requests; keep versions until they hold ``cover`` of the bad
    [{prompt_version, prompt_group, requests, bad, bad_share, bad_rate, lift, exemplars}]
            │
            ▼ the same, summed per prompt group (group of each version: the prompt registry)
    [{prompt_group, versions, requests, bad, bad_share, bad_rate, lift, exemplars}]

*Bad* is an error or an ok request that violates a latency SLO. ``bad_share``
is the version's part of the window's bad requests (those without a prompt
version count in the total, so shares need not add up to 1); ``bad_rate`` is
bad / requests of the version and ``lift`` that rate over the rate of the
whole window — a version with a high share but lift ≈ 1 merely carries most
of the traffic, one with lift ≫ 1 is where the trouble is.
"""

import heapq
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = ["TOP_PROMPTS", "rank_prompts"]

#: At most this many versions (and groups) are listed.
TOP_PROMPTS = 5
#: Versions are listed until they hold this share of the bad requests.
COVER = 0.8
#: Exemplar trace ids listed per version or group.
EXEMPLARS = 3


class Tally(Protocol):
    requests: int
    bad: int
    exemplars: list[tuple[float, str]]


def _row(requests: int, bad: int, total_bad: int, rate: float) -> dict[str, Any]:
    own = bad / requests if requests else 0.0
    return {
        "requests": requests,
        "bad": bad,
        "bad_share": round(bad / total_bad, 4) if total_bad else 0.0,
        "bad_rate": round(own, 4),
        "lift": round(own / rate, 3) if rate > 0 else None,
    }


def _top(rows: list[dict[str, Any]], total_bad: int) -> list[dict[str, Any]]:
    rows.sort(
        key=lambda r: (-r["bad"], -r["requests"], r.get("prompt_version") or r["prompt_group"])
    )
    out, held = [], 0
    for row in rows:
        if row["bad"] == 0 or len(out) >= TOP_PROMPTS:
            break
        out.append(row)
        held += row["bad"]
        if total_bad and held >= COVER * total_bad:
            break
    return out


def rank_prompts(
    prompts: Mapping[str, Tally],
    *,
    total_requests: int | None = None,
    total_bad: int | None = None,
    group_of: Callable[[str], str | None] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(versions, groups)`` holding most of the bad requests, worst first.

    ``total_requests``/``total_bad`` are the window's (all requests, named or
    not); by default the sums over ``prompts``. ``group_of`` maps a version to
    its prompt group (``None``: not registered — the version is then its own
    group, marked ``"registered": False``).
    """
    requests = sum(t.requests for t in prompts.values())
    bad = sum(t.bad for t in prompts.values())
    total_requests = requests if total_requests is None else max(total_requests, requests)
    total_bad = bad if total_bad is None else max(total_bad, bad)
    rate = total_bad / total_requests if total_requests else 0.0
    versions: list[dict[str, Any]] = []
    groups: dict[str, tuple[list[str], list[Tally], bool]] = {}
    for name in sorted(prompts):
        tally = prompts[name]
        group = group_of(name) if group_of is not None else None
        key = group if group is not None else name
        members, tallies, _ = groups.setdefault(key, ([], [], group is not None))
        members.append(name)
        tallies.append(tally)
        versions.append(
            {
                "prompt_version": name,
                "prompt_group": group,
                **_row(tally.requests, tally.bad, total_bad, rate),
                "exemplars": [trace for _, trace in tally.exemplars[:EXEMPLARS]],
            }
        )
    group_rows = []
    for key, (members, tallies, registered) in groups.items():
        candidates = [e for t in tallies for e in t.exemplars]
        group_rows.append(
            {
                "prompt_group": key,
                "registered": registered,
                "versions": members,
                **_row(
                    sum(t.requests for t in tallies), sum(t.bad for t in tallies), total_bad, rate
                ),
                "exemplars": [trace for _, trace in heapq.nlargest(EXEMPLARS, candidates)],
            }
        )
    return _top(versions, total_bad), _top(group_rows, total_bad)
