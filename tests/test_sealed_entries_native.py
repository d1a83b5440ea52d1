"""The compiled verifier path (``tape/_sealed_entries.pyx``) gives exactly the Python fast path's entries.

It hashes a stored row's leaf as it reads the row's texts, so it must take every untouched row that
the Python path takes (v1 and v2 leaves, salted event values, escapes and non-ASCII text, events in
order) and hand back (None) every row whose bytes it cannot vouch for: those go to the Python path,
which decides, so a verification's findings never depend on which path read a row.
"""

from __future__ import annotations

import duckdb
import orjson
import pyarrow as pa
import pytest
from integrity_support import encode, sealed_provider, set_stored_attributes, stored_attributes
from opentelemetry.trace import Link, SpanContext, TraceFlags

from otel_agenttape import semconv
from otel_agenttape.store.reader import open_reader
from otel_agenttape.store.writer import Store
from otel_agenttape.tape import sealed_entries
from otel_agenttape.tape.sealed_rows import load_rows, query_rows, row_entry, to_compact
from otel_agenttape.tape.verification import verify_store

streamed = sealed_entries._streamed
pytestmark = pytest.mark.skipif(streamed is None, reason="compiled verifier path not built or turned off")

REMOTE = SpanContext(0x1F2E3D4C5B6A79881726354453627180, 0x0102030405060708, True, TraceFlags(TraceFlags.SAMPLED))


def _record(run_id: str, v2: bool, n: int = 12):
    provider, sealer, exporter = sealed_provider(checkpoint_every=5, **({} if v2 else {"content_keys": frozenset()}))
    tracer = provider.get_tracer("otel_agenttape")
    with tracer.start_as_current_span("run \"quoted\" \u00e9", attributes={semconv.RUN_ID: run_id}):
        for i in range(n):
            attrs = {semconv.NODE_TYPE: "model", semconv.STEP: i, "ratio": i / 7, "flag": i % 2 == 0,
                     "tags": ("a", "b\n"), "blob": bytes([i, 255]), "text": f"line\t{i}\u2028\U0001f600 \"q\" \\",
                     semconv.GEN_AI_INPUT_MESSAGES: f'[{{"role":"user","content":"secret {i} \u00e9\\n"}}]',
                     semconv.GEN_AI_OUTPUT_MESSAGES: f'[{{"role":"assistant","content":"answer {i}"}}]'}
            links = [Link(REMOTE, {"why": "retry"})] if i == 4 else None
            with tracer.start_as_current_span(f"chat {i} \x01", attributes=attrs, links=links) as sp:
                sp.add_event(semconv.EVENT_TEXT, {semconv.EVENT_SEQ: 0, semconv.EVENT_SEGMENT: f"part {i} \u00e9"})
                sp.add_event("second \"e\"", {"n": i})
                if i == 7:
                    sp.set_status(2, "failed: \"x\"\n")
        with tracer.start_as_current_span("", attributes={semconv.NODE_TYPE: "tool"}):
            pass  # an empty name: a null in its place is another leaf
    provider.shutdown()
    assert sealer.errors == 0
    return exporter.get_finished_spans()


@pytest.fixture(params=["v1", "v2"])
def db(request, tmp_path):
    path = str(tmp_path / "tape.duckdb")
    store = Store(path)
    store.write_traces([encode(_record("run-n", request.param == "v2"))])
    store.close()
    return path


def _both(db: str):
    """(compiled results per row, Python fast path entries, general path entries) of every sealed row."""
    reader = open_reader(db)
    try:
        spans, ev_by, lk_by = query_rows(reader, "chain_id IS NOT NULL", [])
        compiled, python = [], []
        for rb in spans.to_batches(max_chunksize=7):
            col = {n: rb.column(i).to_pylist() for i, n in enumerate(rb.schema.names)}
            got, left = streamed.batch(col, rb.num_rows, ev_by, lk_by)
            assert left == got.count(None)
            assert streamed.batch(col, rb.num_rows, ev_by, lk_by, rb.column("attributes")) == (got, left)
            compiled += got
            saved = sealed_entries._streamed
            sealed_entries._streamed = None
            try:
                python += sealed_entries.batch_entries(rb, ev_by, lk_by)
            finally:
                sealed_entries._streamed = saved
        general = [to_compact(*row_entry(row)) for row in load_rows(reader)]
    finally:
        reader.close()
    return compiled, python, general


def test_untouched_rows_are_hashed_as_read_and_equal_the_python_path(db) -> None:
    compiled, python, general = _both(db)
    assert sorted(python, key=repr) == sorted(general, key=repr)
    taken = [c for c in compiled if c is not None]
    # every row but the one with a link (links are left to the Python path)
    assert len(taken) == len(compiled) - 1 == 13
    for c, p in zip(compiled, python):
        if c is not None:
            assert c == p
    salted = orjson.loads(stored_attributes(db, 2).get(semconv.CHAIN_SALTS, {"s": "{}"})["s"])
    if salted:  # v2: the span's messages and the event's text are salted, and still hashed as read
        assert f"event:0:{semconv.EVENT_SEGMENT}" in salted and semconv.GEN_AI_INPUT_MESSAGES in salted


