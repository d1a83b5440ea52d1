"""Three real receivers (``agenttape serve --lake iceberg+...``) publish into one Iceberg catalog at the same
time, so their commits conflict and are retried; one of them is killed with SIGKILL while it publishes a
batch and restarted on its DuckDB file, then killed twice more at random moments of its publishing. Every span a receiver acknowledged is in the tables exactly once,
for our reader and for pyiceberg's own scan, every batch is one snapshot, and no file the kill left stays.
With a SQLite catalog on a folder, with PostgreSQL and an S3 bucket on 127.0.0.1 (moto), and with an Iceberg
REST catalog server on 127.0.0.1 over a folder (the receivers commit through its HTTP API; a conflict is its
409 CommitFailedException)."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from iceberg_support import KINDS, drop_lake, lake_url, rest_catalog  # noqa: E402, F401
from receiver_util import PB, trace_request  # noqa: E402
from test_lake_receivers import Receiver, _make_bucket, _s3_env, moto_endpoint  # noqa: E402, F401

pytest.importorskip("pyiceberg")

from otel_agenttape.store.lake.iceberg_catalog import load  # noqa: E402
from otel_agenttape.semconv import RUN_ID  # noqa: E402
from otel_agenttape.store.lake.iceberg_files import RUNS, location_fs, summary_props  # noqa: E402
from otel_agenttape.store.reader import open_reader  # noqa: E402

REQUESTS = 5
SPANS = 400
VICTIM = "r1"


def _files(folder: str, receiver: str) -> set[str]:
    """Files this receiver is writing or wrote under ``folder``: its data files and their hidden temp names
    in a local warehouse, or the files it stages beside its DuckDB file before each upload to S3."""
    return {os.path.join(d, n) for d, _, names in os.walk(folder) for n in names
            if (n.lstrip(".").startswith(f"{receiver}-") and ".parquet" in n) or
            (d.endswith(f"{receiver}.duckdb.lake-staging") and n.startswith("agenttape-lake-"))}


def _feed(rec: Receiver, client: httpx.Client, acked: list[str], start: int, n: int = REQUESTS) -> None:
    for i in range(n):
        # every other request continues one of four runs (one trace each) that every receiver gets spans of:
        # the run index's count of runs must count each once across receivers and batches
        trace = bytes([1 + (start + i) % 4]) * 16 if i % 2 == 0 else os.urandom(16)
        req = trace_request(SPANS, trace_id=trace, attrs={"payload": "x" * 100, "i": start + i,
                                                           RUN_ID: f"run-{trace.hex()[:12]}"})
        ids = [s.span_id.hex() for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
        try:
            ok = client.post(f"{rec.url}/v1/traces", content=req.SerializeToString(), headers=PB).status_code == 200
        except httpx.HTTPError:
            return  # killed: what it did not acknowledge is not owed
        if ok:
            acked.extend(ids)


@pytest.fixture(params=KINDS)
def where(request: Any, tmp_path: Any, monkeypatch: Any) -> Any:
    env = dict(os.environ)
    endpoint = None
    if request.param.endswith("-s3"):
        endpoint = request.getfixturevalue("moto_endpoint")
        bucket = f"crash-{os.urandom(4).hex()}"
        for k, v in _s3_env(endpoint).items():
            monkeypatch.setenv(k, v)  # this process reads the lake too
        env.update(_s3_env(endpoint))
    rest = request.getfixturevalue("rest_catalog") if request.param == "rest-folder" else None
    url = lake_url(request.param, tmp_path, endpoint, bucket if endpoint else "ice", rest.address if rest else None)
    if endpoint:
        _make_bucket(endpoint, bucket)
    # the folder the receivers' files are watched in: a local warehouse under tmp_path, or the REST server's
    yield url, env, (os.path.join(rest.folder, "warehouse") if rest else str(tmp_path))
    if request.param.startswith("postgresql"):
        drop_lake(url)


def test_three_receivers_one_killed_mid_publish(where: Any, tmp_path: Any) -> None:
    url, env, watch = where  # the local warehouse, or the receivers' staging folders
    recs = {r: Receiver(str(tmp_path / f"{r}.duckdb"), url, r, env, interval=0.05, max_spans=SPANS * 2).start()
            for r in ("r0", "r1", "r2")}
    acked: dict[str, list[str]] = {r: [] for r in recs}
    try:
        with httpx.Client(timeout=30) as client:
            others = [threading.Thread(target=_feed, args=(recs[r], client, acked[r], 0)) for r in ("r0", "r2")]
            for t in others:
                t.start()
            _feed(recs[VICTIM], client, acked[VICTIM], 0, 2)
            before = _files(watch, VICTIM)
            _feed(recs[VICTIM], client, acked[VICTIM], 2, 1)  # a batch is due: the next file is its publication
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not (_files(watch, VICTIM) - before):
                time.sleep(0.0005)
            assert _files(watch, VICTIM) - before, "never caught the receiver publishing"
            recs[VICTIM].kill()  # SIGKILL, mid-publication
            for t in others:
                t.join()
            # restart on the same DuckDB file: the pending batch is published once, then new spans
            recs[VICTIM] = Receiver(recs[VICTIM].db, url, VICTIM, env, interval=0.05, max_spans=SPANS * 2).start()
            # then killed again at a random moment of its publishing (each run of the test its own), twice
            rng = random.Random()
            for k in range(2):
                _feed(recs[VICTIM], client, acked[VICTIM], 100 + 10 * k, 3)
                time.sleep(rng.uniform(0.0, 0.25))  # the 0.05 s publishing interval: before, during or after a commit
                recs[VICTIM].kill()
                recs[VICTIM] = Receiver(recs[VICTIM].db, url, VICTIM, env, interval=0.05,
                                        max_spans=SPANS * 2).start()
            _feed(recs[VICTIM], client, acked[VICTIM], 200, 2)
    finally:
        for rec in recs.values():
            rec.stop()  # a graceful stop publishes what is left
    want = Counter(s for ids in acked.values() for s in ids)
    assert len(want) == sum(len(v) for v in acked.values()) >= (2 * REQUESTS + 11) * SPANS

    reader = open_reader([url])
    try:
        got = Counter(r["span_id"] for r in reader.query("SELECT span_id FROM spans").to_pylist())
        assert reader.lakes.check_files() == []
    finally:
        reader.close()
    assert got == want  # every acknowledged span once, nothing else

    cat, parsed = load(url)
    spans = cat.load_table(f"{parsed.namespace}.spans")
    assert Counter(spans.scan(selected_fields=("span_id",)).to_arrow().column("span_id").to_pylist()) == want
    index = cat.load_table(f"{parsed.namespace}.run_traces")
    keys = index.scan(selected_fields=("run_hash", "trace_hash")).to_arrow()
    runs = set(zip(keys.column("run_hash").to_pylist(), keys.column("trace_hash").to_pylist()))
    # the count the last commit recorded, counted while the others committed (a conflict recounts)
    assert int(summary_props(index.current_snapshot())[RUNS]) == len(runs) > 4
    batches = [s.summary.additional_properties.get("agenttape.batch") for s in spans.metadata.snapshots]
    assert len(batches) == len(set(batches)), "a batch was committed twice"
    assert {b.split("/")[0] for b in batches} == {"r0", "r1", "r2"}
    # nothing the kill left behind stays in the warehouse: every data file there is live
    fs, _ = location_fs(spans.location())
    live = {t.file.file_path for t in spans.scan().plan_files()}
    there = {f"{spans.location().rstrip('/')}/{k}" for k in fs.list("data")}
    assert there == live
