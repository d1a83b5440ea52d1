"""Bounded, batch-fed metric state: label caps, counters and histograms updated from whole columns.

A batch of stored rows is aggregated with numpy: each label column becomes small integer codes, the
codes of a tuple of labels are folded into one label-set number per row once per batch (``Groups``,
shared by every metric with those labels or fewer), and the set number (with the bucket index of a
histogram) gives the count and sum of every label set in one ``np.bincount`` pass, so the Python work
per batch grows with the number of label sets in it, not with its rows.

Cardinality is bounded twice: each label keeps its first ``limit`` distinct values (``LabelCap``; later
values become ``_other``), and each metric keeps at most ``series_cap`` label sets (later sets are
folded into one whose labels are all ``_other``). Both are listed in ``docs/operations.md``.

Exposition goes through ``prometheus_client``: a series' sample lines are rendered by it when the
series appears, and their text up to the value is kept; a scrape returns the family's text unchanged
when nothing was added since the scrape before, and otherwise formats only the values of the series
that changed (with ``prometheus_client``'s float formatting), so its output is the same bytes as
``generate_latest`` and its cost does not grow with the rows ingested.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

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
        """The capped label of every row, as codes into a list of values (last value: "" for nulls).
        ``column`` may be dictionary-encoded already (its dictionary in the order values first appear)."""
        if isinstance(column, pa.ChunkedArray):  # its only chunk as it is (combine_chunks would copy it)
            column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        if pa.types.is_dictionary(column.type):
            enc = column
        else:
            if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
                column = column.cast(pa.string())
            enc = column.dictionary_encode()
        indices = enc.indices if not enc.indices.null_count else pc.fill_null(enc.indices, -1)
        return self.encoded(enc.dictionary.to_pylist(), indices.to_numpy(zero_copy_only=False).astype(np.int64))

    def encoded(self, dictionary: list[str], codes: np.ndarray) -> Codes:
        """The capped label of rows given as ``codes`` into ``dictionary`` (-1: null), the values
        listed in the order they first appear in the rows."""
        values = [self._map(v) for v in dictionary] + [""]
        if len(codes) and codes.min() < 0:
            codes = np.where(codes < 0, len(values) - 1, codes)
        return codes, values


def constant(value: str, n: int) -> Codes:
    return np.zeros(n, dtype=np.int64), [value]


_DENSE_KEYS = 1 << 16  # keys below this (or below 4x the rows) are counted with bincount, not sorted


def _dense(key: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray]:
    """(uniq, inverse) of ``key`` (ints in [0, space)): counted in place when the space is small
    next to the rows, else sorted."""
    if space <= max(_DENSE_KEYS, 4 * len(key)):
        present = np.bincount(key, minlength=space)
        uniq = np.flatnonzero(present)
        remap = np.zeros(space, dtype=np.int64)
        remap[uniq] = np.arange(len(uniq))
        return uniq, remap[key]
    return np.unique(key, return_inverse=True)


_FOLD_SPACE = 1 << 40  # a folded key past this is renumbered densely before the next label joins it


def _fold(cols: Sequence[np.ndarray], radixes: Sequence[int]) -> tuple[np.ndarray, int]:
    """Each row's number among the distinct code tuples of ``cols`` (in [0, n)), numbered in the
    tuples' lexicographic order, and n. The key is renumbered densely whenever it would grow past
    ``_FOLD_SPACE`` (numbering keeps the order), so many labels of many values never overflow int64."""
    key, space = cols[0], radixes[0]
    for codes, radix in zip(cols[1:], radixes[1:]):
        if space * radix > _FOLD_SPACE:
            uniq, key = _dense(key, space)
            space = len(uniq)
        key = key * radix + codes
        space *= radix
    uniq, key = _dense(key, space)
    return key, len(uniq)


def new_runs(a: np.ndarray) -> np.ndarray:
    """Whether each element starts a run of equal elements (differs from the one before it)."""
    out = np.empty(len(a), dtype=bool)
    if len(a):
        out[0] = True
        np.not_equal(a[1:], a[:-1], out=out[1:])
    return out


class Groups:
    """The label sets of one batch for one tuple of labels, shared by every metric with those labels.

    ``ids`` gives each row of the batch its set's number; sets are numbered in the order of their
    labels' codes (each label's codes index its ``values``), which is the order ``add`` meets them in,
    so which sets a full series cap admits does not depend on how the batch was grouped. A grouping of
    some labels is derived from one of more labels without touching the rows (``project``)."""

    __slots__ = ("ids", "codes", "values", "size")

    def __init__(self, ids: np.ndarray, codes: np.ndarray, values: list[list[str]]) -> None:
        self.ids = ids  # per row: its set's number
        self.codes = codes  # per set and label: the label's code
        self.values = values  # per label: the values its codes index
        self.size = len(codes)

    @classmethod
    def of(cls, cols: Sequence[Codes]) -> Groups:
        """The label sets of rows labelled by ``cols`` (one ``Codes`` per label, all rows alike)."""
        if len(cols) == 1:  # the codes are the set numbers already
            codes, values = cols[0]
            return cls(codes, np.arange(len(values), dtype=np.int64)[:, None], [values])
        ids, n = _fold([c for c, _ in cols], [len(v) for _, v in cols])
        first = np.empty(n, dtype=np.int64)  # a row of each set
        first[ids] = np.arange(len(ids), dtype=np.int64)
        return cls(ids, np.stack([c[first] for c, _ in cols], axis=1), [v for _, v in cols])

    def project(self, positions: Sequence[int]) -> Groups:
        """The sets of the labels at ``positions`` (in that order), from these sets."""
        sub = self.codes[:, list(positions)]
        values = [self.values[p] for p in positions]
        setmap, n = _fold(list(sub.T), [len(v) for v in values])
        first = np.empty(n, dtype=np.int64)
        first[setmap] = np.arange(self.size, dtype=np.int64)
        return Groups(setmap[self.ids], sub[first], values)

    def labels(self, sets: np.ndarray, suffix: tuple[str, ...] = ()) -> list[tuple]:
        """The label values of ``sets`` (numbers), each followed by ``suffix``."""
        cols = self.codes[sets].T.tolist()
        parts = [[values[c] for c in col] for values, col in zip(self.values, cols)]
        if suffix:
            parts.extend([[v] * len(sets) for v in suffix])
        return list(zip(*parts))


class _Family:
    kind = ""

    def __init__(self, name: str, help_: str, labels: Sequence[str], series_cap: int) -> None:
        self.name = name
        self.help = help_
        self.labels = tuple(labels)
        self.series_cap = series_cap
        self.state: dict[tuple, Any] = {}
        self._lock = threading.Lock()  # the state (taken by add/incr and by a scrape's snapshot)
        self._render_lock = threading.Lock()  # the rendered text (one scrape renders at a time)
        self._dirty: set[tuple] = set()  # series changed since the last render
        self._header = ""
        self._order: list[tuple] = []  # every series' key, sorted (the order of the exposition)
        self._prefixes: dict[tuple, list[str]] = {}  # key -> its sample lines up to the value, by prometheus_client
        self._series: dict[tuple, str] = {}  # key -> its lines as last rendered
        self._text: str | None = None  # the whole family as last rendered
        self._templated: bool | None = None  # False: the sample layout is not the expected one, render it all

    def _admit(self, key: tuple, state: dict) -> tuple:
        if key in state or len(state) < self.series_cap:
            return key
        return (OTHER,) * len(self.labels)

    def _touch(self, key: tuple) -> None:
        self._dirty.add(key)

    def _family(self, items: list) -> Metric:
        raise NotImplementedError

    def _item(self, key: tuple) -> tuple:
        raise NotImplementedError

    def _values(self, item: tuple) -> list:
        """The sample values of one series, in the order of its ``_family`` samples."""
        raise NotImplementedError

    def _suffixes(self) -> list[str]:
        """The sample names of one series after the family name, in order (``_bucket`` ... ``_sum``)."""
        raise NotImplementedError

    def _snapshot(self) -> list:
        with self._lock:
            return [self._item(k) for k in sorted(self.state)]

    def family(self) -> Metric:
        return self._family(self._snapshot())

    def render_text(self) -> str:
        """This family in Prometheus text format 0.0.4, the same bytes as ``generate_latest`` of ``family()``.

        A scrape with no change since the one before returns the text it rendered then. Otherwise only
        the changed series are formatted: each series' sample lines up to the value (name, escaped and
        sorted labels, ``le``) are rendered once by ``prometheus_client`` when the series appears and
        kept, and a later change formats just its values with ``prometheus_client``'s ``floatToGoString``.
        """
        with self._render_lock:
            with self._lock:
                if self._text is not None and not self._dirty:
                    return self._text
                dirty, self._dirty = self._dirty, set()
                items = [self._item(k) for k in dirty]
                if len(self._order) != len(self.state):  # new series: keys are never removed
                    self._order = sorted(self.state)
                order = self._order
            if not self._header:
                self._header = _render(self._family([]))
            series = self._series
            for item in items:
                prefixes = self._prefixes.get(item[0])
                if prefixes is None or not self._templated:
                    series[item[0]] = self._first_render(item)
                else:
                    series[item[0]] = "".join([p + (_GO.get(v) or _go(v)) + "\n"
                                               for p, v in zip(prefixes, self._values(item))])
            self._text = self._header + "".join([series[k] for k in order])
            return self._text

    def _first_render(self, item: tuple) -> str:
        """One series through ``prometheus_client``; keeps its line prefixes when the layout is the expected one."""
        fam = self._family([item])
        text = "".join(line + "\n" for line in _render(fam).splitlines() if not line.startswith("#"))
        if self._templated is None:
            base = fam.name + "_total" if fam.type == "counter" else fam.name
            self._templated = ([s.name for s in fam.samples] == [base + x for x in self._suffixes()]
                               and [s.value for s in fam.samples] == self._values(item))
        if self._templated:
            lines = text.splitlines()
            if len(lines) == len(fam.samples):
                self._prefixes[item[0]] = [line.rpartition(" ")[0] + " " for line in lines]
        return text


_GO: dict[float, str] = {}  # floatToGoString of values seen lately (bucket counts repeat a lot)


def _go(value: float) -> str:
    text = floatToGoString(value)
    if len(_GO) >= 100_000:
        _GO.clear()
    _GO[value] = text
    return text


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

    def add(self, cols: Sequence[Codes], values: np.ndarray | None = None) -> None:
        if len(cols[0][0]):
            self.add_sets(Groups.of(cols), None, values)

    def add_sets(self, groups: Groups, rows: np.ndarray | None, values: np.ndarray | None = None,
                 suffix: tuple[str, ...] = ()) -> None:
        """Add each row's value (1 when ``values`` is None) of ``rows`` (all when None), labelled by
        ``groups`` and then ``suffix``."""
        ids = groups.ids if rows is None else groups.ids[rows]
        if not len(ids):
            return
        uniq, inv = _dense(ids, groups.size)
        totals = np.bincount(inv, weights=values, minlength=len(uniq))
        with self._lock:
            for key, total in zip(groups.labels(uniq, suffix), totals.tolist()):
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

    def _item(self, key: tuple) -> tuple:
        return key, self.state[key]

    def _values(self, item: tuple) -> list:
        return [item[1]]

    def _suffixes(self) -> list[str]:
        return [""]

    def _family(self, items: list) -> Metric:
        base = self.name[: -len("_total")] if self.name.endswith("_total") else self.name
        fam = CounterMetricFamily(base, self.help, labels=self.labels)
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
        # self.state: key -> the series' row in _counts (per bucket, last: +Inf) and _sums
        self._counts = np.zeros((16, len(self.bounds) + 1), dtype=np.int64)
        self._sums = np.zeros(16, dtype=np.float64)

    def add(self, cols: Sequence[Codes], values: np.ndarray) -> None:
        if len(values):
            self.add_sets(Groups.of(cols), None, values)

    def add_sets(self, groups: Groups, rows: np.ndarray | None, values: np.ndarray,
                 suffix: tuple[str, ...] = ()) -> None:
        """Observe ``values`` (one per row of ``rows``, all rows when None), labelled by ``groups``
        and then ``suffix``. Python runs once per label set; the counts and sums are added with
        ``np.add.at``, in the order of the (set, bucket) pairs, so each sum adds the same partial
        sums in the same order as adding them one by one would."""
        if not len(values):
            return
        values = np.asarray(values, dtype=np.float64)
        ids = groups.ids if rows is None else groups.ids[rows]
        nb = len(self.bounds) + 1
        bucket = np.searchsorted(self.bounds, values, side="left")
        uniq, inv = _dense(ids * nb + bucket, groups.size * nb)
        counts = np.bincount(inv, minlength=len(uniq))
        sums = np.bincount(inv, weights=values, minlength=len(uniq))
        sets = uniq // nb
        starts = new_runs(sets)
        keys = groups.labels(sets[starts], suffix)
        with self._lock:
            state = self.state
            rows_of_sets = []
            for key in keys:
                k = self._admit(key, state)
                row = state.get(k)
                if row is None:
                    row = state[k] = len(state)
                rows_of_sets.append(row)
                self._touch(k)
            if len(state) > len(self._sums):
                grow = max(len(state), 2 * len(self._sums)) - len(self._sums)
                self._counts = np.concatenate([self._counts, np.zeros((grow, nb), dtype=np.int64)])
                self._sums = np.concatenate([self._sums, np.zeros(grow, dtype=np.float64)])
            series = np.asarray(rows_of_sets, dtype=np.int64)[np.cumsum(starts) - 1]
            np.add.at(self._counts, (series, uniq % nb), counts)
            np.add.at(self._sums, series, sums)

    def count(self, **labels: str) -> int:
        key = tuple(labels.get(n, "") for n in self.labels)
        with self._lock:
            row = self.state.get(key)
            return int(self._counts[row].sum()) if row is not None else 0

    def _item(self, key: tuple) -> tuple:
        row = self.state[key]
        return key, np.cumsum(self._counts[row]).tolist(), float(self._sums[row])

    def _values(self, item: tuple) -> list:
        cum = item[1]
        return [*cum, cum[-1], item[2]]  # buckets, _count, _sum

    def _suffixes(self) -> list[str]:
        return ["_bucket"] * len(self._les) + ["_count", "_sum"]

    def _family(self, items: list) -> Metric:
        fam = HistogramMetricFamily(self.name, self.help, labels=self.labels)
        for key, cum, total in items:
            fam.add_metric(list(key), list(zip(self._les, cum)), total)
        return fam


def families(states: Iterable[_Family]) -> Iterable[Metric]:
    for s in states:
        yield s.family()
