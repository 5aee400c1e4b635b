"""Which GPUs served which requests, as arrays: one row per (request, GPU) pair.

A request names the host that served it and the GPUs it ran on (``host``,
``gpu_ids``). Two consumers read them for a whole batch: the fold (the newest
time each series was served by each GPU, for the GPU join) and the capacity
agent (the GPUs that served a deployment between two load intervals, for the
scaling decision's evidence). Neither needs them request by request, so a
batch's hosts and GPU lists become one :class:`ServedGpus` once, and every
later step (reordering by deployment, a slice of requests, the GPUs of a range)
is a numpy step over its pairs.

A request counts only with both a host and at least one GPU, as the row-by-row
reading always did (``if host and gpus``).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import length_hint

import numpy as np

__all__ = ["NO_GPUS", "ServedGpus"]

_NO_ROWS = np.empty(0, dtype=np.int64)
_NO_ROWS.flags.writeable = False


@dataclass(frozen=True, slots=True, eq=False)
class ServedGpus:
    """The (request, host, GPU) pairs of some requests, by request (ascending)."""

    #: Each pair's request: its position among the requests these pairs describe.
    at: np.ndarray
    #: Each pair's host, an index into :attr:`hosts`.
    host: np.ndarray
    #: Each pair's GPU index.
    gpu: np.ndarray
    hosts: tuple[str, ...]

    @classmethod
    def of(
        cls, hosts: Sequence[str | None], gpu_ids: Sequence[Sequence[int] | None]
    ) -> "ServedGpus":
        """The pairs of requests given by their hosts and GPU lists (same length)."""
        n = len(hosts)
        names = tuple(h for h in dict.fromkeys(hosts) if h)  # in order of first request
        code: dict[str | None, int] = {None: -1, "": -1}
        code.update((h, i) for i, h in enumerate(names))
        host = np.fromiter(map(code.__getitem__, hosts), np.int64, n)
        per = np.fromiter(map(length_hint, gpu_ids), np.int64, n)  # None: 0
        gpu = np.fromiter(chain.from_iterable(filter(None, gpu_ids)), np.int64, int(per.sum()))
        at = np.repeat(np.arange(n, dtype=np.int64), per)
        keep = host[at] >= 0
        return cls(at[keep], host[at[keep]], gpu[keep], names)

    @classmethod
    def join(cls, parts: Sequence[tuple["ServedGpus", int]]) -> "ServedGpus":
        """Pairs of consecutive request ranges, each part with the position of its
        first request, as pairs of the whole (host indexes renumbered)."""
        if not parts:
            return NO_GPUS
        if len(parts) == 1 and parts[0][1] == 0:
            return parts[0][0]
        names: dict[str, int] = {}
        ats, hosts, gpus = [], [], []
        for part, start in parts:
            codes = np.fromiter(
                (names.setdefault(h, len(names)) for h in part.hosts), np.int64, len(part.hosts)
            )
            ats.append(part.at + start)
            hosts.append(codes[part.host] if codes.size else part.host)
            gpus.append(part.gpu)
        return cls(np.concatenate(ats), np.concatenate(hosts), np.concatenate(gpus), tuple(names))

    def __len__(self) -> int:
        return int(self.at.size)

    def reordered(self, order: np.ndarray) -> "ServedGpus":
        """The pairs of requests reordered: request ``order[k]`` becomes request ``k``
        (``order`` a permutation); each request's pairs keep their order."""
        if not self.at.size:
            return self
        place = np.empty(order.size, dtype=np.int64)
        place[order] = np.arange(order.size, dtype=np.int64)
        at = place[self.at]
        by = np.argsort(at, kind="stable")
        return ServedGpus(at[by], self.host[by], self.gpu[by], self.hosts)

    def slice(self, lo: int, hi: int) -> "ServedGpus":
        """The pairs of requests ``[lo, hi)``, positions counted from ``lo``."""
        a, b = np.searchsorted(self.at, (lo, hi)).tolist()
        if a == 0 and b == self.at.size and lo == 0:
            return self
        return ServedGpus(self.at[a:b] - lo, self.host[a:b], self.gpu[a:b], self.hosts)

    def gpus(self, lo: int, hi: int) -> set[tuple[str, int]]:
        """The ``(host, GPU)`` pairs that served requests ``[lo, hi)``."""
        a, b = np.searchsorted(self.at, (lo, hi)).tolist()
        if a >= b:
            return set()
        host, gpu, hosts = self.host[a:b], self.gpu[a:b], self.hosts
        width = int(gpu.max()) + 1
        if width * len(hosts) >= 2**62:  # GPU indexes too large to pack with the host
            return set(zip(map(hosts.__getitem__, host.tolist()), gpu.tolist(), strict=True))
        return {(hosts[c // width], c % width) for c in np.unique(host * width + gpu).tolist()}

    def per_request(self, n: int) -> tuple[list[str | None], list[list[int] | None]]:
        """Each of ``n`` requests' host and GPU list (None where it has no pair)."""
        host: list[str | None] = [None] * n
        gpu_ids: list[list[int] | None] = [None] * n
        names = self.hosts
        for at, h, g in zip(self.at.tolist(), self.host.tolist(), self.gpu.tolist(), strict=True):
            listed = gpu_ids[at]
            if listed is None:
                gpu_ids[at] = [g]
                host[at] = names[h]
            else:
                listed.append(g)
        return host, gpu_ids


#: No request names a host and GPUs.
NO_GPUS = ServedGpus(_NO_ROWS, _NO_ROWS, _NO_ROWS, ())
