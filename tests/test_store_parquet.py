"""The Parquet lake: one-shot export and the rolling sink, read back by DuckDB and pyarrow."""

from __future__ import annotations

import glob
import json
import os

import duckdb
import pyarrow.parquet as pq
import pytest

from otel_agenttape.store import parquet, samples, schema
from otel_agenttape.store.reader import open_reader
from otel_agenttape.store.writer import Store

from test_store_rows import I64_MAX, T0, _logs_request, _typed_spans

DAY2 = 1_767_312_000_000_000_000  # 2026-01-02


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "p.duckdb"))
    s.write_traces(_typed_spans())
    s.write_traces(samples.genai_requests(n_runs=2))
    s.write_traces(samples.genai_requests(n_runs=1, seed=3, start_ns=DAY2))
    s.write_logs([_logs_request()])
    yield s
    s.close()


def _duck_rows(con, sql):
    return sorted(con.execute(sql).fetchall(), key=repr)


def test_export_round_trip_duckdb_and_pyarrow(store, tmp_path):
    lake = str(tmp_path / "lake")
    counts = parquet.export_parquet(store.reader(), lake)
    assert counts["spans"] == 2 + 8 + 4 and counts["log_records"] == 2 and counts["resources"] == 3
    assert sorted(os.listdir(os.path.join(lake, "spans"))) == ["date=2026-01-01", "date=2026-01-02"]
    assert glob.glob(os.path.join(lake, "resources", "*.parquet"))
    meta = pq.ParquetFile(glob.glob(os.path.join(lake, "spans", "date=2026-01-01", "*.parquet"))[0]).metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"
    con = duckdb.connect()
    for table in ("spans", "span_events", "span_links", "log_records"):
        rel = con.sql(f"SELECT * FROM read_parquet('{lake}/{table}/**/*.parquet', hive_partitioning=true)")
        assert rel.columns == schema.column_names(table), table
        stored = dict(zip(*zip(*store.con.execute(
            f"SELECT column_name, data_type FROM information_schema.columns WHERE table_name = '{table}' "
            "ORDER BY ordinal_position").fetchall())))
        lake_types = dict(zip(rel.columns, [str(t) for t in rel.types]))
        assert lake_types == stored, table
        assert _duck_rows(con, f"SELECT * FROM read_parquet('{lake}/{table}/**/*.parquet', hive_partitioning=true)") \
            == _duck_rows(store.con, f"SELECT * FROM {table}")
        ds = parquet.lake_dataset(lake, table).to_table()
        assert ds.column_names == schema.column_names(table)
        assert ds.num_rows == counts[table]
    # sorted for pruning: start times ascending within a file
    f = glob.glob(os.path.join(lake, "spans", "date=2026-01-01", "*.parquet"))[0]
    starts = pq.read_table(f).column("start_time_unix_nano").to_pylist()
    assert starts == sorted(starts)
    # the run index: one row per (run, trace, parent run), naming the span files it covers
    idx = glob.glob(os.path.join(lake, parquet.RUN_TRACES, "*.parquet"))
    assert len(idx) == 1
    assert _duck_rows(con, f"SELECT run_id, trace_id, start_time_unix_nano, spans FROM read_parquet('{idx[0]}')") \
        == _duck_rows(store.con, "SELECT run_id, trace_id, min(start_time_unix_nano), count(*) FROM spans "
                                 "WHERE run_id IS NOT NULL OR parent_run_id IS NOT NULL GROUP BY ALL")
    covered = json.loads(pq.read_schema(idx[0]).metadata[parquet.SPAN_FILES_KEY])
    assert sorted(covered) == sorted(os.path.relpath(p, lake) for p in glob.glob(
        os.path.join(lake, "spans", "**", "*.parquet"), recursive=True))
    assert counts[parquet.RUN_TRACES] == len(pq.read_table(idx[0]))
    # exact int64 and nanoseconds after the round trip
    row = con.execute(f"SELECT attributes, start_time_unix_nano FROM read_parquet('{lake}/spans/**/*.parquet', "
                      "hive_partitioning=true) WHERE name = 'chat m'").fetchone()
    assert str(I64_MAX) in row[0] and row[1] == T0 + 1
    with pytest.raises(FileExistsError):
        parquet.export_parquet(store.reader(), lake)
    parquet.export_parquet(store.reader(), lake, overwrite=True)
    assert parquet.lake_dataset(lake, "spans").count_rows() == counts["spans"]


def test_lake_reader_has_the_same_views(store, tmp_path):
    lake = str(tmp_path / "lake")
    parquet.export_parquet(store.reader(), lake)
    live = store.reader()
    with open_reader(lake) as r:
        assert r.kind == "lake"
        for view, order in (("runs", "run_id"), ("nodes", "record_id"), ("steps", "run_id, step_index")):
            assert r.query(f"SELECT * FROM {view} ORDER BY {order}") == live.query(
                f"SELECT * FROM {view} ORDER BY {order}"), view


def test_rolling_sink_atomic_files_and_dedupe(tmp_path):
    lake = str(tmp_path / "roll")
    now = [0.0]
    sink = parquet.ParquetSink(lake, max_bytes=10**9, max_seconds=30, clock=lambda: now[0])
    store = Store(None)
    reqs = samples.genai_requests(n_runs=3)
    assert sink.append(store.write_traces(reqs[:2]).tables) == []  # buffered, not yet due
    assert not glob.glob(os.path.join(lake, "**", "*.parquet"), recursive=True)
    now[0] = 31.0
    written = sink.append(store.write_traces(reqs).tables)  # 1 new run + 2 duplicates; now due by age
    assert written and all(p.endswith(".parquet") and os.path.exists(p) for p in written)
    assert not glob.glob(os.path.join(lake, "**", ".*.tmp"), recursive=True)
    con = duckdb.connect()
    n = con.execute(f"SELECT count(*), count(DISTINCT span_id) FROM read_parquet('{lake}/spans/**/*.parquet', "
                    "hive_partitioning=true)").fetchone()
    assert n == (12, 12)
    # size-based roll
    small = parquet.ParquetSink(str(tmp_path / "small"), max_bytes=1, max_seconds=1e9)
    assert small.append(Store(None).write_traces(samples.genai_requests(n_runs=1, seed=5)).tables)
    sink.append(store.write_traces(samples.genai_requests(n_runs=1, seed=11)).tables)
    sink.close()
    assert parquet.lake_dataset(lake, "spans").count_rows() == 16
    assert parquet.lake_dataset(lake, "resources").count_rows() == 1
    store.close()
