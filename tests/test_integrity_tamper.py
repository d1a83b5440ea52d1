"""Tampering with a sealed tape in the real store is detected, with the right index and reason."""

from __future__ import annotations

import glob

import duckdb
import orjson
import pyarrow.parquet as pq
import pytest
from integrity_support import encode, sealed_provider

from otel_agenttape import semconv
from otel_agenttape.integrity import Chain, Signer, sign_note
from otel_agenttape.integrity.checkpoint import Checkpoint
from otel_agenttape.store.parquet import export_parquet
from otel_agenttape.store.reader import open_reader
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.sealed_rows import load_rows, row_leaf
from otel_agenttape.tape.verification import verify_store

N_NODES = 12  # seq 0..11 are nodes, seq 12 is the run span


@pytest.fixture(scope="module")
def key():
    return Signer.generate("test.agenttape/agent")


def record(run_id: str, key, cp_file, n: int = N_NODES, on_nodes: bool = True):
    # A checkpoint per node localizes a re-seal to one entry; the default cadence bounds it to a range.
    provider, sealer, exporter = sealed_provider(signing_key=key, checkpoint_file=cp_file, checkpoint_on_nodes=on_nodes)
    tracer = provider.get_tracer("otel_agenttape")
    with tracer.start_as_current_span(f"invoke_agent {run_id}", attributes={semconv.RUN_ID: run_id}):
        for i in range(n):
            kind = "model" if i % 2 == 0 else "tool"
            with tracer.start_as_current_span(f"node {i}", attributes={
                semconv.NODE_TYPE: kind, semconv.RUN_ID: run_id, semconv.STEP: i, "payload": f"v{i}",
                "ratio": i / 3, "blob": bytes([i]),
            }) as sp:
                sp.add_event("agenttape.text", {"agenttape.seq": i, "text": "héllo"})
    provider.shutdown()
    assert sealer.errors == 0
    return exporter.get_finished_spans()


def build_db(tmp_path, key, runs=("run-a",)):
    db = str(tmp_path / "tape.duckdb")
    cp_file = tmp_path / "checkpoints.jsonl"
    store = Store(db)
    for run in runs:
        store.write_traces([encode(record(run, key, cp_file))])
    store.close()
    return db, str(cp_file)


def verify(db, key=None, cp_file=None, run="run-a"):
    reader = open_reader(db)
    try:
        reports = verify_store(reader, run=run, verifiers=[key.verifier()] if key else [],
                               checkpoint_files=[cp_file] if cp_file else [])
    finally:
        reader.close()
    assert len(reports) == 1, reports
    return reports[0]


def span_at(con, seq: int, run="run-a"):
    return con.execute("SELECT span_id, attributes FROM spans WHERE chain_id = ? AND chain_seq = ?", [run, seq]).fetchone()


def set_chain(attrs: dict, col: str, value) -> None:
    key = {"id": semconv.CHAIN_ID, "seq": semconv.CHAIN_SEQ, "prev": semconv.CHAIN_PREV,
           "hash": semconv.CHAIN_HASH}[col]
    attrs[key] = {"i": str(value)} if col == "seq" else {"s": value}


def test_untouched_tape_verifies_with_key_and_checkpoints(tmp_path, key) -> None:
    db, cp = build_db(tmp_path, key)
    r = verify(db, key, cp)
    assert r.valid and r.length == N_NODES + 1 and r.signed_size == N_NODES + 1
    assert verify(db).valid  # the chain alone verifies too


def test_sql_update_of_one_attribute(tmp_path, key) -> None:
    db, cp = build_db(tmp_path, key)
    con = duckdb.connect(db)
    sid, attrs = span_at(con, 5)
    a = orjson.loads(attrs)
    a["payload"] = {"s": "v5 but nicer"}
    con.execute("UPDATE spans SET attributes = ? WHERE span_id = ?", [orjson.dumps(a).decode(), sid])
    con.close()
    r = verify(db)
    assert (r.valid, r.first_broken_index) == (False, 5)
    assert r.reason == "leaf hash mismatch at seq 5: span content edited"
    assert verify(db, key, cp).first_broken_index == 5


