"""Rebuilds use the store's ``run_index`` (DuckDB) or the lake's ``run_traces`` when present, and give the
same runs and trees when they are missing: older stores, lakes without the index or with files added
since, and a remote reader over a store without it."""

from __future__ import annotations

import importlib.util
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from pages_support import all_pages

from otel_agenttape.store import parquet
from otel_agenttape.store.queryapi import handle_query
from otel_agenttape.store.reader import HttpReader, open_reader
from otel_agenttape.store.writer import Store
from otel_agenttape.tape import reconstruct, reconstruct_tree

BENCH = Path(__file__).resolve().parent.parent / "bench" / "replay.py"


def _bench():
    spec = importlib.util.spec_from_file_location("_replay_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Recording:
    """A reader that records the SQL it runs."""

    def __init__(self, inner, kind=None, description=""):
        self.inner, self.sql = inner, []
        if kind:
            self.kind, self.description = kind, description

    def query(self, sql, params=None):
        self.sql.append(sql)
        return self.inner.query(sql, params)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    bench = _bench()
    tmp = tmp_path_factory.mktemp("index")
    db = str(tmp / "tape.duckdb")
    ids = {}
    with Store(db) as store:
        t = bench.T0
        for batch in range(3):
            b = bench.Builder()
            for _ in range(5):
                b.run(b.new_id(16), b.new_id(16), t, 5)
                t += bench.RUN_EVERY_NS
            if batch == 1:
                ids["run"] = b.new_id(16)
                b.run(ids["run"], b.new_id(16), t, 12, agent="big")
                ids["tree"] = b.new_id(16)
                b.run(ids["tree"], b.new_id(16), t, 2, agent="coordinator")
                for i in range(3):
                    b.run(b.new_id(16), b.new_id(16), t + (i + 1) * 500_000_000, 4, agent=f"child-{i}",
                          parent_run_id=ids["tree"])
            store.write_tables(b.tables())
    plain = str(tmp / "plain.duckdb")  # the same rows, as a store written before run_index existed
    shutil.copy(db, plain)
    con = duckdb.connect(plain)
    con.execute("DROP TABLE run_index")
    con.close()
    lake = str(tmp / "lake")
    with open_reader(db) as reader:
        parquet.export_parquet(reader, lake)
    return {"db": db, "plain": plain, "lake": lake, "ids": ids, "tmp": tmp}


def _both(reader, ids):
    return (reconstruct(reader, ids["run"]).to_json(), reconstruct_tree(reader, ids["tree"]).root.to_json())


def test_duckdb_index_is_used_and_missing_index_falls_back(stores):
    ids = stores["ids"]
    with open_reader(stores["db"]) as r:
        rec = Recording(r)
        indexed = _both(rec, ids)
        assert any("FROM run_index" in q for q in rec.sql)
        assert not any("FROM spans WHERE run_id = ?" in q for q in rec.sql)
        with pytest.raises(LookupError):
            reconstruct(rec, "no-such-run")
    with open_reader(stores["plain"]) as r:
        rec = Recording(r)
        assert _both(rec, ids) == indexed
        assert _both(rec, ids) == indexed  # asked once, then the reader is known to lack the index
        assert sum("FROM run_index" in q for q in rec.sql) == 1
    tree = indexed[1]
    assert len(tree["children"]) == 3 and len(indexed[0]["tools"]) == 6


def _outcome(reader, ref):
    try:
        return reconstruct(reader, ref).to_json()
    except LookupError as exc:
        return type(exc).__name__


def test_a_run_at_its_trace_is_found_by_both_keys_in_the_index(stores):
    ids = stores["ids"]
    with open_reader(stores["db"]) as r:
        run_ref = reconstruct(r, ids["run"]).ref
        expected = _both(r, ids)
        tree_ref = reconstruct(r, ids["tree"]).ref
        other_trace = reconstruct(r, tree_ref).trace_id
        rec = Recording(r)
        assert reconstruct(rec, run_ref).to_json() == expected[0]
        # one index lookup by run and trace key; the spans are not read to find the run or its trace
        assert sum("trace_hash = ?" in q for q in rec.sql) == 1
        assert not any("rowid BETWEEN" in q or "GROUP BY trace_id" in q for q in rec.sql)
        assert reconstruct_tree(rec, tree_ref).root.to_json() == expected[1]
        mismatched = f"{ids['run']}@{other_trace}"  # a run named with a trace that does not hold it
        indexed_outcomes = [_outcome(r, ref) for ref in (run_ref, mismatched, f"{ids['run']}@{'0' * 32}")]
    assert indexed_outcomes[2] == "RunNotFound"
    for source in (stores["plain"], stores["lake"]):  # no index by both keys: read from the spans, same answers
        with open_reader(source) as r:
            assert [_outcome(r, ref) for ref in (run_ref, mismatched, f"{ids['run']}@{'0' * 32}")] == indexed_outcomes
            assert reconstruct_tree(r, tree_ref).root.to_json() == expected[1]


def test_lake_run_traces_used_only_while_it_covers_the_lake(stores):
    ids = stores["ids"]
    with open_reader(stores["db"]) as r:
        expected = _both(r, ids)
    lake = stores["lake"]
    with open_reader(lake) as r:
        rec = Recording(r, kind=r.kind, description=r.description)
        assert _both(rec, ids) == expected
        assert any("run_traces" in q for q in rec.sql)
        assert not any("FROM spans WHERE run_id = ?" in q or "FROM spans WHERE parent_run_id" in q for q in rec.sql)
    # spans were added after the export (e.g. by `serve --parquet-dir`): the index is stale, scan spans
    stale = str(stores["tmp"] / "stale")
    shutil.copytree(lake, stale)
    with open_reader(stores["db"]) as r:
        extra = r.query("SELECT * FROM spans WHERE agent_name = 'bench' LIMIT 1")
    extra = extra.set_column(extra.column_names.index("trace_id"), "trace_id", pa.array(["f" * 32]))
    parquet.write_partitions("spans", extra, stale, prefix="late")
    with open_reader(stale) as r:
        rec = Recording(r, kind=r.kind, description=r.description)
        assert _both(rec, ids) == expected
        assert not any("run_traces" in q for q in rec.sql)
    shutil.rmtree(Path(stale) / parquet.RUN_TRACES)  # a lake with no index at all
    with open_reader(stale) as r:
        assert _both(r, ids) == expected


def test_remote_reader_over_a_store_without_the_index(stores):
    ids = stores["ids"]
    with open_reader(stores["db"]) as r:
        expected = _both(r, ids)
    local = open_reader(stores["plain"])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server naming
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status, ctype, out = handle_query(local, body)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        remote = HttpReader(f"http://127.0.0.1:{server.server_address[1]}")
        assert _both(remote, ids) == expected
    finally:
        server.shutdown()
        local.close()


def test_runs_pages_from_the_index_match_the_spans_and_an_older_index_is_rebuilt(stores):
    from otel_agenttape.tape.read import index_keys

    spans_only = {limit: all_pages(stores["plain"], limit) for limit in (1, 4, 50)}
    assert len(spans_only[50][0]) == 20
    with open_reader(stores["db"]) as r:
        assert index_keys.first_page(r, 4) is not None, "the store's run_index is used"
    for limit, want in spans_only.items():
        assert all_pages(stores["db"], limit) == want
    # stores whose run_index has an earlier layout: before it held each run's start and key, and with
    # the run and trace ids in it
    for n, extra in enumerate(("", ", trace_id VARCHAR, run_start_unix_nano BIGINT, last_start_unix_nano BIGINT, "
                                   "run_key_hi UBIGINT, run_key_lo UBIGINT")):
        old = str(stores["tmp"] / f"old-index-{n}.duckdb")
        shutil.copy(stores["db"], old)
        con = duckdb.connect(old)
        con.execute("DROP TABLE run_index")
        con.execute("CREATE TABLE run_index (run_id VARCHAR NOT NULL, start_time_unix_nano BIGINT NOT NULL, "
                    "end_time_unix_nano BIGINT NOT NULL, spans BIGINT NOT NULL, first_span_row BIGINT NOT NULL, "
                    "last_span_row BIGINT NOT NULL, first_event_row BIGINT, last_event_row BIGINT, "
                    f"first_link_row BIGINT, last_link_row BIGINT{extra})")
        con.execute("INSERT INTO run_index (run_id, start_time_unix_nano, end_time_unix_nano, spans, first_span_row, "
                    "last_span_row) SELECT run_id, min(start_time_unix_nano), max(end_time_unix_nano), count(*), "
                    "min(rowid), max(rowid) FROM spans WHERE run_id IS NOT NULL GROUP BY run_id")
        con.close()
        _older_index_is_read_around_then_rebuilt(stores, old, spans_only)


def _older_index_is_read_around_then_rebuilt(stores, old, spans_only):
    from otel_agenttape.tape.read import index_keys

    with open_reader(old) as r:
        assert index_keys.first_page(r, 4) is None  # read from the spans instead
    assert all_pages(old, 4) == spans_only[4]
    with open_reader(old) as r:  # a run's rows are found by scanning the spans
        assert _both(r, stores["ids"]) == _both(open_reader(stores["db"]), stores["ids"])
    Store(old).close()  # a writer opening it indexes it again, in the present layout
    with open_reader(old) as r:
        assert index_keys.first_page(r, 4) is not None
        assert _both(r, stores["ids"]) == _both(open_reader(stores["db"]), stores["ids"])
    for limit, want in spans_only.items():
        assert all_pages(old, limit) == want
