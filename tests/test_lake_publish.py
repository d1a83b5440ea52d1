"""The publisher alone: receiver ids never collide, a pending batch is published once under the same
names, and a lake that cannot be written leaves the rows in the hot store, counted and retried."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from receiver_util import trace_request  # noqa: E402

from otel_agenttape.store.lake import LakePublisher, ReceiverIdInUse, lake_fs, load_catalog  # noqa: E402
from otel_agenttape.store.reader import open_reader  # noqa: E402
from otel_agenttape.store.writer import Store  # noqa: E402


def _spans(uri: str) -> tuple[int, int]:
    reader = open_reader([uri])
    try:
        return tuple(reader.query("SELECT count(*), count(DISTINCT span_id) FROM spans").to_pylist()[0].values())
    finally:
        reader.close()


def test_a_receiver_id_used_by_another_store_is_refused(tmp_path: Any) -> None:
    lake = str(tmp_path / "lake")
    with Store(str(tmp_path / "a.duckdb")) as a:
        a.write_traces([trace_request(3)])
        LakePublisher(a, lake, "r0").publish_all()
    with Store(str(tmp_path / "b.duckdb")) as b:
        with pytest.raises(ReceiverIdInUse, match="give each receiver its own --receiver-id"):
            LakePublisher(b, lake, "r0")
        b.write_traces([trace_request(2)])
        LakePublisher(b, lake, "r1").publish_all()
    assert _spans(lake) == (5, 5)


@pytest.mark.parametrize("rid", ["../x", "", "a/b", "-x", "r" * 101])
def test_receiver_ids_that_would_leave_their_folder_are_refused(tmp_path: Any, rid: str) -> None:
    with Store(None) as store, pytest.raises(ValueError, match="receiver id"):
        LakePublisher(store, str(tmp_path / "lake"), rid)


def test_a_pending_batch_is_published_once_under_the_same_names(tmp_path: Any) -> None:
    lake = str(tmp_path / "lake")
    with Store(str(tmp_path / "a.duckdb")) as store:
        store.write_traces([trace_request(50)])
        pub = LakePublisher(store, lake, "r0")
        batch = pub._new_batch()  # the cursor row is committed, then the process "dies" mid-way:
        files = pub._write_files(batch)  # every file written, no manifest entry yet
        assert files and load_catalog(lake_fs(lake)).files == {}  # nothing listed: readers see nothing
        store.write_traces([trace_request(7)])
        again = LakePublisher(store, lake, "r0")
        assert again.publish_all() == 2  # the pending batch, then the new spans
        cat = load_catalog(lake_fs(lake))
        assert sorted(f["key"] for f in cat.files.values() if f["table"] == "spans" and "-0000000001" in f["key"]) == \
            sorted(f["key"] for f in files if f["table"] == "spans")
    assert _spans(lake) == (57, 57)


def test_rows_a_store_held_when_publishing_starts_reach_the_lake_at_once_and_new_ones_after_the_interval(
        tmp_path: Any) -> None:
    """A store a receiver opens with rows its lake lacks (copied in, or left by a receiver that stopped
    before it published) is published at the cadence's first tick, not an interval later; rows that
    arrive afterwards wait for the interval as before."""
    lake = str(tmp_path / "lake")
    with Store(str(tmp_path / "a.duckdb")) as store:
        store.write_traces([trace_request(6)])
        pub = LakePublisher(store, lake, "r0", interval=600).start()
        try:
            deadline = time.monotonic() + 30
            while pub.published_batches == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pub.published_batches == 1, "the rows it started with waited for the interval"
            assert _spans(lake) == (6, 6)
            store.write_traces([trace_request(4)])
            time.sleep(2.5)  # a few ticks: new rows are not due before the interval
            assert pub.published_batches == 1 and pub.unpublished()["spans"] == 4
        finally:
            pub.stop()  # ... and what is left goes at the stop
    assert _spans(lake) == (10, 10)


def test_an_unwritable_lake_keeps_the_rows_and_counts_the_failure(tmp_path: Any) -> None:
    lake = tmp_path / "lake"
    with Store(str(tmp_path / "a.duckdb")) as store:
        pub = LakePublisher(store, str(lake), "r0", interval=0.05)
        store.write_traces([trace_request(4)])
        blocker = lake / "spans"
        blocker.write_text("not a folder")  # the lake cannot take the span files now
        with pytest.raises(OSError):
            pub.publish_once()
        assert pub.unpublished()["spans"] == 0  # the batch is fixed (pending), not lost
        assert load_catalog(lake_fs(str(lake))).files == {}
        pub.start()  # the cadence retries and counts the failures
        try:
            deadline = time.monotonic() + 10
            while pub.failures == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pub.failures >= 1 and pub.gauges()["agenttape_lake_publish_failures"][1] >= 1
        finally:
            pub._stop.set()
            pub._thread.join(10)
        blocker.unlink()
        assert pub.publish_once() is not None
    assert _spans(str(lake)) == (4, 4)


def test_an_exported_folder_a_lake_and_a_store_read_as_one(tmp_path: Any) -> None:
    from otel_agenttape.store.parquet import export_parquet

    with Store(str(tmp_path / "a.duckdb")) as a:
        a.write_traces([trace_request(4, attrs={"agenttape.run.id": "exported"})])
        export_parquet(a.reader(), str(tmp_path / "export"))
    with Store(str(tmp_path / "b.duckdb")) as b:
        b.write_traces([trace_request(3, attrs={"agenttape.run.id": "published"})])
        LakePublisher(b, str(tmp_path / "lake"), "b").publish_all()
    with Store(str(tmp_path / "c.duckdb")) as c:
        c.write_traces([trace_request(2, attrs={"agenttape.run.id": "hot"})])
    reader = open_reader([str(tmp_path / "export"), str(tmp_path / "lake"), str(tmp_path / "c.duckdb")])
    try:
        got = reader.query("SELECT run_id, count(*) AS n FROM spans GROUP BY 1 ORDER BY 1").to_pylist()
        index = reader.query("SELECT DISTINCT run_id FROM run_traces ORDER BY 1").column(0).to_pylist()
    finally:
        reader.close()
    assert got == [{"run_id": "exported", "n": 4}, {"run_id": "hot", "n": 2}, {"run_id": "published", "n": 3}]
    assert index == ["exported", "hot", "published"]


def test_a_pending_batch_keeps_its_receiver_id_when_the_id_changes(tmp_path: Any) -> None:
    lake = str(tmp_path / "lake")
    with Store(str(tmp_path / "a.duckdb")) as store:
        store.write_traces([trace_request(6)])
        LakePublisher(store, lake, "old")._new_batch()  # fixed under "old", then the process stops
        store.write_traces([trace_request(2)])
        assert LakePublisher(store, lake, "new").publish_all() == 2
    cat = load_catalog(lake_fs(lake))
    assert sorted(cat.receivers()) == ["new", "old"]
    spans = {f["key"].rsplit("/", 1)[1].split("-")[0]: f["rows"] for f in cat.files.values() if f["table"] == "spans"}
    assert spans == {"old": 6, "new": 2}
    assert _spans(lake) == (8, 8)
