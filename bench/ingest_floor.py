"""Where a durable span's CPU goes in the receiver, step by step, and the ceiling that sets on this machine.

``bench/ingest.py`` measures the whole receiver; this measures each step of its ingest path on its
own, in one process, one step at a time, on the same request bodies (``ingest.build_requests``;
``--varied`` content by default, what real agents send), so the sum says how fast the receiver
could be if nothing but those steps ran, and which step is the floor:

- ``decode``: the protobuf parse of a request alone (upb, the floor of any OTLP receiver in Python);
- ``convert``: what a converter process does with a body (``prepare.prepare``: decode, validate,
  Arrow rows through the compiled walk);
- ``handoff``: the rows written to and mapped back from ``/dev/shm`` (``spool.put_tables`` /
  ``take_tables``);
- ``wal``: the body appended to the write-ahead log and fdatasync'd, one request at a time (the
  receiver's group commit shares an fsync between concurrent requests; this is the uncontended cost);
- ``store``: ``Store.write_tables`` of the rows in the receiver's batches (dedupe, insert, run index,
  commit), then a checkpoint, as the receiver's writer thread does (DuckDB's own threads included);
- ``metrics``: the GenAI and agent metrics derived from each stored batch (``SpanMetrics.observe``);
- ``http``: uvicorn + Starlette (the receiver's server stack) reading the same bodies and answering
  200 with nothing else, in a process of its own, measured by that process's CPU.

CPU is ``time.process_time`` (every thread of the process), best of ``--repeat`` rounds. The
ceiling: the receiver's steps run in two kinds of process, the main one (handoff read, wal, store,
metrics, http) and converters (convert, handoff write), so on ``os.cpu_count()`` cores it cannot
ingest more than ``cores / total`` spans a second, nor more than ``1 / main`` while the main process
is one core.

    python bench/ingest_floor.py [--spans 50000] [--per-request 500] [--batch-requests 4] [--same]

Last line: ``ingest_floor decode_us=.. convert_us=.. handoff_us=.. wal_us=.. store_us=.. metrics_us=..
http_us=.. main_us=.. total_us=.. ceiling_spans_per_s=.. main_ceiling_spans_per_s=..``.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import ingest  # noqa: E402  (the request bodies)

_HTTP_APP = r'''
import sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

async def traces(request):
    await request.body()
    return Response(b"", media_type="application/x-protobuf")

app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", http="httptools",
            loop="uvloop" if "--uvloop" in sys.argv else "asyncio", access_log=False)
'''


def cpu_best(fn: Callable[[], Any], repeat: int, setup: Callable[[], Any] | None = None) -> float:
    """Best CPU seconds of ``repeat`` rounds of ``fn`` (``setup`` runs before each, unclocked)."""
    best = float("inf")
    for _ in range(repeat):
        if setup is not None:
            setup()
        gc.collect()
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_cpu(bodies: list[bytes], repeat: int) -> float:
    """Server CPU seconds (best round) for uvicorn + Starlette to read ``bodies`` and answer each."""
    import importlib.util

    args = [sys.executable, "-c", _HTTP_APP, str(port := _free_port())]
    if importlib.util.find_spec("uvloop") is not None:
        args.append("--uvloop")
    proc = subprocess.Popen(args)
    try:
        deadline = time.time() + 30
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                conn.request("POST", "/v1/traces", body=b"", headers={"Content-Type": "application/x-protobuf"})
                conn.getresponse().read()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        best = float("inf")
        for _ in range(repeat):
            before = _proc_cpu_s(proc.pid)
            for body in bodies:
                conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200, resp.status
            best = min(best, _proc_cpu_s(proc.pid) - before)
        conn.close()
        return best
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=50_000)
    ap.add_argument("--per-request", type=int, default=500)
    ap.add_argument("--batch-requests", type=int, default=4, help="requests per store write (the receiver "
                    "writes what its queue holds: a few requests under load)")
    ap.add_argument("--same", action="store_true", help="copies of one span (bench/ingest.py without --varied)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the WAL and stores go (default: a temp folder)")
    args = ap.parse_args(argv)

    import duckdb
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otel_agenttape.receiver import spool
    from otel_agenttape.receiver.genai_metrics import SpanMetrics
    from otel_agenttape.receiver.prepare import prepare
    from otel_agenttape.receiver.wal import KIND_TRACES, WriteAheadLog
    from otel_agenttape.store import rows
    from otel_agenttape.store.writer import Store

    n_requests = -(-args.spans // args.per_request)
    start = time.perf_counter()
    bodies = ingest.build_requests(n_requests, args.per_request, seed=7, varied=not args.same)
    n = n_requests * args.per_request
    load = os.getloadavg()[0]
    print(f"{n} spans in {n_requests} requests of {args.per_request} ({sum(map(len, bodies)) / n:.0f} bytes a span, "
          f"{'copies of one span' if args.same else 'varied content'}), built in {time.perf_counter() - start:.1f}s; "
          f"load {load:.1f}, {os.cpu_count()} cores", flush=True)
    us = {}

    def per_span(name: str, seconds: float) -> None:
        us[name] = seconds / n * 1e6
        print(f"  {name:12s} {us[name]:7.2f} us a span", flush=True)

    per_span("decode", cpu_best(lambda: [ExportTraceServiceRequest.FromString(b) for b in bodies], args.repeat))
    prepared: list[Any] = []
    per_span("convert", cpu_best(lambda: prepared.__setitem__(slice(None), [
        prepare(KIND_TRACES, b, "application/x-protobuf") for b in bodies]), args.repeat))
    tables = [p.tables for p in prepared]
    assert sum(t.spans.num_rows for t in tables) == n

    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    work = args.dir or tempfile.mkdtemp(prefix="agenttape-ingest-floor-")
    os.makedirs(work, exist_ok=True)
    spool_dir = tempfile.mkdtemp(prefix="agenttape-floor-spool-", dir=shm)
    try:
        def handoff() -> None:
            for t in tables:
                spool.take_tables(spool.put_tables(spool_dir, t))
        per_span("handoff", cpu_best(handoff, args.repeat))

        wal_dirs: list[str] = []

        def new_wal() -> None:
            wal_dirs.append(tempfile.mkdtemp(prefix="wal-", dir=work))

        def wal_run() -> None:
            wal = WriteAheadLog(wal_dirs[-1])
            try:
                for b in bodies:
                    wal.append(KIND_TRACES, b)
            finally:
                wal.close()
        wall = time.perf_counter()
        per_span("wal", cpu_best(wal_run, args.repeat, setup=new_wal))
        print(f"               ({(time.perf_counter() - wall) / args.repeat / n_requests * 1e3:.2f} ms wall a "
              f"request of {args.per_request}, fdatasync included)", flush=True)

        batches = [rows.concat(tables[i:i + args.batch_requests]) for i in range(0, len(tables), args.batch_requests)]
        stored: list[Any] = []
        paths: list[str] = []

        def new_path() -> None:
            paths.append(os.path.join(work, f"store-{len(paths)}.duckdb"))

        def store_run() -> None:
            store = Store(paths[-1])
            try:
                stored.clear()
                for b in batches:
                    stored.append(store.write_tables(b))
                store.checkpoint() if hasattr(store, "checkpoint") else store.con.execute("CHECKPOINT")
            finally:
                store.close()
        per_span("store", cpu_best(store_run, args.repeat, setup=new_path))
        assert sum(r.spans_stored for r in stored) == n
        size = os.path.getsize(paths[-1])

        print(f"               (store file {size / n:.0f} bytes a span)", flush=True)

        stored_tables = [r.tables for r in stored]

        def metrics_run() -> None:
            m = SpanMetrics()
            for t in stored_tables:
                m.observe(t)
        per_span("metrics", cpu_best(metrics_run, args.repeat))
        per_span("http", http_cpu(bodies, args.repeat))
    finally:
        shutil.rmtree(spool_dir, ignore_errors=True)
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)

    main_us = us["handoff"] / 2 + us["wal"] + us["store"] + us["metrics"] + us["http"]
    total = main_us + us["convert"] + us["handoff"] / 2
    cores = os.cpu_count() or 1
    ceiling = cores / total * 1e6
    main_ceiling = 1e6 / main_us
    print(f"main process {main_us:.1f} us a span (half the hand-off, wal, store, metrics, http); converters "
          f"{us['convert'] + us['handoff'] / 2:.1f}; total {total:.1f} us: at most {min(ceiling, main_ceiling):,.0f} "
          f"spans/s on {cores} cores",
          flush=True)
    print("ingest_floor " + " ".join(f"{k}_us={v:.2f}" for k, v in us.items())
          + f" main_us={main_us:.2f} total_us={total:.2f} ceiling_spans_per_s={ceiling:.0f} "
          f"main_ceiling_spans_per_s={main_ceiling:.0f} load={load:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
