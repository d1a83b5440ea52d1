"""Reading the Iceberg lake: a lookup by trace or run id reads only the files pyiceberg plans for it (the
trace's bucket, the files whose min/max can hold the id), and `agenttape runs/show/replay --db iceberg+...`
print what the same commands print over the DuckDB store that published it."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

sys.path.insert(0, os.path.dirname(__file__))
from tape_agents import ScriptedModel, ScriptedTools, weather_agent  # noqa: E402

pytest.importorskip("pyiceberg")

import otel_agenttape  # noqa: E402
from otel_agenttape.cli import main as cli_main  # noqa: E402
from otel_agenttape.store.lake.iceberg_files import buckets  # noqa: E402
from otel_agenttape.store.lake.iceberg_publish import IcebergPublisher  # noqa: E402
from otel_agenttape.store.reader import open_reader  # noqa: E402
from otel_agenttape.store.writer import Store  # noqa: E402

BATCHES = 3
RUNS_PER_BATCH = 4


class ToStore(SpanExporter):
    """The spans straight into a DuckDB store, as a receiver stores what it is sent."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def export(self, spans: Any) -> SpanExportResult:
        self.store.write_traces([encode_spans(spans)])
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def lake(tmp_path_factory: Any) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("iceread")
    url = f"iceberg+sql://{tmp}/catalog.db#tapes"
    db = str(tmp / "r0.duckdb")
    with Store(db) as store:
        tape = otel_agenttape.setup(exporter=ToStore(store), service_name="ice")
        publisher = IcebergPublisher(store, url, "r0")
        for b in range(BATCHES):  # one batch (one file of the run index) per four runs
            for i in range(RUNS_PER_BATCH):
                n = b * RUNS_PER_BATCH + i
                weather_agent(tape, ScriptedModel(), ScriptedTools(), f"Weather in city {n}?", run_id=f"run-{n:02d}")
            tape.force_flush()
            publisher.publish_all()
        tape.shutdown()
    return {"url": url, "db": db}


def test_a_trace_or_run_lookup_plans_only_the_files_that_can_hold_it(lake: dict[str, Any]) -> None:
    reader = open_reader([lake["url"]])
    try:
        (ice,) = reader.lakes.icebergs
        (row,) = reader.query("SELECT trace_id FROM spans WHERE run_id = 'run-05' LIMIT 1").to_pylist()
        trace = row["trace_id"]
        every = ice.files["spans"]
        scoped = ice.scoped_files("spans", "trace_id", [trace])
        assert 1 <= len(scoped) < len(every)
        # the same files pyiceberg's own scan plans for the filter
        from pyiceberg.expressions import EqualTo

        planned = ice.tables["spans"].scan(row_filter=EqualTo("trace_id", trace)).plan_files()
        assert sorted(f.file_path for f in scoped) == sorted(t.file.file_path for t in planned)
        bucket = buckets([trace]).to_pylist()[0]
        # the files of other buckets are pruned by partition, the rest by min/max
        assert {f.partition[1] for f in scoped} == {bucket}
        holding = {r["f"] for r in reader.query(
            "SELECT DISTINCT filename AS f FROM read_parquet(?, filename = true) WHERE trace_id = ?",
            [[f.file_path[len("file://"):] for f in every], trace]).to_pylist()}
        assert holding <= {f.file_path[len("file://"):] for f in scoped}
        # the run index is not partitioned: its files' min/max of run_id prune it to one batch's file
        assert len(ice.files["run_traces"]) == BATCHES
        assert len(ice.scoped_files("run_traces", "run_id", ["run-05"])) == 1
        assert len(list(ice.tables["run_traces"].scan(row_filter=EqualTo("run_id", "run-05")).plan_files())) == 1
        # what the read model's lookups read over this reader: those files, no other
        sql = reader.scoped_source("spans", "trace_id", [trace])
        assert {f.file_path[len("file://"):] for f in every if f.file_path[len("file://"):] in sql} == {
            f.file_path[len("file://"):] for f in scoped}
    finally:
        reader.close()


def _out(capsys: Any, *argv: str) -> str:
    assert cli_main(list(argv)) == 0
    return capsys.readouterr().out


