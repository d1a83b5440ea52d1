"""The Parquet lake: one folder per table, Hive-partitioned by UTC date, zstd, rows sorted for pruning.

Layout: ``DIR/spans/date=YYYY-MM-DD/part-*.parquet`` (likewise span_events, span_links, log_records);
``DIR/resources/part-*.parquet`` (no date). The ``date`` column lives in the folder name, as Hive
partitioning expects, so ``read_parquet('DIR/spans/**/*.parquet', hive_partitioning=true)`` returns
the DuckDB table's columns. Rows are sorted by (trace_id, time) so min/max statistics prune a
trace lookup to a few row groups. Every file is written to a hidden ``.tmp`` name and renamed into
place, so a reader never sees a partial file.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from otel_agenttape.store import rows, schema
from otel_agenttape.store.ddl import RUN_KEY_SQL
from otel_agenttape.store.runs_view import OURS_ROLE

PARTITIONED = ("spans", "span_events", "span_links", "log_records")
SORT_KEYS: dict[str, list[str]] = {
    # spans and events by time: a run's or a tree's rows (several traces) sit in one or two row groups,
    # found by the time window a rebuild always has (from ``run_traces``); trace_id statistics still
    # bound a lookup by trace id alone
    "spans": ["start_time_unix_nano", "trace_id", "span_id"],
    "span_events": ["time_unix_nano", "trace_id", "span_id", "event_index"],
    "span_links": ["trace_id", "span_id", "link_index"],
    "log_records": ["trace_id", "time_unix_nano", "log_id"],
    "resources": ["resource_id"],
}
# Times are written as deltas (DELTA_BINARY_PACKED): rows are sorted by time, so the differences are
# small and take a few bits each. Against plain values under zstd this made a 1,000,000-span lake 14
# bytes per span smaller (spans 66.6 -> 59.7, span events 24.3 -> 17.2; bench/lake.py's data).
_DELTA = {"start_time_unix_nano", "end_time_unix_nano", "time_unix_nano", "observed_time_unix_nano",
          "last_start_unix_nano", "run_start_unix_nano"}
# Columns with few distinct values per file are dictionary-encoded; long unique text, random ids and
# keys are not worth it (a dictionary of unique values costs its indices on top of the values).
_NO_DICT = {"attributes", "body", "trace_id", "span_id", "parent_span_id", "log_id", "linked_trace_id",
            "linked_span_id", "chain_hash", "chain_prev", "run_hash", "trace_hash"} | _DELTA
# zstd level: 9 for one-shot exports (about 6% smaller than 3); 3 for the continuous sink, where
# level 9 would cost about 4x the CPU of level 3 per span on the ingest machine (bench/store_size.py)
ZSTD_LEVEL_EXPORT = 9
ZSTD_LEVEL_STREAM = 3
ROW_GROUP_ROWS = 64 * 1024
DATA_PAGE_BYTES = 8 * 1024 * 1024


def _file_schema(table: str) -> pa.Schema:
    sch = rows.SCHEMAS[table]
    return sch.remove(sch.get_field_index("date")) if table in PARTITIONED else sch


def writer_options(columns: list[str], level: int = ZSTD_LEVEL_EXPORT) -> dict[str, Any]:
    """The Parquet writer settings of every lake file with these columns (``pq.write_table`` and
    ``pq.ParquetWriter`` take the same keywords): zstd, dictionaries for repeated values, deltas for times."""
    return {"compression": "zstd", "compression_level": level,
            "use_dictionary": [c for c in columns if c not in _NO_DICT],
            "column_encoding": {c: "DELTA_BINARY_PACKED" for c in columns if c in _DELTA} or None,
            "data_page_size": DATA_PAGE_BYTES, "write_statistics": True}


def write_file(table: pa.Table, path: str, level: int = ZSTD_LEVEL_EXPORT) -> int:
    """Write one Parquet file atomically (hidden tmp name, fsync, rename); returns its size."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    pq.write_table(table, tmp, row_group_size=ROW_GROUP_ROWS, **writer_options(table.column_names, level))
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return os.path.getsize(path)


def _sorted(name: str, table: pa.Table) -> pa.Table:
    keys = [k for k in SORT_KEYS[name] if k in table.column_names]
    return table.sort_by([(k, "ascending") for k in keys]) if table.num_rows > 1 else table


