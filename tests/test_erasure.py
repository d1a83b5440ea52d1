"""Verifiable erasure (docs/integrity.md, "Erasure"): a session's content leaves a DuckDB store for good,
every tape still verifies, the erasure record is signed and names no content, and each forgery is
caught at its index."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import duckdb
import orjson
import pytest
from integrity_support import encode, sealed_provider

import otel_agenttape
from otel_agenttape import semconv
from otel_agenttape.integrity import Signer
from otel_agenttape.integrity.leaf import commitment_hex
from otel_agenttape.integrity.proof import verify_proof
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.proofs import prove_span
from otel_agenttape.tape.verification import verify_store

KEY = Signer.generate("erasure-test.agenttape/key")
SECRET = "Zorblax-private-4111-1111"  # in session s1 only
KEPT = "Quindle-kept-9876"  # in session s2


def _record(tracer, run_id: str, session: str, text: str, n: int = 3) -> None:
    with tracer.start_as_current_span("run", attributes={semconv.RUN_ID: run_id, semconv.SESSION_ID: session,
                                                         semconv.RUN_STATUS: semconv.STATUS_COMPLETED}):
        for i in range(n):
            with tracer.start_as_current_span(f"chat {i}", attributes={
                semconv.RUN_ID: run_id, semconv.NODE_TYPE: "model", semconv.STEP: i,
                semconv.GEN_AI_OPERATION_NAME: "chat", semconv.GEN_AI_REQUEST_MODEL: "m",
                semconv.GEN_AI_INPUT_MESSAGES: json.dumps([{"role": "user", "parts": [
                    {"type": "text", "content": f"{text} asks {i}"}]}]),
                semconv.GEN_AI_OUTPUT_MESSAGES: json.dumps([{"role": "assistant", "parts": [
                    {"type": "text", "content": f"{text} answered {i}"}]}]),
            }) as sp:
                sp.add_event(semconv.EVENT_TEXT, {semconv.EVENT_SEQ: 0, semconv.EVENT_SEGMENT: f"{text} part {i}"})


def _spans():
    provider, sealer, exporter = sealed_provider(checkpoint_every=2, signing_key=KEY)
    tracer = provider.get_tracer("otel_agenttape")
    _record(tracer, "a1", "s1", SECRET)
    _record(tracer, "a2", "s1", SECRET)
    _record(tracer, "b1", "s2", KEPT)
    provider.shutdown()
    v1_provider, v1_sealer, v1_exporter = sealed_provider(checkpoint_every=2, signing_key=KEY,
                                                          content_keys=frozenset())
    _record(v1_provider.get_tracer("otel_agenttape"), "old", "s1", "v1-content")
    v1_provider.shutdown()
    assert sealer.errors == 0 and v1_sealer.errors == 0
    return list(exporter.get_finished_spans()) + list(v1_exporter.get_finished_spans())


def _bytes_on_disk(path: str) -> bytes:
    out = b""
    for p in (path, path + ".wal"):
        if os.path.exists(p):
            with open(p, "rb") as fh:
                out += fh.read()
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A store before erasure (``before``, with what its WAL held while open) and one after erasing s1."""
    d = tmp_path_factory.mktemp("erasure")
    before = str(d / "before.duckdb")
    store = Store(before)
    store.write_traces([encode(_spans())])
    wal_bytes = _bytes_on_disk(before)  # open: the rows are in the WAL as written
    store.close()
    after = str(d / "after.duckdb")
    shutil.copy(before, after)
    with otel_agenttape.open(after) as tapes:
        dry = tapes.erase(session="s1", reason="GDPR art. 17 request #42", by="dpo@example.org",
                          signing_key=KEY, dry_run=True)
        result = tapes.erase(session="s1", reason="GDPR art. 17 request #42", by="dpo@example.org",
                             signing_key=KEY)
    return {"before": before, "after": after, "wal_bytes": wal_bytes, "dry": dry, "result": result, "dir": d}


def _copy(stores, name: str) -> str:
    path = str(stores["dir"] / name)
    shutil.copy(stores["after"], path)
    return path


