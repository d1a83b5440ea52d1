"""The lake as Apache Iceberg tables, with a SQLite catalog on a local folder, with a PostgreSQL catalog whose
warehouse is an S3 bucket on 127.0.0.1 (moto in server mode), and with an Iceberg REST catalog server on
127.0.0.1 over a folder: two receivers' stores publish
through the catalog, our reader and pyiceberg's own scan read the same spans exactly once, a restart
publishes nothing twice, and a data file edited or removed outside a snapshot is caught."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from iceberg_support import KINDS, drop_lake, lake_url, rest_catalog, s3_object  # noqa: E402, F401
from receiver_util import trace_request  # noqa: E402
from test_lake_receivers import _make_bucket, _s3_env, moto_endpoint  # noqa: E402, F401

pytest.importorskip("pyiceberg")

from otel_agenttape.store.lake.iceberg_catalog import load  # noqa: E402
from otel_agenttape.store.lake.iceberg_publish import IcebergPublisher  # noqa: E402
from otel_agenttape.store.reader import open_reader  # noqa: E402
from otel_agenttape.store.writer import Store  # noqa: E402


@pytest.fixture(scope="module", params=KINDS)
def lake(request: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp(request.param)
    saved: dict[str, str | None] = {}
    endpoint = None
    if request.param.endswith("-s3"):
        endpoint = request.getfixturevalue("moto_endpoint")
        saved = {k: os.environ.get(k) for k in _s3_env(endpoint)}
        os.environ.update(_s3_env(endpoint))  # the publisher and the readers in this process
    rest = request.getfixturevalue("rest_catalog").address if request.param == "rest-folder" else None
    url = lake_url(request.param, tmp, endpoint, rest=rest)
    if endpoint:
        _make_bucket(endpoint, "ice")
    expected: set[str] = set()
    try:
        for i, n in enumerate((300, 20)):
            with Store(str(tmp / f"r{i}.duckdb")) as store:
                req = trace_request(n)
                store.write_traces([req])
                expected |= {s.span_id.hex() for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans}
                publisher = IcebergPublisher(store, url, f"r{i}")
                publisher.publish_all()
                assert publisher.published_files > 0
                again = IcebergPublisher(store, url, f"r{i}")  # a restart: the batch is in the table already
                again.publish_all()
                assert again.published_files == 0
        yield {"url": url, "expected": expected, "endpoint": endpoint}
    finally:
        if request.param.startswith("postgresql"):
            drop_lake(url)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _spans(url: str) -> tuple[int, int]:
    reader = open_reader([url])
    try:
        (row,) = reader.query("SELECT count(*) AS n, count(DISTINCT span_id) AS d FROM spans").to_pylist()
        return row["n"], row["d"]
    finally:
        reader.close()


def test_two_receivers_publish_and_both_readers_see_every_span_once(lake: dict[str, Any]) -> None:
    url, expected = lake["url"], lake["expected"]
    assert _spans(url) == (len(expected), len(expected))
    catalog, parsed = load(url)
    table = catalog.load_table(f"{parsed.namespace}.spans")
    scanned = table.scan().to_arrow()  # a reader that is not ours
    assert scanned.num_rows == len(expected)
    assert sorted(scanned.column("span_id").to_pylist()) == sorted(expected)
    batches = {s.summary.additional_properties.get("agenttape.batch") for s in table.metadata.snapshots}
    assert batches - {None} == {"r0/1", "r1/1"}  # one snapshot per receiver's batch, each named
    if lake["endpoint"]:
        assert table.location().startswith("s3://ice/warehouse/")


def test_tables_are_partitioned_by_day_and_trace_bucket_sorted_and_written_with_zstd_and_deltas(
        lake: dict[str, Any]) -> None:
    """What other engines rely on to prune: the partition spec (day of ``date``, a trace-id bucket), the
    sort order, and in each data file zstd pages, delta-encoded times and min/max statistics of trace ids."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs
    from pyiceberg.transforms import BucketTransform, DayTransform

    catalog, parsed = load(lake["url"])
    table = catalog.load_table(f"{parsed.namespace}.spans")
    fields = {f.name: f.transform for f in table.spec().fields}
    assert isinstance(fields["date_day"], DayTransform) and isinstance(fields["trace_id_bucket"], BucketTransform)
    # time first (a time window prunes by min/max), then trace and span (a trace's rows lie together)
    assert [table.schema().find_field(f.source_id).name for f in table.sort_order().fields] == [
        "start_time_unix_nano", "trace_id", "span_id"]
    assert table.properties.get("write.parquet.compression-codec") == "zstd"
    path = next(iter(table.scan().plan_files())).file.file_path
    if path.startswith("s3://"):
        host = lake["endpoint"].split("://", 1)[1]
        fs = pafs.S3FileSystem(endpoint_override=host, scheme="http", access_key="testing", secret_key="testing",
                               region="us-east-1")
        pf = pq.ParquetFile(fs.open_input_file(path[len("s3://"):]))
    else:
        pf = pq.ParquetFile(path[len("file://"):] if path.startswith("file://") else path)
    meta = pf.metadata
    times = pf.read(columns=["start_time_unix_nano"]).column(0).to_pylist()
    assert times == sorted(times)  # the file is written in that order
    cols = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(meta.num_columns)}
    assert cols["trace_id"].compression == "ZSTD" and cols["trace_id"].statistics.has_min_max
    assert "DELTA_BINARY_PACKED" in cols["start_time_unix_nano"].encodings


