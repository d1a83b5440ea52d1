"""Receiver ingest benchmark: durable, queryable spans per second through OTLP/HTTP protobuf.

Starts ``agenttape serve`` as its own process on free loopback ports, then client processes post
prebuilt requests of ~2.7 KB GenAI model spans (every span with its own ids; all requests are built
before the clock starts, so the clients measure the receiver, not themselves). The clock runs from
the first request to the moment the last span is queryable in the store (``count(*)`` over
``/api/query``). Prints sustained spans/s, p99 acknowledgement latency and the server's peak RSS.

With ``--phoenix`` the same clients and the same request bodies drive Arize Phoenix's OTLP/HTTP
endpoint (``/v1/traces``), started from its own venv (created with pip on first use) on free
loopback ports with a fresh SQLite working directory; the clock stops when ``count(*)`` over its
``spans`` table, read-only, reaches the total. Phoenix stores a few hundred spans/s, so it gets its
own, smaller span count (``--phoenix-spans``, ``--phoenix-per-request``).

``--varied`` gives every span its own message, event and response-id text; by default the spans are
copies of one span with fresh ids, so the receiver's attribute caches see repeats.

    python bench/ingest.py [--spans 200000] [--per-request 500] [--clients 2] [--conns 4] [--varied]
                           [--phoenix [--phoenix-spans 5000] [--phoenix-per-request 100] [--phoenix-venv PATH]]

Last line: ``ingest spans_per_s=N p99_ack_ms=X peak_rss_mb=Y`` (plus ``phoenix_spans_per_s=M``
with ``--phoenix``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import queue
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


_VARIED_KEYS = ("gen_ai.input.messages", "gen_ai.output.messages")


def _vary(span, token: str) -> None:
    """Make a span's content its own: a unique response id, and ``token`` at the start of the first
    message text and of every string attribute of its events (the JSON stays valid)."""
    for kv in span.attributes:
        if kv.key == "gen_ai.response.id":
            kv.value.string_value = f"chatcmpl-{token}"
        elif kv.key in _VARIED_KEYS:
            kv.value.string_value = kv.value.string_value.replace('"content":"', f'"content":"{token} ', 1)
    for ev in span.events:
        for kv in ev.attributes:
            if kv.value.HasField("string_value"):
                kv.value.string_value = f"{token} {kv.value.string_value}"


def build_requests(n_requests: int, per_request: int, seed: int, varied: bool = False) -> list[bytes]:
    """Serialized ExportTraceServiceRequests of model spans, each span with fresh ids (and, with
    ``varied``, its own message, event and response-id text, so no receiver cache sees repeats)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

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
            if varied:
                _vary(s, secrets.token_hex(6))
        out.append(req.SerializeToString())
    return out


