"""A quiet receiver gives back the memory that served the busy time (``receiver/quiet.py``): its converter
processes stop and DuckDB's cached blocks go, and each comes back when requests and reads do."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

from multiprocessing import resource_tracker

import httpx
import pytest
from receiver_util import span_keys, stored_keys, trace_request

from otel_agenttape.cli import main
from otel_agenttape.receiver.quiet import QuietRelease
from otel_agenttape.receiver.server import TapeServer
from otel_agenttape.store.writer import Store

PB = {"content-type": "application/x-protobuf"}


def _wait(pred, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return os.path.exists(f"/proc/{pid}") and "zombie" not in _state(pid)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next((line for line in fh if line.startswith("State:")), "").lower()
    except OSError:
        return "zombie"


def _gauge(server: TapeServer, name: str) -> float:
    for line in server.render_metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} is not on /metrics")


def test_a_quiet_receiver_stops_its_converters_and_they_come_back_with_requests(tmp_path):
    server = TapeServer(str(tmp_path / "q.duckdb"), http_port=0, grpc_port=0, ingest_workers=1, warm_workers=True,
                        release_after=1.0).start()
    pool = server.pipeline.pool
    try:
        assert _wait(lambda: pool.running), "the converters never started"
        sent = [trace_request(4)]
        with httpx.Client(timeout=30) as client:
            assert client.post(f"{server.url}/v1/traces", content=sent[0].SerializeToString(), headers=PB).status_code == 200
            pids = list(pool._pool._processes)
            folder = pool.spool_folder
            tracker = resource_tracker._resource_tracker._pid  # multiprocessing's, started with the pool
            assert pids and _gauge(server, "agenttape_converter_processes") == 1
            # a second without writes, reads or requests: the workers and their hand-off files go
            assert _wait(lambda: not pool.running, 30), "the converters kept running on a quiet receiver"
            assert _wait(lambda: not any(_alive(pid) for pid in pids), 30)
            assert _wait(lambda: not os.path.exists(folder), 30)  # removed once the workers are shut down
            assert tracker is None or _wait(lambda: not _alive(tracker), 30)  # it tracks nothing now: stopped
            assert _gauge(server, "agenttape_converter_processes") == 0
            assert _wait(lambda: _gauge(server, "agenttape_quiet_releases_total") >= 1, 10)  # counted once done
            # the next request is answered at once (prepared here) and brings the workers back
            sent.append(trace_request(3))
            assert client.post(f"{server.url}/v1/traces", content=sent[1].SerializeToString(), headers=PB).status_code == 200
            assert _wait(lambda: pool.running), "the converters did not come back with the requests"
            assert not set(pool._pool._processes) & set(pids)
            sent.append(trace_request(2))
            assert client.post(f"{server.url}/v1/traces", content=sent[2].SerializeToString(), headers=PB).status_code == 200
        assert stored_keys(server) == set().union(*(span_keys(r) for r in sent))  # nothing lost on the way
    finally:
        server.stop()


_PAGE_OUT_CHILD = r"""
import hashlib, mmap, sys, json
from otel_agenttape.receiver import code_pages
with open(sys.argv[1], "rb") as fh:
    m = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)  # a private, read-only file mapping, as a library's code
before_digest = hashlib.sha256(m).hexdigest()  # every page read: resident
before = code_pages.file_resident_bytes()
released = code_pages.page_out()
after = code_pages.file_resident_bytes()
print(json.dumps({"before": before, "released": released, "after": after,
                  "same": hashlib.sha256(m).hexdigest() == before_digest, "supported": code_pages.MADV_PAGEOUT}))