def _salts_text(a: dict, fn) -> str:
    m = orjson.loads(a[semconv.CHAIN_SALTS]["s"])
    fn(m)
    a[semconv.CHAIN_SALTS] = {"s": orjson.dumps(m).decode()}
    return orjson.dumps(a).decode()


EDITS = {
    "value edited": lambda a: (a.__setitem__("text", {"s": "forged"}), orjson.dumps(a).decode())[1],
    "whitespace": lambda a: orjson.dumps(a, option=orjson.OPT_INDENT_2).decode(),
    "keys reversed": lambda a: orjson.dumps(dict(reversed(list(a.items())))).decode(),
    "escaped key": lambda a: orjson.dumps(a).decode().replace('"ratio"', '"r\\u0061tio"'),
    "duplicate key": lambda a: orjson.dumps(a).decode()[:-1] + ',"zz":{"s":"1"},"zz":{"s":"2"}}',
    "seq with a leading zero": lambda a: orjson.dumps(a).decode().replace(
        '"agenttape.chain.seq":{"i":"3"}', '"agenttape.chain.seq":{"i":"03"}'),
    "chain id edited": lambda a: (a.__setitem__(semconv.CHAIN_ID, {"s": "other"}), orjson.dumps(a).decode())[1],
    "epoch added": lambda a: (a.__setitem__(semconv.CHAIN_EPOCH, {"i": "1"}), orjson.dumps(a).decode())[1],
    "erased map added": lambda a: (a.__setitem__(semconv.CHAIN_ERASED, {"s": "{}"}), orjson.dumps(a).decode())[1],
    "not an object": lambda a: "[1,2]",
}
V2_EDITS = {
    "salt changed": lambda a: _salts_text(a, lambda m: m.__setitem__(semconv.GEN_AI_INPUT_MESSAGES, "00" * 16)),
    "salt in upper case": lambda a: _salts_text(a, lambda m: m.__setitem__(
        semconv.GEN_AI_INPUT_MESSAGES, m[semconv.GEN_AI_INPUT_MESSAGES].upper())),
    "salt for a missing key": lambda a: _salts_text(a, lambda m: m.__setitem__("nope", "00" * 16)),
    "salt for a missing event": lambda a: _salts_text(a, lambda m: m.__setitem__("event:9:x", "00" * 16)),
    "salt removed, value kept": lambda a: _salts_text(a, lambda m: m.pop(semconv.GEN_AI_INPUT_MESSAGES)),
    "salted value removed": lambda a: (a.pop(semconv.GEN_AI_INPUT_MESSAGES), orjson.dumps(a).decode())[1],
    "salts spaced": lambda a: (a.__setitem__(semconv.CHAIN_SALTS, {"s": orjson.dumps(orjson.loads(
        a[semconv.CHAIN_SALTS]["s"]), option=orjson.OPT_INDENT_2).decode()}), orjson.dumps(a).decode())[1],
}


@pytest.mark.parametrize("edit", [*EDITS, *V2_EDITS])
def test_edited_rows_are_left_to_the_python_path(db, edit) -> None:
    seq = 3
    a = stored_attributes(db, seq)
    if edit in V2_EDITS and semconv.CHAIN_SALTS not in a:
        pytest.skip("a v2 edit")
    set_stored_attributes(db, seq, (EDITS.get(edit) or V2_EDITS[edit])(a))
    compiled, python, general = _both(db)
    at = [i for i, p in enumerate(python) if p[2] == seq]
    assert [compiled[i] for i in at] == [None]  # the compiled path vouches only for bytes it reproduced
    for c, p in zip(compiled, python):
        if c is not None:
            assert c == p
    assert sorted(python, key=repr) == sorted(general, key=repr)
    reader = open_reader(db)
    try:
        reports = verify_store(reader)
    finally:
        reader.close()
    # the same content in another form verifies; an empty erasure map on a v1 row makes it claim leaf v2
    same_content = edit in ("whitespace", "keys reversed", "escaped key", "seq with a leading zero", "salts spaced")
    if edit == "erased map added":
        same_content = semconv.CHAIN_SALTS in a
    assert all(r.valid for r in reports) is same_content, [r.reason for r in reports]


