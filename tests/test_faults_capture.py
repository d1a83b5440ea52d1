"""The outbox under faults, with real processes and receivers on 127.0.0.1: the agent killed with
SIGKILL while it re-sends, the receiver down for a while then back, a full outbox, a torn record at
the tail, and `agenttape ingest OUTBOX`. Nothing the outbox holds is lost, and the store holds every
span once.

``AGENTTAPE_FAULT_DOWN_S`` sets how long the receiver stays down (default 3 s; bench/faults.py
runs the same scenario with 60 s).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from capture_servers import SlowOtlpHttp, free_port, free_ports, serve_process, stop_process
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from receiver_util import free_env

import otel_agenttape
from otel_agenttape import outboxfile
from otel_agenttape.doctor import diagnose
from otel_agenttape.receiver.server import TapeServer

DOWN_S = float(os.environ.get("AGENTTAPE_FAULT_DOWN_S", "3"))
AGENT = str(Path(__file__).with_name("outbox_agent.py"))


@pytest.fixture(autouse=True)
def _quiet():
    logger = logging.getLogger("opentelemetry")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def outbox_keys(path: Path) -> list[tuple[str, str]]:
    """(trace id, span id) of every span the outbox holds, in record order (read-only)."""
    out = []
    for rec in outboxfile.read_outbox(path):
        req = ExportTraceServiceRequest.FromString(rec.payload)
        out += [(s.trace_id.hex(), s.span_id.hex()) for rs in req.resource_spans for ss in rs.scope_spans
                for s in ss.spans]
    return out


def stored(url: str) -> list[tuple[str, str]]:
    import pyarrow as pa

    r = httpx.post(f"{url}/api/query", json={"sql": "SELECT trace_id, span_id FROM spans"}, timeout=60)
    assert r.status_code == 200, r.text
    t = pa.ipc.open_stream(r.content).read_all()
    return list(zip(t.column("trace_id").to_pylist(), t.column("span_id").to_pylist()))


def agent(endpoint: str, protocol: str, box: Path, runs: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, AGENT, endpoint, protocol, str(box), str(runs), *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=free_env())


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_kill_9_of_the_agent_while_it_resends_then_a_second_process_delivers_everything_once(tmp_path):
    box, db = tmp_path / "outbox", str(tmp_path / "t.duckdb")
    http_port, grpc_port = free_ports(2)
    endpoint = f"http://127.0.0.1:{http_port}"
    first = agent(endpoint, "http/protobuf", box, 300, "--hold", "--batch", "16")  # receiver not up yet
    try:
        line = ""
        while not line.startswith("held"):
            line = first.stdout.readline()
            assert line, first.stderr.read()
        held = json.loads(line[len("held "):])
        keys = outbox_keys(box)
        assert len(keys) == held["spans_queued"] == held["spans_to_outbox"] > 900
        server, info = serve_process(db, http_port, grpc_port)
        try:
            deadline = time.monotonic() + 60
            while not stored(info["url"]) and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(first.pid, signal.SIGKILL)  # in the middle of re-sending the outbox
            first.wait(10)
            part = len(stored(info["url"]))
            assert 0 < part
            second = agent(endpoint, "http/protobuf", box, 0, "--wait-drained", "60")
            out, err = second.communicate(timeout=120)
            assert second.returncode == 0, err
            stats = last_json(out)
            assert stats["outbox_spans_pending"] == 0
            rows = stored(info["url"])
            assert sorted(rows) == sorted(set(keys)) and len(rows) == len(set(keys))  # all of it, once
            print(f"delivered before the kill: {part} of {len(keys)}; by the second process: "
                  f"{stats['outbox_spans_delivered']}")
        finally:
            stop_process(server)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert outbox_keys(box) == []


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_receiver_killed_and_down_for_a_while_then_back_nothing_is_lost(tmp_path, protocol):
    box, db = tmp_path / "outbox", str(tmp_path / "t.duckdb")
    http_port, grpc_port = free_ports(2)
    endpoint = f"http://127.0.0.1:{http_port}" if protocol != "grpc" else f"127.0.0.1:{grpc_port}"
    server, info = serve_process(db, http_port, grpc_port)
    runs = int(max(40, 20 * (DOWN_S + 4)))
    proc = agent(endpoint, protocol, box, runs, "--pause", "0.05", "--wait-drained", "90")
    try:
        for _ in range(20):
            assert proc.stdout.readline().startswith("run ")
        os.kill(server.pid, signal.SIGKILL)  # under load
        server.wait(10)
        time.sleep(DOWN_S)
        server, info = serve_process(db, http_port, grpc_port)
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        stats = last_json(out)
        rows = stored(info["url"])
        assert len(rows) == len(set(rows)) == stats["spans_queued"]  # every span, once
        assert stats["spans_to_outbox"] > 0 and stats["outbox_spans_pending"] == 0
        assert stats["spans_dropped_shutdown"] == stats["spans_export_failed"] == stats["outbox_dropped_full"] == 0
        assert stats["runs_ended"] == runs
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop_process(server)


def test_the_outbox_resends_in_the_order_it_was_written(tmp_path):
    receiver = SlowOtlpHttp(delay=0.0, down=True)  # answers 503 until it is "back"
    try:
        tape = otel_agenttape.setup(receiver.url, seal=False, outbox=tmp_path / "outbox", timeout=1,
                                    queue_options={"max_export_batch_size": 10})
        for i in range(200):
            with tape.run(agent="a", run_id=f"r{i}"):
                pass
            if i % 50 == 49:
                time.sleep(0.3)  # several batches, several records
        deadline = time.monotonic() + 30
        while tape.stats()["outbox_spans_written"] < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tape.stats()["outbox_records_written"] > 5
        receiver.down = False
        assert tape.outbox.wait_drained(30)
        tape.shutdown()
    finally:
        receiver.close()
    assert receiver.run_ids == [f"r{i}" for i in range(200)]


def test_a_full_outbox_drops_and_counts_and_doctor_says_so(tmp_path, monkeypatch):
    box = tmp_path / "outbox"
    tape = otel_agenttape.setup(f"http://127.0.0.1:{free_port()}", seal=False, outbox=box, timeout=0.5,
                                outbox_options={"max_bytes": 40_000}, queue_options={"max_export_batch_size": 20})
    for i in range(400):
        with tape.run(agent="a", run_id=f"r{i}") as run:
            run.set_output("y" * 500)
    tape.shutdown()
    stats = tape.stats()
    assert stats["outbox_dropped_full"] > 0
    assert 0 < stats["outbox_bytes"] <= 40_000
    assert stats["outbox_spans_written"] + stats["outbox_dropped_full"] == 400
    assert (stats["spans_to_outbox"] + stats["spans_export_failed"] + stats["spans_dropped_shutdown"]
            + stats["spans_exported"]) == stats["spans_queued"] == 400
    monkeypatch.setenv("AGENTTAPE_OUTBOX", str(box))
    check = next(c for c in diagnose(str(tmp_path / "none.duckdb")) if c.name == "outbox")
    assert not check.ok and check.data["dropped"] == stats["outbox_dropped_full"]
    assert check.data["spans"] == stats["outbox_spans_written"]


def test_a_torn_record_at_the_tail_is_skipped_and_the_rest_delivered(tmp_path):
    box = tmp_path / "outbox"
    port, gport = free_ports(2)
    tape = otel_agenttape.setup(f"http://127.0.0.1:{port}", outbox=box, timeout=0.5)
    for i in range(30):
        with tape.run(agent="a", run_id=f"r{i}") as run:
            run.set_output("ok")
    tape.shutdown()
    keys = outbox_keys(box)
    assert len(keys) == tape.stats()["spans_queued"] == 60
    (lane,) = outboxfile.lanes(box)
    last = outboxfile.segments(lane)[-1][1]
    torn = outboxfile.encode_record(outboxfile.KIND_TRACES, 3, b"z" * 1000)[:700]  # cut off by a crash
    with open(last, "ab") as f:
        f.write(torn)
    assert outbox_keys(box) == keys  # readers stop before it
    with TapeServer(db=str(tmp_path / "t.duckdb"), host="127.0.0.1", http_port=port, grpc_port=gport) as server:
        again = otel_agenttape.setup(f"http://127.0.0.1:{port}", outbox=box)
        assert again.outbox.wait_drained(30)
        stats = again.stats()
        again.shutdown()
        assert stats["outbox_torn_bytes"] == 700 and stats["outbox_spans_delivered"] == 60
        assert server.wait_idle(30)
        rows = [tuple(r.values()) for r in server.query("SELECT trace_id, span_id FROM spans").to_pylist()]
    assert sorted(rows) == sorted(keys)


def test_agenttape_ingest_loads_an_outbox_folder(tmp_path):
    box, db = tmp_path / "outbox", tmp_path / "in.duckdb"
    tape = otel_agenttape.setup(f"http://127.0.0.1:{free_port()}", outbox=box, timeout=0.5)
    for i in range(25):
        with tape.run(agent="a", run_id=f"r{i}") as run:
            with run.model_call("m", [{"role": "user", "content": "hi"}]) as call:
                call.finish(text="ok")
    tape.shutdown()
    expected = tape.stats()["outbox_spans_written"]
    assert expected == tape.stats()["spans_queued"] == 75
    cli = [sys.executable, "-m", "otel_agenttape.cli", "ingest"]
    out = subprocess.run([*cli, str(box), "--db", str(db), "--json"], capture_output=True, text=True,
                         env=free_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["spans"] == expected and summary["rejected"] == 0
    from otel_agenttape.store.reader import open_reader

    with open_reader(str(db)) as reader:
        assert reader.query("SELECT count(DISTINCT span_id) FROM spans").column(0)[0].as_py() == expected
    # the folder is only read; again is harmless (the same span ids)
    again = subprocess.run([*cli, str(box), "--db", str(db), "--json"], capture_output=True, text=True,
                           env=free_env(), timeout=120)
    assert again.returncode == 0 and json.loads(again.stdout)["duplicates"] == expected
    empty = tmp_path / "not-an-outbox"
    empty.mkdir()
    bad = subprocess.run([*cli, str(empty), "--db", str(db)], capture_output=True, text=True, env=free_env(),
                         timeout=60)
    assert bad.returncode != 0 and "not an outbox" in bad.stderr


def test_a_forked_child_writes_its_own_lane(tmp_path):
    box = tmp_path / "outbox"
    tape = otel_agenttape.setup(f"http://127.0.0.1:{free_port()}", seal=False, outbox=box, timeout=0.5)
    with tape.run(agent="parent", run_id="p-0"):
        pass
    pid = os.fork()
    if pid == 0:  # the child: record, shut down, leave without running the parent's exit hooks
        code = 1
        try:
            before = tape.stats()["spans_to_outbox"]  # the counters are inherited
            for i in range(20):
                with tape.run(agent="child", run_id=f"c-{i}"):
                    pass
            tape.shutdown()
            code = 0 if tape.stats()["spans_to_outbox"] - before == 20 else 3
        finally:
            os._exit(code)
    for i in range(1, 20):
        with tape.run(agent="parent", run_id=f"p-{i}"):
            pass
    _, status = os.waitpid(pid, 0)
    tape.shutdown()
    assert os.waitstatus_to_exitcode(status) == 0
    assert tape.stats()["spans_to_outbox"] == 20
    assert len(outboxfile.lanes(box)) == 2
    assert len(set(outbox_keys(box))) == 40
