"""Every SQL string that reads runs: the filters of ``runs()``, one run by ref, a session's turns.

They all read the one definition of a run (store/runs_view.py): a page orders, filters and counts the
runs' keys (``run_keys_select``, the view's values from cheap columns) and then computes the ``runs``
view's rows for the page's runs alone, from their traces; a ``parent=`` filter reads the whole view.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...store.runs_view import (
    HAS_FOREIGN,
    NOT_CHECKPOINT,
    ours_has,
    ours_parent_refs,
    ours_runs_select,
    run_keys_select,
    runs_select,
)
from ..dataset import parse_since
from ..load import Reader, _rows
from . import index_keys
from .summary import Page, RunSummary, decode_cursor, encode_cursor

RUN_COLUMNS = (
    "run_id, trace_id, span_id, agent, session_id, parent_run_id, status, start_time_unix_nano, "
    "end_time_unix_nano, duration_ms, model_nodes, tool_nodes, tool_errors, input_tokens, output_tokens, "
    "service_name, status_message, ref, source, parent_ref, errors, tape_id, models, tools, incomplete"
)
NEWEST_FIRST = "start_time_unix_nano DESC, ref DESC"
MAX_LIMIT = 10_000


def as_ns(value: Any, name: str) -> int | None:
    """Nanoseconds since the epoch from an int, a datetime/date or an ISO string."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"{name}: not a time: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        when = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return int(when.timestamp() * 1_000_000_000)
    if isinstance(value, dt.date):
        return as_ns(dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc), name)
    try:
        return parse_since(str(value))
    except ValueError:
        raise ValueError(f"{name}: not an ISO date/time or nanoseconds since the epoch: {value!r}") from None


