"""Bytes on disk per span in the tape store, and the speed of the store's ingest path.

Spans: realistic ~2.7 KB (OTLP protobuf) GenAI model spans made with the OpenTelemetry SDK, each with
its own ids and its own message text (Zipf-distributed vocabulary, so text compresses like prose).

Measured side by side on the same spans:
- duckdb: a DuckDB file written by ``Store`` in batches, as the receiver does, after close.
- parquet: our lake (``export_parquet``: per-date files, rows sorted by trace and time, zstd level 9,
  dictionary encoding for low-cardinality columns), all tables (spans, events, links, resources).
- naive_parquet: one row per span flattened from OTLP the obvious way (hex ids, times, plain-JSON
  attributes/events/resource), ``pyarrow.parquet.write_table(compression="zstd")`` defaults, unsorted.
  The issue quotes about 784 B/span for this on 2.7 KB spans.
Also: rows conversion us/span, write throughput, dedupe by semi-join vs a PRIMARY KEY index, and
``Store`` insert throughput and run lookup (``spans.run_id`` scan vs ``run_index``) with 0 and with
``--stored`` spans already in the store (filled with small synthetic rows: the key check and the
lookup depend on the row count, not the row size).

Last line: ``store duckdb_bytes_per_span=A parquet_bytes_per_span=B naive_parquet_bytes_per_span=C``.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import sys
import tempfile
import time

import duckdb
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_agenttape.codec import typed as anyvalue
from otel_agenttape.store import rows, samples, schema
from otel_agenttape.store.ddl import INDEX_ROW_SQL, run_hash_where
from otel_agenttape.store.parquet import ParquetSink, export_parquet
from otel_agenttape.store.writer import RUN_LOOKUP_SQL, Store, locked_config


def make_requests(n_spans: int, batch: int, events: bool) -> list[bytes]:
    """Serialized requests of ``batch`` distinct model spans each (ids and text differ per span)."""
    out: list[bytes] = []
    rng = random.Random(42)
    made = 0
    while made < n_spans:
        k = min(batch, n_spans - made)
        runs = samples.genai_requests(n_runs=k, models_per_run=1, tools_per_run=0, seed=rng.randrange(1 << 30),
                                      start_ns=1_767_225_600_000_000_000 + made * 10_000_000, with_events=events)
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.CopyFrom(runs[0].resource_spans[0].resource)
        ss = rs.scope_spans.add()
        ss.scope.CopyFrom(runs[0].resource_spans[0].scope_spans[0].scope)
        for r in runs:
            for s in r.resource_spans[0].scope_spans[0].spans:
                if s.kind == 3:  # the chat span
                    ss.spans.add().CopyFrom(s)
        out.append(req.SerializeToString())
        made += k
    return out


def naive_table(reqs: list[ExportTraceServiceRequest]) -> pa.Table:
    cols: dict[str, list] = {k: [] for k in ("trace_id", "span_id", "parent_span_id", "name", "kind", "start",
                                             "end", "status_code", "attributes", "events", "resource")}
    for req in reqs:
        for rs in req.resource_spans:
            res = orjson.dumps(anyvalue.attrs_to_python(anyvalue.attrs_from_proto(rs.resource.attributes))).decode()
            for ss in rs.scope_spans:
                for s in ss.spans:
                    cols["trace_id"].append(s.trace_id.hex())
                    cols["span_id"].append(s.span_id.hex())
                    cols["parent_span_id"].append(s.parent_span_id.hex())
                    cols["name"].append(s.name)
                    cols["kind"].append(s.kind)
                    cols["start"].append(s.start_time_unix_nano)
                    cols["end"].append(s.end_time_unix_nano)
                    cols["status_code"].append(s.status.code)
                    plain = anyvalue.attrs_to_python(anyvalue.attrs_from_proto(s.attributes))
                    cols["attributes"].append(orjson.dumps(plain).decode())
                    cols["events"].append(orjson.dumps([
                        {"name": e.name, "time": e.time_unix_nano,
                         "attributes": anyvalue.attrs_to_python(anyvalue.attrs_from_proto(e.attributes))}
                        for e in s.events]).decode())
                    cols["resource"].append(res)
    return pa.table(cols)


def _prefill(store: Store, n: int) -> None:
    """``n`` small spans in time order, 50 per run and 10 per trace, indexed like the writer does
    (one run_index row per run, trace and write of 10,000 spans)."""
    store.con.execute(
        "INSERT INTO spans (trace_id, span_id, name, kind, start_time_unix_nano, end_time_unix_nano, "
        "status_code, attributes, date, run_id) SELECT md5((i // 10)::VARCHAR), substr(md5((i * 7)::VARCHAR), 1, 16), "
        "'x', 0, i * 1000000, i * 1000000 + 5, 0, '{}', DATE '2026-01-01', 'run-' || (i // 50)::VARCHAR "
        f"FROM range({int(n)}) t(i)")
    store.con.execute(
        INDEX_ROW_SQL.format(ranges="rowid // 10000 * 10000, rowid // 10000 * 10000 + 9999, NULL, NULL, NULL, NULL")
        + "FROM spans GROUP BY run_id, trace_id, rowid // 10000")


def _lookup_ms(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> tuple[float, float]:
    """Mean ms to fetch a run's spans: scanning ``spans.run_id`` vs ``run_index`` then a rowid range."""
    t = time.perf_counter()
    for r in run_ids:
        con.execute("SELECT * FROM spans WHERE run_id = ?", [r]).fetchall()
    scan = (time.perf_counter() - t) / len(run_ids) * 1e3
    t = time.perf_counter()
    for r in run_ids:
        where, params = run_hash_where(r)
        lo, hi = con.execute(RUN_LOOKUP_SQL + where, params).fetchall()[0][:2]
        con.execute("SELECT * FROM spans WHERE rowid BETWEEN ? AND ? AND run_id = ?", [lo, hi, r]).fetchall()
    indexed = (time.perf_counter() - t) / len(run_ids) * 1e3
    return scan, indexed


