"""An erasure through a running receiver reaches the copies that receiver writes itself (docs/integrity.md
"Every copy"): its write-ahead log, its converter spool, its Parquet export (``--parquet-dir``) and its
lake (``--lake``), while it keeps ingesting. Afterwards no file under the receiver's folders holds an
erased string, the other session's content is in every copy, and every copy verifies."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from integrity_support import encode
from test_erasure import KEPT, KEY, SECRET, _spans
from test_erasure_live import Ingest, _post

import otel_agenttape
from otel_agenttape.receiver.server import TapeServer
from otel_agenttape.tape.verification import verify_store

TOKEN = "erase-copies-token"


def _files(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


def _decoded(path: Path) -> bytes:
    """A Parquet file's values as text (its pages are compressed: the raw bytes may not show a string)."""
    import pyarrow.parquet as pq

    try:
        return str(pq.read_table(path, partitioning=None).to_pylist()).encode()
    except Exception:  # noqa: BLE001 - not a whole Parquet file (a staged or torn one): its bytes are scanned
        return b""


def _holding(needle: bytes, *roots: Path) -> list[str]:
    """Every file under ``roots`` whose bytes, or whose decoded values if it is a Parquet file, hold ``needle``."""
    return [str(p) for p in _files(*roots)
            if needle in p.read_bytes() or (p.suffix == ".parquet" and needle in _decoded(p))]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("erase-copies")
    db = str(root / "store" / "live.duckdb")
    Path(db).parent.mkdir()
    parquet, lake = root / "export", root / "lake"
    server = TapeServer(db, http_port=0, grpc_enabled=False, ingest_workers=1, warm_workers=True, token=TOKEN,
                        parquet_dir=str(parquet), lake=str(lake), lake_interval=3600).start()
    try:
        deadline = time.monotonic() + 60
        while not server.pipeline.pool.running and time.monotonic() < deadline:
            time.sleep(0.05)
        spool = Path(server.pipeline.pool.spool_folder)
        assert _post(server.url, encode(_spans()).SerializeToString(), token=TOKEN) == 200
        assert server.pipeline.wait_idle(30)
        server.pipeline.sink.flush()
        server.publisher.publish_all()
        before = {"lake": _holding(SECRET.encode(), lake), "parquet": _holding(SECRET.encode(), parquet),
                  "spool": _holding(SECRET.encode(), spool)}
        ingest = Ingest(server.url, token=TOKEN).start()
        acked = ingest.acked
        time.sleep(0.3)
        with otel_agenttape.open(db) as tapes:
            assert tapes.reader.kind == "server"
            dry = tapes.erase(session="s1", reason="GDPR art. 17 request #12", signing_key=KEY, dry_run=True)
            result = tapes.erase(session="s1", reason="GDPR art. 17 request #12", signing_key=KEY)
            refused = None
            try:
                tapes.erase(session="s1", reason="again", parquet=[str(root / "elsewhere")])
            except ValueError as exc:
                refused = str(exc)
        time.sleep(0.3)
        ingest.stop()
        assert server.pipeline.wait_idle(60)
        server.pipeline.sink.flush()
        server.publisher.publish_all()
        reader = server.store.reader()
        try:
            stored = set(reader.query("SELECT span_id FROM spans WHERE name LIKE 'load %'").column(0).to_pylist())
            store_reports = {r.chain_id: r for r in verify_store(reader, verifiers=[KEY.verifier()])}
            secret_rows = reader.query("SELECT count(*) FROM spans WHERE attributes LIKE ?",
                                       [f"%{SECRET}%"]).column(0)[0].as_py()
            kept_rows = reader.query("SELECT count(*) FROM spans WHERE attributes LIKE ?", [f"%{KEPT}%"]).column(0)[0]
        finally:
            reader.close()
        after = {"all": _holding(SECRET.encode(), root, spool), "store": secret_rows,
                 # the DuckDB file compresses its strings: the store is asked, the Parquet files scanned
                 "kept": {"store": kept_rows.as_py(), **{name: _holding(KEPT.encode(), where) for name, where in
                                                         (("parquet", parquet), ("lake", lake))}}}
        yield {"root": root, "db": db, "parquet": parquet, "lake": lake, "before": before, "after": after,
               "dry": dry, "result": result, "refused": refused, "acked": acked, "stored": stored,
               "store_reports": store_reports}
    finally:
        server.stop()


def test_the_copies_held_the_secret_before(live) -> None:
    before = live["before"]
    assert before["lake"] and before["parquet"] and before["spool"], before  # so the scan below can fail


def test_no_file_under_the_receiver_folders_holds_an_erased_string(live) -> None:
    assert live["after"]["all"] == [] and live["after"]["store"] == 0
    res = live["result"]
    assert res["erasure_id"] and (res["spans"], res["values"]) == (6, 18)
    kinds = {c["kind"]: c for c in res["copies"]}
    assert set(kinds) == {"parquet", "lake"} and kinds["parquet"]["values"] == 18 and kinds["lake"]["values"] == 18
    assert res["wal"]["rotated"] and res["wal"]["segments_deleted"] >= 1
    dry = live["dry"]
    assert dry["dry_run"] and dry["values"] == 18 and {c["kind"] for c in dry["copies"]} == {"parquet", "lake"}


def test_the_other_session_survives_in_every_copy_and_nothing_acknowledged_is_lost(live) -> None:
    kept = live["after"]["kept"]
    assert all(kept[name] for name in ("store", "parquet", "lake")), kept
    missing = set(live["acked"]) - live["stored"]
    assert len(live["acked"]) > 100 and not missing, f"{len(missing)} acknowledged spans lost"


def test_every_copy_verifies_under_the_record(live) -> None:
    reports = live["store_reports"]
    assert all(r.valid for r in reports.values()), {k: r.reason for k, r in reports.items()}
    assert reports["a1"].erased_values == 9
    for source in (str(live["parquet"]), str(live["lake"])):
        with otel_agenttape.open(source) as tapes:
            copy = {r.chain_id: r for r in verify_store(tapes.reader, verifiers=[KEY.verifier()])}
        assert all(r.valid for r in copy.values()), (source, {k: r.reason for k, r in copy.items()})
        assert copy["a1"].erased_values == 9, source


def test_copies_the_receiver_does_not_write_are_refused_while_it_runs(live) -> None:
    assert live["refused"] and "with the receiver stopped" in live["refused"]
