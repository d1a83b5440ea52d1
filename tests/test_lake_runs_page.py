"""A lake's runs pages come from its run index (``run_traces``): the first page of a fresh reader, and
every page after it, list the same runs in the same order with the same total as the runs computed
from the spans of one DuckDB file holding the same spans — runs published over several batches, runs
that start at the same instant, a run without a run span, sealed tapes' checkpoints included."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import pytest
from integrity_support import encode, sealed_provider
from pages_support import all_pages

sys.path.insert(0, os.path.dirname(__file__))

import otel_agenttape  # noqa: E402
from otel_agenttape import semconv  # noqa: E402
from otel_agenttape.store.lake import LakePublisher  # noqa: E402
from otel_agenttape.store.writer import Store  # noqa: E402
from otel_agenttape.tape.read import index_keys, run_rows  # noqa: E402

T0 = 1_790_000_000_000_000_000
SEC = 1_000_000_000


def _spans(run_id: str, start: int, nodes: int, run_span: bool = True) -> list[Any]:
    """A sealed run: ``nodes`` tool spans a second apart, under a run span starting at ``start``."""
    from opentelemetry import trace

    provider, _sealer, exporter = sealed_provider()
    tracer = provider.get_tracer("otel_agenttape")
    run = tracer.start_span(f"invoke_agent {run_id}", start_time=start, attributes={
        semconv.RUN_ID: run_id, semconv.NODE_TYPE: "run" if run_span else "tool"})
    ctx = trace.set_span_in_context(run)
    for i in range(nodes):
        sp = tracer.start_span(f"tool {i}", context=ctx, start_time=start + (i + 1) * SEC,
                               attributes={semconv.RUN_ID: run_id, semconv.STEP: i, semconv.NODE_TYPE: "tool"})
        sp.end(end_time=start + (i + 1) * SEC + 1000)
    run.end(end_time=start + (nodes + 1) * SEC)
    provider.shutdown()
    return exporter.get_finished_spans()


@pytest.fixture(params=["folder", "iceberg"])
def kind(request: Any) -> str:
    """The lake a receiver publishes into: a folder lake, or Iceberg tables (a SQLite catalog), whose first
    page is found from the newest spans and the count its run index's snapshot recorded."""
    if request.param == "iceberg":
        pytest.importorskip("pyiceberg")
    return str(request.param)


def _publish(tmp_path: Any, batches: list[list[list[Any]]], kind: str = "folder") -> str:
    """Each batch's traces written to a receiver's store and to ``single.duckdb``, the receiver publishing
    after each batch; returns the lake."""
    lake = str(tmp_path / "lake") if kind == "folder" else f"iceberg+sql:///{tmp_path}/catalog.db#tapes"
    hot = Store(str(tmp_path / "r1.duckdb"))
    single = Store(str(tmp_path / "single.duckdb"))
    try:
        for batch in batches:
            for spans in batch:
                hot.write_traces([encode(spans)])
                single.write_traces([encode(spans)])
            if kind == "folder":
                LakePublisher(hot, lake, "r1").publish_all()
            else:
                from otel_agenttape.store.lake.iceberg_publish import IcebergPublisher

                IcebergPublisher(hot, lake, "r1").publish_all()
    finally:
        hot.close()
        single.close()
    return lake


def _recorded(lake: str) -> int | None:
    """The count of runs the Iceberg run index's current snapshot recorded (None for a folder lake)."""
    if not lake.startswith("iceberg+"):
        return None
    from otel_agenttape.store.lake.iceberg_catalog import load
    from otel_agenttape.store.lake.iceberg_files import RUNS, summary_props

    cat, parsed = load(lake, create=False)
    return int(summary_props(cat.load_table(f"{parsed.namespace}.run_traces").current_snapshot())[RUNS])


