"""Console benchmark: the read API's answers on a 1,000,000-span store, beside the same reads as plain SQL.

Builds the store the way ``bench/replay.py`` does (Arrow tables in the store's column contract written
through ``Store.write_tables``, the receiver's write path: no SDK, so a million spans take seconds):
background runs of 9 nodes whose agents take ten names, one 100-node run, and a coordinator with 50
child runs, each child in its own trace linked by ``agenttape.parent_run.id``. Then it serves the
console over the file (uvicorn on 127.0.0.1, read-only) and times, over HTTP, in the same run:

- ``GET /api/runs`` (first page of 50, newest first, with the total), and with ``agent=`` (a tenth of runs)
- ``GET /api/runs/{ref}/steps`` of the 100-node run
- ``GET /api/runs/{ref}/tree`` of the 1 + 50 tree

and, as the baseline, the nearest plain DuckDB SQL on the same file (newest 50 run spans with a count;
the same with the agent filter; one run's spans and events; a tree's spans by parent run id), which
rebuilds nothing. With ``--page`` (default on when /usr/bin/chromium exists) it also loads the page in
headless Chromium and times until the runs table is drawn (target 1 s). Targets (p95): runs 100 ms,
steps 50 ms, tree 200 ms.

    python bench/console.py [--spans 1000000] [--repeat 20] [--dir DIR] [--no-page] [--reuse]

The API keeps a store version's run keys and answers (the bench's read-only file never changes), so the
repeated requests are served from them; the ``*_cold`` rows time the first request of a fresh reader
instead (everything kept is dropped before each one, untimed): what a console just started, or each
``agenttape runs``, pays. After a write only the runs the new spans belong to are read again.

Last lines: ``console_cold runs_ms=.. steps_ms=.. tree_ms=..``, then
``console runs_ms=X steps_ms=Y tree_ms=Z sql_runs_ms=W`` (p95 of each, kept answers).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from replay import RUN_EVERY_NS, T0, Builder  # noqa: E402

CHILDREN = 50
AGENTS = 10
CHROMIUM = "/usr/bin/chromium"


def build(db: str, total_spans: int) -> dict[str, str]:
    """Write the bench store; returns the run ids the measurements open."""
    from otel_agenttape.store.writer import Store

    store = Store(db)
    t, written, runs = T0, 0, 0
    ids: dict[str, str] = {}
    b = Builder()
    special_at = total_spans // 2
    while written + len(b) < total_spans:
        if not ids and written + len(b) >= special_at:
            ids["run"], ids["run_trace"] = b.new_id(16), b.new_id(16)
            b.run(ids["run"], ids["run_trace"], t, 100, agent="big")
            ids["tree"], ids["tree_trace"] = b.new_id(16), b.new_id(16)
            b.run(ids["tree"], ids["tree_trace"], t, 2, agent="coordinator")
            child_t = t + 300_000_000
            for i in range(CHILDREN):
                child_t = b.run(b.new_id(16), b.new_id(16), child_t, 4, agent=f"child-{i}",
                                parent_run_id=ids["tree"]) + 10_000_000
        b.run(b.new_id(16), b.new_id(16), t, 9, agent=f"agent-{runs % AGENTS}")
        t += RUN_EVERY_NS
        runs += 1
        if len(b) >= 200_000:
            written += len(b)
            store.write_tables(b.tables())
            b = Builder()
            print(f"  {written} spans written", file=sys.stderr, flush=True)
    if len(b):
        written += len(b)
        store.write_tables(b.tables())
    n = store.reader().query("SELECT count(*) AS n FROM spans").column("n")[0].as_py()
    store.close()
    print(f"store: {n} spans, {runs} background runs, in {db}", flush=True)
    return ids


def find_ids(db: str) -> dict[str, str]:
    """The 100-node run and the coordinator of a store ``build`` wrote (their agents are unique)."""
    import duckdb

    con = duckdb.connect(db, read_only=True)
    ids: dict[str, str] = {}
    for agent, key in (("big", "run"), ("coordinator", "tree")):
        ids[key], ids[f"{key}_trace"] = con.execute(
            "SELECT run_id, trace_id FROM spans WHERE agent_name = ? AND operation_name = 'invoke_agent'",
            [agent]).fetchone()
    n = con.execute("SELECT count(*) FROM spans").fetchone()[0]
    con.close()
    print(f"store: {n} spans in {db} (reused)", flush=True)
    return ids


def p95(times: list[float]) -> float:
    return statistics.quantiles(times, n=20, method="inclusive")[18] if len(times) > 1 else times[0]


def timed(fn, repeat: int) -> tuple[float, float]:
    """(median, p95) in ms, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), p95(times)


