"""Every SQL string that reads runs: the filters of ``runs()``, one run by ref, a session's turns.

They all read the one definition of a run (store/runs_view.py, store/run_keys.py): a page orders, filters and counts the
runs' keys (``run_keys_select``, the view's values from cheap columns) and then computes the ``runs``
view's rows for the page's runs alone, from their traces; a ``parent=`` filter reads the whole view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...store.run_keys import run_keys_select
from ..load import Reader, _rows
from . import index_keys
from .filters import Filters
from .kept import kept_for, kept_page, kept_summaries
from .run_rows import MAX_TRACES, RUN_COLUMNS, has_foreign, summaries, traces_rows
from .summary import Page, RunSummary, decode_cursor, encode_cursor

NEWEST_FIRST = "start_time_unix_nano DESC, ref DESC"
MAX_LIMIT = 10_000


def page(reader: Reader, filters: Filters, limit: int = 50, cursor: str | None = None) -> Page:
    """One page of runs, newest first, with the count of all matching runs.

    The runs' keys are ordered, filtered and counted first (``run_keys_select``), then only the page's
    runs are summarised, from their traces. On a store with a version (``store_version``) the keys of
    every run (or of a filter's runs) and the summaries read are kept until the version changes, and
    pages are cut from them; when agenttape spans arrive, the keys of the runs they belong to are read
    again and the rest kept (``_advance``)."""
    limit = int(limit)
    if not 0 < limit <= MAX_LIMIT:
        raise ValueError(f"limit: between 1 and {MAX_LIMIT}")
    kept = kept_for(reader) if filters.parent is None else None
    first = None
    if kept is not None and not kept.paged and kept.keys is None and not kept.foreign and not cursor and (
            filters == Filters()):
        first = index_keys.first_page(reader, limit)  # one page asked of a fresh reader: no full order
    if kept is not None and kept.unkept and first is None:  # too many runs to keep their keys: read
        kept = None  # the page from the store
    if kept is not None:
        kept.paged = True
        keys, total = first or kept_page(reader, kept, filters, limit, decode_cursor(cursor) if cursor else None)
        rows = kept_summaries(reader, kept, keys[:limit])
        runs = [RunSummary.from_row(r) for r in rows]
        more = len(keys) > limit
        nxt = encode_cursor(runs[-1].start_ns, runs[-1].ref) if more and runs else None
        return Page(runs=runs, total=total, next_cursor=nxt)
    after, after_params = "true", []
    if cursor:
        start, ref = decode_cursor(cursor)
        after = "(start_time_unix_nano < ? OR (start_time_unix_nano = ? AND ref < ?))"
        after_params = [start, start, ref]
    if filters.parent is not None:  # a parent is known only once runs are summarised
        where, params = filters.where()
        source = f"(SELECT {RUN_COLUMNS} FROM runs WHERE {where})"
        keys = _rows(reader, (
            f"WITH m AS MATERIALIZED {source} "
            f"SELECT *, (SELECT count(*) FROM m) AS total_matching FROM m WHERE {after} "
            f"ORDER BY {NEWEST_FIRST} LIMIT ?"), [*params, *after_params, limit + 1])
        rows = keys
    else:
        where, columns, params = filters.keys_where()
        foreign = has_foreign(reader)
        keys = _rows(reader, (
            "WITH m AS MATERIALIZED (SELECT ref, trace_id, start_time_unix_nano, ours, span_lo, span_hi "
            f"FROM {run_keys_select(columns, foreign, filters.narrow()[0])} c WHERE {where}) "
            f"SELECT *, (SELECT count(*) FROM m) AS total_matching FROM m WHERE {after} "
            f"ORDER BY {NEWEST_FIRST} LIMIT ?"), [*params, *after_params, limit + 1])
        rows = summaries(reader, keys)
    if keys:
        total = int(keys[0]["total_matching"])
    elif filters.parent is not None:
        total = int(_rows(reader, f"SELECT count(*) AS n FROM runs WHERE {where}", params)[0]["n"])
    else:
        keys_sql = run_keys_select(columns, foreign, filters.narrow()[0])
        total = int(_rows(reader, f"SELECT count(*) AS n FROM {keys_sql} c WHERE {where}",
                          params)[0]["n"])
    more = len(keys) > limit
    rows = rows[:limit]
    runs = [RunSummary.from_row(r) for r in rows]
    nxt = encode_cursor(runs[-1].start_ns, runs[-1].ref) if more and runs else None
    return Page(runs=runs, total=total, next_cursor=nxt)


def by_refs(reader: Reader, refs: Sequence[str],
            windows: Mapping[str, tuple[int, int]] | None = None) -> dict[str, RunSummary]:
    if not refs:
        return {}
    marks = ", ".join("?" for _ in refs)
    rows = traces_rows(reader, [r.rpartition("@")[2] for r in refs], RUN_COLUMNS, f"ref IN ({marks})", list(refs),
                       windows)
    return {r["ref"]: RunSummary.from_row(r) for r in rows}


def trace_runs(reader: Reader, trace_id: str,
               windows: Mapping[str, tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    """The runs of one trace (ref, parent_ref), bare trace first, then by start."""
    rows = traces_rows(reader, [trace_id], "ref, parent_ref, run_id, trace_id, start_time_unix_nano", "true", [],
                       windows)
    return sorted(rows, key=lambda r: (r["run_id"] != r["trace_id"], r["start_time_unix_nano"], r["ref"]))


def all_matching(reader: Reader, filters: Filters, oldest_first: bool = False) -> list[RunSummary]:
    order = "start_time_unix_nano, ref" if oldest_first else NEWEST_FIRST
    if filters.parent is None:
        where, columns, params = filters.keys_where()
        foreign = has_foreign(reader)
        keys = _rows(reader, "SELECT ref, trace_id, ours, span_lo, span_hi "
                     f"FROM {run_keys_select(columns, foreign, filters.narrow()[0])} c WHERE {where} "
                     f"LIMIT {MAX_TRACES + 1}", params)
        if len({k["trace_id"] for k in keys}) <= MAX_TRACES and len(keys) <= MAX_TRACES:
            return [RunSummary.from_row(r) for r in summaries(reader, keys, oldest_first)]
    where, params = filters.where()
    return [RunSummary.from_row(r) for r in _rows(
        reader, f"SELECT {RUN_COLUMNS} FROM runs WHERE {where} ORDER BY {order}", params)]
