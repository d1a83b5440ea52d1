"""The DuckDB store on real files: types survive, re-sent spans and logs are stored once."""

from __future__ import annotations

import os

import duckdb
import numpy as np
import orjson
import pytest

from otel_agenttape.codec import typed as anyvalue
from otel_agenttape.store import samples
from otel_agenttape.store.reader import open_reader
from otel_agenttape.store.writer import Store

from test_store_rows import I64_MAX, I64_MIN, T0, _logs_request, _typed_spans


def test_types_survive_a_duckdb_file(tmp_path):
    db = str(tmp_path / "t.duckdb")
    reqs = _typed_spans()
    with Store(db) as store:
        res = store.write_traces(reqs)
        assert res.spans_stored == 2 and res.duplicates == 0
    con = duckdb.connect(db, read_only=True)
    types = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                             "WHERE table_name = 'spans'").fetchall())
    assert types["attributes"] == "JSON" and types["start_time_unix_nano"] == "BIGINT"
    row = con.execute(
        "SELECT attributes, start_time_unix_nano, end_time_unix_nano, date FROM spans WHERE name = 'chat m'"
    ).fetchone()
    con.close()
    attrs = anyvalue.attrs_to_python(row[0])
    assert attrs["i.max"] == I64_MAX and type(attrs["i.max"]) is int
    assert attrs["i.min"] == I64_MIN
    assert attrs["d.one"] == 1.0 and type(attrs["d.one"]) is float
    assert attrs["b"] == b"\x00\xffab" and type(attrs["b"]) is bytes
    assert row[1] == T0 + 1 and row[2] == T0 + 1_000_000_007
    proto = [s for s in reqs[0].resource_spans[0].scope_spans[0].spans if s.name == "chat m"][0]
    assert row[0] == anyvalue.dumps(anyvalue.attrs_from_proto(proto.attributes))


def test_resent_spans_stored_once_in_batch_and_across_batches(tmp_path):
    db = str(tmp_path / "d.duckdb")
    reqs = samples.genai_requests(n_runs=3)
    with Store(db) as store:
        first = store.write_traces(reqs[:2] + reqs[:1])
        assert first.spans_stored == 8 and first.duplicates == 4
        second = store.write_traces(reqs)  # two runs already stored, one new
        assert second.spans_stored == 4 and second.duplicates == 8
        assert second.tables["spans"].num_rows == 4
        assert set(second.tables["span_events"].column("span_id").to_pylist()) <= set(
            second.tables["spans"].column("span_id").to_pylist())
        third = store.write_traces(reqs)
        assert third.spans_stored == 0 and third.duplicates == 12
    reader = open_reader(db)
    try:
        counts = reader.query(
            "SELECT (SELECT count(*) FROM spans), (SELECT count(DISTINCT (trace_id, span_id)) FROM spans), "
            "(SELECT count(*) FROM span_events), (SELECT count(*) FROM resources)").to_pylist()[0]
        assert list(counts.values()) == [12, 12, 3 * 7, 1]
    finally:
        reader.close()


def test_logs_deduplicated(tmp_path):
    with Store(str(tmp_path / "l.duckdb")) as store:
        assert store.write_logs([_logs_request()]).logs_stored == 2
        again = store.write_logs([_logs_request()])
        assert again.logs_stored == 0 and again.duplicates == 2
        body = store.reader().query("SELECT body FROM log_records WHERE body IS NOT NULL").column(0)[0].as_py()
        assert orjson.loads(body) == {"i": str(I64_MAX)}


def test_store_reopens_and_keeps_rows(tmp_path):
    db = str(tmp_path / "r.duckdb")
    reqs = samples.genai_requests(n_runs=2)
    with Store(db) as store:
        store.write_traces(reqs)
    with Store(db) as store:  # schema creation is idempotent; dedupe sees rows of the earlier process
        assert store.write_traces(reqs).duplicates == 8
    assert os.path.getsize(db) > 0


