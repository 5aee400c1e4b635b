"""The requests of one ingest batch, as columns, whatever form their messages came in.

A message of ``tailguard.inference`` is rows (a JSON array of request objects,
decoded into ``InferenceEvent`` records) or columns
(:mod:`tailguard.schemas.columnar`, decoded into one list per field). The
ingest agent reads a batch of both through one :class:`RequestBatch`:

- every request's series as an index into the batch's series (:attr:`gid`,
  :attr:`series`) and its input position (:meth:`positions`; the columns'
  ``part`` and ``offset``);
- the columns the windows fold (:meth:`columns`) and the GPUs that served
  each series (:meth:`served`);
- for the side consumers: the capacity rows of each deployment
  (:meth:`capacity_groups`), and request records (:meth:`events`) only for
  the few that name an experiment or a prompt version.

Columns are gathered message by message: the numeric ones from the arrays a
columnar message was screened with (concatenated once per batch), the others
into flat lists (a C-level ``extend`` for a columnar message, one pass per
field for rows), made arrays once per batch. A columnar message never becomes
request objects, except its rare requests that carry a cache, batch,
flow-control or stage breakdown (their cause flags and stage columns are read
from records).
"""

from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain, pairwise, repeat
from typing import Any

import numpy as np
from tailguard.agents.capacity_columns import CapacityRows
from tailguard.agents.capacity_columns import Group as CapacityGroup
from tailguard.agents.internal import served_by
from tailguard.schemas import InferenceEvent
from tailguard.schemas.columnar import ColumnsDecoded, Numbers, events_of, without_numbers
from tailguard.streams.columns import (
    STATUS_CODES,
    Columns,
    event_hashes,
    prompt_column,
    trace_column,
)
from tailguard.streams.input_marks import Run
from tailguard.streams.served import NO_GPUS, ServedGpus

__all__ = ["RequestBatch"]

Series = tuple[str, str, str, str]
_OTHER_STATUS = 4
_NO_GIDS = np.empty(0, dtype=np.int64)
#: Fields whose requests are read from records to build the cause flags and stages.
_RARE = ("cache", "batch", "flow_control", "stages_ms")


@dataclass(slots=True)
class _Message:
    """One message's valid requests: records (rows) or a decoded columnar message."""

    partition: int
    offset: int
    rows: list[InferenceEvent] | None
    columns: ColumnsDecoded | None
    kept: list[int] | None  # the valid requests of ``columns`` (None: all)
    #: The numeric columns of ``columns`` as arrays, every request (None for rows).
    numbers: Numbers | None = None

    def __len__(self) -> int:
        return len(self.rows) if self.rows is not None else len(self.columns or ())

    def column(self, name: str) -> list[Any] | None:
        """A field of the valid requests of a columnar message (None: no request has it)."""
        assert self.columns is not None
        values = getattr(self.columns.message.requests, name)
        if values is None or self.kept is None:
            return values  # type: ignore[no-any-return]
        return [values[i] for i in self.kept]


