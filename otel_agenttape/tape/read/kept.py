"""The runs' keys and summaries of a store version, kept between pages: a page is cut from them in
Arrow, and when agenttape spans arrive only the keys of the runs they belong to are read again."""

from __future__ import annotations

import duckdb

import dataclasses
import threading
import weakref
from typing import Any

from ... import read_memory as memory
from ...store.run_keys import run_keys_select
from ..load import Reader, _rows
from . import index_keys
from .filters import Filters
from .run_rows import has_foreign, marks, summaries

# Kept for every run: what a page is ordered by, and the time its spans start in.
_KEY_COLUMNS = ["start_time_unix_nano", "span_lo", "span_hi"]
_KEY_SELECT = f"SELECT ref, run_id, trace_id, ours, {', '.join(_KEY_COLUMNS)}"


def store_version(reader: Reader) -> int | None:
    """A number that changes whenever the runs of the store can have changed, or None when there is none
    to be had cheaply. A DuckDB store (a read-only file, or the writer's own database) only ever gains
    spans between rewrites: the writer appends and never updates or deletes a span, and user SQL is
    refused writes, so its span count (from the table's metadata, well under a millisecond), with the
    count of rewrites (an erasure, retention: ``Store.generation``) above it, is such a number. A reader
    whose files cannot change while it is open (a lake's, over the files its manifest listed when it was
    opened) has a ``fixed_version``. A server is asked every time."""
    fixed = getattr(reader, "fixed_version", None)
    if fixed is not None:
        return int(fixed)
    if getattr(reader, "kind", None) != "duckdb" or not hasattr(reader, "con"):
        return None
    # a running receiver's store: an erasure or retention rewrites the file (values go, spans may go);
    # each rewrite bumps the generation, so nothing kept from before it is taken for this version
    generation = int(getattr(reader, "generation", 0) or 0) << 40
    # asked several times a page: one row fetched straight from the connection (about 0.35 ms on a
    # 1,000,000-span store) rather than through an Arrow table (about 0.85 ms)
    execute = getattr(reader.con, "execute", None)
    if execute is not None:
        try:
            return generation + int(execute("SELECT count(*) FROM spans").fetchall()[0][0])
        except duckdb.Error:
            pass
    return generation + int(_rows(reader, "SELECT count(*) AS n FROM spans", [])[0]["n"])


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
        self.unkept = False  # every run's keys did not fit the read model's memory: pages are read from the store

    def nbytes(self) -> int:
        """What this keeps, in bytes (Arrow tables exactly, summaries at ``memory.SUMMARY_BYTES``)."""
        keys = self.keys.nbytes if self.keys is not None else 0
        return keys + sum(t.nbytes for t in list(self.filtered.values())) + len(self.summaries) * memory.SUMMARY_BYTES


_KEPT: weakref.WeakKeyDictionary[Any, _Kept] = weakref.WeakKeyDictionary()
_KEPT_LOCK = threading.Lock()


def _drop_all() -> None:
    with _KEPT_LOCK:
        _KEPT.clear()


memory.register(lambda: sum(k.nbytes() for k in list(_KEPT.values())), _drop_all)
# Above this many runs touched since the kept version, all keys are read again rather than theirs.
MAX_ADVANCE_RUNS = 2_000
# Filters whose matching keys are kept at once (the console's filter boxes, a few at a time).
MAX_KEPT_FILTERS = 32


def forget(reader: Reader) -> None:
    """Let go of what is kept for ``reader`` (it is being closed)."""
    with _KEPT_LOCK:
        try:
            _KEPT.pop(reader, None)
        except TypeError:  # a reader that cannot be weakly referenced: nothing was kept for it
            pass


def kept_for(reader: Reader) -> _Kept | None:
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
            # a store only gains runs until it is rewritten: keys too many to keep stay so
            new.unkept = kept is not None and kept.unkept and kept.version >> 40 == version >> 40
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
            if not memory.fits(keys.nbytes):  # right for this page; the next ones are read from the store
                kept.unkept = True
                return keys
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
        f"{_KEY_SELECT} FROM {run_keys_select(_KEY_COLUMNS, False, runs=f'run_id IN ({marks(run_ids)})')} c",
        run_ids)
    if int(_rows(reader, "SELECT count(*) AS n FROM spans", [])[0]["n"]) != version:
        return None  # written to meanwhile: read everything at the version there is now
    refs = fresh.column("ref")
    rest = kept.keys.filter(pc.invert(pc.is_in(kept.keys["ref"], value_set=refs.combine_chunks())))
    out = _Kept(version, rows_seen, _sorted(pa.concat_tables([rest, fresh.cast(rest.schema)])), False)
    if not memory.fits(out.keys.nbytes - kept.keys.nbytes):  # grown past the bound: read again, then decided
        return None
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


def kept_page(reader: Reader, kept: _Kept, filters: Filters, limit: int,
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
            if filters.score is None and filters.label is None and memory.fits(t.nbytes):
                # not a score filter's: a score can arrive as a log record alone, which the store's
                # version (its span count) does not see
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


def kept_summaries(reader: Reader, kept: _Kept, keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summaries of these keys' runs, those not kept read and kept (the oldest kept ones let go
    while the read model holds more than its bound)."""
    have = kept.summaries
    found = {k["ref"]: have[k["ref"]] for k in keys if k["ref"] in have}
    missing = [k for k in keys if k["ref"] not in found]
    if missing:
        linked: set[str] = set()
        for row in summaries(reader, missing, linked=linked):
            found[row["ref"]] = row
            have[row["ref"]] = row
        kept.linked |= linked
        over = memory.held() - memory.limit()
        if over > 0:
            with _KEPT_LOCK:
                for ref in list(have)[:-(-over // memory.SUMMARY_BYTES)]:  # the oldest, as many as over
                    have.pop(ref, None)
                    kept.linked.discard(ref)
    return [dict(found[k["ref"]]) for k in keys if k["ref"] in found]
