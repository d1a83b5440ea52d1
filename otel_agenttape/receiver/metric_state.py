"""Bounded, batch-fed metric state: label caps, counters and histograms updated from Arrow columns.

A batch of stored rows is aggregated with ``pyarrow`` group-bys (one per metric, over a handful of
label columns), so the Python work per batch grows with the number of label sets in it, not with
its rows. Cardinality is bounded twice: each label has a cap on distinct values (``LabelCap``; later
values become ``_other``), and each metric a cap on label sets (``series_cap``; later sets are folded
into one set whose labels are all ``_other``). Both are documented in ``docs/operations.md``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

OTHER = "_other"
MAX_LABEL_LENGTH = 128
DEFAULT_SERIES_CAP = 2000


class LabelCap:
    """Keeps the first ``limit`` distinct values of a label; every later value maps to ``_other``.

    Nulls and empty strings map to "" (Prometheus shows the label as absent)."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.seen: set[str] = set()
        self._lock = threading.Lock()

    def _map(self, value: str | None) -> str:
        if not value:
            return ""
        value = value[:MAX_LABEL_LENGTH]
        if value in self.seen:
            return value
        with self._lock:
            if len(self.seen) < self.limit:
                self.seen.add(value)
                return value
        return OTHER

    def apply(self, column: pa.Array | pa.ChunkedArray) -> pa.Array:
        """The capped label value of every row (a string array without nulls)."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if not pa.types.is_string(column.type):
            column = column.cast(pa.string())
        enc = column.dictionary_encode()
        mapped = pa.array([self._map(v) for v in enc.dictionary.to_pylist()], pa.string())
        return pc.fill_null(pc.take(mapped, enc.indices), "")


def _group_rows(cols: Sequence[pa.Array], extra: dict[str, pa.Array], aggs: list[tuple[str, str]]) -> list[tuple]:
    """Rows of (label values..., extra keys..., aggregates...) grouped by the labels and the extra keys
    that are not aggregated."""
    names = [f"l{i}" for i in range(len(cols))]
    t = pa.table(dict(zip(names, cols)) | extra)
    keys = names + [k for k in extra if k not in {a for a, _ in aggs}]
    g = t.group_by(keys, use_threads=False).aggregate(aggs)
    order = keys + [f"{a}_{fn}" for a, fn in aggs]
    return list(zip(*[g.column(c).to_pylist() for c in order]))


class _Family:
    def __init__(self, name: str, help_: str, labels: Sequence[str], series_cap: int) -> None:
        self.name = name
        self.help = help_
        self.labels = tuple(labels)
        self.series_cap = series_cap
        self._lock = threading.Lock()

    def _admit(self, key: tuple, state: dict) -> tuple:
        if key in state or len(state) < self.series_cap:
            return key
        return (OTHER,) * len(self.labels)


class CounterState(_Family):
    """A counter family: ``add(label_columns, values)`` adds each row's value (1 when ``values`` is None)."""

    def __init__(self, name: str, help_: str, labels: Sequence[str], series_cap: int = DEFAULT_SERIES_CAP) -> None:
        super().__init__(name, help_, labels, series_cap)
        self.state: dict[tuple, float] = {}

    def add(self, cols: Sequence[pa.Array], values: np.ndarray | None = None) -> None:
        if not len(cols[0]):
            return
        if values is None:
            rows = _group_rows(cols, {"one": pa.array(np.ones(len(cols[0]), dtype=np.int64))}, [("one", "sum")])
        else:
            rows = _group_rows(cols, {"v": pa.array(values)}, [("v", "sum")])
        with self._lock:
            for *key, total in rows:
                k = self._admit(tuple(key), self.state)
                self.state[k] = self.state.get(k, 0) + total

    def incr(self, value: float, *key: str) -> None:
        """Add ``value`` to one label set (for counts made outside a batch aggregation)."""
        with self._lock:
            k = self._admit(tuple(key), self.state)
            self.state[k] = self.state.get(k, 0) + value

    def get(self, **labels: str) -> float:
        key = tuple(labels.get(n, "") for n in self.labels)
        with self._lock:
            return self.state.get(key, 0)

    def family(self) -> Metric:
        base = self.name[: -len("_total")] if self.name.endswith("_total") else self.name
        fam = CounterMetricFamily(base, self.help, labels=self.labels)
        with self._lock:
            items = sorted(self.state.items())
        for key, value in items:
            fam.add_metric(list(key), value)
        return fam


class HistogramState(_Family):
    """A histogram family with fixed bucket bounds: per label set, counts per bucket and the sum."""

    def __init__(self, name: str, help_: str, labels: Sequence[str], bounds: Sequence[float],
                 series_cap: int = DEFAULT_SERIES_CAP) -> None:
        super().__init__(name, help_, labels, series_cap)
        self.bounds = np.asarray(bounds, dtype=np.float64)
        self._les = [floatToGoString(b) for b in bounds] + ["+Inf"]
        self.state: dict[tuple, list] = {}  # key -> [counts per bucket (last: +Inf), sum]

    def add(self, cols: Sequence[pa.Array], values: np.ndarray) -> None:
        if not len(values):
            return
        values = np.asarray(values, dtype=np.float64)
        bucket = np.searchsorted(self.bounds, values, side="left").astype(np.int32)
        rows = _group_rows(cols, {"b": pa.array(bucket), "v": pa.array(values)}, [("v", "sum"), ("v", "count")])
        nb = len(self.bounds) + 1
        with self._lock:
            for *key, b, total, count in rows:
                k = self._admit(tuple(key), self.state)
                st = self.state.get(k)
                if st is None:
                    st = self.state[k] = [np.zeros(nb, dtype=np.int64), 0.0]
                st[0][b] += count
                st[1] += total

    def count(self, **labels: str) -> int:
        key = tuple(labels.get(n, "") for n in self.labels)
        with self._lock:
            st = self.state.get(key)
            return int(st[0].sum()) if st is not None else 0

    def family(self) -> Metric:
        fam = HistogramMetricFamily(self.name, self.help, labels=self.labels)
        with self._lock:
            items = sorted((k, (v[0].copy(), v[1])) for k, v in self.state.items())
        for key, (counts, total) in items:
            cum = np.cumsum(counts).tolist()
            fam.add_metric(list(key), list(zip(self._les, cum)), total)
        return fam


def families(states: Iterable[CounterState | HistogramState]) -> Iterable[Metric]:
    for s in states:
        yield s.family()