def _conform(name: str, table: pa.Table) -> pa.Table:
    """Same column order and types as the store schema (readers may return plain strings for JSON)."""
    sch = rows.SCHEMAS[name]
    cols = []
    for f in sch:
        col = table.column(f.name)
        if col.type != f.type:
            if isinstance(f.type, pa.ExtensionType):
                storage = col.cast(f.type.storage_type) if col.type != f.type.storage_type else col
                col = pa.chunked_array(
                    [pa.ExtensionArray.from_storage(f.type, c) for c in storage.chunks], type=f.type
                )
            else:
                col = col.cast(f.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=sch)


def write_partitions(
    name: str, table: pa.Table, root: str, prefix: str = "part", level: int = ZSTD_LEVEL_EXPORT
) -> list[str]:
    """Split ``table`` by date, sort each part and write one file per date; returns the file paths."""
    if table.num_rows == 0:
        return []
    table = _conform(name, table)
    stamp = f"{prefix}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:12]}.parquet"
    paths = []
    if name not in PARTITIONED:
        path = os.path.join(root, name, stamp)
        write_file(_sorted(name, table), path, level)
        return [path]
    dates = pc.unique(table.column("date")).to_pylist()
    for day in sorted(dates):
        part = table.filter(pc.equal(table.column("date"), pa.scalar(day, pa.date32())))
        part = _sorted(name, part.drop_columns(["date"]))
        path = os.path.join(root, name, f"date={day.isoformat()}", stamp)
        write_file(part, path, level)
        paths.append(path)
    return paths


def export_parquet(reader: Any, root: str, overwrite: bool = False) -> dict[str, int]:
    """Write every table of a store to a lake at ``root`` (one-shot); returns rows written per table."""
    existing = [t for t in (*schema.TABLES, "run_traces") if os.path.isdir(os.path.join(root, t))]
    if existing and not overwrite:
        raise FileExistsError(f"{root} already holds {', '.join(existing)}; pass --overwrite (overwrite=True) to replace them")
    for t in existing:
        shutil.rmtree(os.path.join(root, t))
    os.makedirs(root, exist_ok=True)
    counts: dict[str, int] = {}
    for name in schema.TABLES:
        n = 0
        if name in PARTITIONED:
            days = reader.query(f"SELECT DISTINCT date FROM {name} ORDER BY date").column(0).to_pylist()
            for day in days:
                order = ", ".join(SORT_KEYS[name])
                part = reader.query(
                    f"SELECT * FROM {name} WHERE date = CAST(? AS DATE) ORDER BY {order}", [day.isoformat()]
                )
                write_partitions(name, part, root)
                n += part.num_rows
        else:
            part = reader.query(f"SELECT * FROM {name} ORDER BY resource_id")
            write_partitions(name, part, root)
            n = part.num_rows
        counts[name] = n
    counts[RUN_TRACES] = export_run_traces(root)
    return counts


RUN_TRACES = "run_traces"
SPAN_FILES_KEY = b"agenttape.span_files"
# The lake's run index: where each run is, without scanning spans.run_id / spans.parent_run_id.
# ``run_start_unix_nano``: the start of the run's own run span(s), the time the runs view lists the run
# at; ``run_hash``/``trace_hash``: the run's key (``store.ddl.RUN_KEY_SQL``). A page of runs is cut
# from this index alone (``tape/read/index_keys``).
RUN_TRACES_SQL = f"""SELECT run_id, trace_id, parent_run_id,
       min(start_time_unix_nano) AS start_time_unix_nano, max(start_time_unix_nano) AS last_start_unix_nano,
       max(end_time_unix_nano) AS end_time_unix_nano, count(*)::BIGINT AS spans,
       min(start_time_unix_nano) FILTER (WHERE ({OURS_ROLE}) = 'run') AS run_start_unix_nano, {RUN_KEY_SQL}
FROM spans WHERE run_id IS NOT NULL OR parent_run_id IS NOT NULL
GROUP BY run_id, trace_id, parent_run_id ORDER BY run_id, trace_id, parent_run_id"""