def _reports(path: str, keys=(KEY.verifier(),)):
    with otel_agenttape.open(path) as tapes:
        return {r.chain_id: r for r in verify_store(tapes.reader, verifiers=list(keys))}


def test_erasure_removes_the_session_content_and_every_tape_still_verifies(stores) -> None:
    dry, result = stores["dry"], stores["result"]
    assert dry["dry_run"] and dry["erasure_id"] is None
    assert (dry["spans"], dry["values"]) == (result["spans"], result["values"]) == (6, 18)  # 6 nodes x 3 values
    assert result["skipped_v1_spans"] == 3  # the v1 tape holds its content in the leaf: left, counted
    assert set(result["keys"]) == {semconv.GEN_AI_INPUT_MESSAGES, semconv.GEN_AI_OUTPUT_MESSAGES,
                                   semconv.EVENT_SEGMENT}
    reports = _reports(stores["after"])
    assert set(reports) == {"a1", "a2", "b1", "old"}
    assert all(r.valid for r in reports.values()), {k: r.reason for k, r in reports.items()}
    assert all(r.signed_size == r.length for r in reports.values())
    for run in ("a1", "a2"):
        assert (reports[run].erased_spans, reports[run].erased_values) == (3, 9)
        assert [e["id"] for e in reports[run].erasures] == [result["erasure_id"]]
    assert reports["b1"].erased_spans == 0
    con = duckdb.connect(stores["after"], read_only=True)
    try:
        (live,) = con.execute("SELECT string_agg(attributes, '') FROM (SELECT attributes FROM spans UNION ALL "
                              "SELECT attributes FROM span_events)").fetchone()
        (free,) = con.execute("SELECT free_blocks FROM pragma_database_size()").fetchone()
    finally:
        con.close()
    assert SECRET not in live and KEPT in live and "v1-content" in live
    assert free == 0  # rewritten: no freed block that could still hold an erased value


def test_no_copy_of_an_erased_value_is_left_in_the_file_or_wal(stores) -> None:
    assert SECRET.encode() in stores["wal_bytes"]  # the scan finds the value where it is written raw
    assert not os.path.exists(stores["after"] + ".wal")
    assert SECRET.encode() not in _bytes_on_disk(stores["after"])
    leftovers = [p for p in os.listdir(stores["dir"]) if p.startswith("after.duckdb") and p != "after.duckdb"]
    assert leftovers == []


def test_the_erasure_record_is_signed_and_names_no_content(stores) -> None:
    con = duckdb.connect(stores["after"], read_only=True)
    try:
        rows = con.execute("SELECT attributes, scope_name FROM spans WHERE name = ?", [semconv.EVENT_ERASURE]).fetchall()
    finally:
        con.close()
    (attrs, scope), = rows
    a = orjson.loads(attrs)
    record = orjson.loads(a[semconv.ERASURE_RECORD]["s"])
    assert scope == semconv.SCOPE_INTEGRITY and record["id"] == stores["result"]["erasure_id"]
    assert record["reason"] == "GDPR art. 17 request #42" and record["by"] == "dpo@example.org"
    assert record["selector"] == {"session": "s1"} and len(record["spans"]) == 6 and record["values"] == 18
    assert SECRET not in attrs and "asks" not in attrs
    assert KEY.name in a[semconv.ERASURE_NOTE]["s"]