@dataclass
class Filters:
    """What ``runs()`` selects; every field None selects every run."""

    agent: str | None = None
    status: str | None = None
    source: str | None = None
    session: str | None = None
    service: str | None = None
    model: str | None = None
    tool: str | None = None
    since: int | None = None
    until: int | None = None
    text: str | None = None
    parent: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        """The filter over the ``runs`` view."""
        return self._where(keys=False)

    def narrow(self) -> tuple[str, list[Any]]:
        """A condition some span of every matching agenttape run meets (``run_keys_select``'s ``narrow``):
        its session and agent are those of its spans. Not the service, which most runs share: narrowing
        by a name nearly every run has costs more than it saves (about 250 ms against 420-530 ms for
        1,000,000 spans whose runs all have one agent; 160-250 ms against 240-285 ms for a tenth)."""
        clauses, params = [], []
        for column, value in (("session_id", self.session), ("agent_name", self.agent)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        return " AND ".join(clauses[:1]), params[:1]

    def keys_where(self) -> tuple[str, list[str], list[Any]]:
        """The filter over ``run_keys_select`` rows (``c``), with the key columns it reads; its
        parameters start with ``narrow()``'s."""
        narrow_params = self.narrow()[1]
        where, params = self._where(keys=True)
        params = [*narrow_params, *params]
        columns = ["start_time_unix_nano", "span_lo", "span_hi"]
        wanted = [("agent", self.agent), ("status", self.status), ("source", self.source),
                  ("session_id", self.session), ("service_name", self.service), ("models", self.model),
                  ("tools", self.tool)]
        columns += [c for c, v in wanted if v is not None]
        if self.text:
            columns += ["agent", "session_id", "status_message", "service_name"]
        return where, list(dict.fromkeys(columns)), params

    def _where(self, keys: bool) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("agent", self.agent), ("status", self.status), ("source", self.source),
                              ("session_id", self.session), ("service_name", self.service)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        for column, role, listed, value in (("model", "model", "models", self.model),
                                             ("tool", "tool", "tools", self.tool)):
            if value is None:
                continue
            if keys:  # an agenttape run's spans are asked; another source's run lists them
                clauses.append(f"CASE WHEN c.ours THEN {ours_has(column, role)} "
                               f"ELSE list_contains(c.{listed}, ?) END")
                params += [value, value]
            else:
                clauses.append(f"list_contains({listed}, ?)")
                params.append(value)
        if self.since is not None:
            clauses.append("start_time_unix_nano >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("start_time_unix_nano < ?")
            params.append(self.until)
        if self.parent is not None:
            clauses.append("(parent_ref = ? OR parent_run_id = ?)")
            params += [self.parent, self.parent]
        if self.text:
            # in the run's names, or anywhere in its trace's attributes (prompts, outputs, tool arguments)
            clauses.append(
                "(contains(lower(concat_ws(' ', ref, agent, session_id, status_message, service_name)), lower(?)) "
                "OR trace_id IN (SELECT trace_id FROM spans "
                "WHERE contains(lower(CAST(attributes AS VARCHAR)), lower(?))))")
            params += [self.text, self.text]
        return (" AND ".join(clauses) or "true"), params


# Above this many runs, the rows are taken from the whole ``runs`` view rather than trace by trace.
MAX_TRACES = 500


def _newest_first(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["start_time_unix_nano"], row["ref"])


def has_foreign(reader: Reader) -> bool:
    """Whether the store holds a span without a run id (another instrumentation's, or a bare trace's;
    not a tape checkpoint)."""
    return bool(_rows(reader, HAS_FOREIGN, [])[0]["f"])


def traces_rows(reader: Reader, trace_ids: Sequence[str], columns: str, where: str = "true",
                params: Sequence[Any] = (), windows: Mapping[str, tuple[int, int]] | None = None
                ) -> list[dict[str, Any]]:
    """``runs`` rows of these traces matching ``where``: agenttape runs by the small query, and only the
    traces that hold other spans through the whole one (unordered). ``windows`` (each trace's first start
    and last end, as ``tape.load.trace_windows`` gives them) bound the scan."""
    ids = sorted(set(trace_ids))
    if not ids:
        return []
    window = _window(ids, windows)
    marks = ", ".join("?" for _ in ids)
    foreign = [r["trace_id"] for r in _rows(
        reader, f"SELECT DISTINCT trace_id FROM spans WHERE {window}trace_id IN ({marks}) AND run_id IS NULL "
        f"AND {NOT_CHECKPOINT}", ids)]
    runs, run_params = in_traces(ids, theirs=False, window=window)
    rows = _rows(reader, f"SELECT {columns} FROM {runs} r WHERE {where}", [*run_params, *params])
    if foreign:
        runs, run_params = in_traces(foreign, ours=False, window=window)
        rows += _rows(reader, f"SELECT {columns} FROM {runs} r WHERE {where}", [*run_params, *params])
    return rows


def _window(ids: Sequence[str], windows: Mapping[str, tuple[int, int]] | None) -> str:
    """A bound on start times holding every span of these traces ('' when not known for all)."""
    if not windows or any(i not in windows for i in ids):
        return ""
    lo, hi = min(int(windows[i][0]) for i in ids), max(int(windows[i][1]) for i in ids)
    return f"start_time_unix_nano BETWEEN {lo} AND {hi} AND "


def _summaries(reader: Reader, keys: list[dict[str, Any]], oldest_first: bool = False,
               linked: set[str] | None = None) -> list[dict[str, Any]]:
    """The ``runs`` rows of these keys (``run_keys_select`` rows), computed from their spans alone: an
    agenttape run from the spans with its run id in its trace, within the time its spans start in (so the
    scan skips the row groups outside it); another source's from its whole trace."""
    rows: list[dict[str, Any]] = []
    ours = [k for k in keys if k["ours"]]
    if ours:
        runs = sorted({k["ref"].rpartition("@")[0] for k in ours})
        traces = sorted({k["trace_id"] for k in ours})
        refs = sorted({k["ref"] for k in ours})
        lo, hi = min(k["span_lo"] for k in ours), max(k["span_hi"] for k in ours)
        src = (f"(SELECT * FROM spans WHERE start_time_unix_nano BETWEEN {int(lo)} AND {int(hi)} "
               f"AND trace_id IN ({_marks(traces)}) AND run_id IN ({_marks(runs)}))")
        found = _rows(reader, f"SELECT {RUN_COLUMNS}, run_span FROM ({ours_runs_select(src)}) r "
                      f"WHERE ref IN ({_marks(refs)})", [*traces, *runs, *refs])
        has_links = ours_parent_refs(found, lambda sql, params: _rows(reader, sql, params))
        if linked is not None:
            linked |= has_links
        for r in found:
            del r["run_span"]
        rows += found
    theirs = [k for k in keys if not k["ours"]]
    if theirs:
        refs = sorted({k["ref"] for k in theirs})
        sql, params = in_traces(sorted({k["trace_id"] for k in theirs}), ours=False)
        rows += _rows(reader, f"SELECT {RUN_COLUMNS} FROM {sql} r WHERE ref IN ({_marks(refs)})", [*params, *refs])
    return sorted(rows, key=_newest_first, reverse=not oldest_first)


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


# --- the runs' keys and summaries of a store version, kept between pages ---

# Kept for every run: what a page is ordered by, and the time its spans start in.
_KEY_COLUMNS = ["start_time_unix_nano", "span_lo", "span_hi"]
_KEY_SELECT = f"SELECT ref, run_id, trace_id, ours, {', '.join(_KEY_COLUMNS)}"


def store_version(reader: Reader) -> int | None:
    """A number that changes whenever the runs of the store can have changed, or None when there is none
    to be had cheaply. A DuckDB store (a read-only file, or the writer's own database) only ever gains
    spans: the writer appends and never updates or deletes a span, and user SQL is refused writes, so
    its span count (from the table's metadata, well under a millisecond) is such a number. A reader
    whose files cannot change while it is open (a lake's, over the files its manifest listed when it was
    opened) has a ``fixed_version``. A server is asked every time."""
    fixed = getattr(reader, "fixed_version", None)
    if fixed is not None:
        return int(fixed)
    if getattr(reader, "kind", None) != "duckdb" or not hasattr(reader, "con"):
        return None
    return int(_rows(reader, "SELECT count(*) AS n FROM spans", [])[0]["n"])


class _Kept:
    """One store version's runs keys, newest first (an Arrow table), and the summaries read so far."""

    def __init__(self, version: int, rows_seen: int, keys: Any, foreign: bool) -> None:
        self.version = version
        self.rows_seen = rows_seen  # every span with a rowid below this is in ``keys``
        self.keys = keys
        self.foreign = foreign
        self.summaries: dict[str, dict[str, Any]] = {}
        self.filtered: dict[tuple[Any, ...], Any] = {}  # the matching keys of a filter, this version only
        self.linked: set[str] = set()  # refs whose parent may come from a link to spans not there yet
        self.paged = False  # a page was answered at this version (the next one reads every run's keys)


_KEPT: weakref.WeakKeyDictionary[Any, _Kept] = weakref.WeakKeyDictionary()
_KEPT_LOCK = threading.Lock()
# Above this many runs touched since the kept version, all keys are read again rather than theirs.
MAX_ADVANCE_RUNS = 2_000
# Filters whose matching keys are kept at once (the console's filter boxes, a few at a time).
MAX_KEPT_FILTERS = 32


def _kept(reader: Reader) -> _Kept | None:
    """What is kept for the store's current version (brought up to it from an older one), or None."""
    version = store_version(reader)
    if version is None:
        return None
    try:
        kept = _KEPT.get(reader)
    except TypeError:
        return None
    if kept is not None and kept.version == version:
        return kept
    with _KEPT_LOCK:  # one request brings the kept keys up to a version; the others wait for them
        kept = _KEPT.get(reader)
        version = store_version(reader) or 0
        if kept is not None and kept.version == version:
            return kept
        new = None
        if kept is not None and kept.keys is not None and not kept.foreign:
            new = _advance(reader, kept, version)
        if new is None:
            new = _Kept(version, 0, None, has_foreign(reader))
        _KEPT[reader] = new
        return new


def _all_keys(reader: Reader, kept: _Kept) -> Any:
    """Every run's keys, newest first, read at the kept version (once)."""
    with _KEPT_LOCK:
        if kept.keys is None:
            rows_seen = 0 if getattr(reader, "fixed_version", None) is not None else int(
                _rows(reader, "SELECT coalesce(max(rowid) + 1, 0) AS n FROM spans", [])[0]["n"])
            keys = None if kept.foreign else index_keys.all_keys(reader)
            keys = _sorted(keys if keys is not None else reader.query(
                f"{_KEY_SELECT} FROM {run_keys_select(_KEY_COLUMNS, kept.foreign)} c", []))
            if store_version(reader) != kept.version:
                return keys  # written to meanwhile: right for this page, not kept under the older version
            kept.keys, kept.rows_seen = keys, rows_seen
        return kept.keys


def _sorted(table: Any) -> Any:
    return table.sort_by([("start_time_unix_nano", "descending"), ("ref", "descending")])


def _advance(reader: Reader, kept: _Kept, version: int) -> _Kept | None:
    """The kept keys brought up to ``version`` by reading again only the runs the new spans belong to
    (spans are only ever appended, at higher rowids); None when that is not the cheaper way, or the new
    spans are not exactly the ones past the kept rowid (then everything is read again)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    new = _rows(reader, "SELECT DISTINCT run_id, trace_id, count(*) OVER () AS n FROM spans WHERE rowid >= ?",
                [kept.rows_seen])
    if not new or int(new[0]["n"]) != version - kept.version or any(r["run_id"] is None for r in new):
        return None  # not appended as expected, or a span without a run id (another source's run)
    run_ids = sorted({r["run_id"] for r in new})
    if len(run_ids) > MAX_ADVANCE_RUNS:
        return None
    rows_seen = int(_rows(reader, "SELECT coalesce(max(rowid) + 1, 0) AS n FROM spans", [])[0]["n"])
    fresh = reader.query(
        f"{_KEY_SELECT} FROM {run_keys_select(_KEY_COLUMNS, False, runs=f'run_id IN ({_marks(run_ids)})')} c",
        run_ids)
    if int(_rows(reader, "SELECT count(*) AS n FROM spans", [])[0]["n"]) != version:
        return None  # written to meanwhile: read everything at the version there is now
    refs = fresh.column("ref")
    rest = kept.keys.filter(pc.invert(pc.is_in(kept.keys["ref"], value_set=refs.combine_chunks())))
    out = _Kept(version, rows_seen, _sorted(pa.concat_tables([rest, fresh.cast(rest.schema)])), False)
    touched = set(run_ids)
    changed = set(refs.to_pylist())
    out.summaries = {ref: row for ref, row in kept.summaries.items()
                     if ref not in changed and ref not in kept.linked and row["parent_run_id"] not in touched}
    out.linked = {ref for ref in kept.linked if ref in out.summaries}
    return out


def _ns(value: int) -> Any:
    """A time as an Arrow int64, held to its range (a start time never reaches either end)."""
    import pyarrow as pa

    return pa.scalar(max(-(2**63), min(int(value), 2**63 - 1)), pa.int64())


def _kept_page(reader: Reader, kept: _Kept, filters: Filters, limit: int,
               after: tuple[int, str] | None) -> tuple[list[dict[str, Any]], int]:
    """The page's keys and the count of all matching runs, from the kept keys (newest first): of every
    run, cut by time in Arrow; or, with any other filter, the filter's matching keys, read once per version
    by the same query as an unkept page (``run_keys_select`` and ``Filters.keys_where``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    named = {f: getattr(filters, f) for f in Filters.__dataclass_fields__ if f not in ("since", "until")}
    if any(v is not None for v in named.values()):
        key = tuple(sorted(dataclasses.asdict(filters).items()))
        t = kept.filtered.get(key)
        if t is None:
            where, columns, params = filters.keys_where()
            t = _sorted(reader.query(
                f"{_KEY_SELECT} FROM {run_keys_select(columns, kept.foreign, filters.narrow()[0])} c WHERE {where}",
                params))
            if len(kept.filtered) >= MAX_KEPT_FILTERS:
                kept.filtered.clear()
            kept.filtered[key] = t
    else:
        t = _all_keys(reader, kept)
        start = t["start_time_unix_nano"]
        mask = None
        if filters.since is not None:
            mask = pc.greater_equal(start, _ns(filters.since))
        if filters.until is not None:
            until = pc.less(start, _ns(filters.until))
            mask = until if mask is None else pc.and_(mask, until)
        if mask is not None:
            t = t.filter(mask)
    total = t.num_rows
    if after is not None:
        at, ref = after
        s = t["start_time_unix_nano"]
        later = pc.or_(pc.less(s, _ns(at)), pc.and_(pc.equal(s, _ns(at)), pc.less(t["ref"], pa.scalar(ref, pa.string()))))
        t = t.filter(later)
    return t.slice(0, limit + 1).to_pylist(), total


def _kept_summaries(reader: Reader, kept: _Kept, keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
    missing = [k for k in keys if k["ref"] not in kept.summaries]
    if missing:
        linked: set[str] = set()
        for row in _summaries(reader, missing, linked=linked):
            kept.summaries[row["ref"]] = row
        kept.linked |= linked
    return [dict(kept.summaries[k["ref"]]) for k in keys if k["ref"] in kept.summaries]


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
    kept = _kept(reader) if filters.parent is None else None
    if kept is not None:
        first = None
        if not kept.paged and kept.keys is None and not kept.foreign and not cursor and filters == Filters():
            first = index_keys.first_page(reader, limit)  # one page asked of a fresh reader: no full order
        kept.paged = True
        keys, total = first or _kept_page(reader, kept, filters, limit, decode_cursor(cursor) if cursor else None)
        rows = _kept_summaries(reader, kept, keys[:limit])
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
        rows = _summaries(reader, keys)
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


def in_traces(trace_ids: Sequence[str], *, ours: bool = True, theirs: bool = True,
              window: str = "") -> tuple[str, list[str]]:
    """``runs`` computed from these traces' spans only: one run read without listing the store."""
    marks = ", ".join("?" for _ in trace_ids)
    src = f"(SELECT * FROM spans WHERE {window}trace_id IN ({marks}))"
    return f"({runs_select(src, ours=ours, theirs=theirs)})", list(trace_ids)


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
            return [RunSummary.from_row(r) for r in _summaries(reader, keys, oldest_first)]
    where, params = filters.where()
    return [RunSummary.from_row(r) for r in _rows(
        reader, f"SELECT {RUN_COLUMNS} FROM runs WHERE {where} ORDER BY {order}", params)]
