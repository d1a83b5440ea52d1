"""Runs keys from a run index instead of the spans.

A lake's ``run_traces`` (``store.parquet.RUN_TRACES_SQL``) holds a row per run, trace and published
batch, a DuckDB store's ``run_index`` (``store.ddl``) a row per run, trace and write: about a tenth of
the spans' rows or fewer, and only the columns a page of runs is ordered by. Keys read
from it follow the rules of ``store.run_keys.OURS_KEY_COLUMNS``: a run starts when its run span does
(else its first span), and its spans start in ``[span_lo, span_hi]``.

``first_page`` answers the first page of a reader that has not read every run's keys yet (each
``agenttape runs`` is such a reader, and the console after a restart) in one pass over fixed-width
columns: runs are grouped and counted by the hashes of their run and trace ids (``run_hash``,
``trace_hash``, ``store.ddl.RUN_KEY_SQL``), and only the page's runs have their ids read, from the
spans. ``all_keys`` reads every run's keys from a lake's index, which holds the ids too, for a reader
that pages on (a DuckDB store's index keeps only the hashes: there the spans are read).
"""

from __future__ import annotations

from typing import Any

from ...store.ddl import RUN_KEY_SQL
from ...store.reader import QueryError
from ..load import Reader, _rows, _source, lake_run_traces

_KEYS = (
    "SELECT run_id || '@' || trace_id AS ref, run_id, trace_id, true AS ours, "
    "coalesce(min(run_start_unix_nano), min(start_time_unix_nano)) AS start_time_unix_nano, "
    "min(start_time_unix_nano) AS span_lo, max(last_start_unix_nano) AS span_hi "
    "FROM {src} WHERE run_id IS NOT NULL GROUP BY run_id, trace_id")
_BY_KEY = (
    "SELECT run_hash, trace_hash, "
    "coalesce(min(run_start_unix_nano), min(start_time_unix_nano)) AS start_time_unix_nano, "
    "min(start_time_unix_nano) AS span_lo, max(last_start_unix_nano) AS span_hi "
    "FROM {index} WHERE run_hash IS NOT NULL GROUP BY run_hash, trace_hash")
_NEWEST_FIRST = "start_time_unix_nano DESC, ref DESC"


def _index(reader: Reader) -> tuple[str, bool] | None:
    """The reader's run index (a lake's ``run_traces``, or a DuckDB store's ``run_index``) if it holds
    each run's start and key (``store.ddl.RUN_KEY_SQL``), and whether it holds the ids too (a lake's)."""
    index = lake_run_traces(reader)
    lake = index is not None
    if index is None:
        if getattr(reader, "kind", None) != "duckdb":
            return None
        index = "run_index"  # the writer's (every store a writer opened since has this layout)
    keyed = getattr(reader, "run_index_keyed", None)  # an Iceberg lake's index: its files' null counts
    if lake and keyed is not None and keyed():
        return index, lake
    try:
        found = _rows(reader, f"SELECT count(*) FILTER (WHERE run_hash IS NULL) AS old FROM {index} "
                              f"WHERE {'run_id IS NOT NULL' if lake else 'true'}", [])
    except QueryError:  # no index, or one of an earlier layout: the spans are read
        return None
    # rows published before the keys were kept have none: then the spans are read
    return (index, lake) if not found[0]["old"] else None


def all_keys(reader: Reader) -> Any | None:
    """Every agenttape run's keys (an Arrow table, unordered), or None without an index holding the ids."""
    found = _index(reader)
    if found is None or not found[1]:
        return None
    return reader.query(_KEYS.format(src=found[0]), [])


