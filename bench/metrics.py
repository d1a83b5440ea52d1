"""Metrics benchmark: what deriving the GenAI/agent metrics costs at ingest, and how fast /metrics answers.

Builds 1,000,000 spans of agent runs (an ``invoke_agent`` span, model spans with streamed text
events and token usage, tool spans of which some fail; sealed with chain links; 20 agents, 8 models,
12 tools, 3 services) in batches of the receiver's size, and stores every batch twice in the same
process: into one DuckDB store with the receiver's ingest step (OTLP bytes to Arrow rows, store write)
alone, and into another with the same step plus ``SpanMetrics.observe`` (what ``agenttape serve``
does unless ``--no-span-metrics``). The two arms alternate batch by batch, so machine load hits both
alike. ``ingest_ratio`` is the CPU time of the arm with metrics over the arm without (target <= 1.05).

Then a real receiver (``TapeServer`` over the store with metrics) answers ``GET /metrics`` over HTTP
``--scrapes`` times; ``scrape_p99_ms`` is the 99th percentile of those requests (target <= 20 ms).
``busy_scrape_p99_ms`` is the same for scrapes that each follow a new batch (series re-rendered).

    python bench/metrics.py [--spans 1000000] [--batch 14000] [--scrapes 500] [--keep DIR]

Last line: ``metrics ingest_ratio=R scrape_p99_ms=X`` (plus the derivation's share on its own and
the series count).
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

AGENTS = [f"agent-{i:02d}" for i in range(20)]
MODELS = [f"model-{i}" for i in range(8)]
TOOLS = [f"tool_{i:02d}" for i in range(12)]
SERVICES = ["support", "billing", "research"]
MODELS_PER_RUN, TOOLS_PER_RUN = 6, 3  # + the run span: 10 spans per run


def _template() -> Any:
    """One run of SDK-made spans (samples.genai_requests): the shape every generated run copies."""
    from otel_agenttape.store.samples import genai_requests

    return genai_requests(n_runs=1, models_per_run=MODELS_PER_RUN, tools_per_run=TOOLS_PER_RUN, seed=3)[0]


def _set(span: Any, key: str, value: Any) -> None:
    for kv in span.attributes:
        if kv.key == key:
            break
    else:
        kv = span.attributes.add()
        kv.key = key
    if isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.string_value = value


def build_batch(template: Any, n_runs: int, counter: list[int]) -> list[bytes]:
    """Requests (one per run) of ``n_runs`` fresh runs: new ids, labels spread over the agents,
    models, tools and services, and a chain per run linked the way the sealing processor links it."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otel_agenttape import semconv as sc
    from otel_agenttape.integrity.chain import genesis

    out = []
    for _ in range(n_runs):
        k = counter[0]
        counter[0] += 1
        req = ExportTraceServiceRequest()
        req.CopyFrom(template)
        rs = req.resource_spans[0]
        for kv in rs.resource.attributes:
            if kv.key == "service.name":
                kv.value.string_value = SERVICES[(k % len(AGENTS)) % len(SERVICES)]
        run_id = f"run-{k}-{secrets.token_hex(4)}"
        trace_id = secrets.token_bytes(16)
        # each agent belongs to one service, uses its own model (and a second one for a third of its
        # runs) and a few tools of its own: the label sets a real fleet has, not every combination
        a = k % len(AGENTS)
        agent = AGENTS[a]
        model = MODELS[(a + (1 if k % 3 == 0 else 0)) % len(MODELS)]
        prev = genesis(run_id)
        spans = rs.scope_spans[0].spans
        ids = {s.span_id: secrets.token_bytes(8) for s in spans}
        for seq, s in enumerate(spans):
            s.trace_id = trace_id
            s.span_id = ids[s.span_id]
            if s.parent_span_id:
                s.parent_span_id = ids.get(s.parent_span_id, s.parent_span_id)
            _set(s, sc.RUN_ID, run_id)
            _set(s, sc.GEN_AI_AGENT_NAME, agent)
            for kv in s.attributes:
                if kv.key == sc.GEN_AI_REQUEST_MODEL:
                    kv.value.string_value = model
                elif kv.key == sc.GEN_AI_TOOL_NAME:
                    kv.value.string_value = TOOLS[(a + seq) % len(TOOLS)]
            link = hashlib.sha256(f"{prev}|{run_id}|{seq}".encode()).hexdigest()
            _set(s, sc.CHAIN_ID, run_id)
            _set(s, sc.CHAIN_SEQ, seq)
            _set(s, sc.CHAIN_PREV, prev)
            _set(s, sc.CHAIN_HASH, link)
            prev = link
        out.append(req.SerializeToString())
    return out


def _cpu() -> float:
    return time.process_time()