def test_agenttape_sql_sees_the_tables_as_views_and_cannot_change_them(lake: dict[str, Any], capsys: Any) -> None:
    """``agenttape sql --lake iceberg+...``: the tables are views (spans and the derived ones), the
    counts are pyiceberg's, and a statement that would change the lake is refused."""
    from otel_agenttape.cli import main

    url = lake["url"]
    capsys.readouterr()
    assert main(["sql", "--lake", url, "--json",
                 "SELECT (SELECT count(*) FROM spans) AS spans, (SELECT count(DISTINCT span_id) FROM spans) AS ids, "
                 "(SELECT count(*) FROM runs) AS runs"]) == 0
    (row,) = orjson.loads(capsys.readouterr().out)
    assert row["spans"] == row["ids"] == len(lake["expected"]) and row["runs"] == 0  # no GenAI span: no run
    assert main(["sql", "--lake", url, "DELETE FROM spans"]) != 0
    capsys.readouterr()
    assert _spans(url) == (len(lake["expected"]), len(lake["expected"]))


def _corrupt(lake: dict[str, Any], path: str) -> None:
    """Flip one byte of a data file, keeping its size (only the sha256 can tell)."""
    if path.startswith("s3://"):
        import boto3

        s3 = boto3.client("s3", endpoint_url=lake["endpoint"], region_name="us-east-1")
        bucket, key = s3_object(path)
        body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        body[8] ^= 0xFF
        s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
        return
    local = path[len("file://"):] if path.startswith("file://") else path
    with open(local, "r+b") as fh:
        fh.seek(8)
        byte = fh.read(1)
        fh.seek(8)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _remove(lake: dict[str, Any], path: str) -> None:
    if path.startswith("s3://"):
        import boto3

        bucket, key = s3_object(path)
        boto3.client("s3", endpoint_url=lake["endpoint"], region_name="us-east-1").delete_object(Bucket=bucket, Key=key)
        return
    os.remove(path[len("file://"):] if path.startswith("file://") else path)