def test_failed_write_rolls_back(tmp_path):
    store = Store(None)
    tables = store.write_traces(samples.genai_requests(n_runs=1)).tables
    assert tables["spans"].num_rows == 4
    bad = samples.genai_requests(n_runs=1, seed=99)
    t = __import__("otel_agenttape.store.rows", fromlist=["x"]).traces_to_tables(bad)
    t.span_events = t.span_events.drop_columns(["name"])  # wrong shape: the insert fails
    try:
        store.write_tables(t)
        raise AssertionError("expected failure")
    except duckdb.Error:
        pass
    assert store.reader().query("SELECT count(*) FROM spans").column(0)[0].as_py() == 4
    store.close()


def test_run_index_rowid_ranges_find_every_span_and_event(tmp_path):
    db = str(tmp_path / "ri.duckdb")
    reqs = samples.genai_requests(n_runs=4)
    with Store(db) as store:
        store.write_traces(reqs[:1])
        store.write_traces(reqs[1:3] + reqs[:1])  # a re-sent run adds no rows and no index entry
        store.write_traces(reqs[3:])
        con = store.cursor()
        run_ids = [r[0] for r in con.execute("SELECT DISTINCT run_id FROM spans WHERE run_id IS NOT NULL").fetchall()]
        assert len(run_ids) == 4
        for run_id in run_ids:
            b = store.run_bounds(run_id)
            full = con.execute("SELECT trace_id, span_id FROM spans WHERE run_id = ? ORDER BY ALL", [run_id]).fetchall()
            ranged = con.execute(
                "SELECT trace_id, span_id FROM spans WHERE rowid BETWEEN ? AND ? AND run_id = ? ORDER BY ALL",
                [b["first_span_row"], b["last_span_row"], run_id]).fetchall()
            assert ranged == full and b["spans"] == len(full)
            traces = sorted({t for t, _ in full})
            events = con.execute(
                "SELECT count(*) FROM span_events e JOIN spans s USING (trace_id, span_id) WHERE s.run_id = ?",
                [run_id]).fetchall()[0][0]
            ranged_events = con.execute(
                "SELECT count(*) FROM span_events e JOIN spans s USING (trace_id, span_id) "
                "WHERE e.rowid BETWEEN ? AND ? AND s.run_id = ? AND e.trace_id IN (SELECT unnest(?::VARCHAR[]))",
                [b["first_event_row"], b["last_event_row"], run_id, traces]).fetchall()[0][0]
            assert events > 0 and ranged_events == events
        assert store.run_bounds("no-such-run") is None
        con.close()
    # reopened, the row counters continue where the table ends
    with Store(db) as store:
        store.write_traces(samples.genai_requests(n_runs=1, seed=99))
        con = store.cursor()
        run_id = con.execute("SELECT run_id FROM spans WHERE run_id IS NOT NULL ORDER BY rowid DESC LIMIT 1").fetchall()[0][0]
        b = store.run_bounds(run_id)
        n = con.execute("SELECT count(*) FROM spans WHERE rowid BETWEEN ? AND ? AND run_id = ?",
                        [b["first_span_row"], b["last_span_row"], run_id]).fetchall()[0][0]
        assert n == b["spans"] > 0
        con.close()


def test_stored_key_set_survives_reopen_and_false_positives_stay_exact(tmp_path, monkeypatch):
    db = str(tmp_path / "k.duckdb")
    reqs = samples.genai_requests(n_runs=3)
    with Store(db) as store:
        assert store.write_traces(reqs[:2]).spans_stored == 8
    with Store(db) as store:  # the key set is rebuilt from the table
        assert store._span_keys.count == 8 and store._span_keys.nbytes == 4 * 8  # 4 bytes a stored span
        again = store.write_traces(reqs[:1])
        assert again.spans_stored == 0 and again.duplicates == 4
        # a key set that answers "maybe" for every key: the exact check still stores new spans
        monkeypatch.setattr(type(store._span_keys), "maybe_stored", lambda self, h: np.ones(len(h), dtype=bool))
        res = store.write_traces(reqs[1:])
        assert res.spans_stored == 4 and res.duplicates == 4
        assert store.reader().query("SELECT count(*) FROM spans").column(0)[0].as_py() == 12


