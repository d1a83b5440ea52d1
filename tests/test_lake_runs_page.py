"""A lake's runs pages come from its run index (``run_traces``): the first page of a fresh reader, and
every page after it, list the same runs in the same order with the same total as the runs computed
from the spans of one DuckDB file holding the same spans — runs published over several batches, runs
that start at the same instant, a run without a run span, sealed tapes' checkpoints included."""

from __future__ import annotations

import os
import sys
from typing import Any

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


def _publish(tmp_path: Any, batches: list[list[list[Any]]]) -> str:
    """Each batch's traces written to a receiver's store and to ``single.duckdb``, the receiver publishing
    after each batch; returns the lake."""
    lake = str(tmp_path / "lake")
    hot = Store(str(tmp_path / "r1.duckdb"))
    single = Store(str(tmp_path / "single.duckdb"))
    try:
        for batch in batches:
            for spans in batch:
                hot.write_traces([encode(spans)])
                single.write_traces([encode(spans)])
            LakePublisher(hot, lake, "r1").publish_all()
    finally:
        hot.close()
        single.close()
    return lake


def test_lake_runs_pages_match_the_spans(tmp_path: Any) -> None:
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
    lake = _publish(tmp_path, batches)

    with otel_agenttape.open(lake) as tapes:
        rows = tapes.reader.query("SELECT count(*) AS n FROM run_traces WHERE run_id = 'long'").to_pylist()
        assert rows == [{"n": 2}], "long's index rows are in two files"
        assert tapes.reader.query("SELECT count(*) AS n FROM spans WHERE run_id IS NULL").to_pylist()[0]["n"] > 0
        assert not run_rows.has_foreign(tapes.reader), "tape checkpoints are not another source's spans"
        first = index_keys.first_page(tapes.reader, 4)
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


def test_a_first_page_cut_inside_many_runs_that_start_together(tmp_path: Any) -> None:
    """Eight runs start at one instant: the first page's newest runs tie beyond what one pass keeps, and
    the order by ref still matches the spans'."""
    lake = _publish(tmp_path, [[_spans(f"same-{i}", T0 + 9 * SEC, 1) for i in range(8)] + [_spans("older", T0, 1)]])
    with otel_agenttape.open(lake) as tapes:
        keys, total = index_keys.first_page(tapes.reader, 2)
    assert total == 9 and len(keys) == 3
    for limit in (1, 2, 3, 8):
        assert all_pages(lake, limit) == all_pages(str(tmp_path / "single.duckdb"), limit), limit
