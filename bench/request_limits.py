"""Per-request memory and refusal time of the receiver: large requests of tiny spans, and requests over
``--max-spans-per-request``.

Starts ``agenttape serve`` on free loopback ports with one converter process, then:

1. posts a request of ``--spans`` tiny spans (default 100,000, the default per-request limit) and reads
   the converter's RSS before, its peak (``VmHWM``) and its RSS after, from ``/proc``;
2. posts 650,000 tiny spans in one 20 MiB request and 6,000,000 empty spans in one 12 MB request
   (both over the limit) and times how long each takes to be refused (413).

The baseline is the idle converter measured in the same run: the ratio ``after / before`` says how
much of a large request's memory stays. Last line:
``request_limits converter_before_mb=A converter_peak_mb=P converter_after_mb=B after_ratio=R
refuse_650k_s=X refuse_6m_empty_s=Y``.

    python bench/request_limits.py [--spans 100000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _status(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _converters(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmd:
                out.append(int(child))
    return out


def _tiny_spans(n: int, times: bool = True) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    tid = secrets.token_bytes(16)
    for _ in range(n):
        sp = ss.spans.add()
        sp.trace_id = tid
        sp.span_id = secrets.token_bytes(8)
        if times:
            sp.start_time_unix_nano = sp.end_time_unix_nano = 1_700_000_000_000_000_000
    return req.SerializeToString()


def _empty_spans(n: int) -> bytes:
    def length(x: int) -> bytes:
        out = b""
        while True:
            b, x = x & 0x7F, x >> 7
            out += bytes([b | (0x80 if x else 0)])
            if not x:
                return out

    scope = b"\x12\x00" * n
    resource = b"\x12" + length(len(scope)) + scope
    return b"\x0a" + length(len(resource)) + resource


def _post(port: int, body: bytes) -> tuple[int, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--spans", type=int, default=100_000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="agenttape-limits-"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", str(tmp / "b.duckdb"), "--http-port", "0",
         "--grpc-port", "0", "--json", "--ingest-workers", "1"], stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(proc.stdout.readline())["http_port"]
        deadline = time.time() + 60
        while not _converters(proc.pid) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        (worker,) = _converters(proc.pid)
        before = _status(worker, "VmRSS")
        body = _tiny_spans(args.spans)
        status, took = _post(port, body)
        if status != 200:
            raise SystemExit(f"{args.spans} tiny spans: HTTP {status}")
        time.sleep(1.0)
        peak, after = _status(worker, "VmHWM"), _status(worker, "VmRSS")
        print(f"{args.spans} tiny spans ({len(body) / 1e6:.1f} MB) accepted in {took:.2f}s; converter RSS "
              f"{before:.0f} MB before, {peak:.0f} MB peak, {after:.0f} MB after", file=sys.stderr)
        big = _tiny_spans(650_000, times=False)  # ids only: 20 MiB
        s700, t700 = _post(port, big)
        empty = _empty_spans(6_000_000)
        s6m, t6m = _post(port, empty)
        print(f"650,000 tiny spans ({len(big) / 1e6:.1f} MB): HTTP {s700} in {t700:.2f}s; 6,000,000 empty spans "
              f"({len(empty) / 1e6:.1f} MB): HTTP {s6m} in {t6m:.2f}s", file=sys.stderr)
        print(f"request_limits converter_before_mb={before:.0f} converter_peak_mb={peak:.0f} "
              f"converter_after_mb={after:.0f} after_ratio={after / before:.2f} refuse_650k_s={t700:.2f} "
              f"refuse_6m_empty_s={t6m:.2f}")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