def test_writes_run_on_one_thread_and_reads_get_theirs_back(tmp_path):
    store = Store(str(tmp_path / "t.duckdb"), threads=2)

    def setting(name):
        return store.con.sql(f"SELECT current_setting('{name}')").fetchall()[0][0]

    assert setting("threads") == 2 and setting("max_vacuum_tasks") == 0
    store.write_traces(samples.genai_requests(n_runs=1))
    assert setting("threads") == 1  # stays while writes keep coming
    store.write_traces(samples.genai_requests(n_runs=1, seed=5))
    store.writes_paused()
    assert setting("threads") == 2
    # only the thread count may change: everything else stays locked for /api/query
    assert setting("lock_configuration") is True and setting("enable_external_access") is False
    _assert_locked(store)
    assert store.reader().query("SELECT count(*) FROM spans").column(0)[0].as_py() == 8
    store.close()


def _assert_locked(store) -> None:
    """Settings other than those the writer switches (threads, checkpoint_threshold, memory_limit) stay
    locked (``/api/query`` relies on it, besides refusing every SET)."""
    for statement in ("SET enable_external_access = true", "SET temp_directory = '/tmp/elsewhere'"):
        with pytest.raises(duckdb.Error):
            store.con.execute(statement)


def _model_spans(n: int, seed: int) -> list:
    """One request of ``n`` ~2.7 KB model spans with their own ids."""
    req = samples.model_span_request(seed=seed)
    spans = req.resource_spans[0].scope_spans[0].spans
    span = spans[0]
    for i in range(1, n):
        s = spans.add()
        s.CopyFrom(span)
        s.span_id = (seed * 1_000_000 + i).to_bytes(8, "big")
    return [req]


def test_a_big_write_checkpoints_at_its_commit_instead_of_going_through_the_wal(tmp_path):
    db = tmp_path / "t.duckdb"
    wal = tmp_path / "t.duckdb.wal"
    store = Store(str(db))

    def threshold():
        return store.con.sql("SELECT current_setting('checkpoint_threshold')").fetchall()[0][0]

    default = threshold()
    small = store.write_traces(_model_spans(50, seed=1))
    assert threshold() == default  # small writes collect in DuckDB's WAL as before
    assert wal.exists() and wal.stat().st_size > 0
    big = store.write_traces(_model_spans(6000, seed=2))  # over writer.BIG_WRITE_BYTES of rows
    assert threshold() != default
    assert not wal.exists() or wal.stat().st_size == 0  # checkpointed (with the small write), no WAL copy
    again = store.write_traces(_model_spans(50, seed=3))
    assert threshold() == default and wal.stat().st_size > 0
    assert (small.spans_stored, big.spans_stored, again.spans_stored) == (50, 6000, 50)
    # only the thread count and this threshold may change: everything else stays locked
    _assert_locked(store)
    store.close()
    with Store(str(db)) as reopened:
        assert reopened.reader().query("SELECT count(*) FROM spans").column(0)[0].as_py() == 6100


def test_an_in_memory_store_takes_big_writes_without_checkpoint_settings():
    with Store(None) as store:
        assert store.write_traces(_model_spans(6000, seed=4)).spans_stored == 6000


def test_a_run_key_worked_out_here_is_duckdbs(tmp_path):
    """The run index is looked up by a key computed in Python: it must be DuckDB's md5_number_upper for
    every run id (non-ASCII too), and a run id UTF-8 cannot hold is left to DuckDB as before."""
    import duckdb

    from otel_agenttape.store.ddl import run_hash, run_hash_where

    ids = ["", "run-1", "ünïcode-run", "运行-42", "emoji 😀 run", "a" * 300, "tab\tand\nnewline"]
    con = duckdb.connect()
    for run_id in ids:
        assert run_hash(run_id) == con.execute("SELECT md5_number_upper(?)", [run_id]).fetchone()[0]
    assert run_hash_where("run-1") == ("run_hash = ?", [run_hash("run-1")])
    assert run_hash("bad \udcff") is None
    assert run_hash_where("bad \udcff") == ("run_hash = md5_number_upper(?)", ["bad \udcff"])
    db = str(tmp_path / "key.duckdb")
    with Store(db) as store:
        store.write_traces(samples.genai_requests(n_runs=2))
        con2 = store.cursor()
        for (run_id,) in con2.execute("SELECT DISTINCT run_id FROM spans WHERE run_id IS NOT NULL").fetchall():
            assert store.run_bounds(run_id)["spans"] > 0
        con2.close()