def test_replay_show_and_dataset_say_erased(stores) -> None:
    with otel_agenttape.open(stores["after"]) as tapes:
        run = tapes.rebuild("a1")
        out_path = stores["dir"] / "ds.jsonl"
        with open(out_path, "w", encoding="utf-8") as fh:
            ds = tapes.dataset(fh)
    assert run.erased and all(n.erased for n in run.model_nodes)
    assert run.model_nodes[0].input_messages[0].content() == "[erased]"
    assert SECRET not in orjson.dumps(run.to_json()).decode()
    assert ds.skipped["erased"] == 2  # a1 and a2 (b1 and the v1 run are skipped as incomplete, not erased)
    shown = subprocess.run([sys.executable, "-m", "otel_agenttape", "show", "a1", "--db", stores["after"]],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "ERASED(" in shown.stdout and "input      user: [erased]" in shown.stdout


def test_proof_of_an_erased_span_verifies_offline(stores) -> None:
    con = duckdb.connect(stores["after"], read_only=True)
    try:
        (span_id,) = con.execute("SELECT span_id FROM spans WHERE run_id = 'a1' AND name = 'chat 1'").fetchone()
    finally:
        con.close()
    with otel_agenttape.open(stores["after"]) as tapes:
        proof = prove_span(tapes.reader, span_id, verifiers=[KEY.verifier()])
    assert SECRET not in proof["leaf"] and '"c":' in proof["leaf"]
    assert verify_proof(json.loads(json.dumps(proof)), [KEY.verifier()]).span_id == span_id


def _edit_attrs(path: str, run_id: str, name: str, fn) -> int:
    con = duckdb.connect(path)
    try:
        seq, text = con.execute("SELECT chain_seq, attributes FROM spans WHERE run_id = ? AND name = ?",
                                [run_id, name]).fetchone()
        a = orjson.loads(text)
        fn(a)
        con.execute("UPDATE spans SET attributes = ? WHERE run_id = ? AND name = ?",
                    [orjson.dumps(a).decode(), run_id, name])
    finally:
        con.close()
    return seq


def _salts(a: dict) -> dict:
    return orjson.loads(a[semconv.CHAIN_SALTS]["s"])


def _set_map(a: dict, key: str, m: dict) -> None:
    a[key] = {"s": orjson.dumps(m).decode()}


def _erase_unrecorded(a: dict) -> None:
    """Erase a value as the rule does (commitment kept) but with no record naming it."""
    salts = _salts(a)
    k = semconv.GEN_AI_INPUT_MESSAGES
    c = commitment_hex(bytes.fromhex(salts.pop(k)), a.pop(k))
    _set_map(a, semconv.CHAIN_SALTS, salts)
    _set_map(a, semconv.CHAIN_ERASED, {k: c})


def _salt_kept(a: dict) -> None:
    a.pop(semconv.GEN_AI_OUTPUT_MESSAGES)  # the value removed, its salt left in place


FORGERIES = {
    "edited value": ("b1", lambda a: a.__setitem__(semconv.GEN_AI_INPUT_MESSAGES, {"s": "[]"}),
                     "leaf hash mismatch"),
    "erased value no record names": ("b1", _erase_unrecorded, "no erasure record names it"),
    "salt kept while its value was removed": ("b1", _salt_kept, "salt for a missing value"),
}


@pytest.mark.parametrize("name", list(FORGERIES), ids=list(FORGERIES))
def test_each_forgery_is_caught_with_its_index(stores, name) -> None:
    run_id, fn, why = FORGERIES[name]
    path = _copy(stores, f"forged-{abs(hash(name))}.duckdb")
    seq = _edit_attrs(path, run_id, "chat 1", fn)
    reports = _reports(path)
    r = reports[run_id]
    assert not r.valid and r.first_broken_index == seq and why in r.reason, r.reason
    assert all(reports[k].valid for k in ("a1", "a2", "old"))


def test_a_forged_or_untrusted_erasure_record_is_caught(stores) -> None:
    path = _copy(stores, "forged-record.duckdb")
    con = duckdb.connect(path)
    try:
        (text,) = con.execute("SELECT attributes FROM spans WHERE name = ?", [semconv.EVENT_ERASURE]).fetchone()
        a = orjson.loads(text)
        record = orjson.loads(a[semconv.ERASURE_RECORD]["s"])
        record["reason"] = "routine cleanup"  # edited after signing
        a[semconv.ERASURE_RECORD] = {"s": orjson.dumps(record).decode()}
        con.execute("UPDATE spans SET attributes = ? WHERE name = ?", [orjson.dumps(a).decode(), semconv.EVENT_ERASURE])
        (seq,) = con.execute("SELECT min(chain_seq) FROM spans WHERE run_id = 'a1' AND attributes LIKE '%chain.erased%'"
                             ).fetchone()
    finally:
        con.close()
    r = _reports(path)["a1"]
    assert not r.valid and r.first_broken_index == seq and "does not match the record" in r.reason, r.reason
    # the untouched record, but a verifier that pins another key: its erasures do not count
    other = Signer.generate("someone-else")
    r2 = _reports(stores["after"], keys=(KEY.verifier(), other.verifier()))["a1"]
    assert r2.valid
    r3 = _reports(stores["after"], keys=(other.verifier(),))["a1"]
    assert not r3.valid and "not signed by a trusted key" in " ".join(i.reason for i in r3.issues)


def test_cli_erase_dry_run_erase_and_verify(stores, tmp_path) -> None:
    path = str(tmp_path / "cli.duckdb")
    shutil.copy(stores["before"], path)
    key_file = tmp_path / "k.key"
    key_file.write_text(KEY.skey(), encoding="utf-8")
    pub = tmp_path / "k.pub"
    pub.write_text(KEY.verifier().vkey(), encoding="utf-8")

    def cli(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        return subprocess.run([sys.executable, "-m", "otel_agenttape", *args], capture_output=True, text=True,
                              timeout=120, env=env)

    dry = cli("erase", "--db", path, "--run", "b1", "--reason", "asked", "--dry-run")
    assert dry.returncode == 0 and "would erase 9 values in 3 sealed spans" in dry.stdout, dry.stdout + dry.stderr
    done = cli("erase", "--db", path, "--run", "b1", "--reason", "asked", "--signing-key", str(key_file))
    assert done.returncode == 0 and "erased 9 values in 3 sealed spans (erasure e-" in done.stdout, done.stderr
    ver = cli("verify", "--db", path, "--key", str(pub))
    assert ver.returncode == 0, ver.stdout
    assert "3 spans, 9 values erased by erasure e-" in ver.stdout
    bad = cli("erase", "--db", path, "--session", "s2", "--reason", "  ")
    assert bad.returncode == 2 and "--reason" in bad.stderr


def test_rows_keep_their_rowids_and_the_record_is_appended(stores) -> None:
    """The lake publisher reads a store by rowid ranges: the rewrite keeps every row where it was."""
    def order(path: str) -> tuple[list, list]:
        con = duckdb.connect(path, read_only=True)
        try:
            return (con.execute("SELECT trace_id, span_id, name FROM spans ORDER BY rowid").fetchall(),
                    con.execute("SELECT trace_id, span_id, event_index FROM span_events ORDER BY rowid").fetchall())
        finally:
            con.close()

    (spans_before, events_before), (spans_after, events_after) = order(stores["before"]), order(stores["after"])
    assert spans_after[:-1] == spans_before and spans_after[-1][2] == semconv.EVENT_ERASURE
    assert events_after == events_before


def test_where_erases_what_a_predicate_over_spans_selects(stores) -> None:
    path = _copy(stores, "where.duckdb")
    with otel_agenttape.open(path) as tapes:
        done = tapes.erase(where="run_id = 'b1' AND step = 1", reason="asked", signing_key=KEY)
        for bad, why in (("run_id = 'a2') OR (true", "not one SQL expression"),
                         ("nosuchcolumn = 1", "nosuchcolumn"),
                         ("(SELECT content FROM read_text('/etc/passwd')) = 'x'", "read_text")):
            with pytest.raises(ValueError, match=why):
                tapes.erase(where=bad, reason="asked", signing_key=KEY)
    assert (done["spans"], done["values"]) == (1, 3)
    con = duckdb.connect(path, read_only=True)
    try:
        (record,) = con.execute("SELECT attributes FROM spans WHERE name = ?", [semconv.EVENT_ERASURE]).fetchall()[-1]
        erased = con.execute("SELECT name FROM spans WHERE run_id = 'b1' AND attributes LIKE '%chain.erased%'"
                             ).fetchall()
    finally:
        con.close()
    assert orjson.loads(orjson.loads(record)[semconv.ERASURE_RECORD]["s"])["selector"] == {
        "where": "run_id = 'b1' AND step = 1"}
    assert erased == [("chat 1",)]
    reports = _reports(path)
    assert reports["b1"].valid and reports["b1"].erased_values == 3, reports["b1"].reason
    assert reports["a1"].valid and len(reports["a1"].erasures) == 1  # the first record still accounts for s1