SQL_RUNS = ("SELECT run_id, trace_id, agent_name, start_time_unix_nano, end_time_unix_nano, run_status FROM spans "
            "WHERE operation_name = 'invoke_agent'{where} ORDER BY start_time_unix_nano DESC LIMIT 50")
SQL_COUNT = "SELECT count(*) FROM spans WHERE operation_name = 'invoke_agent'{where}"
SQL_STEPS = ("SELECT s.span_id, s.name, s.start_time_unix_nano, s.attributes, e.event_index, e.attributes "
             "FROM spans s LEFT JOIN span_events e ON e.trace_id = s.trace_id AND e.span_id = s.span_id "
             "WHERE s.trace_id = ? AND s.run_id = ? ORDER BY s.start_time_unix_nano, e.event_index")
SQL_TREE = ("SELECT trace_id, span_id, run_id, parent_run_id, name, attributes FROM spans WHERE trace_id IN "
            "(SELECT trace_id FROM spans WHERE run_id = ? OR parent_run_id = ?)")


def measure_sql(db: str, ids: dict[str, str], repeat: int) -> dict[str, tuple[float, float]]:
    import duckdb

    con = duckdb.connect(db, read_only=True)
    where = " AND agent_name = 'agent-3'"

    def runs(w: str = "") -> None:
        con.execute(SQL_RUNS.format(where=w)).fetchall()
        con.execute(SQL_COUNT.format(where=w)).fetchall()

    out = {
        "runs": timed(runs, repeat),
        "runs_filtered": timed(lambda: runs(where), repeat),
        "steps": timed(lambda: con.execute(SQL_STEPS, [ids["run_trace"], ids["run"]]).fetchall(), repeat),
        "tree": timed(lambda: con.execute(SQL_TREE, [ids["tree"], ids["tree"]]).fetchall(), repeat),
    }
    con.close()
    return out


def forget(tapes) -> None:
    """Drop what the read model keeps between requests (the runs' keys and the answers of a store version),
    so that the next request computes from the store, as the first one after a write does."""
    from otel_agenttape.tape.read import kept

    kept._KEPT.clear()
    tapes._memo.clear()


def timed_cold(fn, reset, repeat: int) -> tuple[float, float]:
    """(median, p95) in ms of ``fn`` right after ``reset`` (not timed)."""
    fn()
    times = []
    for _ in range(repeat):
        reset()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), p95(times)