@pytest.mark.parametrize("sql", [
    "UPDATE spans SET name = 'renamed' WHERE chain_seq = 3",
    "UPDATE spans SET status_message = 'x' WHERE chain_seq = 3",
    "UPDATE spans SET end_time_unix_nano = end_time_unix_nano + 1 WHERE chain_seq = 3",
    "UPDATE spans SET chain_prev = chain_hash WHERE chain_seq = 3",
    ("UPDATE span_events SET attributes = '{\"n\":{\"i\":\"99\"}}' WHERE event_index = 1 AND span_id = "
     "(SELECT span_id FROM spans WHERE chain_seq = 3)"),
    "UPDATE span_events SET name = 'x' WHERE event_index = 0 AND span_id = (SELECT span_id FROM spans WHERE chain_seq = 3)",
    ("UPDATE span_events SET event_index = 1 - event_index WHERE span_id = "
     "(SELECT span_id FROM spans WHERE chain_seq = 3)"),
    "DELETE FROM span_events WHERE event_index = 1 AND span_id = (SELECT span_id FROM spans WHERE chain_seq = 3)",
    "UPDATE spans SET chain_prev = '\u00e9' || substr(chain_prev, 2) WHERE chain_seq = 3",
    "UPDATE spans SET name = NULL WHERE chain_seq = 3",
    "UPDATE spans SET span_id = NULL WHERE chain_seq = 3",
])
def test_edited_columns_are_left_to_the_python_path(db, sql) -> None:
    con = duckdb.connect(db)
    try:
        con.execute("ALTER TABLE spans ALTER name DROP NOT NULL")  # an editor of the file can drop them
        con.execute("ALTER TABLE spans ALTER span_id DROP NOT NULL")
        con.execute(sql)
    finally:
        con.close()
    compiled, python, general = _both(db)
    at = [i for i, p in enumerate(python) if p[2] == 3]
    assert [compiled[i] for i in at] == [None]
    assert sorted(python, key=repr) == sorted(general, key=repr)
    reader = open_reader(db)
    try:
        (report,) = verify_store(reader)
    finally:
        reader.close()
    assert not report.valid and report.first_broken_index == 3, report.reason


def test_an_empty_text_set_to_null_is_not_taken_for_it(db) -> None:
    """A span sealed with an empty name whose name is then set to NULL: the leaf holds a null there,
    so the row no longer verifies; the compiled path must not read the null as the empty name."""
    con = duckdb.connect(db)
    try:
        (seq,) = con.execute("SELECT chain_seq FROM spans WHERE name = ''").fetchone()
        con.execute("ALTER TABLE spans ALTER name DROP NOT NULL")
        con.execute("UPDATE spans SET name = NULL WHERE name = ''")
    finally:
        con.close()
    compiled, python, general = _both(db)
    at = [i for i, p in enumerate(python) if p[2] == seq]
    assert [compiled[i] for i in at] == [None]
    reader = open_reader(db)
    try:
        (report,) = verify_store(reader)
    finally:
        reader.close()
    assert not report.valid and report.first_broken_index == seq, report.reason


def test_odd_column_values_are_left_to_the_python_path() -> None:
    col = {"trace_id": ["t"], "span_id": ["s"], "attributes": ['{"a":{"s":"b"}}'], "name": [None], "kind": [1],
           "start_time_unix_nano": [1], "end_time_unix_nano": [2], "chain_id": ["c"], "chain_seq": [0],
           "chain_prev": ["0" * 64], "chain_hash": ["1" * 64], "chain_epoch": [None]}
    assert streamed.batch(col, 1, {}, {}) == ([None], 1)
    assert streamed.batch({**col, "kind": [1.5]}, 1, {}, {}) == ([None], 1)
    assert streamed.batch({**col, "attributes": [None]}, 1, {}, {}) == ([None], 1)
    assert streamed.batch({**col, "chain_seq": []}, 1, {}, {}) == ([None], 1)  # short columns: nothing taken
    assert streamed.batch(col, 1, {}, {}, pa.array([None], pa.string())) == ([None], 1)
    assert streamed.batch(col, 1, {}, {}, pa.array([1])) == ([None], 1)  # not a string array


def test_a_span_committed_with_its_events_during_a_read_is_never_read_without_them(tmp_path) -> None:
    """The verifier starts the spans' stream before it reads the events: a span a receiver commits
    with its events in the meantime is in neither read (a gap at worst), never a span without its
    events (which would read as edited)."""
    from integrity_support import encode as _encode

    from otel_agenttape.store.readers import ConnectionReader
    from otel_agenttape.tape.sealed_rows import query_row_batches

    path = str(tmp_path / "race.duckdb")
    store = Store(path)
    store.write_traces([_encode(_record("run-r", True, n=3))])
    store.close()
    con = duckdb.connect(path)
    try:
        con.execute("CREATE TEMP TABLE hs AS SELECT * FROM spans WHERE chain_seq = 2")
        con.execute("CREATE TEMP TABLE he AS SELECT e.* FROM span_events e JOIN hs USING (trace_id, span_id)")
        con.execute("DELETE FROM span_events WHERE span_id IN (SELECT span_id FROM hs)")
        con.execute("DELETE FROM spans WHERE chain_seq = 2")
        batches, ev_by, lk_by = query_row_batches(ConnectionReader(con, owns=False), "chain_id IS NOT NULL", [])
        con.execute("BEGIN; INSERT INTO spans SELECT * FROM hs; INSERT INTO span_events SELECT * FROM he; COMMIT")
        entries = [e for rb in batches for e in sealed_entries.batch_entries(rb, ev_by, lk_by)]
    finally:
        con.close()
    assert entries and all(e[4] == e[5] for e in entries)  # every span read hashes to its link
    assert 2 not in {e[2] for e in entries}  # the span committed meanwhile is not in this read
