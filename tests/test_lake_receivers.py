"""Three real receivers (``agenttape serve --lake``) on 127.0.0.1 write one lake, once into a folder and
once into an S3 server on 127.0.0.1 (moto in server mode). The test's client routes each trace to
one receiver by trace id, as the Collector's load-balancing exporter does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import otel_agenttape
from otel_agenttape import semconv
from otel_agenttape.cli import main as cli_main

sys.path.insert(0, os.path.dirname(__file__))
from tape_agents import ScriptedModel, ScriptedTools, weather_agent  # noqa: E402

RECEIVERS = 3
CHILDREN = 4
SOLO_RUNS = 6


class TraceRouter(SpanExporter):
    """Sends each trace to one receiver, chosen by its trace id (the load-balancing exporter's rule)."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.exporters = [OTLPSpanExporter(endpoint=f"{u}/v1/traces") for u in urls]
        self.sent: dict[int, set[str]] = {i: set() for i in range(len(urls))}
        self._runs: dict[str, set[int]] = {}  # run id -> traces of its spans and of its child runs' spans

    def traces_of(self, run_id: str) -> set[int]:
        return self._runs.get(run_id, set())

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        groups: dict[int, list[Any]] = {}
        for s in spans:
            i = s.context.trace_id % len(self.exporters)
            groups.setdefault(i, []).append(s)
            self.sent[i].add(f"{s.context.trace_id:032x}")
            for key in (semconv.RUN_ID, semconv.PARENT_RUN_ID):
                if (s.attributes or {}).get(key):
                    self._runs.setdefault(str(s.attributes[key]), set()).add(s.context.trace_id)
        ok = all(self.exporters[i].export(g) == SpanExportResult.SUCCESS for i, g in groups.items())
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        for e in self.exporters:
            e.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class Receiver:
    def __init__(self, db: str, lake: str, rid: str, env: dict[str, str], interval: float = 0.2,
                 max_spans: int | None = None) -> None:
        self.db, self.lake, self.rid, self.env = db, lake, rid, env
        self.interval, self.max_spans = interval, max_spans
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> Receiver:
        cmd = [sys.executable, "-m", "otel_agenttape", "serve", "--db", self.db, "--lake", self.lake,
               "--receiver-id", self.rid, "--http-port", "0", "--grpc-port", "0", "--ingest-workers", "0",
               "--lake-interval", str(self.interval), "--json"]
        if self.max_spans:
            cmd += ["--lake-max-spans", str(self.max_spans)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"receiver {self.rid} did not start: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.url = json.loads(line)["url"]
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)
        self.proc = None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None


def record(urls: Sequence[str]) -> dict[str, Any]:
    """A coordinator whose children run in their own traces, plus independent runs, all sealed."""
    router = TraceRouter(urls)
    tape = otel_agenttape.setup(exporter=router, service_name="lake-tests")
    model, tools = ScriptedModel(), ScriptedTools()
    solos: list[str] = []
    extra: list[str] = []  # the runs of earlier attempts: listed like any other run
    try:
        for attempt in range(20):  # trace ids are random: until the children sit on another receiver
            children = []
            with tape.run("coordinator", input="plan a trip") as coord:
                for i in range(CHILDREN):
                    rid = f"child-{attempt}-{i}"
                    weather_agent(tape, model, tools, f"Weather in city {i}?", parent=coord.inject(),
                                  agent="specialist", run_id=rid)
                    children.append(rid)
                coord.set_output("done")
            tape.force_flush()
            traces = {f"{t:032x}" for t in router.traces_of(coord.run_id)}
            homes = {i for i, sent in router.sent.items() if traces & sent}
            if len(homes) > 1:
                break
            extra += [coord.run_id, *children]
        n = 0
        while n < SOLO_RUNS or not all(router.sent.values()):  # and until every receiver has a trace
            rid = f"solo-{n}"
            weather_agent(tape, model, tools, "Weather in Oslo?", run_id=rid)
            solos.append(rid)
            n += 1
            tape.force_flush()
    finally:
        tape.shutdown()
    return {"coordinator": coord.run_id, "children": children, "solos": solos, "extra": extra, "sent": router.sent}


def run_cli(*argv: str, capsys: Any) -> tuple[int, str]:
    code = cli_main(list(argv))
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def _s3_env(endpoint: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1"}


def _make_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=bucket)


@pytest.fixture(scope="module", params=["folder", "s3"])
def lake(request: Any, tmp_path_factory: Any, moto_endpoint: str) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp(f"lake-{request.param}")
    env = dict(os.environ)
    saved = {k: os.environ.get(k) for k in _s3_env(moto_endpoint)}
    if request.param == "s3":
        _make_bucket(moto_endpoint, "tapes")
        uri = "s3://tapes/team-a"
        env.update(_s3_env(moto_endpoint))
        os.environ.update(_s3_env(moto_endpoint))  # this process reads the lake too
    else:
        uri = str(base / "lake")
    receivers = [Receiver(str(base / f"r{i}.duckdb"), uri, f"r{i}", env).start() for i in range(RECEIVERS)]
    try:
        rec = record([r.url for r in receivers])
    finally:
        for r in receivers:
            r.stop()  # a clean stop publishes everything stored
    yield {"uri": uri, "kind": request.param, "base": base, "env": env, "receivers": receivers, **rec}
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_runs_lists_every_run_once(lake: dict[str, Any], capsys: Any) -> None:
    assert all(lake["sent"][i] for i in range(RECEIVERS)), "every receiver got traces"
    code, out = run_cli("runs", "--lake", lake["uri"], "--limit", "100", "--json", capsys=capsys)
    assert code == 0
    ids = [r["run_id"] for r in json.loads(out)]
    want = [lake["coordinator"], *lake["children"], *lake["solos"], *lake["extra"]]
    assert sorted(ids) == sorted(want)


def test_coordinator_tree_rebuilds_across_receivers(lake: dict[str, Any], capsys: Any) -> None:
    from otel_agenttape.store.reader import open_reader
    from otel_agenttape.tape.rebuild import reconstruct_tree

    reader = open_reader([lake["uri"]])
    try:
        traces = reader.query("SELECT DISTINCT trace_id FROM spans WHERE run_id = ? OR parent_run_id = ?",
                              [lake["coordinator"], lake["coordinator"]]).column(0).to_pylist()
        tree = reconstruct_tree(reader, lake["coordinator"])
    finally:
        reader.close()
    homes = {i for t in traces for i, sent in lake["sent"].items() if t in sent}
    assert len(homes) > 1, "the coordinator's children were routed to other receivers"
    assert sorted(c.run_id for c in tree.root.children) == sorted(lake["children"])
    assert all(c.output for c in tree.root.children)
    code, out = run_cli("replay", lake["coordinator"], "--tree", "--json", "--lake", lake["uri"], capsys=capsys)
    assert code == 0
    assert len(json.loads(out)["children"]) == CHILDREN


def test_verify_passes_over_the_lake(lake: dict[str, Any], capsys: Any) -> None:
    code, out = run_cli("verify", "--lake", lake["uri"], "--json", capsys=capsys)
    doc = json.loads(out)
    assert code == 0, out
    assert doc["valid"] and len(doc["chains"]) >= 1 + CHILDREN + SOLO_RUNS
    assert doc["lake_files"]["problems"] == [] and doc["lake_files"]["checked"] > RECEIVERS


def test_sql_and_show_over_the_lake(lake: dict[str, Any], capsys: Any) -> None:
    code, out = run_cli("sql", "SELECT count(DISTINCT trace_id) AS n FROM spans", "--lake", lake["uri"], "--json",
                        capsys=capsys)
    assert code == 0
    assert json.loads(out)[0]["n"] == sum(len(s) for s in lake["sent"].values())
    code, out = run_cli("show", lake["solos"][0], "--lake", lake["uri"], capsys=capsys)
    assert code == 0 and "get_weather" in out


def test_diff_dataset_and_resume_index_over_the_lake(lake: dict[str, Any], capsys: Any, tmp_path: Any) -> None:
    a, b = lake["solos"][:2]
    code, out = run_cli("diff", a, b, "--json", "--lake", lake["uri"], capsys=capsys)
    assert code in (0, 1) and json.loads(out)["run_a"] == a
    out_file = tmp_path / "train.jsonl"
    code, out = run_cli("dataset", str(out_file), "--json", "--lake", lake["uri"], capsys=capsys)
    assert code == 0
    assert len(out_file.read_text().splitlines()) >= SOLO_RUNS
    index = tmp_path / "index.json"
    code, out = run_cli("resume-index", a, "--out", str(index), "--lake", lake["uri"], capsys=capsys)
    assert code == 0 and json.loads(index.read_text())


def test_lake_and_a_store_read_as_one(lake: dict[str, Any], tmp_path: Any) -> None:
    """A list of stores: the lake plus a DuckDB file holding another run."""
    import otel_agenttape
    from otel_agenttape.store.writer import Store
    from receiver_util import trace_request

    db = str(tmp_path / "extra.duckdb")
    store = Store(db)
    store.write_traces([trace_request(3, attrs={"agenttape.run.id": "extra-run"})])
    store.close()
    with otel_agenttape.open([lake["uri"], db]) as tapes:
        ids = {r.run_id for r in tapes.runs(limit=100).runs}
    assert "extra-run" in ids and lake["coordinator"] in ids


def _lake_fs(lake: dict[str, Any]) -> Any:
    from otel_agenttape.store.lake import lake_fs

    return lake_fs(lake["uri"])


def _span_file(lake: dict[str, Any]) -> str:
    from otel_agenttape.store.lake import load_catalog

    cat = load_catalog(_lake_fs(lake))
    return max((f for f in cat.files.values() if f["table"] == "spans"), key=lambda f: f["rows"])["key"]


def test_verify_catches_an_edited_parquet_file(lake: dict[str, Any], capsys: Any) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    fs = _lake_fs(lake)
    key = _span_file(lake)
    original = fs.read(key)
    table = pq.read_table(pa.BufferReader(original))
    names = table.column("name").to_pylist()
    i = table.column("chain_hash").to_pylist().index(next(h for h in table.column("chain_hash").to_pylist() if h))
    names[i] = names[i] + " (edited)"  # a sealed span (not, say, a checkpoint span)
    table = table.set_column(table.schema.get_field_index("name"), "name", pa.array(names, table.schema.field("name").type))
    assert pc.sum(pc.equal(table.column("name"), names[i])).as_py() == 1
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    fs.put_bytes(key, sink.getvalue().to_pybytes())
    try:
        code, out = run_cli("verify", "--lake", lake["uri"], "--json", capsys=capsys)
        doc = json.loads(out)
        assert code == 1 and not doc["valid"]
        assert any(key in p["file"] for p in doc["lake_files"]["problems"])
        assert any("span content edited" in (c["reason"] or "") for c in doc["chains"])
    finally:
        fs.put_bytes(key, original)
    assert run_cli("verify", "--lake", lake["uri"], capsys=capsys)[0] == 0


def test_verify_catches_a_removed_parquet_file(lake: dict[str, Any], capsys: Any) -> None:
    fs = _lake_fs(lake)
    key = _span_file(lake)
    original = fs.read(key)
    assert fs.delete(key)
    try:
        code, out = run_cli("verify", "--lake", lake["uri"], "--json", capsys=capsys)
        doc = json.loads(out)
        assert code == 1
        assert [p["problem"] for p in doc["lake_files"]["problems"] if key in p["file"]] == [
            "missing: listed in the lake manifest but not there"]
        code, out = run_cli("verify", "--lake", lake["uri"], capsys=capsys)
        assert code == 1 and "FAIL  lake file" in out and "missing" in out
    finally:
        fs.put_bytes(key, original)


def _counts(uri: str) -> dict[str, int]:
    from otel_agenttape.store.reader import open_reader

    reader = open_reader([uri])
    try:
        return {t: reader.query(f"SELECT count(*) FROM {t}").column(0)[0].as_py()
                for t in ("spans", "span_events", "span_links", "log_records", "resources", "run_traces")}
    finally:
        reader.close()


def test_compact_keeps_every_row(lake: dict[str, Any], capsys: Any) -> None:
    from otel_agenttape.store.lake import load_catalog

    before = _counts(lake["uri"])
    files_before = len(load_catalog(_lake_fs(lake)).files)
    code, out = run_cli("lake", "compact", lake["uri"], "--grace", "0", "--json", capsys=capsys)
    assert code == 0
    done = json.loads(out)
    assert done["merged_files"] > 0
    assert _counts(lake["uri"]) == before
    cat = load_catalog(_lake_fs(lake))
    assert len(cat.files) < files_before and cat.entries == []
    # the replaced files are gone from the lake itself, not only from the manifest
    assert set(_lake_fs(lake).list("spans")) == {f["key"] for f in cat.table_files("spans")}
    again = json.loads(run_cli("lake", "compact", lake["uri"], "--grace", "0", "--json", capsys=capsys)[1])
    assert again["merged_files"] == 0 and _counts(lake["uri"]) == before
    code, out = run_cli("runs", "--lake", lake["uri"], "--limit", "100", "--json", capsys=capsys)
    assert len(json.loads(out)) == 1 + CHILDREN + len(lake["solos"]) + len(lake["extra"])
    assert run_cli("verify", "--lake", lake["uri"], capsys=capsys)[0] == 0
