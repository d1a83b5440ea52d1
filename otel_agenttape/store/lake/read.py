"""Reading one or more lakes (and DuckDB stores) as one store: DuckDB views over the live files.

The file list comes from the manifest (``manifest.load_catalog``), never from a recursive listing.
A local lake is read by DuckDB's own Parquet reader over that explicit list; an S3 lake through
``pyarrow.dataset`` over ``S3FileSystem`` registered in DuckDB (filters and projections are pushed
down to the Parquet row groups either way). Several sources (``open_sources([...])``) are one store:
each table is the union of its parts, so a run whose child runs were routed to other receivers, or
published into another lake, rebuilds as one tree.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from otel_agenttape.store import parquet as pqlake
from otel_agenttape.store import rows, schema, views
from otel_agenttape.store.lake import manifest as mf
from otel_agenttape.store.lake.files import RUN_TRACES, RUN_TRACES_SCHEMA
from otel_agenttape.store.lake.fs import LakeError, LakeFS, is_lake_uri, lake_fs
from otel_agenttape.store.readers import ConnectionReader, StoreError, StoreOpenError, is_lake, open_error_message

_RUN_TRACES_COLS = ", ".join(RUN_TRACES_SCHEMA.names)


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _table_schema(table: str) -> pa.Schema:
    return RUN_TRACES_SCHEMA if table == RUN_TRACES else rows.SCHEMAS[table]


def scan_sql(con: duckdb.DuckDBPyConnection, lake: LakeFS, table: str, keys: Sequence[str], name: str,
             registry: dict[str, Any] | None = None) -> str:
    """A ``SELECT`` over these files of one table (``date`` from the folder name for dated tables).

    An object-store lake is a ``pyarrow`` dataset registered on ``con`` under ``name``; such a
    registration belongs to that connection alone, so it is also kept in ``registry`` for the cursors a
    reader opens later (``ConnectionReader.new_cursor``)."""
    cols = ", ".join(_table_schema(table).names)
    hive = table in pqlake.PARTITIONED
    if lake.local:
        paths = "[" + ", ".join(_q(lake.path(k)) for k in keys) + "]"
        if table == RUN_TRACES:
            cols = _index_columns(lake.path(keys[-1]))
        opts = ", hive_partitioning = true, hive_types = {'date': DATE}" if hive else ", hive_partitioning = false"
        return f"SELECT {cols} FROM read_parquet({paths}{opts}, union_by_name = true)"
    part = ds.partitioning(pa.schema([("date", pa.date32())]), flavor="hive") if hive else None
    dataset = ds.dataset(
        [lake.path(k) for k in keys], filesystem=lake.fs, format="parquet", schema=_table_schema(table),
        partitioning=part, partition_base_dir=lake.path(table) if hive else None,
    )
    con.register(name, dataset)
    if registry is not None:
        registry[name] = dataset
    return f"SELECT {cols} FROM {name}"


def _index_columns(newest: str) -> str:
    """The run index's columns, read from files that may predate its newest column (a lake published
    by an earlier version): what the newest file lacks is NULL, and readers fall back to the spans."""
    import pyarrow.parquet as pq

    have = set(pq.read_schema(newest).names)
    return ", ".join(n if n in have else f"CAST(NULL AS {_DUCK_TYPES[RUN_TRACES_SCHEMA.field(n).type]}) AS {n}"
                     for n in RUN_TRACES_SCHEMA.names)


_DUCK_TYPES = {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.uint64(): "UBIGINT"}


def _empty_index() -> str:
    """An empty run index with the index's columns (no source has one)."""
    cols = ", ".join(f"NULL::{_DUCK_TYPES[f.type]} AS {f.name}" for f in RUN_TRACES_SCHEMA)
    return f"CREATE TABLE {RUN_TRACES} AS SELECT * FROM (SELECT {cols}) WHERE false"