def test_a_data_file_edited_or_removed_outside_a_snapshot_is_caught(lake: dict[str, Any], capsys: Any) -> None:
    """Last in the module: it damages the lake."""
    url = lake["url"]
    reader = open_reader([url])
    try:
        assert reader.lakes.check_files() == []
        files = sorted((f for ice in reader.lakes.icebergs for t, fs in ice.files.items() if t == "spans" for f in fs),
                       key=lambda f: f.file_path)
        paths = [f.file_path for f in files]
    finally:
        reader.close()
    edited, removed = paths[0], paths[1]
    _remove(lake, removed)
    reader = open_reader([url])  # opens: the removed file is read around, the rest reads, verify names it
    try:
        (n,) = reader.query("SELECT count(*) AS n FROM spans").to_pylist()
    finally:
        reader.close()
    assert n["n"] == len(lake["expected"]) - files[1].record_count
    _corrupt(lake, edited)
    reader = open_reader([url])
    try:
        problems = {p["file"]: p["problem"] for p in reader.lakes.check_files()}
    finally:
        reader.close()
    assert any(k == edited and "edited" in v for k, v in problems.items()), problems
    assert any(k == removed and "missing" in v for k, v in problems.items()), problems

    # `agenttape verify --lake` says so too, naming both files, and fails
    from otel_agenttape.cli import main

    capsys.readouterr()
    assert main(["verify", "--lake", url, "--json"]) == 1
    doc = orjson.loads(capsys.readouterr().out)
    found = {p["file"]: p["problem"] for p in doc["lake_files"]["problems"]}
    assert "edited" in found[edited] and "missing" in found[removed] and doc["valid"] is False
    assert main(["verify", "--lake", url]) == 1
    out = capsys.readouterr().out
    assert f"FAIL  lake file {edited}" in out and f"FAIL  lake file {removed}" in out


def test_a_commit_that_loses_the_race_is_refreshed_and_retried_once_and_counted(tmp_path: Any, monkeypatch: Any) -> None:
    """Receiver A has loaded the table and built its snapshot when receiver B commits first: A's commit
    conflicts, A refreshes and commits on top of B's, counts the retry (``agenttape_lake_commit_retries``),
    and both batches are in the table once each."""
    from otel_agenttape.store.lake import iceberg_files as ifl

    url = f"iceberg+sql:///{tmp_path}/catalog.db#race"
    stores = [Store(str(tmp_path / f"r{i}.duckdb")) for i in range(2)]
    try:
        expected: set[str] = set()
        for i, store in enumerate(stores):
            req = trace_request(50 + i)
            store.write_traces([req])
            expected |= {s.span_id.hex() for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans}
        a, b = (IcebergPublisher(store, url, f"r{i}") for i, store in enumerate(stores))
        b.publish_all()  # the tables exist
        stores[1].write_traces([trace_request(7)])
        expected |= set(_span_ids(stores[1]))
        real = ifl.commit
        raced: list[str] = []

        def commit_after_b(tbl: Any, work: Any, already: Any = None, on_retry: Any = None) -> bool:
            if not raced and tbl.name()[-1] == "spans":
                raced.append("b")
                b.publish_all()  # B commits after A loaded the table: A's view is stale now
            return real(tbl, work, already, on_retry)

        monkeypatch.setattr(ifl, "commit", commit_after_b)
        a.publish_all()
        monkeypatch.setattr(ifl, "commit", real)
        assert raced and a.commit_retries >= 1 and b.commit_retries == 0
        assert a.gauges()["agenttape_lake_commit_retries"][1] == a.commit_retries
        catalog, parsed = load(url)
        table = catalog.load_table(f"{parsed.namespace}.spans")
        ids = table.scan(selected_fields=("span_id",)).to_arrow().column("span_id").to_pylist()
        assert len(ids) == len(set(ids)) and set(ids) == expected
        batches = [s.summary.additional_properties.get("agenttape.batch") for s in table.metadata.snapshots]
        assert sorted(x for x in batches if x) == ["r0/1", "r1/1", "r1/2"]
    finally:
        for store in stores:
            store.close()


def _span_ids(store: Any) -> list[str]:
    return [r[0] for r in store.cursor().execute("SELECT span_id FROM spans").fetchall()]