class RequestBatch:
    """The valid requests of a batch of input messages, in input order."""

    def __init__(self) -> None:
        self._messages: list[_Message] = []
        self._index: dict[Series, int] = {}
        #: Each message's requests as indexes into :attr:`series`, one array a message.
        self._gids: list[np.ndarray] = []
        self._n = 0
        self._built: Columns | None = None
        self._gid_array: np.ndarray | None = None
        self._gpus: ServedGpus | None = None

    # -- building ------------------------------------------------------------
    def add_rows(self, partition: int, offset: int, events: list[InferenceEvent]) -> None:
        index = self._index
        gid = [
            index.setdefault((ev.service, ev.model, ev.variant, ev.tenant), len(index))
            for ev in events
        ]
        self._append(np.array(gid, dtype=np.int64))
        self._messages.append(_Message(partition, offset, events, None, None))

    def add_columns(self, partition: int, offset: int, decoded: ColumnsDecoded) -> None:
        message = decoded.message
        kept = None if decoded.keep is None else np.flatnonzero(decoded.keep).tolist()
        sid = np.array(message.requests.series, dtype=np.int64)
        if kept is not None:
            sid = sid[kept]
        # The batch's series in order of first use (a series no kept request names
        # is left out), each looked up once per message; then every request's
        # index through one table lookup.
        index, names = self._index, message.series  # tuples, as decoded
        used, first = np.unique(sid, return_index=True)
        used = used[np.argsort(first, kind="stable")]
        lut = np.zeros(len(names), dtype=np.int64)
        lut[used] = [index.setdefault(names[s], len(index)) for s in used.tolist()]
        self._append(lut[sid])
        # The screen's arrays (a message decoded otherwise, taken apart, makes its
        # own); the lists of those columns are let go: a batch keeps arrays only.
        lean = without_numbers(decoded)
        self._messages.append(_Message(partition, offset, None, lean, kept, lean.numbers))

    def _append(self, gid: np.ndarray) -> None:
        self._gids.append(gid)
        self._n += gid.size
        self._built = None
        self._gpus = None

    # -- what every request has ----------------------------------------------
    def __len__(self) -> int:
        return self._n

    @property
    def series(self) -> list[Series]:
        """The batch's series, first named first."""
        return list(self._index)

    @property
    def gid(self) -> np.ndarray:
        """Each request's index into :attr:`series` (read once every message is added)."""
        if self._gid_array is None or self._gid_array.size != self._n:
            self._gid_array = np.concatenate(self._gids) if self._gids else _NO_GIDS
        return self._gid_array

    def positions(self, rows: list[int]) -> list[tuple[int, int]]:
        part, offset = self.columns().part, self.columns().offset
        return [(int(part[i]), int(offset[i])) for i in rows]

    def _absent(self, *names: str) -> bool:
        """Whether no request of the batch can have any of the fields ``names``:
        every message is columnar and leaves those columns out (as most do)."""
        for m in self._messages:
            if m.columns is None:
                return False
            requests = m.columns.message.requests
            if any(getattr(requests, name) is not None for name in names):
                return False
        return True

    def _flat(self, name: str, from_row: Any, default: Any = None) -> list[Any]:
        """One field of every request, in order (``default`` where a request has none)."""
        out: list[Any] = []
        for m in self._messages:
            if m.rows is not None:
                out.extend(map(from_row, m.rows))
            else:
                values = m.column(name)
                out.extend(repeat(default, len(m)) if values is None else values)
        return out

    def columns(self) -> Columns:
        """The columns the windows fold (what ``Columns.from_events`` makes of records)."""
        if self._built is not None:
            return self._built
        n = len(self)
        counts = [len(m) for m in self._messages]
        part = np.repeat([m.partition for m in self._messages], counts).astype(np.int64)
        offset = np.repeat([m.offset for m in self._messages], counts).astype(np.int64)
        gaps, lengths = self._gaps()
        ttft = self._numbers(lambda num: num.ttft_ms, lambda ev: ev.ttft_ms, np.float64)
        tokens = self._numbers(
            lambda num: num.output_tokens, lambda ev: ev.output_tokens, np.float64
        )
        status = self._flat("status", lambda ev: ev.status)
        cols = Columns(
            ts=self._numbers(lambda num: num.ts_ms, lambda ev: ev.ts_ms, np.int64),
            status=np.fromiter(map(STATUS_CODES.get, status, repeat(_OTHER_STATUS)), np.uint8, n),
            e2e=self._numbers(lambda num: num.e2e_ms, lambda ev: ev.e2e_ms, np.float64),
            ttft=ttft,
            tokens=np.where(np.isnan(tokens), -1, tokens).astype(np.int64),
            warmup=np.array(self._flat("warmup", lambda ev: ev.warmup, False), np.bool_),
            itl=gaps,
            itl_len=lengths,
            ids=event_hashes(self._flat("event_id", lambda ev: ev.event_id)),
            traces=trace_column(self._flat("trace_id", lambda ev: ev.trace_id)),
            part=part,
            offset=offset,
        )
        if self._absent("prompt_version"):
            cols.prompt_names, cols.prompt = [], np.full(n, -1, dtype=np.int32)
        else:
            cols.prompt_names, cols.prompt = prompt_column(
                self._flat("prompt_version", lambda ev: ev.prompt_version)
            )
        rare = self._rare_rows()
        if rare:
            sub = Columns.from_events(self.events(rare))
            cols.factors[rare] = sub.factors
            cols.stage_names = sub.stage_names
            cols.stages = np.full((n, len(sub.stage_names)), np.nan)
            cols.stages[rare] = sub.stages
        self._built = cols
        return cols

    def _numbers(
        self, pick: Callable[[Numbers], np.ndarray], from_row: Any, dtype: Any
    ) -> np.ndarray:
        """A numeric field of every request, in order: the arrays each columnar
        message was screened with, concatenated (one pass over the records for
        rows); None becomes NaN."""
        parts: list[np.ndarray] = []
        for m in self._messages:
            if m.rows is not None:
                parts.append(np.array([from_row(ev) for ev in m.rows], dtype=dtype))
            else:
                assert m.numbers is not None
                values = pick(m.numbers)
                parts.append(values if m.kept is None else values[m.kept])
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

    def _gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """Every request's ITL gaps, concatenated in order, and how many each has."""
        gaps: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        for m in self._messages:
            if m.rows is not None:
                lists = [ev.itl_ms for ev in m.rows]
                lengths.append(np.fromiter(map(len, lists), np.int64, len(lists)))
                gaps.append(np.fromiter(chain.from_iterable(lists), np.float64))
                continue
            num = m.numbers
            assert num is not None
            if m.kept is None:
                lengths.append(num.itl_len)
                gaps.append(num.itl_ms)
                continue
            kept = np.asarray(m.kept, dtype=np.int64)
            lens = num.itl_len[kept]
            firsts = (np.cumsum(num.itl_len) - num.itl_len)[kept]
            lengths.append(lens)
            gaps.append(
                num.itl_ms[
                    np.repeat(firsts - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
                ]
            )
        if not gaps:
            return np.empty(0, dtype=np.float64), np.empty(0, dtype=np.int64)
        return np.concatenate(gaps), np.concatenate(lengths)

    def _rare_rows(self) -> list[int]:
        """Requests carrying a cache, batch, flow-control or stage breakdown."""
        out: list[int] = []
        at = 0
        for m in self._messages:
            if m.rows is not None:
                out.extend(
                    at + i
                    for i, ev in enumerate(m.rows)
                    if ev.cache or ev.batch or ev.flow_control or ev.stages_ms
                )
            else:
                present = [v for name in _RARE if (v := m.column(name)) is not None]
                if present:
                    out.extend(
                        at + i for i, values in enumerate(zip(*present, strict=True)) if any(values)
                    )
            at += len(m)
        return out

    def gpus(self) -> ServedGpus:
        """The GPUs that served each request (read once a batch: the fold and the
        capacity agent both read them)."""
        if self._gpus is None:
            if self._absent("host") or self._absent("gpu_ids"):
                self._gpus = NO_GPUS
            else:
                self._gpus = ServedGpus.of(
                    self._flat("host", lambda ev: ev.host),
                    self._flat("gpu_ids", lambda ev: ev.gpu_ids),
                )
        return self._gpus

    def served(self) -> dict[tuple[int, str, int], int]:
        """The newest request time per ``(series index, host, GPU)`` that served it."""
        return served_by(self.gid, self.gpus(), self.columns().ts)

    # -- the side consumers ----------------------------------------------------
    def events(self, rows: list[int]) -> list[InferenceEvent]:
        """Records of the requests at ``rows`` (sorted), built only for a columnar message."""
        out: list[InferenceEvent] = []
        at = 0
        wanted = iter(rows)
        i = next(wanted, None)
        for m in self._messages:
            end = at + len(m)
            local: list[int] = []
            while i is not None and i < end:
                local.append(i - at)
                i = next(wanted, None)
            if local:
                if m.rows is not None:
                    out.extend(m.rows[j] for j in local)
                else:
                    assert m.columns is not None
                    picked = local if m.kept is None else [m.kept[j] for j in local]
                    out.extend(events_of(m.columns, picked))
            at = end
        return out

    def named_rows(self) -> list[int]:
        """Requests (not warm-up) that name an experiment or a prompt version."""
        if self._absent("experiment", "experiments", "prompt_version"):
            return []
        warm = self.columns().warmup
        experiment = self._flat("experiment", lambda ev: ev.experiment)
        tags = self._flat("experiments", lambda ev: ev.experiments)
        prompt = self._flat("prompt_version", lambda ev: ev.prompt_version)
        return [
            i
            for i, (e, t, p) in enumerate(zip(experiment, tags, prompt, strict=True))
            if (e or t or p) and not warm[i]
        ]

    def capacity_groups(self) -> list[CapacityGroup]:
        """Each deployment's requests as the capacity agent reads them, in input order,
        with their input positions as runs; deployments in order of first request."""
        cols = self.columns()
        series = self.series
        deployments: dict[tuple[str, str], int] = {}
        of_series = np.fromiter(
            (deployments.setdefault((s[0], s[1]), len(deployments)) for s in series),
            np.int64,
            len(series),
        )
        dep = of_series[self.gid]
        order = np.argsort(dep, kind="stable")
        bounds = np.searchsorted(dep[order], np.arange(len(deployments) + 1)).tolist()
        rows = CapacityRows(
            cols.ts[order],
            cols.e2e[order],
            cols.ttft[order],
            np.maximum(cols.tokens, 0)[order],
            cols.status[order] == STATUS_CODES["ok"],
            cols.warmup[order],
            self._ordered("instance", lambda ev: ev.instance, order),
            self.gpus().reordered(order),
            self._ordered("expert_ids", lambda ev: ev.expert_ids, order),
            None,
            self._ordered("rag_index", lambda ev: ev.rag_index, order),
        )
        if not self._absent("rag_top1_similarity"):
            similarity = self._flat("rag_top1_similarity", lambda ev: ev.rag_top1_similarity)
            if any(v is not None for v in similarity):
                rows.similarity = np.array(similarity, dtype=np.float64)[order]
        runs = _runs(cols.part[order], cols.offset[order], bounds)
        return [
            (service, model, rows[bounds[d] : bounds[d + 1]], runs[d])
            for (service, model), d in deployments.items()
        ]

    def _ordered(self, name: str, from_row: Any, order: np.ndarray) -> list[Any] | None:
        """A field of every request, in ``order`` (None when no request has it)."""
        if self._absent(name):
            return None
        values = self._flat(name, from_row)
        if not any(values):
            return None
        return list(map(values.__getitem__, order.tolist()))


def _runs(part: np.ndarray, offset: np.ndarray, bounds: list[int]) -> list[list[Run]]:
    """Per group ``[bounds[d], bounds[d + 1])``, its requests' input positions as runs
    (consecutive requests of one input message)."""
    n = len(part)
    cut = np.zeros(n + 1, dtype=np.bool_)
    cut[0] = cut[n] = True
    cut[1:n] = (part[1:] != part[:-1]) | (offset[1:] != offset[:-1])
    cut[bounds] = True
    edges = np.flatnonzero(cut)
    lo = edges[:-1]
    runs = list(zip(part[lo].tolist(), offset[lo].tolist(), repeat(0), np.diff(edges).tolist()))
    # Runs never cross a group's bounds (cut there): each group's are consecutive.
    first = np.searchsorted(lo, bounds).tolist()
    return [runs[a:b] for a, b in pairwise(first)]
