"""The lake as Apache Iceberg tables (a SQLite catalog on a local folder): two receivers' stores publish
through the catalog, our reader and pyiceberg's own scan read the same spans exactly once, a restart
publishes nothing twice, and a data file edited or removed outside a snapshot is caught."""

from __future__ import annotations

import os

import pytest
from receiver_util import trace_request

pytest.importorskip("pyiceberg")

from otel_agenttape.store.lake.iceberg_catalog import load  # noqa: E402
from otel_agenttape.store.lake.iceberg_publish import IcebergPublisher  # noqa: E402
from otel_agenttape.store.reader import open_reader  # noqa: E402
from otel_agenttape.store.writer import Store  # noqa: E402


@pytest.fixture
def lake(tmp_path):
    url = f"iceberg+sql:///{tmp_path}/catalog.db#agenttape"
    expected = set()
    for i, n in enumerate((300, 20)):
        with Store(str(tmp_path / f"r{i}.duckdb")) as store:
            req = trace_request(n)
            store.write_traces([req])
            expected |= {(s.span_id.hex()) for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans}
            publisher = IcebergPublisher(store, url, f"r{i}")
            publisher.publish_all()
            assert publisher.published_files > 0
            again = IcebergPublisher(store, url, f"r{i}")  # a restart: the batch is in the table already
            again.publish_all()
            assert again.published_files == 0
    return url, expected


def _spans(url: str) -> tuple[int, int]:
    reader = open_reader([url])
    try:
        (row,) = reader.query("SELECT count(*) AS n, count(DISTINCT span_id) AS d FROM spans").to_pylist()
        return row["n"], row["d"]
    finally:
        reader.close()


def test_two_receivers_publish_and_both_readers_see_every_span_once(lake):
    url, expected = lake
    assert _spans(url) == (len(expected), len(expected))
    catalog, _ = load(url)
    table = catalog.load_table("agenttape.spans")
    scanned = table.scan().to_arrow()  # a reader that is not ours
    assert scanned.num_rows == len(expected)
    batches = {s.summary.additional_properties.get("agenttape.batch") for s in table.metadata.snapshots}
    assert len(batches - {None}) == 2  # one snapshot per receiver's batch, each named


def test_a_data_file_edited_or_removed_outside_a_snapshot_is_caught(lake):
    url, _ = lake
    reader = open_reader([url])
    try:
        assert reader.lakes.check_files() == []
        paths = [f.file_path for ice in reader.lakes.icebergs for files in ice.files.values() for f in files]
    finally:
        reader.close()
    local = [p[len("file://"):] if p.startswith("file://") else p for p in paths]
    edited, removed = local[0], local[1]
    with open(edited, "r+b") as fh:
        fh.seek(8)
        byte = fh.read(1)
        fh.seek(8)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.remove(removed)
    reader = open_reader([url])
    try:
        problems = {p["file"]: p["problem"] for p in reader.lakes.check_files()}
    finally:
        reader.close()
    assert any(k.endswith(os.path.basename(edited)) and "edited" in v for k, v in problems.items()), problems
    assert any(k.endswith(os.path.basename(removed)) and "missing" in v for k, v in problems.items()), problems
