"""Bounded, batch-fed metric state: label caps, counters and histograms updated from whole columns.

A batch of stored rows is aggregated with numpy: each label column becomes small integer codes, the
codes of a metric's labels (and the bucket index of a histogram) are folded into one integer key per
row, and ``np.unique`` + ``np.bincount`` give the count and sum of every label set in one pass, so
the Python work per batch grows with the number of label sets in it, not with its rows.

Cardinality is bounded twice: each label keeps its first ``limit`` distinct values (``LabelCap``; later
values become ``_other``), and each metric keeps at most ``series_cap`` label sets (later sets are
folded into one whose labels are all ``_other``). Both are listed in ``docs/operations.md``.

Exposition goes through ``prometheus_client``; each series' lines are rendered once per change and
kept, so a scrape re-renders only the series that received spans since the scrape before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

OTHER = "_other"
MAX_LABEL_LENGTH = 128
DEFAULT_SERIES_CAP = 2000

Codes = tuple[np.ndarray, list[str]]  # per row: an index into the values of the batch


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

    def codes(self, column: pa.Array | pa.ChunkedArray) -> Codes:
        """The capped label of every row, as codes into a list of values (last value: "" for nulls)."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
            column = column.cast(pa.string())
        enc = column.dictionary_encode()
        values = [self._map(v) for v in enc.dictionary.to_pylist()] + [""]
        idx = pc.fill_null(enc.indices, len(values) - 1).to_numpy(zero_copy_only=False).astype(np.int64)
        return idx, values


def constant(value: str, n: int) -> Codes:
    return np.zeros(n, dtype=np.int64), [value]


_DENSE_KEYS = 1 << 22  # label-set keys below this are counted with bincount (no sort)


def _groups(cols: Sequence[Codes], extra: np.ndarray | None = None, extra_size: int = 1):
    """(keys, inverse, decode): the distinct label sets (and ``extra``, a small int per row) of the
    rows, each row's position among them, and a function decoding the keys to label tuples."""
    n = len(cols[0][0]) if cols else len(extra)
    key = np.zeros(n, dtype=np.int64)
    space = 1
    for codes, values in cols:
        key = key * len(values) + codes
        space *= len(values)
    if extra is not None:
        key = key * extra_size + extra
        space *= extra_size
    if space <= _DENSE_KEYS:  # label sets are few: count them in place
        present = np.bincount(key, minlength=space)
        uniq = np.flatnonzero(present)
        remap = np.zeros(space, dtype=np.int64)
        remap[uniq] = np.arange(len(uniq))
        inv = remap[key]
    else:
        uniq, inv = np.unique(key, return_inverse=True)

    def decode() -> list[tuple]:
        rest = uniq // extra_size if extra is not None else uniq
        parts = []
        for codes, values in reversed(cols):
            size = len(values)
            parts.append([values[c] for c in (rest % size).tolist()])
            rest = rest // size
        parts.reverse()
        return list(zip(*parts)) if parts else [()] * len(uniq)

    return uniq, inv, decode


class _Family:
    kind = ""

    def __init__(self, name: str, help_: str, labels: Sequence[str], series_cap: int) -> None:
        self.name = name
        self.help = help_
        self.labels = tuple(labels)
        self.series_cap = series_cap
        self._lock = threading.Lock()
        self._version: dict[tuple, int] = {}
        self._rendered: dict[tuple, tuple[int, str]] = {}
        self._header = ""

    def _admit(self, key: tuple, state: dict) -> tuple:
        if key in state or len(state) < self.series_cap:
            return key
        return (OTHER,) * len(self.labels)

    def _touch(self, key: tuple) -> None:
        self._version[key] = self._version.get(key, 0) + 1

    def _family(self, items: list) -> Metric:
        raise NotImplementedError

    def _snapshot(self) -> list:
        raise NotImplementedError

    def family(self) -> Metric:
        return self._family(self._snapshot())

    def render_text(self) -> str:
        """This family in Prometheus text format, by ``prometheus_client``; unchanged series from cache."""
        if not self._header:
            self._header = _render(self._family([]))
        with self._lock:
            keys = sorted(self.state)
            stale = [k for k in keys if self._rendered.get(k, (-1,))[0] != self._version.get(k, 0)]
            items = {k: self._item(k) for k in stale}
        if items:  # one prometheus_client call for every changed series, cut into the series' lines
            lines = [line for line in _render(self._family(list(items.values()))).splitlines()
                     if not line.startswith("#")]
            per, extra = divmod(len(lines), len(items))
            for j, (k, item) in enumerate(items.items()):
                if extra:  # not the fixed number of lines per series: render this one alone
                    text = "".join(line + "\n" for line in _render(self._family([item])).splitlines()
                                   if not line.startswith("#"))
                else:
                    text = "".join(line + "\n" for line in lines[j * per:(j + 1) * per])
                self._rendered[k] = (item[-1], text)
        return self._header + "".join(self._rendered[k][1] for k in keys)

    def _item(self, key: tuple) -> tuple:
        raise NotImplementedError