def first_page(reader: Reader, limit: int) -> tuple[list[dict[str, Any]], int] | None:
    """The ``limit + 1`` newest runs' keys and the count of all runs, or None without a usable index.

    The runs that start no earlier than the ``limit + 1``-th newest (ties included) are read by key,
    then their ids, and ordered by start and ref exactly as every other page is. Two runs with one key (a
    collision of both hashes) would show as one id per key too many: then the spans are read instead.
    Over one Iceberg lake the newest runs are found from the newest spans instead (``_newest_by_time``)."""
    found = _index(reader)
    if found is None:
        return None
    want = limit + 1
    if found[1]:
        by_time = _newest_by_time(reader, want)
        if by_time is not None:
            return by_time
    top, total = _newest(reader, found[0], want)
    if not top:
        return [], total
    # the ids, from the spans these runs' spans start among (spans are stored in time order, so the
    # window reads a few row groups; the index is in id order and would be read whole)
    runs = ", ".join(str(h) for h in sorted({int(r["run_hash"]) for r in top}))
    lo, hi = min(int(r["span_lo"]) for r in top), max(int(r["span_hi"]) for r in top)
    ids = _rows(reader, (
        f"SELECT DISTINCT {RUN_KEY_SQL}, run_id, trace_id FROM {_source(reader, 'spans', None, [], (lo, hi))} "
        "WHERE start_time_unix_nano BETWEEN ? AND ? "
        f"AND run_id IS NOT NULL AND md5_number_upper(run_id) IN ({runs})"), [lo, hi])
    named: dict[tuple[int, int], tuple[str, str]] = {}
    for r in ids:
        key = (int(r["run_hash"]), int(r["trace_hash"]))
        if key in named and named[key] != (r["run_id"], r["trace_id"]):
            return None
        named[key] = (r["run_id"], r["trace_id"])
    keys = []
    for r in top:
        run_id, trace_id = named[(int(r["run_hash"]), int(r["trace_hash"]))]
        keys.append({"ref": f"{run_id}@{trace_id}", "run_id": run_id, "trace_id": trace_id, "ours": True,
                     "start_time_unix_nano": r["start_time_unix_nano"], "span_lo": r["span_lo"],
                     "span_hi": r["span_hi"]})
    keys.sort(key=lambda k: (k["start_time_unix_nano"], k["ref"]), reverse=True)
    return keys[:want], total


def _newest(reader: Reader, index: str, want: int) -> tuple[list[dict[str, Any]], int]:
    """The runs (by key) that start no earlier than the ``want``-th newest, ties included, and the count
    of all runs: one pass over the grouped index keeping the ``2 * want`` newest (``max_by``); only when
    the ``want``-th ties with the last one kept is the grouping read again for every tie."""
    row = _rows(reader, (
        f"WITH g AS ({_BY_KEY.format(index=index)}) SELECT count(*) AS total, max_by({{'run_hash': run_hash, "
        "'trace_hash': trace_hash, 'start_time_unix_nano': start_time_unix_nano, 'span_lo': span_lo, "
        "'span_hi': span_hi}, start_time_unix_nano, ?) AS top FROM g"), [2 * want])[0]
    total, top = int(row["total"]), list(row["top"] or [])
    if len(top) <= want:
        return top, total
    top.sort(key=lambda r: r["start_time_unix_nano"], reverse=True)
    edge = top[want - 1]["start_time_unix_nano"]
    if top[-1]["start_time_unix_nano"] < edge:
        return [r for r in top if r["start_time_unix_nano"] >= edge], total
    return _rows(reader, f"SELECT * FROM ({_BY_KEY.format(index=index)}) g WHERE start_time_unix_nano >= ?",
                 [edge]), total


# how many times the window of newest spans is widened (by WIDEN each time) before the whole index is grouped
WIDENINGS = 10
WIDEN = 4
_SIGN = 1 << 64


def _signed(h: int) -> int:
    """A 64-bit key as the signed ``long`` an Iceberg run index keeps it as (the same bits)."""
    return h - _SIGN if h >= 1 << 63 else h


