"""Receiver faults at scale: kill -9 under load, a full disk, and SQL write attempts (``bench/faults.py`` runs it too).

Each round runs real `agenttape serve` processes on 127.0.0.1 (the fault harnesses of ``tests/``):

- kill -9 under load (8 client threads) inside a WAL append, inside an uncommitted store write and
  inside a DuckDB checkpoint, then a restart: ``lost`` counts acknowledged spans not stored,
  ``duplicated`` spans stored more than once;
- a full disk (ENOSPC injected on the write-ahead log) for a while, then space back:
  ``recovered_s`` is the time from space back to the first acknowledged export, without a restart;
  its baseline ``restart_s`` is what a restart (spawn to ``/healthz`` 200) costs in the same run;
- every attempt of ``tests/sql_write_attempts.json`` through ``agenttape sql`` on the file and through
  ``POST /api/query`` of a running server: ``sql_writes`` counts attempts that ran, plus 1 when the
  store file's sha256 changed.

Last line: ``faults acked=N lost=0 duplicated=0 sql_writes=0 recovered_s=S restart_s=R``.
(Spans lost on the agent side, the outbox, are measured by the capture benchmarks.)
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from receiver_util import PB, free_env, span_keys, trace_request  # noqa: E402

from otel_agenttape.store import samples  # noqa: E402
from otel_agenttape.store.writer import Store  # noqa: E402


def _serve(db: str, env: dict | None = None, entry: list[str] | None = None) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, *(entry or ["-m", "otel_agenttape.cli"]), "serve", "--db", db,
                             "--http-port", "0", "--grpc-port", "0", "--json", "--ingest-workers", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env or free_env())
    line = proc.stdout.readline()
    if not line:
        raise SystemExit("agenttape serve did not start")
    return proc, json.loads(line)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)


def _stored(url: str) -> list[tuple[str, str]]:
    r = httpx.post(f"{url}/api/query", json={"sql": "SELECT trace_id, span_id FROM spans"}, timeout=120)
    import pyarrow as pa

    t = pa.ipc.open_stream(r.content).read_all()
    return list(zip(t.column("trace_id").to_pylist(), t.column("span_id").to_pylist()))


def _load(url: str, acked: set, lock: threading.Lock, done: threading.Event) -> None:
    with httpx.Client(timeout=10) as c:
        while not done.is_set():
            req = trace_request(30, attrs={"gen_ai.input.messages": "m" * 1500})
            try:
                r = c.post(f"{url}/v1/traces", content=req.SerializeToString(), headers=PB)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                with lock:
                    acked.update(span_keys(req))


def kill_round(tmp: Path, moment: str, after: int, clients: int) -> tuple[int, int, int]:
    """(acked, lost, duplicated) of one kill -9 at ``moment`` and a restart."""
    db, mark = str(tmp / f"{moment}.duckdb"), tmp / f"{moment}.mark"
    env = {**free_env(), "FAULT_AT": moment, "FAULT_AFTER": str(after), "FAULT_MARK": str(mark)}
    proc, info = _serve(db, env, [str(TESTS / "fault_serve.py")])
    acked: set = set()
    lock, done = threading.Lock(), threading.Event()
    senders = [threading.Thread(target=_load, args=(info["url"], acked, lock, done)) for _ in range(clients)]
    for t in senders:
        t.start()
    deadline = time.monotonic() + 300
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    done.set()
    for t in senders:
        t.join(60)
    proc, info = _serve(db)
    try:
        counts = collections.Counter(_stored(info["url"]))
    finally:
        _stop(proc)
    return len(acked), len(acked - set(counts)), sum(n - 1 for n in counts.values() if n > 1)


def disk_full_round(tmp: Path, full_seconds: float) -> tuple[int, int, int, float]:
    """(acked, lost, duplicated, seconds from space back to the first acknowledged export)."""
    db, flag = str(tmp / "full.duckdb"), tmp / "disk-is-full"
    proc, info = _serve(db, {**free_env(), "ENOSPC_FLAG": str(flag)}, [str(TESTS / "enospc_serve.py")])
    url, acked = info["url"], set()
    try:
        with httpx.Client(timeout=30) as c:
            def post() -> bool:
                req = trace_request(50)
                ok = c.post(f"{url}/v1/traces", content=req.SerializeToString(), headers=PB).status_code == 200
                if ok:
                    acked.update(span_keys(req))
                return ok

            for _ in range(50):
                post()
            flag.touch()
            end = time.monotonic() + full_seconds
            while time.monotonic() < end:
                post()
                time.sleep(0.05)
            flag.unlink()
            back = time.monotonic()
            while not post():
                time.sleep(0.01)
            recovered = time.monotonic() - back
            for _ in range(50):
                post()
        deadline = time.monotonic() + 60
        while len(_stored(url)) < len(acked) and time.monotonic() < deadline:
            time.sleep(0.2)
        counts = collections.Counter(_stored(url))
    finally:
        _stop(proc)
    return len(acked), len(acked - set(counts)), sum(n - 1 for n in counts.values() if n > 1), recovered


def sql_round(tmp: Path) -> tuple[int, float]:
    """(sql_writes, seconds for a clean start of the server: spawn to /healthz 200)."""
    db = str(tmp / "sql.duckdb")
    with Store(db) as store:
        store.write_traces(samples.genai_requests(n_runs=20))
    digest = hashlib.sha256(Path(db).read_bytes()).hexdigest()
    attempts = json.loads((TESTS / "sql_write_attempts.json").read_text(encoding="utf-8"))
    writes = 0
    for a in attempts:
        sql = a["sql"].replace("{db}", os.path.abspath(db))
        out = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "sql", sql, "--db", db],
                             capture_output=True, env=free_env(), timeout=120)
        writes += out.returncode == 0
    start = time.monotonic()
    proc, info = _serve(db)
    while httpx.get(f"{info['url']}/healthz", timeout=10).status_code != 200:
        time.sleep(0.01)
    restart = time.monotonic() - start
    try:
        for a in attempts:
            sql = a["sql"].replace("{db}", os.path.abspath(db))
            writes += httpx.post(f"{info['url']}/api/query", json={"sql": sql}, timeout=120).status_code == 200
    finally:
        _stop(proc)
    writes += hashlib.sha256(Path(db).read_bytes()).hexdigest() != digest
    return writes, restart


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rounds", type=int, default=2, help="kill rounds per moment (default %(default)s)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--full-seconds", type=float, default=5.0, help="how long the disk stays full")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="agenttape-faults-"))
    acked = lost = duplicated = 0
    try:
        for r in range(args.rounds):
            for moment, after in (("wal", 200), ("insert", 20), ("checkpoint", 30)):
                where = tmp / f"{moment}-{r}"
                where.mkdir()
                a, lo, d = kill_round(where, moment, after, args.clients)
                print(f"kill -9 in {moment}: acked={a} lost={lo} duplicated={d}")
                acked, lost, duplicated = acked + a, lost + lo, duplicated + d
        (tmp / "full").mkdir()
        a, lo, d, recovered = disk_full_round(tmp / "full", args.full_seconds)
        print(f"disk full {args.full_seconds:g} s: acked={a} lost={lo} duplicated={d} recovered_s={recovered:.2f}")
        acked, lost, duplicated = acked + a, lost + lo, duplicated + d
        (tmp / "sql").mkdir()
        sql_writes, restart = sql_round(tmp / "sql")
        print(f"sql: sql_writes={sql_writes}; a clean start of the server takes {restart:.2f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"faults acked={acked} lost={lost} duplicated={duplicated} sql_writes={sql_writes} "
          f"recovered_s={recovered:.2f} restart_s={restart:.2f}")
    return 0 if not (lost or duplicated or sql_writes) else 1


if __name__ == "__main__":
    sys.exit(main())