def _lake_sources(con: duckdb.DuckDBPyConnection, cat: mf.Catalog, n: int, missing: set[str],
                  registry: dict[str, Any] | None = None) -> dict[str, str]:
    """One SQL source per table with live files in this lake (files missing from the lake are left out:
    verification reports them, reads answer from what is there)."""
    out: dict[str, str] = {}
    for table in (*schema.TABLES, RUN_TRACES):
        files = [f for f in cat.table_files(table) if f["key"] not in missing]
        if files:
            out[table] = scan_sql(con, cat.lake, table, [f["key"] for f in files], f"_lake{n}_{table}", registry)
    floor = retained_before_ns(cat)
    if floor is not None and RUN_TRACES in out:  # the index is not dated: retention leaves its rows
        out[RUN_TRACES] = f"SELECT * FROM ({out[RUN_TRACES]}) WHERE last_start_unix_nano >= {floor}"
    return out


def retained_before_ns(cat: mf.Catalog) -> int | None:
    """The first instant retention kept (UTC midnight of the latest ``before`` date), or None: every span
    that started earlier was in a dated partition that retention removed."""
    import datetime as dt

    days = [r["before"] for r in cat.retention if r.get("before")]
    if not days:
        return None
    day = dt.date.fromisoformat(max(days))
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp()) * 1_000_000_000


def _duckdb_sources(con: duckdb.DuckDBPyConnection, path: str, n: int) -> dict[str, str]:
    alias = f"_store{n}"
    try:
        con.execute(f"ATTACH {_q(os.path.abspath(path))} AS {alias} (READ_ONLY)")
    except duckdb.Error as exc:
        raise StoreOpenError(open_error_message(path, exc) + " (a store held by `agenttape serve` is read through "
                             "its lake, or its server: --db)") from exc
    out = {t: f"SELECT {', '.join(schema.column_names(t))} FROM {alias}.main.{t}" for t in schema.TABLES}
    out[RUN_TRACES] = pqlake.RUN_TRACES_SQL.replace("FROM spans", f"FROM {alias}.main.spans").split(" ORDER BY")[0]
    return out


def _is_export(src: str) -> bool:
    return os.path.isdir(src) and is_lake(src)


def _folder_catalog(lake: LakeFS) -> mf.Catalog:
    """The files of an exported lake folder, listed by walking it (it has no manifest)."""
    cat = mf.Catalog(lake)
    for table in (*schema.TABLES, RUN_TRACES):
        for key, size in lake.list(table).items():
            if key.endswith(".parquet"):
                part = key.split("/date=")
                day = part[1][:10] if len(part) > 1 else None
                cat.files[key] = {"table": table, "key": key, "bytes": size, "date": day}
    return cat


class LakeSet:
    """The catalogs a reader was opened over; verification asks it about files and retention."""

    def __init__(self, catalogs: list[mf.Catalog], missing: list[tuple[mf.Catalog, str]],
                 icebergs: Sequence[Any] = ()) -> None:
        self.catalogs = catalogs
        self.missing = missing  # (catalog, key) of listed files not in the lake when it was opened
        self.icebergs = list(icebergs)  # iceberg_read.IcebergLake: they answer for their own tables

    def retained_ranges(self) -> dict[tuple[str, int], list[tuple[int, int, str]]]:
        out: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
        for cat in self.catalogs:
            for k, v in cat.retained_ranges().items():
                out.setdefault(k, []).extend(v)
        for ice in self.icebergs:
            for k, v in ice.retained_ranges().items():
                out.setdefault(k, []).extend(v)
        return out

    def check_files(self, hashes: bool = True) -> list[dict[str, Any]]:
        """Every live file the manifest lists, checked: missing, another size, another sha256."""
        problems: list[dict[str, Any]] = [
            {"file": f"{cat.lake.uri}/{key}", "problem": "missing: listed in the lake manifest but not there"}
            for cat, key in self.missing]
        for cat in self.catalogs:
            recs = sorted(cat.files.values(), key=lambda f: f["key"])
            sizes = cat.lake.sizes([f["key"] for f in recs]) if recs else {}
            for f in recs:
                where = f"{cat.lake.uri}/{f['key']}"
                size = sizes.get(f["key"])
                if any(c is cat and k == f["key"] for c, k in self.missing):
                    continue
                if size is None:
                    problems.append({"file": where, "problem": "missing: listed in the lake manifest but not there"})
                elif size != f["bytes"]:
                    problems.append({"file": where, "problem": f"size {size} bytes, the manifest says {f['bytes']}: "
                                                              "edited or replaced"})
                elif hashes and mf.file_sha256(cat.lake, f["key"]) != f["sha256"]:
                    problems.append({"file": where, "problem": "sha256 differs from the manifest: edited"})
        for ice in self.icebergs:
            problems.extend(ice.check_files(hashes))
        return problems

    def files(self) -> int:
        return sum(len(c.files) for c in self.catalogs) + sum(len(v) for i in self.icebergs for v in i.files.values())


