"""Replay benchmark: how fast a run and a run tree are rebuilt from a large store.

Builds a store of ``--spans`` spans (default 1,000,000) directly as Arrow tables in the store's
column contract (no SDK, so building takes seconds): background traffic of 10-span runs (one
``invoke_agent`` span, model spans with streamed-text events, tool spans), one 100-node run, and a
coordinator with 20 child runs, each child in its own trace linked by ``agenttape.parent_run.id``.
The rows go into a DuckDB store through ``Store.write_tables`` (the receiver's write path, which
also keeps ``run_index``) and are exported to a Parquet lake with ``export_parquet`` (with its
``run_traces`` index). Then it times ``reconstruct`` of the 100-node run and ``reconstruct_tree`` of
the 1 + 20 tree from each, and prints the medians (targets: 10 ms for the run, 25 ms for the tree
from the DuckDB store; 50 and 200 ms from the lake), and how much of each is the store's queries.

    python bench/replay.py [--spans 1000000] [--repeat 15] [--dir DIR [--reuse]]

The DuckDB figures are also taken with the run and the tree named by ``RUN_ID@TRACE_ID`` refs (what
``agenttape runs`` lists and the console asks for): ``ref_run_ms``, ``ref_tree_ms``.

Last line: ``replay run_ms=X tree_ms=Y parquet_run_ms=Z parquet_tree_ms=W ref_run_ms=A ref_tree_ms=B``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import orjson
import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from otel_agenttape.codec import typed as anyvalue  # noqa: E402
from otel_agenttape import semconv as sc  # noqa: E402
from otel_agenttape.store import rows  # noqa: E402

T0 = 1_790_000_000_000_000_000  # ns
DAY_NS = 86_400 * 1_000_000_000
NODE_NS = 100_000_000  # one node every 100 ms inside a run
RUN_EVERY_NS = 864_000_000  # background runs start every 0.864 s: 1M spans over about a day
TEXT = "The agent reads the ticket, checks the order history and drafts a reply quoting the policy. " * 4


def _attrs(d: dict) -> str:
    return anyvalue.dumps(anyvalue.attrs_from_python(d))


class Builder:
    """Accumulates span/event/link rows as column lists in the store's column order."""

    def __init__(self) -> None:
        self.spans: dict[str, list] = {c: [] for c in rows.SCHEMAS["spans"].names}
        self.events: dict[str, list] = {c: [] for c in rows.SCHEMAS["span_events"].names}
        self.links: dict[str, list] = {c: [] for c in rows.SCHEMAS["span_links"].names}
        self._ids = iter(())
        self.model_attrs = {}
        self.templates()

    def templates(self) -> None:
        messages = orjson.dumps([
            {"role": "system", "parts": [{"type": "text", "content": TEXT[:200]}]},
            {"role": "user", "parts": [{"type": "text", "content": TEXT[:300]}]},
        ]).decode()
        output = orjson.dumps([{"role": "assistant", "parts": [{"type": "text", "content": TEXT[:160]}],
                                "finish_reason": "stop"}]).decode()
        self.model_base = {
            sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_PROVIDER_NAME: "openai", sc.GEN_AI_REQUEST_MODEL: "gpt-b",
            sc.GEN_AI_RESPONSE_MODEL: "gpt-b", sc.GEN_AI_INPUT_MESSAGES: messages, sc.GEN_AI_OUTPUT_MESSAGES: output,
            sc.GEN_AI_USAGE_INPUT_TOKENS: 120, sc.GEN_AI_USAGE_OUTPUT_TOKENS: 40, sc.NODE_TYPE: "model",
            sc.MODEL_OUTPUT_TEXT: TEXT[:160],
        }
        self.tool_base = {
            sc.GEN_AI_OPERATION_NAME: "execute_tool", sc.GEN_AI_TOOL_NAME: "lookup", sc.NODE_TYPE: "tool",
            sc.GEN_AI_TOOL_CALL_ARGUMENTS: '{"order": 1234}', sc.GEN_AI_TOOL_CALL_RESULT: '{"status": "shipped"}',
        }
        self.event_attrs = [_attrs({sc.EVENT_SEQ: i + 1, sc.EVENT_SEGMENT: TEXT[i * 40:(i + 1) * 40]})
                            for i in range(4)]

    def new_id(self, n_bytes: int) -> str:
        return os.urandom(n_bytes).hex()

    def span(self, trace_id: str, span_id: str, parent: str | None, name: str, kind: int, start: int, end: int,
             attrs: dict, *, run_id: str | None, node_type: str | None, op: str, agent: str,
             parent_run_id: str | None = None, status: str | None = None, step: int | None = None,
             tool: str | None = None, model: str | None = None) -> None:
        s = self.spans
        values = {
            "trace_id": trace_id, "span_id": span_id, "parent_span_id": parent, "trace_state": None, "flags": 1,
            "name": name, "kind": kind, "start_time_unix_nano": start, "end_time_unix_nano": end,
            "duration_ms": (end - start) / 1e6, "status_code": 0, "status_message": None,
            "attributes": _attrs(attrs), "dropped_attributes_count": 0, "dropped_events_count": 0,
            "dropped_links_count": 0, "resource_id": "r" * 64, "scope_name": "otel_agenttape",
            "scope_version": "0.1.0", "service_name": "bench", "operation_name": op, "agent_name": agent,
            "run_id": run_id, "session_id": None, "parent_run_id": parent_run_id, "run_status": status,
            "turn_id": "1", "step": step, "node_type": node_type, "provider_name": "openai" if model else None,
            "request_model": model, "response_model": model, "tool_name": tool, "tool_call_id": None,
            "input_tokens": 120 if model else None, "output_tokens": 40 if model else None, "chain_id": None,
            "chain_seq": None, "chain_prev": None, "chain_hash": None, "chain_epoch": None,
            "date": (start // DAY_NS),
        }
        for k, v in values.items():
            s[k].append(v)

    def event(self, trace_id: str, span_id: str, index: int, time_ns: int, name: str, attrs_json: str) -> None:
        e = self.events
        for k, v in (("trace_id", trace_id), ("span_id", span_id), ("event_index", index), ("time_unix_nano", time_ns),
                     ("name", name), ("attributes", attrs_json), ("dropped_attributes_count", 0),
                     ("date", time_ns // DAY_NS)):
            e[k].append(v)

    def run(self, run_id: str, trace_id: str, start: int, n_nodes: int, *, agent: str = "bench",
            parent_run_id: str | None = None, parent_span: str | None = None) -> int:
        """One run: an invoke_agent span and ``n_nodes`` alternating model/tool spans. Returns its end."""
        run_span = self.new_id(8)
        t = start + 2_000_000
        for i in range(n_nodes):
            sid = self.new_id(8)
            if i % 2 == 0:
                attrs = {**self.model_base, sc.RUN_ID: run_id, sc.STEP: i // 2 + 1}
                self.span(trace_id, sid, run_span, "chat gpt-b", 3, t, t + 80_000_000, attrs, run_id=run_id,
                          node_type="model", op="chat", agent=agent, step=i // 2 + 1, model="gpt-b")
                for j, ev in enumerate(self.event_attrs):
                    self.event(trace_id, sid, j, t + 15_000_000 * (j + 1), sc.EVENT_TEXT, ev)
            else:
                attrs = {**self.tool_base, sc.RUN_ID: run_id, sc.STEP: i // 2 + 1}
                self.span(trace_id, sid, run_span, "execute_tool lookup", 1, t, t + 30_000_000, attrs, run_id=run_id,
                          node_type="tool", op="execute_tool", agent=agent, step=i // 2 + 1, tool="lookup")
            t += NODE_NS
        attrs = {sc.GEN_AI_OPERATION_NAME: "invoke_agent", sc.GEN_AI_AGENT_NAME: agent, sc.RUN_ID: run_id,
                 sc.NODE_TYPE: "run", sc.RUN_STATUS: "completed",
                 sc.GEN_AI_INPUT_MESSAGES: '[{"role":"user","parts":[{"type":"text","content":"help"}]}]'}
        if parent_run_id:
            attrs[sc.PARENT_RUN_ID] = parent_run_id
        self.span(trace_id, run_span, parent_span, f"invoke_agent {agent}", 1, start, t, attrs, run_id=run_id,
                  node_type="run", op="invoke_agent", agent=agent, parent_run_id=parent_run_id, status="completed")
        return t

    def tables(self) -> rows.Tables:
        def table(name: str, cols: dict[str, list]) -> pa.Table:
            sch = rows.SCHEMAS[name]
            arrays = []
            for f in sch:
                if f.type == pa.date32():
                    arrays.append(pa.array(cols[f.name], type=pa.int32()).view(pa.date32()))
                else:
                    arrays.append(pa.array(cols[f.name], type=f.type))
            return pa.Table.from_arrays(arrays, schema=sch)

        empty = rows.SCHEMAS
        return rows.Tables(
            spans=table("spans", self.spans), span_events=table("span_events", self.events),
            span_links=empty["span_links"].empty_table(),
            resources=pa.Table.from_pylist([{"resource_id": "r" * 64, "attributes": _attrs({"service.name": "bench"}),
                                             "schema_url": None, "dropped_attributes_count": 0}],
                                           schema=empty["resources"]),
            log_records=empty["log_records"].empty_table(),
        )

    def __len__(self) -> int:
        return len(self.spans["trace_id"])


def build(db: str, total_spans: int) -> dict[str, str]:
    """Write the bench store; returns the ids to reconstruct."""
    from otel_agenttape.store.writer import Store

    store = Store(db)
    t = T0
    written = 0
    background_runs = 0
    chunk = 200_000
    special_at = total_spans // 2
    ids: dict[str, str] = {}
    b = Builder()
    while written + len(b) < total_spans:
        if not ids and written + len(b) >= special_at:
            ids["run"] = b.new_id(16)  # run ids are random hex, as capture makes them
            b.run(ids["run"], b.new_id(16), t, 100, agent="big")
            ids["tree"] = b.new_id(16)
            b.run(ids["tree"], b.new_id(16), t, 2, agent="coordinator")
            child_t = t + 300_000_000
            for i in range(20):
                child_t = b.run(b.new_id(16), b.new_id(16), child_t, 4, agent=f"child-{i}",
                                parent_run_id=ids["tree"]) + 10_000_000
        b.run(b.new_id(16), b.new_id(16), t, 9)
        t += RUN_EVERY_NS
        background_runs += 1
        if len(b) >= chunk:
            written += len(b)
            store.write_tables(b.tables())
            b = Builder()
            print(f"  {written} spans written", file=sys.stderr, flush=True)
    if len(b):
        written += len(b)
        store.write_tables(b.tables())
    n, indexed = store.reader().query(
        "SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM run_index)").to_pylist()[0].values()
    store.close()
    print(f"store: {n} spans ({background_runs} background runs, {indexed} run_index rows) in {db}", flush=True)
    return ids


def median_ms(fn, repeat: int) -> float:
    fn()  # warm caches once
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def split(reader, fn, repeat: int) -> tuple[float, float, int]:
    """Where one rebuild's time goes: (median ms inside the store's queries, median ms of the rest,
    queries a rebuild runs), measured on rebuilds of their own after the timed ones."""
    spent: list[float] = []

    def timed(method):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - start)
        return run

    reader.query, reader.rows = timed(reader.query), timed(reader.rows)
    try:
        sql, rest, count = [], [], 0
        for _ in range(repeat):
            spent.clear()
            start = time.perf_counter()
            fn()
            total = time.perf_counter() - start
            sql.append(sum(spent) * 1000)
            rest.append((total - sum(spent)) * 1000)
            count = len(spent)
    finally:
        del reader.query, reader.rows
    return statistics.median(sql), statistics.median(rest), count


def measure(reader, ids: dict[str, str], repeat: int, label: str = "") -> tuple[float, float]:
    from otel_agenttape.tape import reconstruct, reconstruct_tree

    run = reconstruct(reader, ids["run"])
    assert len(run.nodes) == 100, len(run.nodes)
    tree = reconstruct_tree(reader, ids["tree"])
    assert tree.run_count == 21, tree.run_count
    out = (median_ms(lambda: reconstruct(reader, ids["run"]), repeat),
           median_ms(lambda: reconstruct_tree(reader, ids["tree"]), repeat))
    for name, fn in (("run", lambda: reconstruct(reader, ids["run"])),
                     ("tree", lambda: reconstruct_tree(reader, ids["tree"]))):
        sql_ms, rest_ms, count = split(reader, fn, repeat)
        print(f"  {label}{name}: {sql_ms:.1f} ms in {count} store queries, {rest_ms:.1f} ms building "
              f"(Python)", flush=True)
    return out


def measure_refs(reader, ids: dict[str, str], repeat: int) -> tuple[float, float]:
    """The same run and tree named by ``RUN_ID@TRACE_ID`` refs (median ms)."""
    from otel_agenttape.tape import reconstruct, reconstruct_tree
    from otel_agenttape.tape.refs import resolve

    run_ref, tree_ref = resolve(reader, ids["run"]).ref, resolve(reader, ids["tree"]).ref
    assert len(reconstruct(reader, run_ref).nodes) == 100
    assert reconstruct_tree(reader, tree_ref).run_count == 21
    return (median_ms(lambda: reconstruct(reader, run_ref), repeat),
            median_ms(lambda: reconstruct_tree(reader, tree_ref), repeat))


def stored_ids(db: str) -> dict[str, str]:
    """The ids ``build`` wrote into an existing bench store (``--reuse``)."""
    from otel_agenttape.store.reader import open_reader

    with open_reader(db) as reader:
        found = reader.query("SELECT agent_name, any_value(run_id) AS run_id FROM spans WHERE agent_name IN "
                             "('big', 'coordinator') AND run_id IS NOT NULL GROUP BY agent_name").to_pylist()
    by_agent = {r["agent_name"]: r["run_id"] for r in found}
    return {"run": by_agent["big"], "tree": by_agent["coordinator"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--dir", default=None, help="where to build the store (default: a temp folder)")
    ap.add_argument("--reuse", action="store_true", help="measure the store and lake already in --dir")
    args = ap.parse_args()
    from otel_agenttape.store.parquet import export_parquet
    from otel_agenttape.store.reader import open_reader

    folder = args.dir or tempfile.mkdtemp(prefix="agenttape-replay-bench-")
    os.makedirs(folder, exist_ok=True)
    db = os.path.join(folder, "bench.duckdb")
    lake = os.path.join(folder, "lake")
    if args.reuse and os.path.exists(db) and os.path.isdir(lake):
        ids = stored_ids(db)
        print(f"reusing the store and lake in {folder}", flush=True)
    else:
        for path in (db, db + ".wal"):
            if os.path.exists(path):
                os.remove(path)
        start = time.perf_counter()
        ids = build(db, args.spans)
        print(f"built in {time.perf_counter() - start:.1f}s", flush=True)
        with open_reader(db) as reader:
            start = time.perf_counter()
            export_parquet(reader, lake, overwrite=True)
            print(f"parquet lake exported in {time.perf_counter() - start:.1f}s", flush=True)
    print(f"load {os.getloadavg()[0]:.1f}", flush=True)
    with open_reader(db) as reader:
        run_ms, tree_ms = measure(reader, ids, args.repeat, "duckdb ")
        ref_run_ms, ref_tree_ms = measure_refs(reader, ids, args.repeat)
    print(f"duckdb: run {run_ms:.1f} ms (target 10), tree {tree_ms:.1f} ms (target 25)", flush=True)
    print(f"duckdb, by RUN_ID@TRACE_ID refs (what `agenttape runs` lists and the console asks for): "
          f"run {ref_run_ms:.1f} ms, tree {ref_tree_ms:.1f} ms", flush=True)
    with open_reader(lake) as reader:
        p_run_ms, p_tree_ms = measure(reader, ids, args.repeat, "parquet ")
    print(f"parquet: run {p_run_ms:.1f} ms (target 50), tree {p_tree_ms:.1f} ms (target 200)", flush=True)
    print(f"replay run_ms={run_ms:.1f} tree_ms={tree_ms:.1f} parquet_run_ms={p_run_ms:.1f} "
          f"parquet_tree_ms={p_tree_ms:.1f} ref_run_ms={ref_run_ms:.1f} ref_tree_ms={ref_tree_ms:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
