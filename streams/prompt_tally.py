"""Requests per prompt version in a bucket: how many, how many bad, the slowest bad ones.

A bucket names at most :data:`MAX_PROMPTS` versions; the requests of further
versions are counted under :data:`OTHER_PROMPT`. Versions are added in name
order, so a bucket does not depend on the order its requests came in (up to
that bound).
"""

from dataclasses import dataclass, field

import numpy as np
from tailguard.streams.columns import Columns

__all__ = [
    "MAX_PROMPTS",
    "OTHER_PROMPT",
    "PROMPT_EXEMPLARS",
    "PromptTally",
    "prompt_rows",
    "top_candidates",
]

#: Exemplar traces (slowest bad requests) a bucket keeps per prompt version.
PROMPT_EXEMPLARS = 3
#: Distinct prompt versions a bucket names; requests of further versions are
#: counted under OTHER_PROMPT (which versions those are then depends on the
#: order they came in — the only order dependence of a bucket, and only past
#: this many versions of one series in one minute).
MAX_PROMPTS = 64
OTHER_PROMPT = "~other"


def top_candidates(groups: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """Mask of the rows that can be among the ``k`` largest ``values`` of their group.

    Ties with the k-th value are all kept, so choosing the final ``k`` from the
    candidates by ``(value, name)`` gives the same answer whatever the input order.
    """
    order = np.lexsort((-values, groups))
    g, v = groups[order], values[order]
    start = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1]
    sizes = np.diff(np.r_[start, g.size])
    kth = v[np.minimum(start + k - 1, start + sizes - 1)]
    out = np.zeros(groups.size, dtype=np.bool_)
    out[order[v >= np.repeat(kth, sizes)]] = True
    return out


@dataclass(slots=True)
class PromptTally:
    """Requests of one prompt version in a bucket: how many, how many bad, the slowest bad.

    *Bad* is an error or an ok request violating a latency SLO (the requests
    a breach is about); ``exemplars`` are ``(e2e_ms, trace_id)`` of the
    slowest bad requests that had a trace, slowest first.
    """

    requests: int = 0
    bad: int = 0
    exemplars: list[tuple[float, str]] = field(default_factory=list)


def prompt_rows(
    cols: Columns, rows: np.ndarray, groups: np.ndarray, bad: np.ndarray
) -> dict[int, list[tuple[str, int, int, list[tuple[float, str]]]]]:
    """Per group (a bucket): ``(prompt version, requests, bad, exemplar candidates)``.

    ``rows`` are the (non-warm-up) requests, ``groups`` their group and ``bad``
    a mask over them. Versions come in name order, so adding them to a bucket
    does not depend on the input order (see :data:`MAX_PROMPTS`).
    """
    prompt = cols.prompt[rows]
    named = prompt >= 0
    if not named.any():
        return {}
    size = len(cols.prompt_names)
    key = groups.astype(np.int64) * size + prompt
    keys, inverse = np.unique(key[named], return_inverse=True)
    n = np.bincount(inverse, minlength=keys.size)
    n_bad = np.bincount(inverse[bad[named]], minlength=keys.size)
    found: dict[int, list[tuple[float, str]]] = {}
    traced = named & bad & cols.has_trace[rows]
    if traced.any():
        t_key, t_rows = key[traced], rows[traced]
        t_e2e = cols.e2e[t_rows]
        keep = top_candidates(t_key, t_e2e, PROMPT_EXEMPLARS)
        for k, e, trace in zip(
            t_key[keep].tolist(),
            t_e2e[keep].tolist(),
            cols.traces[t_rows[keep]].tolist(),
            strict=True,
        ):
            found.setdefault(k, []).append((e, trace))
    names = cols.prompt_names
    out: dict[int, list[tuple[str, int, int, list[tuple[float, str]]]]] = {}
    for k, count, count_bad in zip(keys.tolist(), n.tolist(), n_bad.tolist(), strict=True):
        g, p = divmod(k, size)
        out.setdefault(g, []).append((names[p], count, count_bad, found.get(k, [])))
    for versions in out.values():
        versions.sort(key=lambda row: row[0])
    return out
