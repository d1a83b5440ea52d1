"""Erasure reaches every copy (docs/integrity.md, "Erasure"): the Parquet export, a folder lake, the
receiver's write-ahead log and an agent's outbox. The erased value is found in every copy before and in
no byte of any file under it after; the copies read as stores still verify, the erasure reported."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from integrity_support import encode
from test_erasure import KEPT, KEY, SECRET, _spans

import otel_agenttape
from otel_agenttape import outboxfile, semconv, walfile
from otel_agenttape.store.lake.publish import LakePublisher
from otel_agenttape.store.parquet import export_parquet
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.verification import verify_store


def _all_bytes(folder: Path) -> bytes:
    """Every byte of every file under ``folder`` (hidden and temp files too), and for a Parquet file its
    decoded rows as well (zstd pages hide a value from a raw scan)."""
    out = b""
    for dirpath, _, names in os.walk(folder):
        for n in names:
            path = Path(dirpath) / n
            out += path.read_bytes()
            if n.endswith(".parquet"):
                out += str(pq.read_table(path, partitioning=None).to_pylist()).encode()
    return out


def _reports(source) -> dict:
    with otel_agenttape.open(source) as tapes:
        return {r.chain_id: r for r in verify_store(tapes.reader, verifiers=[KEY.verifier()])}


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    d = tmp_path_factory.mktemp("copies")
    payload = encode(_spans()).SerializeToString()
    db = str(d / "tapes.duckdb")
    store = Store(db)
    store.write_traces([payload])
    LakePublisher(store, str(d / "lake"), "r0").publish_all()
    store.close()
    with otel_agenttape.open(db) as tapes:
        export_parquet(tapes.reader, str(d / "export"))
    # a WAL a crashed receiver left beside the store (found without naming it), and an agent's outbox
    wal = Path(db + ".otlpwal")
    wal.mkdir()
    (wal / walfile.segment_name(1)).write_bytes(walfile.record_header(walfile.KIND_TRACES, payload) + payload)
    lane, _ = outboxfile.open_lane(d / "outbox")
    lane.append(outboxfile.KIND_TRACES, 13, payload)
    lane.append(outboxfile.KIND_TRACES, 13, payload)  # a retried request: the same spans twice
    lane.ack_first()  # the first was delivered: its bytes are still in the segment
    lane.close()
    places = {"export": d / "export", "lake": d / "lake", "wal": wal, "outbox": d / "outbox"}
    before = {k: _all_bytes(p) for k, p in places.items()}
    with otel_agenttape.open(db) as tapes:
        dry = tapes.erase(session="s1", reason="GDPR art. 17 request #7", signing_key=KEY, dry_run=True,
                          parquet=[str(d / "export")], lakes=[str(d / "lake")], outbox=[str(d / "outbox")])
        result = tapes.erase(session="s1", reason="GDPR art. 17 request #7", signing_key=KEY,
                             parquet=[str(d / "export")], lakes=[str(d / "lake")], outbox=[str(d / "outbox")])
    return {"dir": d, "db": db, "places": places, "before": before, "dry": dry, "result": result,
            "payload": payload}


@pytest.mark.parametrize("place", ["export", "lake", "wal", "outbox"])
def test_the_erased_value_is_in_each_copy_before_and_in_no_file_after(copies, place) -> None:
    assert SECRET.encode() in copies["before"][place]
    after = _all_bytes(copies["places"][place])
    assert SECRET.encode() not in after
    assert KEPT.encode() in after  # the other session is untouched


def test_one_record_names_the_spans_of_every_copy(copies) -> None:
    dry, result = copies["dry"], copies["result"]
    assert dry["erasure_id"] is None and [c["kind"] for c in dry["copies"]] == ["parquet", "lake", "wal", "outbox"]
    assert all(c["values"] == 18 for c in dry["copies"]), dry["copies"]  # 6 nodes x 3 values in each copy
    by_kind = {c["kind"]: c for c in result["copies"]}
    assert by_kind["parquet"]["files_rewritten"] >= 2  # spans and span events
    assert by_kind["lake"]["files_rewritten"] >= 2 and by_kind["lake"]["files_deleted"] >= 2
    assert by_kind["wal"]["segments_rewritten"] == 1 and by_kind["outbox"]["segments_rewritten"] == 1
    assert (result["spans"], result["values"]) == (6, 18)


@pytest.mark.parametrize("place", ["export", "lake"])
def test_a_copy_read_as_a_store_verifies_with_the_erasure_reported(copies, place) -> None:
    reports = _reports(str(copies["places"][place]))
    assert set(reports) == {"a1", "a2", "b1", "old"}
    assert all(r.valid for r in reports.values()), {k: r.reason for k, r in reports.items()}
    for run in ("a1", "a2"):
        assert (reports[run].erased_spans, reports[run].erased_values) == (3, 9)
        assert [e["id"] for e in reports[run].erasures] == [copies["result"]["erasure_id"]]
    assert reports["b1"].erased_spans == 0


def test_the_lake_lists_no_deleted_file_and_the_old_files_are_gone(copies) -> None:
    from otel_agenttape.store.lake import manifest as mf
    from otel_agenttape.store.lake.fs import lake_fs

    lake = lake_fs(str(copies["places"]["lake"]))
    cat = mf.load_catalog(lake)
    on_disk = set(lake.list("spans")) | set(lake.list("span_events"))
    listed = {k for k in cat.files if k.startswith(("spans/", "span_events/"))}
    assert listed == on_disk  # every listed file is there, and no replaced one is left behind
    assert any("/erased-" in k for k in listed) and any("/erasure-" in k for k in listed)
    assert not any(k.startswith(("spans/", "span_events/")) and "/r0-" in k for k in on_disk)  # the originals


@pytest.mark.parametrize("place", ["wal", "outbox"])
def test_requests_of_a_log_still_verify_once_stored_with_the_record(copies, place, tmp_path) -> None:
    """Replayed (WAL) or re-sent (outbox), the erased requests store spans whose tapes verify under the record."""
    if place == "wal":
        payloads = [p for seg in walfile.segments(copies["places"]["wal"]) for _, p in walfile.read_segment(seg)]
    else:
        payloads = [r.payload for r in outboxfile.read_outbox(copies["places"]["outbox"])]
        assert len(payloads) == 1  # the acknowledged offset still points past the delivered record
    db = str(tmp_path / "replayed.duckdb")
    store = Store(db)
    store.write_traces(payloads)
    store.close()
    con = duckdb.connect(db)
    try:
        con.execute(f"ATTACH '{copies['db']}' AS erased (READ_ONLY)")
        con.execute("INSERT INTO spans SELECT * FROM erased.spans WHERE name = ?", [semconv.EVENT_ERASURE])
    finally:
        con.close()
    reports = _reports(db)
    assert all(r.valid for r in reports.values()), {k: r.reason for k, r in reports.items()}
    assert reports["a1"].erased_values == 9 and reports["b1"].erased_values == 0


def test_cli_names_the_copies_and_refuses_a_missing_one(copies, tmp_path) -> None:
    db = str(tmp_path / "cli.duckdb")
    shutil.copy(copies["db"], db)
    export = tmp_path / "export"
    shutil.copytree(copies["places"]["export"], export)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "otel_agenttape", "erase", "--db", db, *args],
                              capture_output=True, text=True, timeout=120, env=env)

    # a receiver killed while a request body sat in its shared-memory spool
    killed = subprocess.run([sys.executable, "-c", "from otel_agenttape.receiver import spool; d = spool.create(); "
                             f"spool.put_body(d, {KEPT!r}.encode()); print(d)"],
                            capture_output=True, text=True, timeout=60, env=env, check=True)
    spooled = Path(killed.stdout.strip())
    assert KEPT.encode() in _all_bytes(spooled)
    done = cli("--run", "b1", "--reason", "asked", "--parquet", str(export))
    assert done.returncode == 0, done.stderr
    assert f"parquet {export}: erased 9 values in 3 sealed spans (2 files rewritten)" in done.stdout, done.stdout
    assert "spool folders of stopped receivers" in done.stdout and not spooled.exists()
    assert KEPT.encode() not in _all_bytes(export)
    missing = cli("--run", "b1", "--reason", "asked", "--outbox", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no outbox at" in missing.stderr


def test_an_outbox_lane_a_live_process_holds_is_refused_before_anything_changes(copies, tmp_path) -> None:
    db = str(tmp_path / "held.duckdb")
    shutil.copy(copies["db"], db)
    box = tmp_path / "outbox"
    lane, _ = outboxfile.open_lane(box)  # held (flock) by this process, as a running agent holds its lane
    try:
        lane.append(outboxfile.KIND_TRACES, 13, copies["payload"])
        with otel_agenttape.open(db) as tapes:
            with pytest.raises(Exception, match="held by a running process"):
                tapes.erase(run="b1", reason="asked", signing_key=KEY, outbox=[str(box)])
        assert KEPT.encode() in _all_bytes(box)
        assert _reports(db)["b1"].erased_values == 0  # the store was not touched either
    finally:
        lane.close()


def test_an_iceberg_lake_is_rewritten_and_its_old_files_deleted(copies, tmp_path) -> None:
    pytest.importorskip("pyiceberg")
    from otel_agenttape.store.lake.iceberg_publish import IcebergPublisher

    url = f"iceberg+sql://{tmp_path}/catalog.db#tapes"
    db = str(tmp_path / "ice.duckdb")
    store = Store(db)
    store.write_traces([copies["payload"]])
    IcebergPublisher(store, url, "r0").publish_all()
    store.close()
    assert SECRET.encode() in _all_bytes(tmp_path)
    with otel_agenttape.open(db) as tapes:
        done = tapes.erase(session="s1", reason="GDPR art. 17 request #8", signing_key=KEY, lakes=[url])
    (ice,) = done["copies"]
    assert ice["kind"] == "iceberg" and ice["values"] == 18 and ice["files_rewritten"] >= 2, ice
    everything = _all_bytes(tmp_path)
    assert SECRET.encode() not in everything and KEPT.encode() in everything
    reports = _reports(url)
    assert all(r.valid for r in reports.values()), {k: r.reason for k, r in reports.items()}
    assert reports["a1"].erased_values == 9 and [e["id"] for e in reports["a1"].erasures] == [done["erasure_id"]]