def test_sql_update_of_an_event(tmp_path, key) -> None:
    db, _ = build_db(tmp_path, key)
    con = duckdb.connect(db)
    sid, _ = span_at(con, 3)
    con.execute("UPDATE span_events SET name = 'other' WHERE span_id = ?", [sid])
    con.close()
    r = verify(db)
    assert r.first_broken_index == 3 and "edited" in r.reason


def test_delete_of_one_span_is_a_gap(tmp_path, key) -> None:
    db, _ = build_db(tmp_path, key)
    con = duckdb.connect(db)
    con.execute("DELETE FROM spans WHERE chain_id = 'run-a' AND chain_seq = 7")
    con.close()
    r = verify(db)
    assert (r.valid, r.first_broken_index, r.reason) == (False, 7, "missing seq 7..7")
    assert r.issues[0].kind == "gap" and len(r.issues) == 1


def test_swapped_sequence_numbers(tmp_path, key) -> None:
    db, _ = build_db(tmp_path, key)
    con = duckdb.connect(db)
    (s3, a3), (s4, a4) = span_at(con, 3), span_at(con, 4)
    a3, a4 = orjson.loads(a3), orjson.loads(a4)
    set_chain(a3, "seq", 4)
    set_chain(a4, "seq", 3)
    con.execute("UPDATE spans SET chain_seq = 4, attributes = ? WHERE span_id = ?", [orjson.dumps(a3).decode(), s3])
    con.execute("UPDATE spans SET chain_seq = 3, attributes = ? WHERE span_id = ?", [orjson.dumps(a4).decode(), s4])
    con.close()
    r = verify(db)
    assert r.first_broken_index == 3 and r.reason == "seq 3 links to seq 4: entries reordered"


def test_swapped_columns_only(tmp_path, key) -> None:
    db, _ = build_db(tmp_path, key)
    con = duckdb.connect(db)
    (s3, _), (s4, _) = span_at(con, 3), span_at(con, 4)
    con.execute("UPDATE spans SET chain_seq = 4 WHERE span_id = ?", [s3])
    con.execute("UPDATE spans SET chain_seq = 3 WHERE span_id = ?", [s4])
    con.close()
    r = verify(db)
    assert r.first_broken_index == 3 and "chain columns differ" in r.reason


def test_truncated_tail_needs_the_signed_checkpoints(tmp_path, key) -> None:
    db, cp = build_db(tmp_path, key)
    con = duckdb.connect(db)
    con.execute("DELETE FROM spans WHERE (chain_id = 'run-a' AND chain_seq >= 10) OR name = ?", [semconv.EVENT_CHECKPOINT])
    con.close()
    assert verify(db).valid  # a bare hash chain cannot see a cut tail
    r = verify(db, key, cp)
    assert (r.first_broken_index, r.reason) == (10, "truncated: signed checkpoint covers 13 entries, found 10")


def test_tape_spliced_from_two_tapes(tmp_path, key) -> None:
    db, _ = build_db(tmp_path, key, runs=("run-a", "run-b"))
    con = duckdb.connect(db)
    con.execute("DELETE FROM spans WHERE chain_id = 'run-a' AND chain_seq >= 6")
    for sid, attrs in con.execute("SELECT span_id, attributes FROM spans WHERE chain_id = 'run-b' AND chain_seq >= 6").fetchall():
        a = orjson.loads(attrs)
        set_chain(a, "id", "run-a")
        con.execute("UPDATE spans SET chain_id = 'run-a', attributes = ? WHERE span_id = ?", [orjson.dumps(a).decode(), sid])
    con.close()
    r = verify(db)
    assert r.first_broken_index == 6 and "does not link to seq 5" in r.reason
    # the whole of tape B relabelled as tape A fails at its genesis
    db2, _ = build_db(tmp_path / "x", key, runs=("run-b",)) if (tmp_path / "x").mkdir() is None else None
    con = duckdb.connect(db2)
    for sid, attrs in con.execute("SELECT span_id, attributes FROM spans WHERE chain_id = 'run-b'").fetchall():
        a = orjson.loads(attrs)
        set_chain(a, "id", "run-a")
        con.execute("UPDATE spans SET chain_id = 'run-a', attributes = ? WHERE span_id = ?", [orjson.dumps(a).decode(), sid])
    con.close()
    r = verify(db2)
    assert r.first_broken_index == 0 and "genesis" in r.reason




