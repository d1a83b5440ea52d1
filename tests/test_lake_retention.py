"""``lake retain`` drops whole old date partitions and records them, so ``verify`` reports those entries
as removed by retention; the same files deleted by hand are reported as missing (tampered)."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from typing import Any

import pytest
from integrity_support import encode, sealed_provider

sys.path.insert(0, os.path.dirname(__file__))

from otel_agenttape import semconv  # noqa: E402
from otel_agenttape.cli import main as cli_main  # noqa: E402
from otel_agenttape.store.lake import LakePublisher, lake_fs, load_catalog  # noqa: E402
from otel_agenttape.store.writer import Store  # noqa: E402

DAY = 86_400 * 1_000_000_000
OLD_NODES = 5
NEW_NODES = 4


def _sealed_spans(run_id: str, days_ago: int = 0) -> list[Any]:
    """A tape whose first nodes ran 40 days ago and whose later nodes (and run span) run now (or all of it
    ``days_ago`` earlier)."""
    from opentelemetry import trace

    provider, sealer, exporter = sealed_provider()
    tracer = provider.get_tracer("otel_agenttape")
    now = time.time_ns() - days_ago * DAY
    run = tracer.start_span(f"invoke_agent {run_id}", attributes={semconv.RUN_ID: run_id}, start_time=now)
    ctx = trace.set_span_in_context(run)
    for i in range(OLD_NODES + NEW_NODES):
        t = now - 40 * DAY + i if i < OLD_NODES else now + i
        sp = tracer.start_span(f"node {i}", context=ctx, start_time=t,
                               attributes={semconv.RUN_ID: run_id, semconv.STEP: i, semconv.NODE_TYPE: "tool"})
        sp.end(end_time=t + 1000)
    run.end(end_time=now + 10_000)
    provider.shutdown()
    assert sealer.errors == 0
    return exporter.get_finished_spans()


@pytest.fixture(params=["folder", "s3"])
def lake_uri(request: Any, tmp_path: Any) -> Any:
    if request.param == "folder":
        yield str(tmp_path / "lake")
        return
    from moto.server import ThreadedMotoServer

    from test_lake_receivers import _make_bucket, _s3_env

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    bucket = f"keep-{uuid.uuid4().hex[:8]}"  # moto keeps its buckets for the whole process
    _make_bucket(endpoint, bucket)
    saved = {k: os.environ.get(k) for k in _s3_env(endpoint)}
    os.environ.update(_s3_env(endpoint))
    try:
        yield f"s3://{bucket}/tapes"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def _publish(tmp_path: Any, uri: str) -> None:
    store = Store(str(tmp_path / "r.duckdb"))
    try:
        store.write_traces([encode(_sealed_spans("kept-run"))])
        LakePublisher(store, uri, "r1").publish_all()
    finally:
        store.close()


def _verify(uri: str, capsys: Any) -> tuple[int, dict[str, Any]]:
    code = cli_main(["verify", "--lake", uri, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_retention_is_not_tampering(tmp_path: Any, lake_uri: str, capsys: Any) -> None:
    _publish(tmp_path, lake_uri)
    code, doc = _verify(lake_uri, capsys)
    assert code == 0 and doc["chains"][0]["length"] == OLD_NODES + NEW_NODES + 1
    assert cli_main(["lake", "retain", lake_uri, "--older-than", "30d", "--grace", "0", "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["removed_files"] >= 1 and done["chains"] == 1
    fs = lake_fs(lake_uri)
    assert not any("date=" in k and k.split("date=")[1][:10] < done["before"] for k in fs.list("spans"))
    code, doc = _verify(lake_uri, capsys)
    chain = doc["chains"][0]
    assert code == 0 and doc["valid"], doc
    assert chain["removed_by_retention"] == OLD_NODES and chain["issues"] == []
    assert cli_main(["verify", "--lake", lake_uri]) == 0
    assert f"{OLD_NODES} earlier entries removed by retention" in capsys.readouterr().out
    status = json.loads((cli_main(["lake", "status", lake_uri, "--json"]), capsys.readouterr().out)[1])
    assert status["retention"][0]["rows"] == done["rows"]


def test_the_same_files_deleted_by_hand_are_tampering(tmp_path: Any, lake_uri: str, capsys: Any) -> None:
    _publish(tmp_path, lake_uri)
    fs = lake_fs(lake_uri)
    old = [f["key"] for f in load_catalog(fs).files.values()
           if f.get("date") and f["table"] == "spans" and f["min_time"] < time.time_ns() - 30 * DAY]
    assert old
    for key in old:
        fs.delete(key)
    code, doc = _verify(lake_uri, capsys)
    assert code == 1 and not doc["valid"]
    assert doc["chains"][0]["issues"][0]["kind"] == "gap"
    assert {p["file"].rsplit("/", 3)[-3] for p in doc["lake_files"]["problems"]} == {"spans"}


def test_a_run_removed_by_retention_is_no_longer_listed(tmp_path: Any, capsys: Any) -> None:
    uri = str(tmp_path / "lake")
    store = Store(str(tmp_path / "r.duckdb"))
    try:
        store.write_traces([encode(_sealed_spans("kept-run")), encode(_sealed_spans("old-run", days_ago=60))])
        LakePublisher(store, uri, "r1").publish_all()
    finally:
        store.close()

    def listed() -> list[str]:
        assert cli_main(["runs", "--lake", uri, "--json"]) == 0
        return sorted(r["run_id"] for r in json.loads(capsys.readouterr().out))

    assert listed() == ["kept-run", "old-run"]
    assert cli_main(["lake", "retain", uri, "--older-than", "30d", "--grace", "0", "--json"]) == 0
    capsys.readouterr()
    assert listed() == ["kept-run"]
    import otel_agenttape

    with otel_agenttape.open(uri) as tapes:
        page = tapes.runs()
        assert [r.run_id for r in page.runs] == ["kept-run"] and page.total == 1
    assert cli_main(["show", "old-run", "--lake", uri]) != 0
    assert "old-run" in capsys.readouterr().err
