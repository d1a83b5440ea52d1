"""Runs listing benchmark: the one read model's ``runs()`` page against the listing it replaced.

Builds the store of ``bench/replay.py`` (``--spans`` spans, default 200,000: 10-span agenttape runs
plus a 100-node run and a 1 + 20 tree) and times, in the same run and on the same file:

- baseline: the query ``agenttape runs`` ran before (invoke_agent spans only, joined to node counts,
  plus runs known only by their nodes), newest 20;
- ``Tapes.runs(limit=20)``: runs of every source with their total and cursor;
- ``Tapes.runs(agent=..., limit=20)`` and ``Tapes.run(ref)`` (one run's summary by ref).

    python bench/runs.py [--spans 200000] [--repeat 5] [--dir DIR] [--reuse]

``--reuse`` measures the store already in ``--dir`` (so two versions of the code can be timed in turn
on one file).

Last line: ``runs baseline_ms=A page_ms=B filtered_ms=C run_ms=D ratio=B/A``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from replay import build, median_ms  # noqa: E402

# The listing before the read model: the old `runs` view body (invoke_agent spans, node counts by
# run id and trace through each node's direct parent) and the incomplete runs, newest first.
BASELINE = """
WITH ns AS (
  SELECT s.*, coalesce(s.run_id, p.run_id, p.span_id) AS resolved_run_id
  FROM spans s LEFT JOIN spans p ON p.trace_id = s.trace_id AND p.span_id = s.parent_span_id
    AND p.operation_name = 'invoke_agent'
  WHERE s.node_type IN ('model', 'tool')
), c AS (
  SELECT resolved_run_id AS run_id, trace_id,
    count(*) FILTER (WHERE node_type = 'model') AS model_nodes,
    count(*) FILTER (WHERE node_type = 'tool') AS tool_nodes,
    CAST(sum(input_tokens) AS BIGINT) AS input_tokens, CAST(sum(output_tokens) AS BIGINT) AS output_tokens
  FROM ns GROUP BY resolved_run_id, trace_id
), listed AS (
  SELECT coalesce(r.run_id, r.span_id) AS run_id, r.trace_id, r.agent_name AS agent, r.session_id,
    coalesce(r.run_status, CASE WHEN r.status_code = 2 THEN 'error' ELSE 'completed' END) AS status,
    r.start_time_unix_nano, c.model_nodes, c.tool_nodes, c.input_tokens, c.output_tokens
  FROM spans r LEFT JOIN c ON c.run_id = coalesce(r.run_id, r.span_id) AND c.trace_id = r.trace_id
  WHERE r.operation_name = 'invoke_agent'
  UNION ALL
  SELECT s.run_id, s.trace_id, any_value(s.agent_name), any_value(s.session_id), 'incomplete',
    min(s.start_time_unix_nano), count(*) FILTER (WHERE s.node_type = 'model'),
    count(*) FILTER (WHERE s.node_type = 'tool'), CAST(sum(s.input_tokens) AS BIGINT),
    CAST(sum(s.output_tokens) AS BIGINT)
  FROM spans s
  WHERE s.node_type IN ('model', 'tool') AND s.run_id IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM spans r WHERE r.operation_name = 'invoke_agent' AND r.run_id = s.run_id AND r.trace_id = s.trace_id)
  GROUP BY s.run_id, s.trace_id
)
SELECT * FROM listed ORDER BY start_time_unix_nano DESC, run_id LIMIT 20
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--reuse", action="store_true", help="measure the store already in --dir instead of building")
    args = ap.parse_args()
    import otel_agenttape

    folder = args.dir or tempfile.mkdtemp(prefix="agenttape-runs-bench-")
    db = os.path.join(folder, "bench.duckdb")
    if not (args.reuse and os.path.exists(db)):
        for path in (db, db + ".wal"):
            if os.path.exists(path):
                os.remove(path)
        build(db, args.spans)
    with otel_agenttape.open(db) as tapes:
        page = tapes.runs(limit=20)
        baseline = tapes.reader.query(BASELINE).to_pylist()
        assert [r["run_id"] for r in baseline] == [r.run_id for r in page.runs], "the two listings disagree"
        agent = page.runs[0].agent
        ref = page.runs[-1].ref
        base_ms = median_ms(lambda: tapes.reader.query(BASELINE), args.repeat)
        page_ms = median_ms(lambda: tapes.runs(limit=20), args.repeat)
        filtered_ms = median_ms(lambda: tapes.runs(agent=agent, limit=20), args.repeat)
        run_ms = median_ms(lambda: tapes.run(ref), args.repeat)
        print(f"{page.total} runs over {args.spans} spans: baseline {base_ms:.0f} ms, runs() {page_ms:.0f} ms, "
              f"runs(agent=) {filtered_ms:.0f} ms, run(ref) {run_ms:.0f} ms", flush=True)
    print(f"runs baseline_ms={base_ms:.1f} page_ms={page_ms:.1f} filtered_ms={filtered_ms:.1f} "
          f"run_ms={run_ms:.1f} ratio={page_ms / base_ms:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