class ScopedSources:
    """A lookup by trace id (or run id) over an Iceberg lake reads only the files pyiceberg plans for those
    ids, not the whole view: ``scoped(table, column, ids)`` is the SQL to read instead of ``table``."""

    COLUMNS = {"trace_id": ("spans", "span_events", "span_links", "log_records", RUN_TRACES),
               "run_id": (RUN_TRACES,)}

    def __init__(self, reader: ConnectionReader, icebergs: Sequence[Any], plain: dict[str, list[str]]) -> None:
        self.reader = reader
        self.icebergs = list(icebergs)
        self.plain = plain

    def __call__(self, table: str, column: str | None, values: Sequence[str],
                 window: tuple[int | None, int | None] | None = None) -> str | None:
        """``(SELECT ...)`` over the files that can hold these values (``column`` None: any) with a time in
        ``window`` (lo, hi: the time of ``iceberg_read.TIME_COLUMNS``), or None to read the whole view."""
        from otel_agenttape.store.lake.iceberg_read import TIME_COLUMNS

        if column is None:
            if window is None or table not in TIME_COLUMNS:
                return None
        elif table not in self.COLUMNS.get(column, ()) or not values or len(values) > 1000:
            return None
        sqls = list(self.plain.get(table, []))
        for ice in self.icebergs:
            sql = ice.scoped_source(self.reader.con, table, column, values, self.reader.registered, window)
            if sql is not None:
                sqls.append(sql)
        if not sqls:  # no file can hold them: an empty relation of the view's columns
            return f"(SELECT * FROM {table} WHERE false)"
        return "(" + " UNION ALL BY NAME ".join(f"({s})" for s in sqls) + ")"


