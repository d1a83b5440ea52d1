"""Erasure in an Iceberg lake streams (docs/integrity.md "Every copy"): each data file holding an erased
value is read and written a batch of rows at a time, files without one are not read past their key
columns, and one overwrite snapshot per table is committed. The rows that result are the store's own
after the same erasure, and Arrow's peak memory stays far below one table."""

from __future__ import annotations

import os
import threading
import time

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from integrity_support import encode
from test_erasure import KEY, SECRET, _spans
from test_erasure_live import _request

import otel_agenttape
from otel_agenttape.store.erasure import erase_duckdb
from otel_agenttape.store.erasure_copies import IcebergCopy
from otel_agenttape.store.parquet import DATA_PAGE_BYTES
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.verification import verify_store

pytest.importorskip("pyiceberg")

FILLER = 72_000


def _filler(n: int, start: int, trace_id: bytes) -> bytes:
    """``n`` plain spans of ~1 KB of attributes each in ``trace_id`` (so in one big data file of its bucket)."""
    return _request(n, trace_id=trace_id, name="filler", start=start, filler_bytes=400)[0]


class MeasuredCopy(IcebergCopy):
    """An ``IcebergCopy`` that samples Arrow's allocation while it rewrites the lake."""

    peak = 0

    def apply(self, p, record):
        out, self.peak = _peak_while(lambda: super(MeasuredCopy, self).apply(p, record))
        return out


def _other_bucket(secret) -> bytes:
    """A trace id in none of the trace-id buckets of ``secret``'s traces (so its rows get files of their own)."""
    from otel_agenttape.store.lake.iceberg_files import buckets

    taken = set(buckets(pa.array([s.trace_id.hex() for rs in secret.resource_spans for ss in rs.scope_spans
                                   for s in ss.spans])).to_pylist())
    while True:
        tid = os.urandom(16)
        if buckets(pa.array([tid.hex()])).to_pylist()[0] not in taken:
            return tid


def _data_files(url: str, table: str) -> list:
    from otel_agenttape.store.lake.iceberg_maintain import erase_datasets

    return erase_datasets(url)[table][2]


def _peak_while(fn) -> tuple[object, int]:
    """``fn()``'s result and the highest Arrow allocation seen (sampled) above where it started."""
    base = pa.total_allocated_bytes()
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], pa.total_allocated_bytes() - base)
            time.sleep(0.001)

    t = threading.Thread(target=sample)
    t.start()
    try:
        out = fn()
    finally:
        done.set()
        t.join()
    return out, peak[0]


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    from otel_agenttape.store.lake.iceberg_publish import IcebergPublisher

    d = tmp_path_factory.mktemp("ice-stream")
    url = f"iceberg+sql://{d}/catalog.db#tapes"
    db = str(d / "ice.duckdb")
    store = Store(db)
    secret = encode(_spans())
    a1 = next(s.trace_id for rs in secret.resource_spans for ss in rs.scope_spans for s in ss.spans
              if any(kv.key == "agenttape.run.id" and kv.value.string_value == "a1" for kv in s.attributes))
    store.write_traces([_filler(FILLER // 2, 0, a1)])  # a1's file: its erased spans among 36,000 others
    store.write_traces([secret.SerializeToString()])
    store.write_traces([_filler(FILLER // 2, FILLER // 2, _other_bucket(secret))])  # a file erasure does not touch
    IcebergPublisher(store, url, "r0").publish_all()
    store.close()
    files_before = _data_files(url, "spans")
    tables = [pq.read_table(f.file_path.removeprefix("file://")) for f in files_before]
    table_bytes = sum(t.nbytes for t in tables)
    touched = [f for f, t in zip(files_before, tables) if SECRET.encode() in str(t.to_pylist()).encode()]
    del tables
    copy = MeasuredCopy(url, batch_rows=1000)
    result = erase_duckdb(db, "run_id IN ('a1', 'a2')", [], reason="GDPR art. 17 request #13", by="dpo",
                          selector={"run": "a1,a2"}, signer=KEY, copies=[copy])
    peak = copy.peak
    return {"url": url, "db": db, "files_before": files_before, "table_bytes": table_bytes, "result": result,
            "peak": peak, "touched": touched}


def test_several_data_files_and_only_the_ones_holding_erased_values_are_rewritten(lake) -> None:
    assert len(lake["files_before"]) >= 3, len(lake["files_before"])
    (ice,) = lake["result"].copies
    assert ice["kind"] == "iceberg" and ice["values"] == 18
    touched = lake["touched"]
    assert 1 <= len(touched) < len(lake["files_before"])
    assert ice["files_rewritten"] >= len(touched)  # the span files, and the span_events files beside them


def test_the_lake_rows_are_the_stores_rows_after_the_same_erasure(lake) -> None:
    sql = "SELECT trace_id, span_id, attributes FROM spans WHERE name NOT LIKE 'filler %' ORDER BY trace_id, span_id"
    with otel_agenttape.open(lake["db"]) as tapes:
        store_rows = tapes.reader.query(sql).to_pylist()
    with otel_agenttape.open(lake["url"]) as tapes:
        lake_rows = tapes.reader.query(sql).to_pylist()
        (n,) = tapes.reader.query("SELECT count(*) FROM spans WHERE name LIKE 'filler %'").column(0).to_pylist()
        reports = {r.chain_id: r for r in verify_store(tapes.reader, verifiers=[KEY.verifier()])}
    assert n == FILLER  # no other row lost or doubled
    assert [(r["trace_id"], r["span_id"], orjson.loads(r["attributes"])) for r in lake_rows] == \
        [(r["trace_id"], r["span_id"], orjson.loads(r["attributes"])) for r in store_rows]
    assert SECRET not in str(lake_rows)
    assert all(r.valid for r in reports.values()) and reports["a1"].erased_values == 9


def test_arrow_memory_stays_far_below_one_table(lake) -> None:
    # the spans table in Arrow is ~84 MB, a1's data file ~42 MB of it; a batch of 1,000 rows ~1 MB
    assert lake["table_bytes"] > 10_000_000, lake["table_bytes"]
    # what is held is bounded by the data pages being read and written (8 MB each), not by a file
    assert lake["peak"] < 4 * DATA_PAGE_BYTES < lake["table_bytes"] / 2, (lake["peak"], lake["table_bytes"])