def test_lake_runs_pages_match_the_spans(tmp_path: Any, kind: str) -> None:
    long = _spans("long", T0 + 200 * SEC, 4)  # nodes, then the run span
    batches = [
        # two runs starting at the same instant; a run without a run span; ten plain runs
        [_spans("tie-a", T0 + 50 * SEC, 2), _spans("tie-b", T0 + 50 * SEC, 3),
         _spans("no-run-span", T0 + 70 * SEC, 2, run_span=False),
         *[_spans(f"run-{i:02d}", T0 + i * 7 * SEC, 2) for i in range(10)]],
        # "long" has spans in this batch and the next: its index rows are in two published files
        [long[:2]],
        [long[2:], _spans("late", T0 + 300 * SEC, 1)],
    ]
    lake = _publish(tmp_path, batches, kind)
    assert _recorded(lake) in (None, 15)

    with otel_agenttape.open(lake) as tapes:
        rows = tapes.reader.query("SELECT count(*) AS n FROM run_traces WHERE run_id = 'long'").to_pylist()
        assert rows == [{"n": 2}], "long's index rows are in two files"
        assert tapes.reader.query("SELECT count(*) AS n FROM spans WHERE run_id IS NULL").to_pylist()[0]["n"] > 0
        assert not run_rows.has_foreign(tapes.reader), "tape checkpoints are not another source's spans"
        first = index_keys.first_page(tapes.reader, 4)
        if kind == "iceberg":  # found from the newest spans, without grouping the whole index
            assert index_keys._newest_by_time(tapes.reader, 5) == first
    assert first is not None, "the lake's run index is used"
    assert len(first[0]) == 5 and first[1] == 15

    for limit in (1, 4, 7, 50):
        lake_refs, lake_totals = all_pages(lake, limit)
        want_refs, want_totals = all_pages(str(tmp_path / "single.duckdb"), limit)
        assert lake_refs == want_refs and lake_totals == want_totals, limit
    refs, _ = all_pages(lake, 3)
    ids = [r.split("@")[0] for r in refs]
    assert len(refs) == len(set(refs)) == 15
    assert ids[:5] == ["late", "long", "no-run-span", "run-09", "run-08"] and sorted(ids[5:7]) == ["tie-a", "tie-b"]
    with otel_agenttape.open(lake) as tapes:
        long = [r for r in tapes.runs(limit=50).runs if r.run_id == "long"][0]
        assert long.start_ns == T0 + 200 * SEC


def test_a_first_page_cut_inside_many_runs_that_start_together(tmp_path: Any, kind: str) -> None:
    """Eight runs start at one instant: the first page's newest runs tie beyond what one pass keeps, and
    the order by ref still matches the spans'."""
    lake = _publish(tmp_path, [[_spans(f"same-{i}", T0 + 9 * SEC, 1) for i in range(8)] + [_spans("older", T0, 1)]],
                    kind)
    with otel_agenttape.open(lake) as tapes:
        keys, total = index_keys.first_page(tapes.reader, 2)
        if kind == "iceberg":
            assert index_keys._newest_by_time(tapes.reader, 3) == (keys, total)
    assert total == 9 and len(keys) == 3
    for limit in (1, 2, 3, 8):
        assert all_pages(lake, limit) == all_pages(str(tmp_path / "single.duckdb"), limit), limit


def test_a_run_started_long_ago_with_the_newest_spans_is_not_on_the_first_page(tmp_path: Any, kind: str) -> None:
    """Three runs that started first are still sending spans when thirty short runs have come and gone:
    their spans are the newest, their starts the oldest, so the first page (found from the newest spans
    over Iceberg: the newest window holds those three alone, and widens until enough runs start in it)
    holds the newest short runs, as the store's does."""
    # the runs end about now, where the tapes' checkpoints (signed at the wall clock) are: the newest spans
    t0 = time.time_ns() - 53 * SEC
    active = [_spans(f"active-{i}", t0 + i * SEC, 50) for i in range(3)]  # nodes up to t0 + 52 s
    short = [_spans(f"short-{i:02d}", t0 + (10 + i) * SEC, 1) for i in range(30)]
    lake = _publish(tmp_path, [[*(a[:20] for a in active), *short[:15]], [*(a[20:] for a in active), *short[15:]]],
                    kind)
    assert _recorded(lake) in (None, 33)
    with otel_agenttape.open(lake) as tapes:
        page = tapes.runs(limit=2)
        if kind == "iceberg":
            found = index_keys._newest_by_time(tapes.reader, 3)
            assert found is not None and [k["run_id"] for k in found[0]] == ["short-29", "short-28", "short-27"]
    assert [r.run_id for r in page.runs] == ["short-29", "short-28"] and page.total == 33
    for limit in (1, 2, 5, 40):
        assert all_pages(lake, limit) == all_pages(str(tmp_path / "single.duckdb"), limit), limit