def test_full_reseal_with_another_key(tmp_path, key) -> None:
    db, cp = build_db(tmp_path, key)
    attacker = Signer.generate("test.agenttape/agent")  # same name, other key
    reader = open_reader(db)
    rows = sorted(load_rows(reader, "chain_id = 'run-a'"), key=lambda r: r["chain_seq"])
    reader.close()
    chain = Chain("run-a")
    con = duckdb.connect(db)
    con.execute("DELETE FROM spans WHERE name = ?", [semconv.EVENT_CHECKPOINT])
    for row in rows:
        a = orjson.loads(row["attributes"])
        if row["chain_seq"] == 5:
            a["payload"] = {"s": "rewritten"}
        row = dict(row, attributes=a)
        link = chain.append(row_leaf(row))
        set_chain(a, "prev", link.prev)
        set_chain(a, "hash", link.hash)
        con.execute("UPDATE spans SET attributes = ?, chain_prev = ?, chain_hash = ? WHERE span_id = ?",
                    [orjson.dumps(a).decode(), link.prev, link.hash, row["span_id"]])
    note = sign_note(Checkpoint(chain.origin, chain.size, chain.root(), (f"chain {chain.head}",)).body(), [attacker])
    con.execute(
        "INSERT INTO spans SELECT * REPLACE (? AS span_id, ? AS name, ? AS attributes, NULL AS chain_id, NULL AS chain_seq,"
        " NULL AS chain_prev, NULL AS chain_hash, NULL AS chain_epoch) FROM spans WHERE chain_id = 'run-a' AND chain_seq = 0",
        ["00000000000000ff", semconv.EVENT_CHECKPOINT, orjson.dumps({semconv.CHECKPOINT_NOTE: {"s": note}}).decode()])
    con.close()
    assert verify(db).valid  # the chain alone cannot tell a re-seal
    r = verify(db, key)
    assert (r.valid, r.first_broken_index) == (False, 0) and "no checkpoint signed by the trusted key (1 signed" in r.reason
    r = verify(db, key, cp)
    assert r.first_broken_index == 5
    assert r.reason == "checkpoint at size 6 does not match the stored entries: edited or re-sealed (entries 5..5)"


def test_edited_parquet_file(tmp_path, key) -> None:
    db, cp = build_db(tmp_path, key)
    lake = str(tmp_path / "lake")
    reader = open_reader(db)
    export_parquet(reader, lake)
    reader.close()
    assert verify(lake, key, cp).valid
    (path,) = glob.glob(f"{lake}/spans/**/*.parquet", recursive=True)
    table = pq.read_table(path)
    attrs = table.column("attributes").to_pylist()
    seqs = table.column("chain_seq").to_pylist()
    i = seqs.index(7)
    a = orjson.loads(attrs[i])
    a["ratio"] = {"d": "2.5"}
    attrs[i] = orjson.dumps(a).decode()
    idx = table.schema.get_field_index("attributes")
    import pyarrow as pa

    table = table.set_column(idx, table.schema.field(idx), pa.array(attrs, type=table.schema.field(idx).type))
    pq.write_table(table, path)
    r = verify(lake, key, cp)
    assert (r.first_broken_index, r.reason) == (7, "leaf hash mismatch at seq 7: span content edited")


def test_parallel_verification_matches(tmp_path, key, monkeypatch) -> None:
    from otel_agenttape.tape import sealed_entries

    db, cp = build_db(tmp_path, key)
    con = duckdb.connect(db)
    sid, attrs = span_at(con, 9)
    a = orjson.loads(attrs)
    a["blob"] = {"b": "AA=="}
    con.execute("UPDATE spans SET attributes = ? WHERE span_id = ?", [orjson.dumps(a).decode(), sid])
    con.close()
    monkeypatch.setattr(sealed_entries, "PARALLEL_MIN_ROWS", 1)
    reader = open_reader(db)
    (r,) = verify_store(reader, verifiers=[key.verifier()], checkpoint_files=[cp], workers=2)
    reader.close()
    assert (r.first_broken_index, r.reason) == (9, "leaf hash mismatch at seq 9: span content edited")