def export_run_traces(root: str) -> int:
    """Write ``root/run_traces/part-*.parquet``: one row per (run, trace, parent run) of the lake's span
    files, sorted by run id, with those files' names in the Parquet key/value metadata
    (``agenttape.span_files``) so a reader can tell when the lake gained files since. Computed from the
    files themselves, so it matches them even if the source store was written to during the export.
    Returns its rows."""
    import duckdb

    folder = os.path.join(root, RUN_TRACES)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    files = sorted(glob.glob(os.path.join(root, "spans", "**", "*.parquet"), recursive=True))
    if files:
        con = duckdb.connect(":memory:")
        try:
            src = "read_parquet([" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "])"
            table = con.sql(RUN_TRACES_SQL.replace("FROM spans", f"FROM {src}")).to_arrow_table()
        finally:
            con.close()
    else:
        table = pa.schema(_RUN_TRACES_FIELDS).empty_table()
    table = table.cast(pa.schema(_RUN_TRACES_FIELDS)).replace_schema_metadata(
        {SPAN_FILES_KEY: json.dumps([os.path.relpath(f, root) for f in files]).encode()})
    stamp = f"part-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:12]}.parquet"
    write_file(table, os.path.join(folder, stamp))
    return table.num_rows


_RUN_TRACES_FIELDS = [
    ("run_id", pa.string()), ("trace_id", pa.string()), ("parent_run_id", pa.string()),
    ("start_time_unix_nano", pa.int64()), ("last_start_unix_nano", pa.int64()), ("end_time_unix_nano", pa.int64()),
    ("spans", pa.int64()), ("run_start_unix_nano", pa.int64()), ("run_hash", pa.uint64()),
    ("trace_hash", pa.uint64()),
]


def lake_dataset(root: str, table: str) -> ds.Dataset:
    """A pyarrow dataset over one lake table with the store's column types (``date`` as date32)."""
    part = ds.partitioning(pa.schema([("date", pa.date32())]), flavor="hive") if table in PARTITIONED else None
    return ds.dataset(
        os.path.join(root, table),
        format="parquet",
        partitioning=part,
        schema=rows.SCHEMAS[table],
        exclude_invalid_files=False,
        ignore_prefixes=[".", "_"],
    )


class ParquetSink:
    """Continuous lake writer: buffers stored rows and rolls a file per table and date by size or age.

    The receiver calls ``append(result.tables)`` after each DuckDB write; ``close()`` flushes the rest.
    Rows are already deduplicated by the store, so the lake holds each span once.
    """

    def __init__(
        self,
        root: str,
        max_bytes: int = 64 * 1024 * 1024,
        max_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        level: int = ZSTD_LEVEL_STREAM,
    ) -> None:
        self.root = root
        self.level = level
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._buf: dict[str, list[pa.Table]] = {}
        self._bytes = 0
        self._since: float | None = None
        self.files_written = 0
        os.makedirs(root, exist_ok=True)

    def append(self, tables: Mapping[str, pa.Table]) -> list[str]:
        """Buffer rows; returns the files written if this call rolled them."""
        with self._lock:
            for name, table in tables.items():
                if name in schema.TABLES and table is not None and table.num_rows:
                    self._buf.setdefault(name, []).append(table)
                    self._bytes += table.nbytes
                    if self._since is None:
                        self._since = self._clock()
            if self._due():
                return self._flush_locked()
        return []

    def _due(self) -> bool:
        if not self._buf:
            return False
        if self._bytes >= self.max_bytes:
            return True
        return self._since is not None and self._clock() - self._since >= self.max_seconds

    def maybe_roll(self) -> list[str]:
        """Roll by age even when no new rows arrive (call it from a timer)."""
        with self._lock:
            return self._flush_locked() if self._due() else []

    def flush(self) -> list[str]:
        """Write everything buffered now."""
        with self._lock:
            return self._flush_locked()

    def _flush_locked(self) -> list[str]:
        written: list[str] = []
        buf, self._buf = self._buf, {}
        self._bytes = 0
        self._since = None
        for name, parts in buf.items():
            table = pa.concat_tables([_conform(name, p) for p in parts])
            written.extend(write_partitions(name, table, self.root, level=self.level))
        self.files_written += len(written)
        return written

    def close(self) -> None:
        self.flush()