"""


def _kernel() -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", os.uname().release)[:2])


@pytest.mark.skipif(not sys.platform.startswith("linux") or _kernel() < (5, 4), reason="MADV_PAGEOUT: Linux 5.4+")
def test_page_out_hands_the_resident_pages_of_mapped_files_back_and_they_read_the_same(tmp_path):
    data = tmp_path / "lib.bin"
    with open(data, "wb") as fh:  # 32 MB mapped by the child alone (a page two processes map stays)
        for i in range(512):
            fh.write(os.urandom(64 << 10))
        fh.flush()
        os.fsync(fh.fileno())  # clean pages, as a library's
    out = subprocess.run([sys.executable, "-c", _PAGE_OUT_CHILD, str(data)], capture_output=True, text=True,
                         check=True, timeout=120)
    got = json.loads(out.stdout)
    assert got["before"] - got["after"] >= 24 << 20, got  # the file's pages left the process's RSS
    assert got["released"] >= 24 << 20, got  # ... and page_out says so
    assert got["same"], got  # read back, the same bytes


def _store_with_rows(path: str, n: int = 40) -> Store:
    store = Store(path, memory_limit="64MiB")
    store.write_traces([trace_request(100, attrs={"text": "x" * 2000, "i": i}) for i in range(n)])
    return store


def test_release_gives_the_cached_blocks_back_and_reads_come_out_the_same(tmp_path):
    store = _store_with_rows(str(tmp_path / "r.duckdb"))
    reader = store.reader()
    sql = "SELECT count(*), sum(length(attributes)) FROM spans"
    before = reader.query(sql).to_pylist()
    cached = store.con.sql("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchall()[0][0]
    released = store.release_memory()
    left = store.con.sql("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchall()[0][0]
    assert released > 0 and left < cached, (cached, released, left)
    limit = store.con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0]
    assert limit.replace(" ", "") in ("64.0MiB", "64MiB")  # the bound is back
    assert reader.query(sql).to_pylist() == before
    store.close()


def test_release_waits_for_no_read_and_blocks_none(tmp_path):
    store = _store_with_rows(str(tmp_path / "b.duckdb"), n=2)
    inside, leave = threading.Event(), threading.Event()

    def long_read():
        with store.gate.reading():
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=long_read)
    t.start()
    try:
        assert inside.wait(10)
        t0 = time.monotonic()
        assert store.release_memory() == 0  # a read runs: nothing is done, and nothing waits for it
        assert time.monotonic() - t0 < 1.0
    finally:
        leave.set()
        t.join()
    assert store.reader().query("SELECT count(*) FROM spans").column(0)[0].as_py() == 200
    store.close()


def test_one_release_per_quiet_spell_and_any_read_or_write_starts_a_new_one(tmp_path):
    store = _store_with_rows(str(tmp_path / "s.duckdb"), n=2)
    quiet = QuietRelease(store, None, after=0.3)
    assert quiet.check() is None  # not quiet for long enough yet
    time.sleep(0.4)
    assert quiet.check() is not None
    assert quiet.check() is None  # released once; nothing happened since
    time.sleep(0.4)
    assert quiet.check() is None
    store.reader().query("SELECT count(*) FROM spans")  # a read: a new spell starts
    assert quiet.check() is None
    time.sleep(0.4)
    assert quiet.check() is not None
    quiet.stored()  # a write
    time.sleep(0.4)
    assert quiet.check() is not None
    assert QuietRelease(store, None, after=0).check() is None  # 0: never
    store.close()


def test_serve_refuses_a_negative_release_after(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--db", str(tmp_path / "x.duckdb"), "--http-port", "0", "--grpc-port", "0",
              "--release-after", "-1"])
    assert exc.value.code == 2
    assert "--release-after: must be 0 or more seconds, not -1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="release_after must be 0"):
        TapeServer(str(tmp_path / "y.duckdb"), release_after=-1)


@pytest.mark.parametrize("after", ["0", "2.5"])
def test_serve_takes_release_after_from_the_environment(monkeypatch, after):
    from otel_agenttape.cli import _build_parser

    monkeypatch.setenv("AGENTTAPE_RELEASE_AFTER", after)
    args = _build_parser().parse_args(["serve"])
    assert args.release_after == float(after)


def test_a_store_opened_on_many_keys_gives_back_what_reading_them_cached(tmp_path, monkeypatch):
    from otel_agenttape.store import writer

    path = str(tmp_path / "k.duckdb")
    store = Store(path)
    for _ in range(3):  # 150,000 keys: their blocks are more than the 1 MiB a release leaves
        store.write_traces([trace_request(1000) for _ in range(50)])
    store.close()

    def cached_after_open() -> int:
        store = Store(path, memory_limit="64MiB")
        try:
            return store.con.sql("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchall()[0][0]
        finally:
            store.close()

    monkeypatch.setattr(writer, "_GIVE_BACK_KEYS", 10**9)
    kept = cached_after_open()
    monkeypatch.setattr(writer, "_GIVE_BACK_KEYS", 10_000)
    given_back = cached_after_open()
    assert given_back < kept, (given_back, kept)


def test_requests_do_not_wait_for_the_converters_to_come_back(tmp_path):
    """While the workers start (``start`` holds the pool's lock for the seconds that takes), each request
    is prepared in the main process at once."""
    from otel_agenttape.codec.otlp_decode import PROTOBUF
    from otel_agenttape.receiver.convert import ConvertPool
    from otel_agenttape.receiver.metrics import Metrics
    from otel_agenttape.receiver.pipeline import IngestPipeline
    from otel_agenttape.receiver.wal import KIND_TRACES, WriteAheadLog

    store = Store(str(tmp_path / "w.duckdb"))
    wal = WriteAheadLog(tmp_path / "wal")
    pool = ConvertPool(1)
    pool.restart_on_use = True
    p = IngestPipeline(store, wal, Metrics(), pool=pool)
    answers: list = []
    body = trace_request(3).SerializeToString()
    with pool._lock:  # a start under way
        pool._starting = True
        t = threading.Thread(target=lambda: answers.append(p.prepare(KIND_TRACES, body, PROTOBUF)))
        t.start()
        t.join(5)
        prepared_while_starting = not t.is_alive()
    t.join()
    pool._starting = False
    assert prepared_while_starting, "a request waited for the converters to start"
    assert answers[0].accepted == 3 and not pool.running
    p.close()
    wal.close(applied_all=True)
    store.close()


def test_the_lake_publisher_holds_still_while_the_store_gives_its_blocks_back(tmp_path):
    """The publisher queries the store on a cursor of its own (outside the read gate): a release pauses
    it, and it publishes what comes after as before."""
    server = TapeServer(str(tmp_path / "l.duckdb"), http_port=0, grpc_enabled=False, ingest_workers=0,
                        lake=str(tmp_path / "lake"), lake_interval=3600, release_after=0.5).start()
    publisher = server.publisher
    held = []
    real = publisher.suspended

    def counted():
        held.append(time.monotonic())
        return real()

    publisher.suspended = counted
    try:
        with httpx.Client(timeout=30) as client:
            first = trace_request(5)
            assert client.post(f"{server.url}/v1/traces", content=first.SerializeToString(), headers=PB).status_code == 200
            assert server.pipeline.wait_idle(30)
            assert _wait(lambda: _gauge(server, "agenttape_quiet_releases_total") >= 1, 30)
            assert held, "the publisher kept running while the store's memory limit was lowered"
            second = trace_request(4)
            assert client.post(f"{server.url}/v1/traces", content=second.SerializeToString(), headers=PB).status_code == 200
            assert server.pipeline.wait_idle(30)
        assert publisher.publish_all() >= 1
        assert publisher.failures == 0 and publisher.unpublished()["spans"] == 0
        assert stored_keys(server) == span_keys(first) | span_keys(second)
    finally:
        server.stop()


def test_closing_the_pool_while_a_conversion_finishes_does_not_hang():
    """A conversion's done callbacks take the pool's lock on the executor's own thread: closing must not
    hold that lock while it waits for the executor."""
    from otel_agenttape.receiver.convert import ConvertPool
    from otel_agenttape.receiver.wal import KIND_TRACES

    pool = ConvertPool(1)
    pool.start()
    payloads = [trace_request(200, attrs={"text": "x" * 500}).SerializeToString() for _ in range(20)]
    futures = [pool.submit(KIND_TRACES, payloads) for _ in range(3)]
    closer = threading.Thread(target=pool.close)
    closer.start()
    closer.join(60)
    assert not closer.is_alive(), "closing the pool hung while conversions finished"
    assert all(f.done() for f in futures)