def _newest_by_time(reader: Reader, want: int) -> tuple[list[dict[str, Any]], int] | None:
    """The first page's keys over one Iceberg lake without grouping its whole run index (a row per run,
    trace and batch: linear in the runs), or None to group it.

    The count of all runs is the one the index's snapshot recorded when it was committed
    (``iceberg_read.IcebergLake.recorded_runs``), else a count of its distinct keys. The newest runs are
    among those with a span in the newest window of time ``[t, newest]``: a run without one has every span,
    its run span too, before ``t``, so it starts before ``t``. Those runs' keys and ids come from the
    spans of the window (the newest files alone), their starts and span bounds from the index rows of
    their keys (a filter on one fixed-width column); when at least ``want`` of them start at ``t`` or
    later, no other run can be on the page or tie with its last run. Else the window is widened."""
    raw = getattr(reader, "run_index_raw", None)
    bounds = getattr(reader, "span_time_bounds", None)
    if raw is None or bounds is None:
        return None
    index, span_range = raw(), bounds()
    if index is None or span_range is None:
        return None
    src, floor = index
    above = f" AND last_start_unix_nano >= {int(floor)}" if floor is not None else ""
    total = reader.run_index_recorded()
    if total is None:
        total = int(_rows(reader, f"SELECT count(*) AS n FROM (SELECT DISTINCT run_hash, trace_hash FROM {src} "
                                  f"WHERE run_hash IS NOT NULL{above})", [])[0]["n"])
    if not total:
        return [], 0
    lo, hi = span_range
    width = max(1, (hi - lo) * want // total)  # a page of runs at the lake's mean rate
    for _ in range(WIDENINGS):
        t = hi - width
        named: dict[tuple[int, int], tuple[str, str]] = {}
        for r in _rows(reader, (
                f"SELECT DISTINCT {RUN_KEY_SQL}, run_id, trace_id FROM {_source(reader, 'spans', None, [], (t, None))} "
                "WHERE start_time_unix_nano >= ? AND run_id IS NOT NULL"), [t]):
            key = (int(r["run_hash"]), int(r["trace_hash"]))
            if key in named and named[key] != (r["run_id"], r["trace_id"]):
                return None  # two runs with one key: the spans are read instead
            named[key] = (r["run_id"], r["trace_id"])
        every = t <= lo  # the window holds every span: every run is in it
        if len(named) >= want or every:
            ranked = _starts(reader, src, above, named)
            if every or (len(ranked) >= want and ranked[want - 1]["start_time_unix_nano"] >= t):
                return ranked[:want], total  # a run tied with the last one starts at t or later: it is here
        width *= WIDEN
    return None


def _starts(reader: Reader, src: str, above: str, named: dict[tuple[int, int], tuple[str, str]]) -> list[dict[str, Any]]:
    """The keys of these runs from every index row of them (start, span bounds), newest first as a page
    orders them (start, then ref); a run the index does not hold yet is left out, as from the index."""
    if not named:
        return []
    runs = ", ".join(str(_signed(h)) for h in sorted({k[0] for k in named}))
    keys = []
    for r in _rows(reader, (
            "SELECT run_hash, trace_hash, coalesce(min(run_start_unix_nano), min(start_time_unix_nano)) "
            "AS start_time_unix_nano, min(start_time_unix_nano) AS span_lo, max(last_start_unix_nano) AS span_hi "
            f"FROM {src} WHERE run_hash IN ({runs}){above} GROUP BY run_hash, trace_hash"), []):
        ids = named.get((int(r["run_hash"]) % _SIGN, int(r["trace_hash"]) % _SIGN))
        if ids is None:  # another run of the same run hash, in another trace
            continue
        run_id, trace_id = ids
        keys.append({"ref": f"{run_id}@{trace_id}", "run_id": run_id, "trace_id": trace_id, "ours": True,
                     "start_time_unix_nano": r["start_time_unix_nano"], "span_lo": r["span_lo"],
                     "span_hi": r["span_hi"]})
    keys.sort(key=lambda k: (k["start_time_unix_nano"], k["ref"]), reverse=True)
    return keys
