"""Evaluations benchmark: a code evaluator over many runs, and the runs page with and without cost.

Builds the store of ``bench/replay.py`` (``--spans`` spans, default 1,000,000: about 100,000 10-span
agenttape runs, written through ``Store.write_tables``, the receiver's write path), then, in the same run:

- ``evaluate``: the built-in ``latency_budget`` evaluator (a code check reading each run's summary) over
  the oldest ``--runs`` runs (default 100,000), every score recorded the way ``agenttape eval`` records it:
  a sealed score tape exported over OTLP/HTTP to a receiver holding the store, counted once stored.
  Target >= 5,000 runs/s. Then the same again, which must add nothing (every run skipped).
- ``contains`` (a check that reads each run's output, so runs are rebuilt) over ``--content-runs`` runs.
- the runs page, ``Tapes.runs(limit=50)`` (priced: the bench's model is given a price with
  ``use_prices``) against the same page without cost (``listing.page`` and the runs' scores, what
  ``Tapes.runs`` does but pricing), alternated, ``--repeat`` times each after a warm-up, on the store with its
  scores; p95 of each. Targets: p95 <= 100 ms, with cost / without <= 1.10.

    python bench/evaluations.py [--spans 1000000] [--runs 100000] [--content-runs 5000] [--repeat 40] [--dir DIR]

Last line: ``evaluations eval_runs_per_s=N runs_page_ms=X cost_overhead=R``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from replay import build  # noqa: E402


def p95(times: list[float]) -> float:
    return statistics.quantiles(times, n=20, method="inclusive")[18] if len(times) > 1 else times[0]


def evaluate_stored(db: str, ev, runs: int) -> tuple[float, object, float]:
    """(seconds until every score is stored, the summary, seconds of a rerun that must add nothing): what
    ``agenttape eval`` does on a file no receiver holds (select the runs, start a receiver on the file,
    evaluate, record, wait until stored)."""
    import otel_agenttape
    from otel_agenttape.commands.eval import evaluate_store

    start = time.perf_counter()
    summary = evaluate_store(db, ev, limit=runs)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    again = evaluate_store(db, ev, limit=runs)
    rerun = time.perf_counter() - start
    assert (again.evaluated, again.skipped) == (0, summary.evaluated), again.to_json()
    from otel_agenttape.tape.evaluate import by_evaluator

    with otel_agenttape.open(db) as tapes:
        where, params = by_evaluator(tapes, ev)
        stored = tapes.sql(f"SELECT count(*) AS n FROM scores WHERE {where}", params).to_pylist()[0]["n"]
    assert stored == summary.evaluated, (stored, summary.to_json())
    return seconds, summary, rerun


def page_times(db: str, repeat: int, prices: str) -> tuple[list[float], list[float], int]:
    """p95 inputs: the runs page with cost and without, alternated on one reader (kept answers)."""
    import otel_agenttape
    from otel_agenttape.tape.read.filters import Filters
    from otel_agenttape.tape.read.listing import page
    from otel_agenttape.tape.read.scores import score_summaries

    def bare(tapes):
        found = page(tapes.reader, Filters(), limit=50)
        score_summaries(tapes.reader, found.runs)
        return found

    with otel_agenttape.open(db) as cold:  # a fresh reader: the page's runs are priced for the first time
        cold.use_prices(prices)
        bare(cold)
        start = time.perf_counter()
        cold.runs(limit=50)
        print(f"first priced page on a fresh reader: {(time.perf_counter() - start) * 1000:.1f} ms", flush=True)
    with otel_agenttape.open(db) as tapes:
        tapes.use_prices(prices)
        first = tapes.runs(limit=50)
        assert first.runs and all(r.cost_usd is not None for r in first.runs if r.model_calls), "the page is not priced"
        bare(tapes)
        with_cost, without = [], []
        for _ in range(repeat):
            start = time.perf_counter()
            tapes.runs(limit=50)
            with_cost.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            bare(tapes)
            without.append((time.perf_counter() - start) * 1000)
        return with_cost, without, first.total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=100_000, help="runs the code evaluator scores")
    ap.add_argument("--content-runs", type=int, default=5_000, help="runs the output check (rebuilding) scores")
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    from otel_agenttape.tape.evaluators import contains, latency_budget

    folder = args.dir or tempfile.mkdtemp(prefix="agenttape-eval-bench-")
    os.makedirs(folder, exist_ok=True)
    db = os.path.join(folder, "bench.duckdb")
    for path in (db, db + ".wal"):
        if os.path.exists(path):
            os.remove(path)
    start = time.perf_counter()
    build(db, args.spans)
    print(f"built in {time.perf_counter() - start:.1f}s", flush=True)

    seconds, summary, rerun = evaluate_stored(db, latency_budget(2_000), args.runs)
    rate = summary.evaluated / seconds
    print(f"latency_budget: {summary.evaluated} runs scored and stored in {seconds:.1f} s = {rate:,.0f} runs/s "
          f"(target 5,000); labels {summary.labels}; rerun skipped {summary.evaluated} in {rerun:.1f} s", flush=True)
    c_seconds, c_summary, _ = evaluate_stored(db, contains("policy"), args.content_runs)
    print(f"contains (runs rebuilt): {c_summary.evaluated} runs in {c_seconds:.1f} s = "
          f"{c_summary.evaluated / c_seconds:,.0f} runs/s", flush=True)

    prices = os.path.join(folder, "prices.json")
    with open(prices, "w", encoding="utf-8") as fh:
        json.dump({"gpt-b": {"input_mtok": 1.0, "output_mtok": 4.0}}, fh)
    with_cost, without, total = page_times(db, args.repeat, prices)
    page_ms, bare_ms = p95(with_cost), p95(without)
    overhead = page_ms / bare_ms
    print(f"runs page (limit 50) over {total} runs: p95 {page_ms:.1f} ms with cost (target 100), "
          f"{bare_ms:.1f} ms without; medians {statistics.median(with_cost):.1f} / "
          f"{statistics.median(without):.1f} ms; "
          f"overhead {overhead:.2f} (target 1.10)", flush=True)
    print(f"evaluations eval_runs_per_s={rate:.0f} runs_page_ms={page_ms:.1f} cost_overhead={overhead:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