def open_sources(sources: Sequence[str | os.PathLike[str]]) -> Any:
    """One reader over lakes (Iceberg catalogs by URL, folders with ``_manifest/`` or ``s3://`` URIs) and
    DuckDB files together."""
    from otel_agenttape.store.lake.iceberg_catalog import is_iceberg_uri
    from otel_agenttape.store.lake.iceberg_read import IcebergLake

    if not sources:
        raise StoreError("no source: give a lake (--lake) or a store")
    con = duckdb.connect(":memory:")
    parts: dict[str, list[str]] = {t: [] for t in (*schema.TABLES, RUN_TRACES)}
    catalogs: list[mf.Catalog] = []
    missing: list[tuple[mf.Catalog, str]] = []
    allowed: list[str] = []
    registry: dict[str, Any] = {}
    icebergs: list[Any] = []
    plain: dict[str, list[str]] = {t: [] for t in parts}  # the parts that are not Iceberg tables
    try:
        for n, src in enumerate(os.fspath(s) for s in sources):
            if is_iceberg_uri(src):
                ice = IcebergLake(src)
                if not ice.tables:
                    raise StoreError(f"{src} holds no agenttape tables (namespace {ice.parsed.namespace}): "
                                     "nothing published there yet")
                icebergs.append(ice)
                allowed.extend(ice.local_roots())
                found = ice.sources(con, n, registry)
            elif is_lake_uri(src):
                lake = lake_fs(src)
                cat = mf.load_catalog(lake)
                if not cat.listed:
                    raise StoreError(f"{src} holds no lake manifest (_manifest/): nothing published there yet")
                catalogs.append(cat)
                if lake.local:
                    allowed.append(lake.base)
                keys = sorted(cat.files)
                gone = {k for k, size in (lake.sizes(keys) if keys else {}).items() if size is None}
                missing.extend((cat, k) for k in sorted(gone))
                found = _lake_sources(con, cat, n, gone, registry)
            elif os.path.isfile(src):
                found = _duckdb_sources(con, src, n)
            elif _is_export(src):  # a folder written by `export parquet` or `--parquet-dir`: no manifest
                cat = _folder_catalog(lake_fs(src))
                allowed.append(cat.lake.base)
                found = _lake_sources(con, cat, n, set(), registry)
            else:
                raise StoreError(f"{src} is neither a lake (a folder with _manifest/, or s3://...) nor a DuckDB file")
            for t, sql in found.items():
                parts[t].append(sql)
                if not is_iceberg_uri(src):
                    plain[t].append(sql)
        for t, sqls in parts.items():
            if not sqls:
                if t == RUN_TRACES:
                    con.execute(_empty_index())
                else:
                    con.execute(schema.table_ddl(t))
                continue
            body = " UNION ALL BY NAME ".join(f"({s})" for s in sqls)
            if t == "resources":  # the same resource reaches several receivers: list it once
                body = f"SELECT * FROM ({body}) QUALIFY row_number() OVER (PARTITION BY resource_id) = 1"
            con.execute(f"CREATE VIEW {t} AS {body}")
        views.create_views(con)
        con.execute("SET parquet_metadata_cache = true")
        if allowed:
            con.execute("SET allowed_directories = [" + ", ".join(_q(a + "/") for a in allowed) + "]")
        con.execute("SET enable_external_access = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET lock_configuration = true")
    except (duckdb.Error, LakeError, ValueError) as exc:
        con.close()
        raise StoreError(str(exc)) from exc
    except BaseException:
        con.close()
        raise
    reader = ConnectionReader(con, description=", ".join(os.fspath(s) for s in sources), kind="lake",
                              registered=registry)
    reader.lakes = LakeSet(catalogs, missing, icebergs)  # type: ignore[attr-defined]
    reader.run_index_view = RUN_TRACES  # type: ignore[attr-defined]
    if icebergs:
        reader.scoped_source = ScopedSources(reader, icebergs, plain)  # type: ignore[attr-defined]
        if not plain[RUN_TRACES]:  # the run index is Iceberg's alone: its statistics say whether it is keyed
            reader.run_index_keyed = lambda: all(i.run_index_keyed() for i in icebergs)  # type: ignore[attr-defined]
        if len(icebergs) == 1 and not any(plain.values()):  # one Iceberg lake alone: its own count and bounds
            ice = icebergs[0]
            reader.run_index_raw = lambda: ice.raw_index(con, registry)  # type: ignore[attr-defined]
            reader.run_index_recorded = ice.recorded_runs  # type: ignore[attr-defined]
            reader.span_time_bounds = lambda: ice.time_bounds("spans")  # type: ignore[attr-defined]
    # the views read the files listed when the reader was opened, and a lake file is never rewritten (a
    # DuckDB file is attached read-only): what the reader answers cannot change while it is open, so the
    # read model keeps a runs page's keys under this version (tape/read/kept.store_version)
    reader.fixed_version = (sum(int(f.get("rows") or 0) for c in catalogs for f in c.files.values())
                            + sum(i.rows() for i in icebergs))  # type: ignore[attr-defined]
    return reader