class _One(Collector):
    def __init__(self, fam: Metric) -> None:
        self.fam = fam

    def collect(self) -> Iterable[Metric]:
        yield self.fam


def _render(fam: Metric) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_One(fam))
    return generate_latest(reg).decode("utf-8")


class CounterState(_Family):
    """A counter family: ``add(label_codes, values)`` adds each row's value (1 when ``values`` is None)."""

    def __init__(self, name: str, help_: str, labels: Sequence[str], series_cap: int = DEFAULT_SERIES_CAP) -> None:
        super().__init__(name, help_, labels, series_cap)
        self.state: dict[tuple, float] = {}

    def add(self, cols: Sequence[Codes], values: np.ndarray | None = None) -> None:
        if not len(cols[0][0]):
            return
        uniq, inv, decode = _groups(cols)
        totals = np.bincount(inv, weights=values, minlength=len(uniq))
        with self._lock:
            for key, total in zip(decode(), totals.tolist()):
                k = self._admit(key, self.state)
                self.state[k] = self.state.get(k, 0) + total
                self._touch(k)

    def incr(self, value: float, *key: str) -> None:
        """Add ``value`` to one label set (for counts made outside a batch aggregation)."""
        with self._lock:
            k = self._admit(tuple(key), self.state)
            self.state[k] = self.state.get(k, 0) + value
            self._touch(k)

    def get(self, **labels: str) -> float:
        key = tuple(labels.get(n, "") for n in self.labels)
        with self._lock:
            return self.state.get(key, 0)

    def _snapshot(self) -> list:
        with self._lock:
            return [self._item(k) for k in sorted(self.state)]

    def _item(self, key: tuple) -> tuple:
        return key, self.state[key], self._version.get(key, 0)

    def _family(self, items: list) -> Metric:
        base = self.name[: -len("_total")] if self.name.endswith("_total") else self.name
        fam = CounterMetricFamily(base, self.help, labels=self.labels)
        for key, value, _ in items:
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

    def add(self, cols: Sequence[Codes], values: np.ndarray) -> None:
        if not len(values):
            return
        values = np.asarray(values, dtype=np.float64)
        nb = len(self.bounds) + 1
        bucket = np.searchsorted(self.bounds, values, side="left")
        uniq, inv, decode = _groups(cols, bucket, nb)
        counts = np.bincount(inv, minlength=len(uniq)).tolist()
        sums = np.bincount(inv, weights=values, minlength=len(uniq)).tolist()
        buckets = (uniq % nb).tolist()
        with self._lock:
            for key, b, count, total in zip(decode(), buckets, counts, sums):
                k = self._admit(key, self.state)
                st = self.state.get(k)
                if st is None:
                    st = self.state[k] = [np.zeros(nb, dtype=np.int64), 0.0]
                st[0][b] += count
                st[1] += total
                self._touch(k)

    def count(self, **labels: str) -> int:
        key = tuple(labels.get(n, "") for n in self.labels)
        with self._lock:
            st = self.state.get(key)
            return int(st[0].sum()) if st is not None else 0

    def _snapshot(self) -> list:
        with self._lock:
            return [self._item(k) for k in sorted(self.state)]

    def _item(self, key: tuple) -> tuple:
        st = self.state[key]
        return key, st[0].copy(), st[1], self._version.get(key, 0)

    def _family(self, items: list) -> Metric:
        fam = HistogramMetricFamily(self.name, self.help, labels=self.labels)
        for key, counts, total, _ in items:
            fam.add_metric(list(key), list(zip(self._les, np.cumsum(counts).tolist())), total)
        return fam


def families(states: Iterable[_Family]) -> Iterable[Metric]:
    for s in states:
        yield s.family()
