"""Reading the Iceberg lake: pyiceberg plans the files, DuckDB reads them.

``plan`` asks pyiceberg for a table's live data files (its manifests, pruned by partition and column
statistics when a filter is given: a trace id prunes to its bucket and to files whose min/max covers it, a
time window to its days); only the current snapshot's files are ever read, so a file written but not
committed, or replaced by compaction, is never seen. The views cast Iceberg's types back to the store's
(``long`` hashes to ``UBIGINT`` with the same bits, strings to JSON), so the read model's SQL is unchanged.
``IcebergLake.check_files`` is ``verify``'s check: every live file there, with the size the catalog lists
and the sha256 the snapshot that added it recorded.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow.dataset as ds

from otel_agenttape.store import schema
from otel_agenttape.store.lake import iceberg_catalog as ic
from otel_agenttape.store.lake import iceberg_files as ifl
from otel_agenttape.store.lake.files import RUN_TRACES
from otel_agenttape.store.lake.fs import LakeFS

_RUN_TRACES_TYPES = {"run_id": "VARCHAR", "trace_id": "VARCHAR", "parent_run_id": "VARCHAR",
                     "run_hash": "UBIGINT", "trace_hash": "UBIGINT"}
_store_types: dict[str, dict[str, str]] = {}
# the time a dated table's files are sorted by (their min/max bound a time window)
TIME_COLUMNS = {"spans": "start_time_unix_nano", "span_events": "time_unix_nano", "log_records": "time_unix_nano"}


def store_types(table: str) -> dict[str, str]:
    """The DuckDB type of each store column (what the views cast the Iceberg columns back to)."""
    if table == RUN_TRACES:
        return {c: _RUN_TRACES_TYPES.get(c, "BIGINT") for c in ic.store_schema(RUN_TRACES).names}
    if table not in _store_types:
        con = duckdb.connect(":memory:")
        try:
            con.execute(schema.table_ddl(table))
            _store_types[table] = {r[0]: r[1] for r in con.execute(f"DESCRIBE {table}").fetchall()}
        finally:
            con.close()
    return _store_types[table]


def _cast(col: str, typ: str) -> str:
    if typ == "UBIGINT":  # a 64-bit hash kept in a signed long: the same bits
        return (f"CAST(CASE WHEN {col} < 0 THEN {col}::HUGEINT + 18446744073709551616 ELSE {col}::HUGEINT END "
                f"AS UBIGINT) AS {col}")
    return f"CAST({col} AS {typ}) AS {col}"


def select_sql(table: str, source: str) -> str:
    cols = ", ".join(_cast(c, t) for c, t in store_types(table).items())
    return f"SELECT {cols} FROM {source}"


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class IcebergLake:
    """One Iceberg lake opened for reading: its tables, the snapshot each is read at, and its live files."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.catalog, self.parsed = ic.load(url, create=False)
        self.tables = ic.load_tables(self.catalog, self.parsed.namespace)
        # every read of this lake (whole views and scoped lookups) is of the snapshot current at open
        self.snapshots: dict[str, int | None] = {
            t: (snap.snapshot_id if (snap := tbl.current_snapshot()) is not None else None)
            for t, tbl in self.tables.items()}
        self.files: dict[str, list[Any]] = {t: self.plan(t) for t in self.tables}
        self.present: dict[str, set[str]] = {}  # the live files there when the views were made
        self._n = 0
        self._scoped: dict[tuple[str, frozenset[str]], str] = {}

    def plan(self, table: str, row_filter: Any = None) -> list[Any]:
        """pyiceberg's plan of this table at the snapshot read: the data files that can hold rows matching
        ``row_filter`` (partition and min/max pruning), or every live file."""
        from pyiceberg.expressions import AlwaysTrue

        snap = self.snapshots.get(table)
        if snap is None:
            return []
        scan = self.tables[table].scan(row_filter=row_filter or AlwaysTrue(), snapshot_id=snap)
        return [task.file for task in scan.plan_files()]

    def scoped_files(self, table: str, column: str | None, values: Sequence[str],
                     window: tuple[int | None, int | None] | None = None) -> list[Any]:
        """The live files that can hold rows whose ``column`` is one of ``values`` (a trace id prunes to its
        bucket and to files whose min/max covers it; a run id to the index files whose bounds cover it) and,
        with a ``window`` (lo, hi; either end open), whose time (``TIME_COLUMNS``) can fall in it: the
        newest runs' spans are in the newest files, so a page of them reads those alone."""
        from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, In, LessThanOrEqual

        if table not in self.tables or (column is not None and not values):
            return []
        parts: list[Any] = []
        if column is not None:
            vals = sorted(set(values))
            parts.append(EqualTo(column, vals[0]) if len(vals) == 1 else In(column, vals))
        time_col = TIME_COLUMNS.get(table)
        if window is not None and time_col is not None:
            lo, hi = window
            if lo is not None:
                parts.append(GreaterThanOrEqual(time_col, int(lo)))
            if hi is not None:
                parts.append(LessThanOrEqual(time_col, int(hi)))
        if not parts:
            return list(self.files.get(table, []))
        f = parts[0] if len(parts) == 1 else And(*parts)
        here = self.present.get(table)
        return [x for x in self._prune(table, f) if here is None or x.file_path in here]

    def _prune(self, table: str, row_filter: Any) -> list[Any]:
        """pyiceberg's own pruning (partition projection, then min/max metrics) applied to the files planned
        at open: the same answer as ``plan(table, row_filter)`` without reading the manifests again."""
        from pyiceberg.expressions.visitors import (
            _InclusiveMetricsEvaluator,
            expression_evaluator,
            inclusive_projection,
        )

        tbl = self.tables[table]
        files = self.files.get(table, [])
        schema, spec = tbl.schema(), tbl.spec()
        if any(f.spec_id != spec.spec_id for f in files):  # an evolved spec: let pyiceberg plan it
            return self.plan(table, row_filter)
        from pyiceberg.schema import Schema

        part_schema = Schema(*spec.partition_type(schema).fields)
        keep = expression_evaluator(part_schema, inclusive_projection(schema, spec)(row_filter), True)
        metrics = _InclusiveMetricsEvaluator(schema, row_filter, case_sensitive=True)
        return [f for f in files if keep(f.partition) and metrics.eval(f)]

    def local_roots(self) -> list[str]:
        out = []
        for tbl in self.tables.values():
            loc = tbl.location()
            if loc.startswith("file://"):
                out.append(loc[len("file://"):])
            elif loc.startswith("/"):
                out.append(loc)
        return out

    def _file_sql(self, con: duckdb.DuckDBPyConnection, table: str, files: list[Any], name: str,
                  registry: dict[str, Any]) -> str:
        return select_sql(table, self._raw_from(con, table, files, name, registry))

    def _raw_from(self, con: duckdb.DuckDBPyConnection, table: str, files: list[Any], name: str,
                  registry: dict[str, Any]) -> str:
        """What reads these files with their Iceberg columns as stored (``long`` hashes not cast back)."""
        paths = [f.file_path for f in files]
        if all(p.startswith("file://") or p.startswith("/") for p in paths):
            local = [p[len("file://"):] if p.startswith("file://") else p for p in paths]
            return "read_parquet([" + ", ".join(_q(p) for p in local) + "], union_by_name = true)"
        if name not in registry:
            fs, _ = ifl.location_fs(self.tables[table].location())
            dataset = ds.dataset([object_key(fs, p) for p in paths], filesystem=fs.fs, format="parquet",
                                 schema=ic.arrow_schema(table))
            con.register(name, dataset)
            registry[name] = dataset
        return name

    def raw_index(self, con: duckdb.DuckDBPyConnection, registry: dict[str, Any]) -> tuple[str, int | None] | None:
        """The run index's files as stored (its 64-bit keys the signed ``long`` Iceberg keeps, so a filter on
        them is pushed into the scan instead of into a cast of every row) and the retention floor its rows
        are read above (``last_start_unix_nano``), or None without index files."""
        files = [f for f in self.files.get(RUN_TRACES, []) if f.file_path in self.present.get(RUN_TRACES, ())]
        if not files:
            return None
        return self._raw_from(con, RUN_TRACES, files, f"_ice{self._n}_{RUN_TRACES}", registry), self.retained_before_ns()

    def recorded_runs(self) -> int | None:
        """How many runs (keys of run and trace) the run index read holds, as the snapshot that made it
        recorded (``iceberg_files.RUNS``, counted at its commit): None when it did not record one (another
        engine's commit, a migration), a listed index file is missing, or retention filters the index."""
        snap_id = self.snapshots.get(RUN_TRACES)
        tbl = self.tables.get(RUN_TRACES)
        if tbl is None or snap_id is None or self.retained_before_ns() is not None:
            return None
        if len(self.present.get(RUN_TRACES, ())) != len(self.files.get(RUN_TRACES, [])):
            return None
        snap = tbl.snapshot_by_id(snap_id)
        value = ifl.summary_props(snap).get(ifl.RUNS) if snap is not None else None
        return int(value) if value is not None else None

    def time_bounds(self, table: str) -> tuple[int, int] | None:
        """The earliest and latest time (``TIME_COLUMNS``) of the table's live files read, by their
        statistics (lower and upper bounds) alone; None when a file does not say."""
        col = TIME_COLUMNS.get(table)
        files = [f for f in self.files.get(table, []) if f.file_path in self.present.get(table, ())]
        if col is None or not files:
            return None
        fid = self.tables[table].schema().find_field(col).field_id
        lows, highs = [], []
        for f in files:
            lo, hi = (f.lower_bounds or {}).get(fid), (f.upper_bounds or {}).get(fid)
            if lo is None or hi is None:
                return None
            lows.append(int.from_bytes(lo, "little", signed=True))
            highs.append(int.from_bytes(hi, "little", signed=True))
        return min(lows), max(highs)

    def _there(self, table: str, files: list[Any]) -> list[Any]:
        """The listed files that exist: one that is gone is read around, so the reader opens and verify
        names it (a stat per local file; one listing per table on S3)."""
        paths = [f.file_path for f in files]
        if all(p.startswith("file://") or p.startswith("/") for p in paths):
            return [f for f in files if os.path.exists(object_key(None, f.file_path))]
        fs, _ = ifl.location_fs(self.tables[table].location())
        there = set(fs.list("data"))
        return [f for f in files if object_key(fs, f.file_path)[len(fs.base) + 1:] in there]

    def sources(self, con: duckdb.DuckDBPyConnection, n: int, registry: dict[str, Any]) -> dict[str, str]:
        """The SQL each table's view reads: every live file of the snapshot read."""
        self._n = n
        out: dict[str, str] = {}
        for table, files in self.files.items():
            files = self._there(table, files) if files else []
            self.present[table] = {f.file_path for f in files}
            if files:
                out[table] = self._file_sql(con, table, files, f"_ice{n}_{table}", registry)
        floor = self.retained_before_ns()
        if floor is not None and RUN_TRACES in out:
            out[RUN_TRACES] = f"SELECT * FROM ({out[RUN_TRACES]}) WHERE last_start_unix_nano >= {floor}"
        return out

    def scoped_source(self, con: duckdb.DuckDBPyConnection, table: str, column: str | None, values: Sequence[str],
                      registry: dict[str, Any], window: tuple[int | None, int | None] | None = None) -> str | None:
        """The SQL over only the files pyiceberg plans for these values and time window (None: no file can
        hold them)."""
        files = self.scoped_files(table, column, values, window)
        if not files:
            return None
        key = (table, frozenset(f.file_path for f in files))
        if key not in self._scoped:
            if len(self._scoped) > 256:  # S3 datasets registered per file set: keep the set bounded
                for name in [k for k in registry if k.startswith(f"_ices{self._n}_")]:
                    registry.pop(name, None)
                self._scoped.clear()
            name = f"_ices{self._n}_{table}_{len(self._scoped)}"
            sql = self._file_sql(con, table, files, name, registry)
            if table == RUN_TRACES and (floor := self.retained_before_ns()) is not None:
                sql = f"SELECT * FROM ({sql}) WHERE last_start_unix_nano >= {floor}"
            self._scoped[key] = sql
        return self._scoped[key]

    def run_index_keyed(self) -> bool:
        """Does every row of the run index read hold its run's key (``run_hash``), by the null counts of the
        files' statistics alone (False: not known, the rows are read)."""
        files = [f for f in self.files.get(RUN_TRACES, []) if f.file_path in self.present.get(RUN_TRACES, ())]
        if RUN_TRACES not in self.tables or not files:
            return False
        fid = self.tables[RUN_TRACES].schema().find_field("run_hash").field_id
        return all((f.null_value_counts or {}).get(fid) == 0 for f in files)

    def rows(self) -> int:
        return sum(int(f.record_count) for files in self.files.values() for f in files)

    # -- what maintenance recorded -----------------------------------------------------------
    def retention(self) -> list[dict[str, Any]]:
        tbl = self.tables.get("spans")
        if tbl is None:
            return []
        out = list(json.loads((tbl.properties or {}).get("agenttape.retention", "[]")))  # kept past expiry
        for snap in tbl.metadata.snapshots:
            props = ifl.summary_props(snap)
            if "agenttape.retention" in props:
                out.extend(json.loads(props["agenttape.retention"]))
        uniq = {json.dumps(r, sort_keys=True): r for r in out}
        return list(uniq.values())

    def retained_before_ns(self) -> int | None:
        days = [r["before"] for r in self.retention() if r.get("before")]
        if not days:
            return None
        day = dt.date.fromisoformat(max(days))
        return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp()) * 1_000_000_000

    def retained_ranges(self) -> dict[tuple[str, int], list[tuple[int, int, str]]]:
        out: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
        for rec in self.retention():
            for cid, epoch, lo, hi, head in rec.get("chains", []):
                out.setdefault((cid, int(epoch)), []).append((int(lo), int(hi), head))
        return out

    def hashes(self, table: str) -> dict[str, str]:
        """Full path -> sha256 of each file, as the snapshots that added them recorded."""
        tbl = self.tables[table]
        base = tbl.location().rstrip("/")
        out: dict[str, str] = dict(json.loads((tbl.properties or {}).get(ifl.HASHES, "{}")))  # kept past expiry
        for snap in tbl.metadata.snapshots:
            props = ifl.summary_props(snap)
            for key, digest in json.loads(props.get(ifl.HASHES, "{}")).items():
                out[key if "://" in key else f"{base}/{key}"] = digest
        return out

    def check_files(self, hashes: bool = True) -> list[dict[str, Any]]:
        """Every live file: missing, another size than the catalog lists, another sha256 than recorded."""
        problems: list[dict[str, Any]] = []
        for table, files in self.files.items():
            if not files:
                continue
            fs, _ = ifl.location_fs(self.tables[table].location())
            known = self.hashes(table) if hashes else {}
            keys = [object_key(fs, f.file_path) for f in files]
            sizes = fs.fs.get_file_info(keys)
            for f, info in zip(files, sizes):
                where = f.file_path
                if info.type.name != "File":
                    problems.append({"file": where, "problem": "missing: listed in the Iceberg table but not there"})
                elif int(info.size) != int(f.file_size_in_bytes):
                    problems.append({"file": where, "problem": f"size {info.size} bytes, the table lists "
                                                              f"{f.file_size_in_bytes}: edited or replaced"})
                elif hashes and where in known and _sha256(fs, object_key(fs, where)) != known[where]:
                    problems.append({"file": where, "problem": "sha256 differs from the snapshot that added it: edited"})
        return problems


def object_key(fs: LakeFS | None, path: str) -> str:
    """A data file's Iceberg path as its file system opens it (no ``file://`` or ``s3://`` scheme)."""
    if path.startswith("file://"):
        return path[len("file://"):]
    if path.startswith("s3://"):
        return path[len("s3://"):]
    return path


def _sha256(fs: LakeFS, path: str) -> str:
    h = hashlib.sha256()
    with fs.fs.open_input_stream(path) as fh:
        while chunk := fh.read(8 * 1024 * 1024):
            h.update(chunk)
    return h.hexdigest()


def open_iceberg(urls: Sequence[str]) -> list[IcebergLake]:
    return [IcebergLake(u) for u in urls]
