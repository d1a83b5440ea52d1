"""Fault benchmark: nothing lost between the agent and the store, nothing written through a read.

Real processes on free loopback ports: ``agenttape serve`` and agent processes recording sealed runs
with the outbox on (``tests/outbox_agent.py``). Scenarios:

1. receiver killed with SIGKILL under load at 3 moments (a quarter, half and three quarters into the
   agent's runs), restarted after ``--restart-s``;
2. receiver down for ``--down-s`` (60 s) while the agent records, then back: the outbox re-sends, and
   ``recovered_s`` is the time from the restart until the store holds every span;
3. agent killed with SIGKILL while it re-sends its outbox; a second process with the same outbox
   delivers the rest;
4. if ``tests/sql_write_attempts.json`` exists (a JSON list of ``{"sql", "why"}``), each statement
   through ``agenttape sql`` against the store, with the file's sha256 before and after.
5. the receiver-side scenarios of ``bench/faults_receiver.py`` (kill -9 inside a WAL append, an
   uncommitted store write and a checkpoint; a full disk and its recovery without a restart; the SQL
   corpus through a running server), added to the counts.

``lost`` counts spans the agent recorded (or the outbox held) that the store lacks, ``duplicated``
rows beyond one per span id, ``outbox_lost`` spans an outbox held that never arrived, ``sql_writes``
statements after which the store file changed.

    python bench/faults.py [--quick] [--runs N] [--down-s S] [--restart-s S] [--protocol grpc]

Last line: ``faults acked=N lost=0 duplicated=0 sql_writes=0 outbox_lost=0 recovered_s=X
disk_full_recovered_s=Y restart_s=Z``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "tests" / "outbox_agent.py"
SQL_CORPUS = ROOT / "tests" / "sql_write_attempts.json"
sys.path.insert(0, str(ROOT))

from otel_agenttape import outboxfile  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENTTAPE_"))}
    out["PYTHONPATH"] = str(ROOT) + os.pathsep + out.get("PYTHONPATH", "")
    return out


def serve(db: str, http_port: int, grpc_port: int) -> tuple[subprocess.Popen, dict]:
    deadline = time.monotonic() + 30
    while True:
        proc = subprocess.Popen([sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", db, "--host",
                                 "127.0.0.1", "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
        line = proc.stdout.readline()
        if line:
            return proc, json.loads(line)
        err = proc.stderr.read()
        proc.wait()
        if time.monotonic() > deadline:
            raise SystemExit(f"agenttape serve did not start: {err}")
        time.sleep(0.5)  # the killed server's port may still be held for a moment


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill9(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)


def query_keys(url: str) -> list[tuple[str, str]]:
    import urllib.request

    import pyarrow as pa

    req = urllib.request.Request(f"{url}/api/query", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"sql": "SELECT trace_id, span_id FROM spans"}).encode())
    with urllib.request.urlopen(req, timeout=120) as resp:
        t = pa.ipc.open_stream(resp.read()).read_all()
    return list(zip(t.column("trace_id").to_pylist(), t.column("span_id").to_pylist()))


def outbox_keys(box: Path) -> set[tuple[str, str]]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out = set()
    for rec in outboxfile.read_outbox(box):
        req = ExportTraceServiceRequest.FromString(rec.payload)
        out |= {(s.trace_id.hex(), s.span_id.hex()) for rs in req.resource_spans for ss in rs.scope_spans
                for s in ss.spans}
    return out


def agent(endpoint: str, protocol: str, box: Path, runs: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(AGENT), endpoint, protocol, str(box), str(runs), *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env())


def endpoint_for(protocol: str, http_port: int, grpc_port: int) -> str:
    return f"http://127.0.0.1:{http_port}" if protocol != "grpc" else f"127.0.0.1:{grpc_port}"


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[str, str]:
    """The rest of a process's output once it exits. ``communicate`` reads the pipes' file descriptors
    and would miss lines that ``readline`` already pulled into the text buffer."""
    if proc.stdin:
        proc.stdin.close()
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    out = proc.stdout.read()  # to EOF: the process has exited or closed its output
    proc.wait(timeout=timeout)
    reader.join(timeout)
    return out, "".join(err)


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


class Tally:
    def __init__(self) -> None:
        self.acked = self.lost = self.duplicated = self.outbox_lost = self.sql_writes = 0
        self.recovered_s = 0.0

    def check(self, name: str, expected: set | int, rows: list[tuple[str, str]]) -> None:
        distinct = set(rows)
        dup = len(rows) - len(distinct)
        missing = len(expected - distinct) if isinstance(expected, set) else max(0, expected - len(distinct))
        self.acked += len(distinct)
        self.lost += missing
        self.duplicated += dup
        print(f"  {name}: stored {len(distinct)} spans, missing {missing}, duplicated {dup}", flush=True)


def receiver_kills(tmp: Path, t: Tally, protocol: str, runs: int, restart_s: float) -> None:
    print(f"1. receiver SIGKILL under load at 3 moments ({runs} runs, restart after {restart_s} s)", flush=True)
    db, box = str(tmp / "kills.duckdb"), tmp / "kills.outbox"
    hp, gp = free_port(), free_port()
    server, info = serve(db, hp, gp)
    proc = agent(endpoint_for(protocol, hp, gp), protocol, box, runs, "--pause", "0.002", "--wait-drained", "180")
    try:
        moments = [runs // 4, runs // 2, 3 * runs // 4]
        done = 0
        for moment in moments:
            while done < moment:
                line = proc.stdout.readline()
                if not line:
                    raise SystemExit(f"agent died: {proc.stderr.read()}")
                done += line.startswith("run ")
            kill9(server)
            print(f"  killed the receiver after run {done}", flush=True)
            time.sleep(restart_s)
            server, info = serve(db, hp, gp)
        out, err = finish(proc)
        if proc.returncode:
            raise SystemExit(f"agent failed: {err}")
        stats = last_json(out)
        t.check("receiver kills", stats["spans_queued"], query_keys(info["url"]))
        t.outbox_lost += stats["outbox_spans_pending"]
        print(f"  agent: {stats['spans_queued']} spans, {stats['spans_to_outbox']} through the outbox, "
              f"{stats['outbox_spans_delivered']} re-sent, pending {stats['outbox_spans_pending']}", flush=True)
    finally:
        if proc.poll() is None:
            proc.kill()
        stop(server)


def receiver_down(tmp: Path, t: Tally, protocol: str, runs: int, down_s: float) -> None:
    print(f"2. receiver down for {down_s} s while the agent records {runs} runs, then back", flush=True)
    db, box = str(tmp / "down.duckdb"), tmp / "down.outbox"
    hp, gp = free_port(), free_port()
    server, info = serve(db, hp, gp)
    kill9(server)
    went_down = time.monotonic()
    pause = max(0.0, down_s / max(runs, 1) / 2)
    proc = agent(endpoint_for(protocol, hp, gp), protocol, box, runs, "--pause", f"{pause:.4f}", "--hold",
                 "--wait-drained", "300")
    try:
        line = ""
        while not line.startswith("held"):
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"agent died: {proc.stderr.read()}")
        held = json.loads(line[len("held "):])
        expected = outbox_keys(box)
        time.sleep(max(0.0, down_s - (time.monotonic() - went_down)))
        server, info = serve(db, hp, gp)
        back = time.monotonic()
        while len(set(query_keys(info["url"]))) < len(expected) and time.monotonic() - back < 600:
            time.sleep(0.1)
        t.recovered_s = round(time.monotonic() - back, 2)
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = finish(proc)
        if proc.returncode:
            raise SystemExit(f"agent failed: {err}")
        stats = last_json(out)
        rows = query_keys(info["url"])
        t.check("receiver down", expected | set(), rows)
        t.outbox_lost += len(expected - set(rows))
        print(f"  agent: {held['spans_queued']} spans while down, all in the outbox ({len(expected)}); "
              f"stored all {t.recovered_s} s after the restart; pending {stats['outbox_spans_pending']}",
              flush=True)
        if held["spans_queued"] != len(expected):
            t.lost += abs(held["spans_queued"] - len(expected))
    finally:
        if proc.poll() is None:
            proc.kill()
        stop(server)


def agent_kill(tmp: Path, t: Tally, protocol: str, runs: int) -> None:
    print(f"3. agent SIGKILL while it re-sends its outbox ({runs} runs), then a second process", flush=True)
    db, box = str(tmp / "agent.duckdb"), tmp / "agent.outbox"
    hp, gp = free_port(), free_port()
    endpoint = endpoint_for(protocol, hp, gp)
    first = agent(endpoint, protocol, box, runs, "--hold", "--batch", "16")
    server = None
    try:
        line = ""
        while not line.startswith("held"):
            line = first.stdout.readline()
            if not line:
                raise SystemExit(f"agent died: {first.stderr.read()}")
        expected = outbox_keys(box)
        server, info = serve(db, hp, gp)
        while not query_keys(info["url"]):
            time.sleep(0.01)
        kill9(first)
        part = len(set(query_keys(info["url"])))
        second = agent(endpoint, protocol, box, 0, "--wait-drained", "300")
        out, err = finish(second)
        if second.returncode:
            raise SystemExit(f"second agent failed: {err}")
        rows = query_keys(info["url"])
        t.check("agent kill", expected, rows)
        t.outbox_lost += len(expected - set(rows))
        print(f"  {part} of {len(expected)} delivered before the kill, the rest by the second process "
              f"({last_json(out)['outbox_spans_delivered']})", flush=True)
    finally:
        if first.poll() is None:
            first.kill()
        if server is not None:
            stop(server)


def sql_attempts(tmp: Path, t: Tally) -> None:
    if not SQL_CORPUS.exists():
        print(f"4. {SQL_CORPUS.relative_to(ROOT)} not found: no SQL write attempts", flush=True)
        return
    corpus = json.loads(SQL_CORPUS.read_text(encoding="utf-8"))
    db = tmp / "kills.duckdb"  # filled by scenario 1, no server holds it now
    print(f"4. {len(corpus)} SQL write attempts through `agenttape sql` against {db.name}", flush=True)

    def digest() -> str:
        return hashlib.sha256(db.read_bytes()).hexdigest()

    for item in corpus:
        before = digest()
        subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "sql", "--db", str(db), item["sql"]],
                       capture_output=True, text=True, env=env(), timeout=120)
        if digest() != before:
            t.sql_writes += 1
            print(f"  CHANGED the store: {item['sql']!r} ({item.get('why', '')})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a short run: fewer runs, receiver down for 5 s")
    p.add_argument("--runs", type=int, default=None, help="runs per scenario (default 3000, quick 300)")
    p.add_argument("--down-s", type=float, default=None, help="how long the receiver stays down (60, quick 5)")
    p.add_argument("--restart-s", type=float, default=1.0, help="pause before each restart in scenario 1")
    p.add_argument("--protocol", choices=["http/protobuf", "grpc"], default="http/protobuf")
    p.add_argument("--receiver-rounds", type=int, default=None,
                   help="rounds of bench/faults_receiver.py (kill -9 inside a WAL append, a store write and a "
                        "checkpoint; a full disk; the SQL corpus through a running server); default 2, quick 1; 0: skip")
    args = p.parse_args()
    runs = args.runs or (300 if args.quick else 3000)
    down_s = args.down_s if args.down_s is not None else (5.0 if args.quick else 60.0)
    t = Tally()
    with tempfile.TemporaryDirectory(prefix="agenttape-faults-") as d:
        tmp = Path(d)
        receiver_kills(tmp, t, args.protocol, runs, args.restart_s)
        receiver_down(tmp, t, args.protocol, max(50, runs // 2), down_s)
        agent_kill(tmp, t, args.protocol, runs)
        sql_attempts(tmp, t)
    rounds = args.receiver_rounds if args.receiver_rounds is not None else (1 if args.quick else 2)
    extra = receiver_faults(t, rounds) if rounds > 0 else ""
    print(f"faults acked={t.acked} lost={t.lost} duplicated={t.duplicated} sql_writes={t.sql_writes} "
          f"outbox_lost={t.outbox_lost} recovered_s={t.recovered_s}{extra}")


def receiver_faults(t: Tally, rounds: int) -> str:
    """The receiver-side scenarios of ``faults_receiver.py``, added to the tally; its extra fields."""
    print(f"5. receiver faults (bench/faults_receiver.py --rounds {rounds})", flush=True)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "faults_receiver.py"), "--rounds", str(rounds)],
                          capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    for line in lines[:-1]:
        print("  " + line, flush=True)
    if proc.returncode not in (0, 1) or not lines or not lines[-1].startswith("faults "):
        raise SystemExit(f"bench/faults_receiver.py failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    fields = dict(kv.split("=", 1) for kv in lines[-1].split()[1:])
    t.acked += int(fields["acked"])
    t.lost += int(fields["lost"])
    t.duplicated += int(fields["duplicated"])
    t.sql_writes += int(fields["sql_writes"])
    return f" disk_full_recovered_s={fields['recovered_s']} restart_s={fields['restart_s']}"


if __name__ == "__main__":
    main()