def _client(idx: int, port: int, path: str, n_requests: int, per_request: int, conns: int,
            built: mp.Queue, go: Any, results: mp.Queue, varied: bool = False) -> None:
    bodies = build_requests(n_requests, per_request, seed=idx + 1, varied=varied)
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]

    def worker(mine: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for body in mine:
            while True:
                t0 = time.perf_counter()
                conn.request("POST", path, body=body, headers={"Content-Type": "application/x-protobuf"})
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
    built.put(idx)
    go.wait()
    cpu0 = time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put({"latencies": latencies, "retries": errors[0], "cpu": time.process_time() - cpu0})


class Load:
    """Client processes that build their requests, then post them all once ``go`` is called."""

    def __init__(self, port: int, path: str, spans: int, per_request: int, clients: int, conns: int,
                 varied: bool = False) -> None:
        n_requests = -(-spans // per_request)
        per_client = [n_requests // clients + (1 if i < n_requests % clients else 0) for i in range(clients)]
        self.requests = sum(per_client)
        self.total = self.requests * per_request
        self._built: mp.Queue = mp.Queue()
        self._go = mp.Event()
        self._results: mp.Queue = mp.Queue()
        self._procs = [mp.Process(target=_client, args=(i, port, path, per_client[i], per_request, conns,
                                                         self._built, self._go, self._results, varied))
                       for i in range(clients)]
        for p in self._procs:
            p.start()

    def go(self) -> float:
        """Wait until every client has built its requests, release them; the start time. A client
        that dies first (say, it cannot import the package) ends the run with its exit code."""
        ready = 0
        while ready < len(self._procs):
            try:
                self._built.get(timeout=1)
                ready += 1
            except queue.Empty:
                dead = [p.exitcode for p in self._procs if not p.is_alive()]
                if dead:
                    raise SystemExit(f"a client process failed while building its requests (exit codes {dead})")
        self._go.set()
        return time.time()

    def join(self) -> tuple[list[float], int]:
        """Sorted acknowledgement latencies (seconds) and the count of throttled attempts; the clients'
        CPU seconds while posting go to ``self.client_cpu``."""
        outs = []
        while len(outs) < len(self._procs):
            try:
                outs.append(self._results.get(timeout=1))
            except queue.Empty:
                if not any(p.is_alive() for p in self._procs) and self._results.empty():
                    codes = [p.exitcode for p in self._procs]
                    raise SystemExit(f"a client process failed (exit codes {codes})") from None
        for p in self._procs:
            p.join()
        self.client_cpu = sum(o["cpu"] for o in outs)
        return sorted(x for o in outs for x in o["latencies"]), sum(o["retries"] for o in outs)


def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


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
    from otel_agenttape import native

    # the server inherits this environment (AGENTTAPE_NO_NATIVE included), so it runs the same path
    state = native.status()["otel_agenttape.store._spanwalk"]
    print(f"span conversion: {state}", file=sys.stderr)
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
        load = Load(port, "/v1/traces", args.spans, args.per_request, args.clients, args.conns, args.varied)
        total = load.total
        print(f"building {load.requests} requests of {args.per_request} spans in {args.clients} processes ...",
              file=sys.stderr)
        cpu0 = _tree_cpu_seconds(proc.pid)
        t0 = load.go()
        lat, retries = load.join()
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
        p99 = _pct(lat, 0.99) * 1000
        rss = _peak_rss_mb(proc.pid)
        rate = total / (t_end - t0)
        m = _metrics(port)
        writes = m.get("agenttape_store_write_seconds_count", 0)
        if writes:  # the store commits once per batch: fewer, larger batches cost DuckDB less per span
            print(f"store: {writes:.0f} batched writes, {total / writes:.0f} spans and "
                  f"{m.get('agenttape_store_write_seconds_sum', 0) / writes * 1000:.0f} ms each", file=sys.stderr)
        print(f"agenttape: {total} spans, all acked after {t_acked - t0:.2f}s, queryable after {t_end - t0:.2f}s, "
              f"{retries} throttled attempts, p50 ack {lat[len(lat) // 2] * 1000:.1f} ms, "
              f"receiver CPU {cpu:.1f}s = {cpu / total * 1e6:.0f} us/span ({cpu_main / total * 1e6:.0f} main + "
              f"{cpu_workers / total * 1e6:.0f} converter processes), client CPU {load.client_cpu:.1f}s = "
              f"{load.client_cpu / total * 1e6:.0f} us/span, load average {os.getloadavg()[0]:.1f}",
              file=sys.stderr)
        return rate, p99, rss
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


DEFAULT_PHOENIX_VENV = Path.home() / ".cache" / "otel-agenttape" / "phoenix-venv"


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_phoenix_venv(venv: Path) -> Path:
    """Python of a venv holding ``arize-phoenix``, created on first use so it never touches ours."""
    py = _venv_python(venv)
    probe = [str(py), "-c", "import phoenix, importlib.metadata as m; print(m.version('arize-phoenix'))"]
    if py.exists():
        got = subprocess.run(probe, check=False, capture_output=True, text=True)
        if got.returncode == 0:
            print(f"phoenix: arize-phoenix {got.stdout.strip()} in {venv}", file=sys.stderr)
            return py
    steps = [] if py.exists() else [[sys.executable, "-m", "venv", str(venv)]]
    steps += [[str(py), "-m", "pip", "install", "--quiet", "arize-phoenix"]]
    for cmd in steps:
        print(f"phoenix: {' '.join(cmd)}", file=sys.stderr)
        if subprocess.run(cmd, check=False, stdout=sys.stderr).returncode != 0:
            raise SystemExit(f"phoenix: setting up {venv} failed: {' '.join(cmd)} (not measured)")
    got = subprocess.run(probe, check=False, capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(f"phoenix: arize-phoenix does not import in {venv}: {got.stderr.strip()[-500:]}")
    print(f"phoenix: installed arize-phoenix {got.stdout.strip()} in {venv}", file=sys.stderr)
    return py


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [c for c, p in parents.items() if p in frontier]
        tree += frontier
    return tree


class TreeRss:
    """Peak RSS of a process tree: every process's own peak (VmHWM), sampled while it lives, summed."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self._pid, self._every = pid, every
        self._peaks: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        for pid in _descendants(self._pid):
            try:
                self._peaks[pid] = max(self._peaks.get(pid, 0.0), _peak_rss_mb(pid))
            except OSError:
                continue

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.sample()

    def stop(self) -> tuple[float, int]:
        """Summed peak in MB and the number of processes seen."""
        self._stop.set()
        self._thread.join()
        self.sample()
        return sum(self._peaks.values()), len(self._peaks)


def _phoenix_env(tmp: Path, port: int, grpc_port: int) -> dict[str, str]:
    """Only our PHOENIX_* settings: a stray database URL or Postgres setting must not redirect the run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHOENIX_")}
    env.update(PHOENIX_HOST="127.0.0.1", PHOENIX_PORT=str(port), PHOENIX_GRPC_PORT=str(grpc_port),
               PHOENIX_WORKING_DIR=str(tmp / "phoenix"), PHOENIX_TELEMETRY_ENABLED="false")
    return env


def _wait_http_ok(port: int, path: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"phoenix: server exited with code {proc.returncode} before it was ready:\n{tail}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"phoenix: no HTTP 200 on {path} after {timeout:.0f}s (log: {log})")


def _sqlite_span_count(db: Path) -> int:
    """``count(*)`` over Phoenix's spans table through a read-only connection (Phoenix keeps writing)."""
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return int(conn.execute("SELECT count(*) FROM spans").fetchone()[0])
    except sqlite3.OperationalError:  # tables not migrated yet
        return 0
    finally:
        conn.close()


def run_phoenix(args: argparse.Namespace, py: Path) -> float:
    """Phoenix's sustained ingest, first request to last span queryable in its SQLite store."""
    tmp = Path(tempfile.mkdtemp(prefix="agenttape-bench-phoenix-"))
    port, grpc_port = _free_port(), _free_port()
    log = tmp / "phoenix.log"
    db = tmp / "phoenix" / "phoenix.db"
    print(f"phoenix: starting the server on 127.0.0.1:{port} (SQLite in {db.parent}) ...", file=sys.stderr)
    with log.open("wb") as out:
        proc = subprocess.Popen([str(py), "-m", "phoenix.server.main", "serve"], env=_phoenix_env(tmp, port, grpc_port),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        t_start = time.time()
        _wait_http_ok(port, "/healthz", proc, log, timeout=180)
        _wait_http_ok(port, "/readyz", proc, log, timeout=60)
        print(f"phoenix: ready after {time.time() - t_start:.1f}s", file=sys.stderr)
        before = _sqlite_span_count(db)
        load = Load(port, "/v1/traces", args.phoenix_spans, args.phoenix_per_request, args.clients, args.conns,
                    args.varied)
        total = load.total
        print(f"phoenix: building {load.requests} requests of {args.phoenix_per_request} spans "
              f"({total} spans; agenttape got {args.spans} in requests of {args.per_request}) "
              f"in {args.clients} processes ...", file=sys.stderr)
        rss = TreeRss(proc.pid)
        cpu0 = sum(_tree_cpu_seconds(proc.pid))
        t0 = load.go()
        lat, retries = load.join()
        t_acked = time.time()
        n, last_n, last_change = before, before, time.time()
        while n < before + total:
            time.sleep(0.05)
            n = _sqlite_span_count(db)
            now = time.time()
            if n != last_n:
                last_n, last_change = n, now
            elif now - last_change > args.phoenix_stall_s:
                raise SystemExit(f"phoenix: only {n - before} of {total} spans queryable after {now - t0:.1f}s "
                                 f"(no new span for {args.phoenix_stall_s:g}s); not measured")
            if proc.poll() is not None:
                raise SystemExit(f"phoenix: server exited with code {proc.returncode} with {n - before} of "
                                 f"{total} spans stored (log: {log})")
        t_end = time.time()
        cpu = sum(_tree_cpu_seconds(proc.pid)) - cpu0
        peak, nproc = rss.stop()
        if n - before != total:
            raise SystemExit(f"phoenix: expected {total} spans in its store, found {n - before}")
        rate = total / (t_end - t0)
        print(f"phoenix: {total} spans in requests of {args.phoenix_per_request}, all acked after "
              f"{t_acked - t0:.2f}s, queryable after {t_end - t0:.2f}s, {retries} throttled attempts, "
              f"p50 ack {_pct(lat, 0.5) * 1000:.1f} ms, p99 ack {_pct(lat, 0.99) * 1000:.1f} ms, "
              f"server CPU {cpu:.1f}s = {cpu / total * 1e6:.0f} us/span, peak RSS {peak:.0f} MB "
              f"({nproc} process{'es' if nproc != 1 else ''}), {rate:.0f} spans/s, "
              f"load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
        return rate
    finally:
        _stop_group(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's own process group (it was started in a new session), SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    try:  # children left in the group after the leader exited
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--per-request", type=int, default=500)
    ap.add_argument("--clients", type=int, default=2, help="client processes")
    ap.add_argument("--conns", type=int, default=4, help="keep-alive connections per client process")
    ap.add_argument("--varied", action="store_true",
                    help="every span with its own message, event and response-id text (the default sends "
                         "copies of one span with fresh ids, which the receiver's caches see as repeats)")
    ap.add_argument("--workers", type=int, default=None, help="receiver --ingest-workers (default: auto)")
    ap.add_argument("--phoenix", action="store_true", help="also measure Arize Phoenix (own venv)")
    ap.add_argument("--phoenix-venv", default=str(DEFAULT_PHOENIX_VENV),
                    help="venv with arize-phoenix, created with pip on first use")
    ap.add_argument("--phoenix-spans", type=int, default=5_000,
                    help="spans sent to Phoenix (it stores a few hundred per second)")
    ap.add_argument("--phoenix-per-request", type=int, default=100)
    ap.add_argument("--phoenix-stall-s", type=float, default=120.0,
                    help="give up when no new span reaches Phoenix's store for this long")
    args = ap.parse_args()
    py = ensure_phoenix_venv(Path(args.phoenix_venv).expanduser()) if args.phoenix else None
    rate, p99, rss = run_agenttape(args)
    line = f"ingest spans_per_s={rate:.0f} p99_ack_ms={p99:.1f} peak_rss_mb={rss:.0f}"
    if py is not None:
        ph = run_phoenix(args, py)
        print(f"agenttape/phoenix: {rate / ph:.0f}x the spans/s (agenttape {args.spans} spans in requests of "
              f"{args.per_request}, phoenix {args.phoenix_spans} in requests of {args.phoenix_per_request}; "
              f"phoenix acknowledges before it stores)", file=sys.stderr)
        line += f" phoenix_spans_per_s={ph:.0f}"
    print(line)


if __name__ == "__main__":
    main()