def store_at_scale(tmp: str, tables: list, stored: int) -> None:
    """Insert throughput and run lookup with 0 and ``stored`` spans already in the store."""
    for before in (0, stored):
        path = os.path.join(tmp, f"scale-{before}.duckdb")
        store = Store(path)
        if before:
            _prefill(store, before)
            store.close()
            t = time.perf_counter()
            store = Store(path)  # reopening rebuilds the stored-key set
            print(f"store_open_with_{before}_spans_s={time.perf_counter() - t:.2f}")
        n = sum(tb.spans.num_rows for tb in tables)
        t, c = time.perf_counter(), time.process_time()
        for tb in tables:
            store.write_tables(tb)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        line = (f"store_insert_at_{before}_stored_spans_per_s={n / wall:.0f} "
                f"cpu_us_per_span={cpu / n * 1e6:.1f}")
        if before:
            con = store.cursor()
            scan, indexed = _lookup_ms(con, [f"run-{(i * 7919) % (before // 50)}" for i in range(20)])
            con.close()
            line += f" run_lookup_scan_ms={scan:.1f} run_lookup_index_ms={indexed:.1f}"
        print(line)
        store.close()


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=2_000, help="spans per request/write")
    ap.add_argument("--events", action="store_true", help="add the agenttape text/reasoning/retry events")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--stored", type=int, default=1_000_000, help="spans already stored for the scale check")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="agenttape-store-bench-")
    try:
        t = time.perf_counter()
        datas = make_requests(args.spans, args.batch, args.events)
        reqs = [ExportTraceServiceRequest.FromString(d) for d in datas]
        n = sum(len(r.resource_spans[0].scope_spans[0].spans) for r in reqs)
        otlp_bytes = sum(s.ByteSize() for r in reqs for s in r.resource_spans[0].scope_spans[0].spans) / n
        print(f"spans={n} otlp_bytes_per_span={otlp_bytes:.0f} (generated in {time.perf_counter() - t:.1f}s)")

        # rows conversion (the ingest hot path): CPU time, best of 3, so other load on the host matters less
        best = float("inf")
        for _ in range(3):
            gc.collect()
            t = time.process_time()
            for r in reqs:
                rows.traces_to_tables([r])
            best = min(best, time.process_time() - t)
        print(f"rows_conversion_cpu_us_per_span={best / n * 1e6:.1f}")

        # DuckDB store: convert + dedupe + insert per batch, as the receiver's writer thread does
        db = os.path.join(tmp, "bench.duckdb")
        store = Store(db)
        t = time.perf_counter()
        for d in datas:
            store.write_traces([ExportTraceServiceRequest.FromString(d)])
        write_s = time.perf_counter() - t
        t = time.perf_counter()
        again = store.write_traces([ExportTraceServiceRequest.FromString(datas[0])])
        dup_ms = (time.perf_counter() - t) * 1e3
        assert again.spans_stored == 0
        lake = os.path.join(tmp, "lake")
        export_parquet(store.reader(), lake)
        store.close()
        duck_bytes = os.path.getsize(db) + (os.path.getsize(db + ".wal") if os.path.exists(db + ".wal") else 0)
        print(f"store_write_spans_per_s={n / write_s:.0f} (parse+rows+dedupe+insert+commit, {args.batch}/batch); "
              f"re-sent batch of {args.batch} refused in {dup_ms:.0f} ms")

        # dedupe strategy: semi-join (what Store does) vs a PRIMARY KEY with INSERT OR IGNORE
        tables = [rows.traces_to_tables([r]) for r in reqs]
        for label, ddl_extra, insert in (
            ("semi_join", "", None),
            ("primary_key", ", PRIMARY KEY (trace_id, span_id)", "INSERT OR IGNORE INTO spans SELECT * FROM n"),
        ):
            path = os.path.join(tmp, f"dedupe-{label}.duckdb")
            con = duckdb.connect(path, config=locked_config())
            con.execute(schema.table_ddl("spans")[:-2] + ddl_extra + "\n)")
            t = time.perf_counter()
            for tb in tables:
                con.register("n", tb.spans)
                con.begin()
                if insert:
                    con.execute(insert)
                else:
                    con.execute("INSERT INTO spans SELECT * FROM n WHERE NOT EXISTS (SELECT 1 FROM spans s "
                                "WHERE s.trace_id = n.trace_id AND s.span_id = n.span_id)")
                con.commit()
            dt = time.perf_counter() - t
            con.close()
            print(f"dedupe_{label}_spans_per_s={n / dt:.0f} file_bytes_per_span={os.path.getsize(path) / n:.0f}")

        store_at_scale(tmp, tables, args.stored)

        sink_dir = os.path.join(tmp, "sink")
        sink = ParquetSink(sink_dir, max_bytes=64 * 1024 * 1024, max_seconds=1e9)
        t = time.process_time()
        for tb in tables:
            sink.append(tb.as_dict())
        sink.close()
        sink_cpu = time.process_time() - t
        print(f"sink (zstd {sink.level}, 64 MiB rolls): bytes_per_span={dir_bytes(sink_dir) / n:.0f} "
              f"cpu_us_per_span={sink_cpu / n * 1e6:.1f}")

        naive = os.path.join(tmp, "naive.parquet")
        pq.write_table(naive_table(reqs), naive, compression="zstd")
        naive_b = os.path.getsize(naive) / n
        lake_b = dir_bytes(lake) / n
        duck_b = duck_bytes / n
        print(f"lake_tables: " + ", ".join(f"{t}={dir_bytes(os.path.join(lake, t)) / n:.0f}B/span"
                                             for t in sorted(os.listdir(lake))))
        print(f"store duckdb_bytes_per_span={duck_b:.0f} parquet_bytes_per_span={lake_b:.0f} "
              f"naive_parquet_bytes_per_span={naive_b:.0f}")
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