def test_reseal_with_default_checkpoint_cadence_is_bounded_to_a_range(tmp_path, key) -> None:
    """Default cadence (opening and run-end checkpoints for a short run): a consistent re-seal of one
    entry cannot be pinned to it, but the signed checkpoint still refuses the tape over its range."""
    db = str(tmp_path / "tape.duckdb")
    cp_file = tmp_path / "checkpoints.jsonl"
    store = Store(db)
    store.write_traces([encode(record("run-a", key, cp_file, on_nodes=False))])
    store.close()
    reader = open_reader(db)
    rows = sorted(load_rows(reader, "chain_id = 'run-a'"), key=lambda r: r["chain_seq"])
    reader.close()
    chain = Chain("run-a")
    con = duckdb.connect(db)
    for row in rows:
        a = orjson.loads(row["attributes"])
        if row["chain_seq"] == 5:
            a["payload"] = {"s": "rewritten"}
        link = chain.append(row_leaf(dict(row, attributes=a)))
        set_chain(a, "prev", link.prev)
        set_chain(a, "hash", link.hash)
        con.execute("UPDATE spans SET attributes = ?, chain_prev = ?, chain_hash = ? WHERE span_id = ?",
                    [orjson.dumps(a).decode(), link.prev, link.hash, row["span_id"]])
    con.close()
    r = verify(db, key, str(cp_file))
    assert not r.valid and r.first_broken_index == 0
    assert r.reason.startswith(f"checkpoint at size {len(rows)} does not match the stored entries")


def test_a_run_id_sealed_by_two_processes_without_a_checkpoint_file(tmp_path, key) -> None:
    """Reusing a run id to resume, with no shared checkpoint file: two chains of the same tape id and
    epoch, one per trace. Each verifies on its own; tampering in one is reported there only."""
    from otel_agenttape.integrity.proof import verify_proof
    from otel_agenttape.tape.proofs import prove_span

    db = str(tmp_path / "tape.duckdb")
    store = Store(db)
    store.write_traces([encode(record("run-a", key, None, n=4))])  # first process
    store.write_traces([encode(record("run-a", key, None, n=7))])  # second process, same run id
    store.close()
    reader = open_reader(db)
    reports = verify_store(reader, run="run-a", verifiers=[key.verifier()])
    reader.close()
    assert [(r.chain_id, r.epoch, r.valid, r.length) for r in reports] in (
        [("run-a", 0, True, 5), ("run-a", 0, True, 8)], [("run-a", 0, True, 8), ("run-a", 0, True, 5)])
    assert all(r.signed_size == r.length for r in reports)
    assert len({r.trace_id for r in reports}) == 2 and all(r.trace_id for r in reports)
    long_trace = next(r.trace_id for r in reports if r.length == 8)

    con = duckdb.connect(db)
    sid, attrs = con.execute("SELECT span_id, attributes FROM spans WHERE chain_id = 'run-a' AND chain_seq = 6 "
                             "AND trace_id = ?", [long_trace]).fetchone()
    con.close()
    reader = open_reader(db)
    proof = prove_span(reader, sid, verifiers=[key.verifier()])  # the tree of its own trace's chain
    reader.close()
    assert verify_proof(proof, [key.verifier()]).index == 6

    con = duckdb.connect(db)
    a = orjson.loads(attrs)
    a["payload"] = {"s": "edited"}
    con.execute("UPDATE spans SET attributes = ? WHERE span_id = ?", [orjson.dumps(a).decode(), sid])
    con.close()
    reader = open_reader(db)
    reports = verify_store(reader, run="run-a", verifiers=[key.verifier()])
    reader.close()
    by_trace = {r.trace_id: r for r in reports}
    assert not by_trace[long_trace].valid and by_trace[long_trace].first_broken_index == 6
    assert "span content edited" in by_trace[long_trace].reason
    assert all(r.valid for t, r in by_trace.items() if t != long_trace)
