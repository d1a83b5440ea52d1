"""Idle receiver memory: what ``agenttape serve`` holds on a large store after it has served reads.

Builds a store of ``--spans`` spans (default 1,000,000; ``replay.py``'s builder), starts ``agenttape
serve`` on it (its own process, free loopback ports), reads the first runs page, a run's replay and
a 1 + 20 run tree through the console's API, and reads the process's resident memory (``VmRSS``,
split into anonymous, file-backed and shared-memory pages) ``--settle`` seconds later, and again
once the receiver has been quiet for ``--release-after`` seconds (``serve --release-after``, which
gives idle memory back: ``receiver/quiet.py``; the bench shortens the default 60 s to keep the run
short). Baselines measured in the same run: the same server right after it started (before any
read), the same server after the reads but before its quiet release, and the floor of the code it
loads (a bare interpreter that imports DuckDB, Arrow and the receiver, no store).

    python bench/idle_memory.py [--spans 1000000] [--settle 3] [--release-after 5] [--dir DIR]

The receiver's child processes (its converters, started right away by ``agenttape serve`` and
stopped by the quiet release, and multiprocessing's resource tracker) are not in its figure; their
resident memory together is printed beside it, before the release (``children_held_mb``) and after
(``children_mb``).

The runs page and the replay are read once more before the release and once after it: ``warm_ms``
and ``wake_ms``, what the first requests after a quiet spell pay for what it gave back.

Last line: ``idle_memory rss_mb=X held_mb=H started_mb=Y floor_mb=Z children_mb=C children_held_mb=D
wake_ms=W warm_ms=V``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))


def build_store(db: str, spans: int) -> dict[str, str]:
    """``replay.build`` in a process of its own: this one maps none of the receiver's libraries, so the
    receiver's pages are its own, as on a host where it runs alone (a page two processes map is counted
    in both, and the kernel reclaims neither's)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import replay; "
            "print(json.dumps(replay.build(sys.argv[2], int(sys.argv[3]))))")
    out = subprocess.run([sys.executable, "-c", code, HERE, db, str(spans)], check=True, stdout=subprocess.PIPE,
                         text=True).stdout
    *said, last = out.strip().splitlines()
    for line in said:  # the builder's own report
        print(line, file=sys.stderr)
    return json.loads(last)


def memory_mb(pid: int | str = "self") -> dict[str, float]:
    """VmRSS and its parts (MB) of a process."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(value.split()[0]) / 1024
    return out


def children_mb(pid: int) -> tuple[int, float]:
    """How many child processes ``pid`` has (the converter processes, multiprocessing's resource
    tracker) and their resident memory together (MB); their pages shared with the receiver (the same
    libraries) are counted in each."""
    kids: list[str] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids += (task / "children").read_text().split()
        except OSError:
            pass
    total = 0.0
    for kid in kids:
        try:
            total += memory_mb(kid)["VmRSS"]
        except OSError:
            pass
    return len(kids), total


def floor_mb() -> float:
    """RSS of an interpreter that only imports what the receiver imports."""
    code = ("import duckdb, pyarrow, pyarrow.ipc, otel_agenttape.receiver.server, otel_agenttape.receiver.http;"
            "from pathlib import Path;"
            "print([l for l in Path('/proc/self/status').read_text().splitlines() if l.startswith('VmRSS')][0].split()[1])")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout) / 1024


def timed_read(base: str, ids: dict) -> float:
    """Milliseconds for the first runs page and the run's replay, read one after the other."""
    t0 = time.perf_counter()
    get(f"{base}/api/runs")
    get(f"{base}/api/runs/{ids['run']}/replay")
    return (time.perf_counter() - t0) * 1e3


def get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=120) as resp:
        return json.loads(resp.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--release-after", type=float, default=5.0)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="agenttape-idle-"))
    tmp.mkdir(parents=True, exist_ok=True)
    db = str(tmp / "idle.duckdb")
    for path in (db, db + ".wal"):  # a store left by an earlier run would be added to, not replaced
        if os.path.exists(path):
            os.remove(path)
    print(f"building a store of {args.spans} spans in {db} ...", file=sys.stderr, flush=True)
    ids = build_store(db, args.spans)
    proc = subprocess.Popen([sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", db, "--http-port", "0",
                             "--grpc-port", "0", "--json", "--release-after", str(args.release_after)],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(proc.stdout.readline())["http_port"]
        time.sleep(args.settle)
        started = memory_mb(proc.pid)
        base = f"http://127.0.0.1:{port}"
        t0 = time.perf_counter()
        page = get(f"{base}/api/runs")
        get(f"{base}/api/runs/{ids['run']}/replay")
        get(f"{base}/api/runs/{ids['tree']}/tree")
        reads_s = time.perf_counter() - t0
        served = memory_mb(proc.pid)
        time.sleep(args.settle)
        held = memory_mb(proc.pid)  # idle, before the quiet release (when --settle < --release-after)
        _, kids_held_mb = children_mb(proc.pid)
        warm_ms = timed_read(base, ids)  # the same reads again, before the release (a new quiet spell)
        time.sleep(args.release_after + 3.0)  # the release, and a few seconds to look
        idle = memory_mb(proc.pid)
        kids, kids_mb = children_mb(proc.pid)
        wake_ms = timed_read(base, ids)  # ... and after it: what the first request pays for the release
        floor = floor_mb()
        runs = len(page.get("runs", page) if isinstance(page, dict) else page)
        print(f"reads: runs page ({runs} runs), replay, tree in {reads_s:.2f}s; peak during reads "
              f"{served['VmHWM']:.0f} MB", file=sys.stderr)
        for name, m in (("started", started), (f"{args.settle:g} s after the reads", held),
                        (f"quiet for {args.release_after:g} s (released)", idle)):
            print(f"{name}: {m['VmRSS']:.0f} MB = {m['RssAnon']:.0f} anonymous + {m['RssFile']:.0f} file-backed "
                  f"(shared libraries) + {m['RssShmem']:.0f} shared memory", file=sys.stderr)
        print(f"its child processes (converters; multiprocessing's resource tracker): {kids_held_mb:.0f} MB "
              f"resident together before the release, {kids_mb:.0f} MB ({kids} processes) after", file=sys.stderr)
        print(f"the runs page and a replay: {warm_ms:.0f} ms before the release, {wake_ms:.0f} ms as the first "
              f"requests after it", file=sys.stderr)
        print(f"floor (imports only): {floor:.0f} MB; load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
        print(f"idle_memory rss_mb={idle['VmRSS']:.0f} held_mb={held['VmRSS']:.0f} started_mb={started['VmRSS']:.0f} "
              f"floor_mb={floor:.0f} children_mb={kids_mb:.0f} children_held_mb={kids_held_mb:.0f} "
              f"wake_ms={wake_ms:.0f} warm_ms={warm_ms:.0f}")
    finally:
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
