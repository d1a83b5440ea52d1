"""Writing one lake Parquet file from a stream of rows, and the run index of a batch of spans.

Rows stream from a DuckDB query in store order into one ``ParquetWriter`` (row groups of
``parquet.ROW_GROUP_ROWS``), so memory stays at about one row group whatever the batch size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from otel_agenttape.store import parquet as pqlake
from otel_agenttape.store import rows
from otel_agenttape.store.lake.fs import LakeFS

RUN_TRACES = pqlake.RUN_TRACES
RUN_TRACES_SCHEMA = pa.schema(pqlake._RUN_TRACES_FIELDS)  # noqa: SLF001 - one definition of the index


def file_schema(table: str) -> pa.Schema:
    if table == RUN_TRACES:
        return RUN_TRACES_SCHEMA
    return pqlake._file_schema(table)  # noqa: SLF001 - the lake's one file layout


def _conform(table: str, t: pa.Table) -> pa.Table:
    if table == RUN_TRACES:
        return t.cast(RUN_TRACES_SCHEMA)
    t = pqlake._conform(table, t)  # noqa: SLF001
    return t.drop_columns(["date"]) if "date" in t.column_names else t


def write_stream(lake: LakeFS, key: str, table: str, batches: Iterable[pa.RecordBatch | pa.Table],
                 level: int = pqlake.ZSTD_LEVEL_STREAM) -> dict[str, Any] | None:
    """Write the rows of ``batches`` as one Parquet file ``key`` (atomically); returns its file record
    (rows, bytes, sha256, time range) or None when there were no rows (nothing is written)."""
    sch = file_schema(table)
    time_col = "time_unix_nano" if table in ("span_events", "log_records") else "start_time_unix_nano"
    n = 0
    lo: int | None = None
    hi: int | None = None
    pending: list[pa.Table] = []
    pending_rows = 0
    with lake.staged(key) as tmp:
        writer: pq.ParquetWriter | None = None
        try:
            def flush() -> None:
                nonlocal writer, pending, pending_rows
                if not pending:
                    return
                t = pa.concat_tables(pending)
                pending, pending_rows = [], 0
                if writer is None:
                    writer = pq.ParquetWriter(tmp, sch, **pqlake.writer_options(sch.names, level))
                writer.write_table(t, row_group_size=pqlake.ROW_GROUP_ROWS)

            for b in batches:
                t = b if isinstance(b, pa.Table) else pa.Table.from_batches([b])
                if t.num_rows == 0:
                    continue
                t = _conform(table, t)
                if time_col in t.column_names:
                    import pyarrow.compute as pc

                    mm = pc.min_max(t.column(time_col)).as_py()
                    if mm["min"] is not None:
                        lo = mm["min"] if lo is None else min(lo, mm["min"])
                        hi = mm["max"] if hi is None else max(hi, mm["max"])
                n += t.num_rows
                pending.append(t)
                pending_rows += t.num_rows
                if pending_rows >= pqlake.ROW_GROUP_ROWS:
                    flush()
            flush()
        finally:
            if writer is not None:
                writer.close()
        if n == 0:
            raise _Empty
        size, digest = size_and_hash(tmp)
    return {"table": table, "key": key, "rows": n, "bytes": size, "sha256": digest, "min_time": lo, "max_time": hi}


class _Empty(Exception):
    """No rows: the staged file is discarded (raised inside ``staged`` so nothing is published)."""


def write_or_skip(lake: LakeFS, key: str, table: str, batches: Iterable[Any], level: int = pqlake.ZSTD_LEVEL_STREAM
                  ) -> dict[str, Any] | None:
    try:
        return write_stream(lake, key, table, batches, level)
    except _Empty:
        return None


def size_and_hash(path: str) -> tuple[int, str]:
    """A written file's size and sha256 (hex), read back in 8 MiB pieces: what a lake records of it."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(8 * 1024 * 1024):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def schema_columns(table: str) -> list[str]:
    return list(rows.SCHEMAS[table].names) if table != RUN_TRACES else list(RUN_TRACES_SCHEMA.names)