def measure_api(url: str, ids: dict[str, str], repeat: int, tapes=None) -> dict[str, tuple[float, float]]:
    import httpx

    with httpx.Client(base_url=url + "api", timeout=120) as client:
        def get(path: str, **params: str) -> dict:
            r = client.get(path, params=params)
            r.raise_for_status()
            return r.json()

        page = get("/runs")
        assert len(page["runs"]) == 50 and page["total"] > 1000, page["total"]
        assert all(r["agent"] == "agent-3" for r in get("/runs", agent="agent-3")["runs"])
        run_ref = f"{ids['run']}@{ids['run_trace']}"
        tree_ref = f"{ids['tree']}@{ids['tree_trace']}"
        steps = get(f"/runs/{run_ref}/steps")["steps"]
        assert sum(1 for s in steps if s["kind"] == "tool_result") == 50, len(steps)
        tree = get(f"/runs/{tree_ref}/tree")
        assert tree["runs"] == 1 + CHILDREN, tree["runs"]
        out = {
            "runs": timed(lambda: get("/runs"), repeat),
            "runs_filtered": timed(lambda: get("/runs", agent="agent-3"), repeat),
            "steps": timed(lambda: get(f"/runs/{run_ref}/steps"), repeat),
            "tree": timed(lambda: get(f"/runs/{tree_ref}/tree"), repeat),
        }
        if tapes is not None:  # the first request of a fresh reader: nothing kept
            cold = max(3, repeat // 2)
            out.update({
                "runs_cold": timed_cold(lambda: get("/runs"), lambda: forget(tapes), cold),
                "steps_cold": timed_cold(lambda: get(f"/runs/{run_ref}/steps"), lambda: forget(tapes), cold),
                "tree_cold": timed_cold(lambda: get(f"/runs/{tree_ref}/tree"), lambda: forget(tapes), cold),
            })
        return out


def measure_page(url: str, ids: dict[str, str], repeat: int) -> dict[str, tuple[float, float]]:
    """Navigation start to the drawn runs table (and to the drawn 51-node graph), in headless Chromium."""
    from playwright.sync_api import sync_playwright

    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"]
    tree_hash = f"#/tree/{ids['tree']}%40{ids['tree_trace']}"
    out: dict[str, list[float]] = {"page_shell": [], "page_runs": [], "page_tree": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        for i in range(repeat + 1):
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            page = context.new_page()
            page.goto(url)
            page.wait_for_selector("#filters input")  # the page answers input (the runs still loading)
            shell_ms = page.evaluate("() => performance.now()")
            page.wait_for_selector("#runs tbody tr[data-ref]", timeout=300_000)
            runs_ms = page.evaluate("() => performance.now()")
            page.goto("about:blank")  # leave, so the tree is a fresh navigation too
            page.goto(url + tree_hash)
            page.wait_for_selector("#graph g.gnode >> nth=50")
            tree_ms = page.evaluate("() => performance.now()")
            context.close()
            if i:  # the first one warms the server and the browser
                out["page_shell"].append(shell_ms)
                out["page_runs"].append(runs_ms)
                out["page_tree"].append(tree_ms)
        browser.close()
    return {k: (statistics.median(v), p95(v)) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--dir", default=None, help="where to build the store (default: a temp folder)")
    ap.add_argument("--no-page", action="store_true", help="skip the headless Chromium page timing")
    ap.add_argument("--reuse", action="store_true", help="measure the store already in --dir instead of building")
    args = ap.parse_args()

    import otel_agenttape

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from console_app import serve_console

    folder = args.dir or tempfile.mkdtemp(prefix="agenttape-console-bench-")
    os.makedirs(folder, exist_ok=True)
    db = os.path.join(folder, "bench.duckdb")
    if args.reuse and os.path.exists(db):
        ids = find_ids(db)
    else:
        for path in (db, db + ".wal"):
            if os.path.exists(path):
                os.remove(path)
        start = time.perf_counter()
        ids = build(db, args.spans)
        print(f"built in {time.perf_counter() - start:.1f}s", flush=True)
    sql = measure_sql(db, ids, args.repeat)
    tapes = otel_agenttape.open(db)
    try:
        with serve_console(tapes) as base:
            api = measure_api(base + "/", ids, args.repeat, tapes)
            page = {} if args.no_page or not os.path.exists(CHROMIUM) else measure_page(base + "/", ids, 5)
    finally:
        tapes.close()
    targets = {"runs": 100, "runs_filtered": 100, "steps": 50, "tree": 200}
    sql.update({"runs_cold": sql["runs"], "steps_cold": sql["steps"], "tree_cold": sql["tree"]})
    targets.update({k + "_cold": targets[k] for k in ("runs", "steps", "tree")})
    print(f"{'read':<14} {'api median':>11} {'api p95':>9} {'sql median':>11} {'sql p95':>9} {'target':>7}")
    for k, target in targets.items():
        print(f"{k:<14} {api[k][0]:>9.1f}ms {api[k][1]:>7.1f}ms {sql[k][0]:>9.1f}ms {sql[k][1]:>7.1f}ms "
              f"{target:>5}ms  api/sql x{api[k][1] / max(sql[k][1], 0.01):.1f}")
    for k, (med, top) in page.items():
        print(f"{k:<14} {med:>9.0f}ms {top:>7.0f}ms {'':>11} {'':>9} {1000:>5}ms  (navigation to drawn)")
    print(f"console_cold runs_ms={api['runs_cold'][1]:.1f} steps_ms={api['steps_cold'][1]:.1f} "
          f"tree_ms={api['tree_cold'][1]:.1f}")
    print(f"console runs_ms={api['runs'][1]:.1f} steps_ms={api['steps'][1]:.1f} tree_ms={api['tree'][1]:.1f} "
          f"sql_runs_ms={sql['runs'][1]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