def test_runs_show_and_replay_read_the_iceberg_lake_as_the_store(lake: dict[str, Any], capsys: Any) -> None:
    url, db = lake["url"], lake["db"]
    runs = _out(capsys, "runs", "--db", url, "--limit", "50")
    assert runs == _out(capsys, "runs", "--db", db, "--limit", "50")
    assert sum(line.startswith("run-") for line in runs.splitlines()) == BATCHES * RUNS_PER_BATCH
    for ref in ("run-05", "run-11"):
        shown = _out(capsys, "show", ref, "--db", url)
        assert shown == _out(capsys, "show", ref, "--db", db)
        assert f"Weather in city {int(ref[4:])}?" in shown
        replay = _out(capsys, "replay", ref, "--db", url)
        assert replay == _out(capsys, "replay", ref, "--db", db)
        assert f"output: In {int(ref[4:])} it is" in replay


def test_a_reader_of_a_catalog_that_is_not_there_says_so_and_creates_nothing(tmp_path: Any, capsys: Any) -> None:
    url = f"iceberg+sql://{tmp_path}/nothere/catalog.db#tapes"
    assert cli_main(["runs", "--lake", url]) == 2
    assert "no Iceberg catalog at" in capsys.readouterr().err
    assert not (tmp_path / "nothere").exists()


def test_the_first_runs_page_reads_only_the_newest_files(lake: dict[str, Any]) -> None:
    """The newest runs are in the newest batch's files: the first page of a fresh reader (its keys from the
    run index, the runs' ids, summaries and model calls from the spans) reads no other span file, and
    shows the same runs and count as the store that published them."""
    from otel_agenttape.store.lake.iceberg_read import IcebergLake

    read: list[tuple[str, list[str]]] = []
    plain = IcebergLake._file_sql

    def recording(self: Any, con: Any, table: str, files: list[Any], name: str, registry: Any) -> str:
        read.append((table, [f.file_path.rsplit("/", 1)[-1] for f in files]))
        return plain(self, con, table, files, name, registry)

    with otel_agenttape.open(lake["db"]) as store_tapes:
        want = store_tapes.runs(limit=RUNS_PER_BATCH - 1)
        # the premise: each batch's spans start after the batch before it ended (the page's files are
        # chosen by start time); a wall clock set back between batches would make older files overlap
        spans = [(int(r["run_id"][4:]) // RUNS_PER_BATCH, int(r["t"])) for r in store_tapes.sql(
            "SELECT run_id, start_time_unix_nano AS t FROM spans WHERE run_id LIKE 'run-%'").to_pylist()]
    ends = {b: max(t for bb, t in spans if bb == b) for b in range(BATCHES)}
    begins = {b: min(t for bb, t in spans if bb == b) for b in range(BATCHES)}
    if any(begins[b] <= ends[b - 1] for b in range(1, BATCHES)):
        pytest.skip(f"the wall clock went back between batches: starts {begins}, ends {ends}")
    IcebergLake._file_sql = recording  # type: ignore[method-assign]
    try:
        with otel_agenttape.open(lake["url"]) as tapes:
            opened = len(read)
            (ice,) = tapes.reader.lakes.icebergs
            assert tapes.reader.run_index_keyed()  # every index row keyed, by the files' null counts alone
            page = tapes.runs(limit=RUNS_PER_BATCH - 1)
            first = read[opened:]
            more = tapes.runs(limit=RUNS_PER_BATCH - 1, cursor=page.next_cursor)
    finally:
        IcebergLake._file_sql = plain  # type: ignore[method-assign]
    assert [r.ref for r in page.runs] == [r.ref for r in want.runs]
    assert [(r.run_id, r.model_calls, r.input_tokens, r.cost_usd) for r in page.runs] == [
        (r.run_id, r.model_calls, r.input_tokens, r.cost_usd) for r in want.runs]
    assert page.total == want.total == BATCHES * RUNS_PER_BATCH
    assert [r.run_id for r in page.runs] == ["run-11", "run-10", "run-09"]
    assert [r.run_id for r in more.runs] == ["run-08", "run-07", "run-06"]  # every run is still reachable
    newest = f"r0-{BATCHES:010d}.parquet"  # the last batch's files (seq counts from 1)
    spans_read = [names for table, names in first if table == "spans"]
    assert spans_read, first
    every = {f.file_path.rsplit("/", 1)[-1] for f in ice.files["spans"]}
    assert len(every) > 1 and newest in every
    for names in spans_read:  # the page's ids, summaries and calls: the newest batch's span files only
        assert set(names) == {newest}, (names, sorted(every))
    # the older span files only for a later page
    assert any(set(names) - {newest} for table, names in read[opened + len(first):] if table == "spans")
