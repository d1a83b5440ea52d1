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


def plan(tbl: Any, row_filter: Any = None) -> list[Any]:
    """The live data files of a table (pyiceberg's scan planning), pruned by ``row_filter`` if given."""
    from pyiceberg.expressions import AlwaysTrue

    if tbl.current_snapshot() is None:
        return []
    return [task.file for task in tbl.scan(row_filter=row_filter or AlwaysTrue()).plan_files()]


def trace_filter(trace_id: str, since_ns: int | None = None) -> Any:
    """A filter that prunes to one trace (its bucket and min/max) and, with ``since_ns``, to its days."""
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual

    f: Any = EqualTo("trace_id", trace_id)
    if since_ns is not None:
        day = dt.datetime.fromtimestamp(since_ns / 1e9, dt.timezone.utc).date()
        f = And(f, GreaterThanOrEqual("date", day.isoformat()))
    return f


class IcebergLake:
    """One Iceberg lake opened for reading: its tables and the files each read over."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.catalog, self.parsed = ic.load(url)
        self.tables = ic.load_tables(self.catalog, self.parsed.namespace)
        self.files: dict[str, list[Any]] = {t: plan(tbl) for t, tbl in self.tables.items()}

    def local_roots(self) -> list[str]:
        out = []
        for tbl in self.tables.values():
            loc = tbl.location()
            if loc.startswith("file://"):
                out.append(loc[len("file://"):])
            elif loc.startswith("/"):
                out.append(loc)
        return out

    def sources(self, con: duckdb.DuckDBPyConnection, n: int, registry: dict[str, Any]) -> dict[str, str]:
        out: dict[str, str] = {}
        for table, files in self.files.items():
            if not files:
                continue
            paths = [f.file_path for f in files]
            if all(p.startswith("file://") or p.startswith("/") for p in paths):
                local = [p[len("file://"):] if p.startswith("file://") else p for p in paths]
                # a listed file that is gone is read around, so the reader opens and verify names it
                local = [p for p in local if os.path.exists(p)]
                if not local:
                    continue
                src = "read_parquet([" + ", ".join(_q(p) for p in local) + "], union_by_name = true)"
            else:
                fs, _ = ifl.location_fs(self.tables[table].location())
                name = f"_ice{n}_{table}"
                dataset = ds.dataset([p[len("s3://"):] for p in paths], filesystem=fs.fs, format="parquet",
                                     schema=ic.arrow_schema(table))
                con.register(name, dataset)
                registry[name] = dataset
                src = name
            out[table] = select_sql(table, src)
        floor = self.retained_before_ns()
        if floor is not None and RUN_TRACES in out:
            out[RUN_TRACES] = f"SELECT * FROM ({out[RUN_TRACES]}) WHERE last_start_unix_nano >= {floor}"
        return out

    def rows(self) -> int:
        return sum(int(f.record_count) for files in self.files.values() for f in files)

    # -- what maintenance recorded -----------------------------------------------------------
    def retention(self) -> list[dict[str, Any]]:
        tbl = self.tables.get("spans")
        if tbl is None:
            return []
        out = []
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
        out: dict[str, str] = {}
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
            keys = [_key(fs, f.file_path) for f in files]
            sizes = fs.fs.get_file_info(keys)
            for f, info in zip(files, sizes):
                where = f.file_path
                if info.type.name != "File":
                    problems.append({"file": where, "problem": "missing: listed in the Iceberg table but not there"})
                elif int(info.size) != int(f.file_size_in_bytes):
                    problems.append({"file": where, "problem": f"size {info.size} bytes, the table lists "
                                                              f"{f.file_size_in_bytes}: edited or replaced"})
                elif hashes and where in known and _sha256(fs, _key(fs, where)) != known[where]:
                    problems.append({"file": where, "problem": "sha256 differs from the snapshot that added it: edited"})
        return problems


def _key(fs: LakeFS, path: str) -> str:
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