def run(args: argparse.Namespace) -> dict[str, float]:
    from otel_agenttape.receiver.server import TapeServer
    from otel_agenttape.store import rows
    from otel_agenttape.store.writer import Store

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="agenttape-bench-metrics-"))
    tmp.mkdir(parents=True, exist_ok=True)
    template = _template()
    spans_per_run = len(template.resource_spans[0].scope_spans[0].spans)
    runs_per_batch = max(1, args.batch // spans_per_run)
    n_batches = max(1, args.spans // (runs_per_batch * spans_per_run))
    off_store = Store(str(tmp / "off.duckdb"))
    on_store = Store(str(tmp / "on.duckdb"))
    # the receiver whose /metrics is timed afterwards; its SpanMetrics is the one the "on" arm feeds
    server = TapeServer(str(tmp / "on.duckdb"), http_port=0, grpc_port=0, store=on_store, ingest_workers=0,
                        wal_dir=tmp / "wal")
    derive = server.span_metrics
    cpu = {"on": 0.0, "off": 0.0, "derive": 0.0}
    wall = {"on": 0.0, "off": 0.0}
    counter = [0]
    stored = 0
    started = time.monotonic()
    for b in range(n_batches):
        payloads = build_batch(template, runs_per_batch, counter)
        order = ("off", "on") if b % 2 == 0 else ("on", "off")
        for arm in order:
            w0, c0 = time.perf_counter(), _cpu()
            tables = rows.traces_to_tables(payloads)
            res = (on_store if arm == "on" else off_store).write_tables(tables)
            if arm == "on":
                d0 = _cpu()
                derive.observe(res.tables)
                cpu["derive"] += _cpu() - d0
            cpu[arm] += _cpu() - c0
            wall[arm] += time.perf_counter() - w0
            if arm == "on":
                stored += res.spans_stored
        if args.progress and (b + 1) % 10 == 0:
            print(f"  {stored:,} spans stored in each store ({time.monotonic() - started:.0f} s)", flush=True)
    off_store.close()
    import httpx

    server.start()
    try:
        url = f"{server.url}/metrics"
        times = []
        with httpx.Client() as client:
            text = client.get(url).text
            for _ in range(args.scrapes):
                t0 = time.perf_counter()
                r = client.get(url)
                times.append(time.perf_counter() - t0)
                assert r.status_code == 200
            # scrapes while spans keep arriving: a batch of 500 spans stored (and derived) before each
            busy = []
            for _ in range(args.busy_scrapes):
                res = on_store.write_tables(rows.traces_to_tables(build_batch(template, 50, counter)))
                derive.observe(res.tables)
                t0 = time.perf_counter()
                assert client.get(url).status_code == 200
                busy.append(time.perf_counter() - t0)
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    times.sort()
    busy.sort()
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return {
        "spans": stored,
        "ingest_ratio": cpu["on"] / cpu["off"],
        "wall_ratio": wall["on"] / wall["off"],
        "derive_share": cpu["derive"] / cpu["off"],
        "off_us_per_span": cpu["off"] / stored * 1e6,
        "derive_us_per_span": cpu["derive"] / stored * 1e6,
        "scrape_p50_ms": statistics.median(times) * 1000,
        "scrape_p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1000,
        "samples": series,
        "busy_p99_ms": busy[min(len(busy) - 1, int(len(busy) * 0.99))] * 1000 if busy else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000, help="spans stored in each store")
    ap.add_argument("--batch", type=int, default=14_000, help="spans per store write (the receiver's batch size)")
    ap.add_argument("--scrapes", type=int, default=500)
    ap.add_argument("--busy-scrapes", type=int, default=50, help="scrapes each after a new batch of 500 spans")
    ap.add_argument("--keep", help="keep the two stores in this folder")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args()
    r = run(args)
    print(f"stored {r['spans']:,} spans twice; CPU per span without metrics {r['off_us_per_span']:.2f} us, "
          f"deriving the metrics {r['derive_us_per_span']:.3f} us ({r['derive_share'] * 100:.2f} %); "
          f"wall ratio {r['wall_ratio']:.3f}")
    print(f"/metrics: {r['samples']} samples, p50 {r['scrape_p50_ms']:.2f} ms, p99 {r['scrape_p99_ms']:.2f} ms "
          f"over {args.scrapes} scrapes; p99 {r['busy_p99_ms']:.2f} ms over {args.busy_scrapes} scrapes each "
          f"after 500 new spans")
    print(f"metrics ingest_ratio={r['ingest_ratio']:.3f} scrape_p99_ms={r['scrape_p99_ms']:.2f} "
          f"derive_share={r['derive_share']:.4f} busy_scrape_p99_ms={r['busy_p99_ms']:.2f} samples={r['samples']}")


if __name__ == "__main__":
    main()
