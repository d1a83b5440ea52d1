"""Iceberg lake maintenance: `agenttape lake migrate` copies a folder lake into Iceberg tables (run again it
copies only what is new; a receiver of the old lake then goes on where the migration stopped, publishing
nothing twice), compaction while a
receiver publishes keeps every span once and verifiable, expiry keeps what a restarted receiver needs, and
retention drops old days in one snapshot."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import threading
from typing import Any

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from receiver_util import trace_request  # noqa: E402

pytest.importorskip("pyiceberg")

from otel_agenttape.cli import main as cli_main  # noqa: E402
from otel_agenttape.store.lake.iceberg_catalog import load  # noqa: E402
from otel_agenttape.store.lake.iceberg_maintain import compact, retain  # noqa: E402
from otel_agenttape.store.lake.iceberg_publish import IcebergPublisher  # noqa: E402
from otel_agenttape.store.lake.publish import LakePublisher, ReceiverIdInUse  # noqa: E402
from otel_agenttape.store.reader import open_reader  # noqa: E402
from otel_agenttape.store.writer import Store  # noqa: E402

TODAY_NS = int(dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()) * 10**9


NEW_TRACE, OLD_TRACE = bytes.fromhex("11" * 16), bytes.fromhex("22" * 16)


def _request(n: int, today: bool = False, trace_id: bytes | None = None) -> Any:
    req = trace_request(n, trace_id=trace_id)
    if today:  # trace_request's spans are of 2023-11-14: these are of today
        for s in req.resource_spans[0].scope_spans[0].spans:
            s.start_time_unix_nano += TODAY_NS - 1_700_000_000_000_000_000
            s.end_time_unix_nano += TODAY_NS - 1_700_000_000_000_000_000
    return req


def _ids(url: str) -> list[str]:
    reader = open_reader([url])
    try:
        assert reader.lakes.check_files() == []
        return sorted(r["span_id"] for r in reader.query("SELECT span_id FROM spans").to_pylist())
    finally:
        reader.close()


def _cli(capsys: Any, *argv: str) -> dict[str, Any]:
    assert cli_main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_migrate_a_folder_lake_then_again_with_what_is_new(tmp_path: Any, capsys: Any) -> None:
    folder = str(tmp_path / "lake")
    url = f"iceberg+sql://{tmp_path}/catalog.db#tapes"
    stores = [Store(str(tmp_path / f"r{i}.duckdb")) for i in range(2)]
    try:
        pubs = [LakePublisher(s, folder, f"r{i}") for i, s in enumerate(stores)]
        for s, p in zip(stores, pubs):
            for n in (50, 30):
                s.write_traces([_request(n)])
                p.publish_all()
        first = _cli(capsys, "lake", "migrate", folder, url)
        assert first["files"] > 0 and first["skipped"] == 0
        assert _ids(url) == _ids(folder)
        again = _cli(capsys, "lake", "migrate", folder, url)  # nothing new: nothing copied
        assert again["files"] == 0 and again["skipped"] == first["files"] and again["snapshots"] == 0
        stores[0].write_traces([_request(40)])
        pubs[0].publish_all()
        more = _cli(capsys, "lake", "migrate", folder, url)  # only the new batch's files
        assert 0 < more["files"] < first["files"] and more["skipped"] == first["files"]
        assert _ids(url) == _ids(folder)
        assert len(_ids(url)) == 2 * 80 + 40
        cat, parsed = load(url)
        assert cat.load_table(f"{parsed.namespace}.spans").scan().to_arrow().num_rows == 200  # not only our reader
        # the receivers move to the Iceberg lake: each goes on after the batches the migration brought in
        stores[0].write_traces([_request(10)])
        for i, s in enumerate(stores):
            IcebergPublisher(s, url, f"r{i}").publish_all()
        ids = _ids(url)
        assert len(ids) == len(set(ids)) == 2 * 80 + 40 + 10
        # another store under a migrated receiver's id would publish what is not its own: refused
        with Store(str(tmp_path / "other.duckdb")) as other, pytest.raises(ReceiverIdInUse):
            IcebergPublisher(other, url, "r1")
    finally:
        for s in stores:
            s.close()


def test_compact_while_publishing_then_expire_and_retain(tmp_path: Any, capsys: Any) -> None:
    url = f"iceberg+sql://{tmp_path}/catalog.db#tapes"
    with Store(str(tmp_path / "r0.duckdb")) as store:
        pub = IcebergPublisher(store, url, "r0")
        for i in range(6):
            today = i % 2 == 0  # two traces, so that batches land in the same partitions
            store.write_traces([_request(40, today=today, trace_id=NEW_TRACE if today else OLD_TRACE)])
            pub.publish_all()
        before = _ids(url)
        stop = threading.Event()

        def publishing() -> None:
            for _ in range(6):
                if stop.is_set():
                    return
                store.write_traces([_request(20, today=True, trace_id=NEW_TRACE)])
                pub.publish_all()

        t = threading.Thread(target=publishing)
        t.start()
        done = _cli(capsys, "lake", "compact", url, "--grace", "600")
        t.join()
        assert done["merged_files"] > done["written_files"] > 0
        ids = _ids(url)  # every span once, each file's sha256 recorded
        assert len(ids) == len(set(ids)) == len(before) + 6 * 20
        cat, parsed = load(url)
        spans = cat.load_table(f"{parsed.namespace}.spans")
        kinds = [s.summary.additional_properties.get("agenttape.operation") for s in spans.metadata.snapshots]
        assert kinds.count("compact") == 1
        # a compaction that stopped before its commit left a merged file no snapshot lists: removed next run
        orphan = next(p for p in tmp_path.rglob("spans/data/**/compact-*.parquet"))
        stray = orphan.with_name("compact-1-0000.parquet")
        stray.write_bytes(orphan.read_bytes())
        # past the grace period: replaced files deleted, old snapshots expired, still every span
        done = compact(url, grace_seconds=0)
        assert not stray.exists()
        assert done["deleted"] > 0 and done["expired_snapshots"] > 0
        assert _ids(url) == ids
        spans.refresh()
        assert len(spans.metadata.snapshots) <= 2
        again = IcebergPublisher(store, url, "r0")  # a restart after expiry: nothing published twice
        again.publish_all()
        assert again.published_files == 0 and _ids(url) == ids
        gone = retain(url, 1, grace_seconds=0)  # the 2023 spans go, today's stay
        assert gone["removed_files"] > 0 and gone["rows"] == 3 * 40
        assert gone["deleted"] == gone["removed_files"]  # --grace 0: from storage at once
    reader = open_reader([url])
    try:
        (row,) = reader.query("SELECT count(*) AS n, min(start_time_unix_nano) AS lo FROM spans").to_pylist()
    finally:
        reader.close()
    assert row["n"] == len(ids) - 3 * 40 and row["lo"] >= TODAY_NS


def test_retain_while_receivers_publish_keeps_every_span_newer_than_the_cutoff(tmp_path: Any) -> None:
    """Two receivers publish today's spans and late 2023 ones while `lake retain --older-than 1 --grace 0`
    runs again and again: their commits and retention's deletes and expiries conflict and are retried; no
    receiver fails, every acknowledged span of today is there once, every 2023 span published is gone after
    the last retain, and a restarted receiver finds all its batches (nothing twice)."""
    url = f"iceberg+sql://{tmp_path}/catalog.db#tapes"
    stores = [Store(str(tmp_path / f"r{i}.duckdb")) for i in range(2)]
    try:
        pubs = [IcebergPublisher(s, url, f"r{i}") for i, s in enumerate(stores)]
        for s, p in zip(stores, pubs):
            s.write_traces([_request(30), _request(30, today=True)])
            p.publish_all()
        errors: list[BaseException] = []

        def publishing(store: Store, pub: IcebergPublisher) -> None:
            try:
                for i in range(6):
                    store.write_traces([_request(20, today=True)] + ([_request(10)] if i % 2 else []))
                    pub.publish_all()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=publishing, args=(s, p)) for s, p in zip(stores, pubs)]
        for t in threads:
            t.start()
        removed = []
        while any(t.is_alive() for t in threads):
            removed.append(retain(url, 1, grace_seconds=0)["rows"])
        for t in threads:
            t.join()
        removed.append(retain(url, 1, grace_seconds=0)["rows"])
        assert errors == []
        assert all(p.failures == 0 for p in pubs)
        today, old = [], 0
        for s in stores:
            today += [r[0] for r in s.con.execute("SELECT span_id FROM spans WHERE start_time_unix_nano >= ?",
                                                  [TODAY_NS]).fetchall()]
            old += s.con.execute("SELECT count(*) FROM spans WHERE start_time_unix_nano < ?", [TODAY_NS]).fetchall()[0][0]
        assert len(today) == 2 * (30 + 6 * 20)
        assert _ids(url) == sorted(today)  # every span of today once, every 2023 one gone (and verify's check clean)
        assert sum(removed) == old == 2 * (30 + 3 * 10)
        assert sum(1 for n in removed if n) >= 2, removed  # retention ran between the receivers' publications
        for i, s in enumerate(stores):  # restarted after retention expired their snapshots: nothing twice
            again = IcebergPublisher(s, url, f"r{i}")
            again.publish_all()
            assert again.published_files == 0
        assert _ids(url) == sorted(today)
    finally:
        for s in stores:
            s.close()


def _sealed_lake(tmp_path: Any) -> str:
    """An Iceberg lake holding one sealed tape whose first nodes ran 40 days ago (test_lake_retention's)."""
    from integrity_support import encode
    from test_lake_retention import _sealed_spans

    url = f"iceberg+sql:///{tmp_path}/catalog.db#tapes"
    with Store(str(tmp_path / "r.duckdb")) as store:
        store.write_traces([encode(_sealed_spans("kept-run"))])
        IcebergPublisher(store, url, "r1").publish_all()
    return url


def test_iceberg_retention_is_not_tampering_and_a_file_deleted_by_hand_is(tmp_path: Any, capsys: Any) -> None:
    """``lake retain`` on Iceberg tables is recorded in the snapshot it commits: ``verify`` reports the
    tape's old entries as removed by retention, not as a gap; the same old data file deleted by hand
    (outside a snapshot) is a gap and a missing file."""
    from test_lake_retention import NEW_NODES, OLD_NODES

    kept, tampered = tmp_path / "kept", tmp_path / "tampered"
    kept.mkdir()
    tampered.mkdir()
    url = _sealed_lake(kept)
    assert cli_main(["verify", "--lake", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["chains"][0]["length"] == OLD_NODES + NEW_NODES + 1
    assert cli_main(["lake", "retain", url, "--older-than", "30d", "--grace", "0", "--json"]) == 0
    capsys.readouterr()
    assert cli_main(["verify", "--lake", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    chain = doc["chains"][0]
    assert doc["valid"] and chain["removed_by_retention"] == OLD_NODES and chain["issues"] == [], doc

    url = _sealed_lake(tampered)
    cat, parsed = load(url)
    spans = cat.load_table(f"{parsed.namespace}.spans")
    old_ns = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30)).timestamp() * 1e9
    old = []  # the data files holding only spans older than the cutoff: what retention would drop
    for task in spans.scan().plan_files():
        path = task.file.file_path
        local = path[len("file://"):] if path.startswith("file://") else path
        if max(pq.read_table(local, columns=["start_time_unix_nano"]).column(0).to_pylist()) < old_ns:
            old.append(local)
    assert old
    for path in old:
        os.remove(path)
    assert cli_main(["verify", "--lake", url, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert not doc["valid"] and doc["chains"][0]["issues"][0]["kind"] == "gap", doc
    assert doc["lake_files"]["problems"] and all("missing" in p["problem"] for p in doc["lake_files"]["problems"])
