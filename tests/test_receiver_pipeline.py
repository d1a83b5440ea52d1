"""The store hand-off: batched writes, conversion in worker processes, WAL cleanup, replay at start."""

from __future__ import annotations

import time

import pytest
from receiver_util import logs_request, span_keys, trace_request

from otel_agenttape.receiver.convert import ConvertPool
from otel_agenttape.receiver.metrics import Metrics
from otel_agenttape.receiver.pipeline import Backpressure, IngestPipeline
from otel_agenttape.receiver.wal import KIND_LOGS, KIND_TRACES, WriteAheadLog
from otel_agenttape.store.writer import Store


def _keys(store: Store) -> set[tuple[str, str]]:
    t = store.reader().query("SELECT trace_id, span_id FROM spans")
    return set(zip(t.column("trace_id").to_pylist(), t.column("span_id").to_pylist()))


def test_worker_process_conversion_stores_everything_once(tmp_path):
    store = Store(str(tmp_path / "p.duckdb"))
    wal = WriteAheadLog(tmp_path / "wal")
    pool = ConvertPool(1)
    p = IngestPipeline(store, wal, Metrics(), pool=pool, pool_threshold=1, chunk_items=5)
    p.start()
    reqs = [trace_request(4) for _ in range(6)]
    for r in reqs + reqs[:2]:  # re-sent requests land in other chunks
        p.accept(KIND_TRACES, r, r.SerializeToString(), 4)
    logs = logs_request(3)
    p.accept(KIND_LOGS, logs, logs.SerializeToString(), 3)
    assert p.wait_idle(60)
    assert pool._pool is not None  # the worker process did the conversion
    assert _keys(store) == set().union(*(span_keys(r) for r in reqs))
    assert store.reader().query("SELECT count(*) FROM spans").column(0)[0].as_py() == 24
    assert store.reader().query("SELECT count(*) FROM log_records").column(0)[0].as_py() == 3
    assert p.metrics.get("agenttape_spans_duplicate_total") == 8
    assert wal.lag_records == 0
    p.close()
    wal.close(applied_all=True)
    assert wal.segments() == []
    store.close()


def test_unapplied_wal_records_are_replayed_at_start(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal")
    reqs = [trace_request(3) for _ in range(3)]
    for r in reqs:
        wal.append(KIND_TRACES, r.SerializeToString())
    wal.close()  # as if the process died before the writer ran
    store = Store(str(tmp_path / "r.duckdb"))
    store.write_traces(reqs[:1])  # the first one had reached the store already
    wal2 = WriteAheadLog(tmp_path / "wal")
    p = IngestPipeline(store, wal2, Metrics())
    assert p.replay_wal() == 3
    assert _keys(store) == set().union(*(span_keys(r) for r in reqs))
    assert store.reader().query("SELECT count(*) FROM spans").column(0)[0].as_py() == 9
    assert wal2.pending_replay() == [] and list(wal2.replay()) == []
    wal2.close()
    store.close()


class _SlowStore:
    """A real store whose writes take a while (a writer that drains, slowly)."""

    def __init__(self, inner: Store, delay: float) -> None:
        self.inner = inner
        self.delay = delay

    def write_traces(self, reqs):
        time.sleep(self.delay)
        return self.inner.write_traces(reqs)

    def write_logs(self, reqs):
        return self.inner.write_logs(reqs)


def test_full_queue_holds_a_request_while_the_writer_drains(tmp_path):
    inner = Store(str(tmp_path / "h.duckdb"))
    wal = WriteAheadLog(tmp_path / "wal")
    reqs = [trace_request(4) for _ in range(3)]
    size = len(reqs[0].SerializeToString())
    p = IngestPipeline(_SlowStore(inner, 0.3), wal, Metrics(), max_queue_bytes=int(size * 1.5))
    p.start()
    p.accept(KIND_TRACES, reqs[0], reqs[0].SerializeToString(), 4)
    assert p.wait_idle(10)  # the writer has stored something: it is draining
    p.accept(KIND_TRACES, reqs[1], reqs[1].SerializeToString(), 4)
    t0 = time.monotonic()
    p.accept(KIND_TRACES, reqs[2], reqs[2].SerializeToString(), 4)  # full: held until the writer made room
    assert time.monotonic() - t0 > 0.05
    assert p.metrics.get("agenttape_backpressure_total") == 0
    assert p.wait_idle(10)
    assert _keys(inner) == set().union(*(span_keys(r) for r in reqs))
    p.close()
    wal.close(applied_all=True)
    inner.close()


def test_stalled_writer_refuses_at_once(tmp_path):
    inner = Store(str(tmp_path / "s.duckdb"))
    wal = WriteAheadLog(tmp_path / "wal")
    reqs = [trace_request(4) for _ in range(2)]
    size = len(reqs[0].SerializeToString())
    p = IngestPipeline(_SlowStore(inner, 1.0), wal, Metrics(), max_queue_bytes=int(size * 1.5))
    p.start()  # nothing stored yet: not draining
    p.accept(KIND_TRACES, reqs[0], reqs[0].SerializeToString(), 4)
    t0 = time.monotonic()
    with pytest.raises(Backpressure):
        p.accept(KIND_TRACES, reqs[1], reqs[1].SerializeToString(), 4)
    assert time.monotonic() - t0 < 0.5
    assert p.wait_idle(10)
    p.close()
    wal.close(applied_all=True)
    inner.close()


def test_requests_prepared_in_a_worker_answer_like_the_main_process(tmp_path):
    """With the pool running, bodies are decoded, validated and converted in a worker: same verdicts
    (rows, partial success, 400) as in the main process, and the hand-off folder goes with the pool."""
    import os

    from otel_agenttape.codec.otlp_decode import JSON, PROTOBUF, DecodeError
    from otel_agenttape.receiver.prepare import prepare
    from otel_agenttape.codec import otlp_view

    store = Store(str(tmp_path / "w.duckdb"))
    wal = WriteAheadLog(tmp_path / "wal")
    pool = ConvertPool(1)
    pool.start()
    p = IngestPipeline(store, wal, Metrics(), pool=pool)
    good = trace_request(5, attrs={"gen_ai.request.model": "m", "n": 3})
    bad = otlp_view.parse_traces(good.SerializeToString())
    bad.resource_spans[0].scope_spans[0].spans[1].trace_id = b"\x01" * 3
    broken = otlp_view.parse_traces(good.SerializeToString())
    broken.resource_spans[0].scope_spans[0].spans[2].attributes.append(b"\x0a\x02\xff\xfe")
    cases = [(KIND_TRACES, good.SerializeToString(), PROTOBUF), (KIND_TRACES, bad.SerializeToString(), PROTOBUF),
             (KIND_LOGS, logs_request(3).SerializeToString(), PROTOBUF),
             (KIND_TRACES, b'{"resourceSpans": []}', JSON)]
    for kind, body, media in cases:
        here, there = prepare(kind, body, media), p.prepare(kind, body, media)
        assert (there.accepted, there.rejected, there.message, there.payload) == (
            here.accepted, here.rejected, here.message, here.payload)
        if here.tables is not None:
            for name, table in here.tables.as_dict().items():
                assert there.tables.as_dict()[name].equals(table), name
    v = p.prepare(KIND_TRACES, bad.SerializeToString(), PROTOBUF)
    assert (v.accepted, v.rejected) == (4, 1) and "trace_id must be 16 bytes" in v.message
    assert len(span_keys(_parse(v.payload))) == 4  # the WAL gets the valid spans only
    # a string that is not UTF-8 rejects its span only; a body that is not a request, all of it
    v = p.prepare(KIND_TRACES, broken.SerializeToString(), PROTOBUF)
    assert (v.accepted, v.rejected, v.reasons) == (4, 1, {"invalid_utf8": 1})
    assert len(span_keys(_parse(v.payload))) == 4
    with pytest.raises(DecodeError):
        p.prepare(KIND_TRACES, b"\x0a\xff\xff", PROTOBUF)
    folder = pool._spool
    del here, there, v
    # every hand-off file was taken: what is left is kept to be written again
    kept = set(pool._bodies.paths()) | set(pool._rows.paths())
    assert folder is not None and {os.path.join(folder, n) for n in os.listdir(folder)} == kept
    # requests one at a time: one body file, and a rows file per request whose rows were alive at once
    assert len(pool._bodies.paths()) == 1 and len(pool._rows.paths()) <= 2
    # a reused file is written from its start and not shrunk: a small request after a large one reads
    # only its own bytes and rows
    large = trace_request(60, attrs={"long": "x" * 5000})
    for body in (large.SerializeToString(), good.SerializeToString(), large.SerializeToString()):
        here, there = prepare(KIND_TRACES, body, PROTOBUF), p.prepare(KIND_TRACES, body, PROTOBUF)
        assert there.accepted == here.accepted
        for name, table in here.tables.as_dict().items():
            assert there.tables.as_dict()[name].equals(table), name
    del here, there
    kept = set(pool._bodies.paths()) | set(pool._rows.paths())
    assert {os.path.join(folder, n) for n in os.listdir(folder)} == kept and len(kept) <= 3
    p.close()
    assert not os.path.exists(folder)
    wal.close(applied_all=True)
    store.close()


def _parse(payload):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    return ExportTraceServiceRequest.FromString(payload)


def test_a_dead_worker_costs_no_request(tmp_path):
    import os
    import signal

    from otel_agenttape.codec.otlp_decode import PROTOBUF

    store = Store(str(tmp_path / "k.duckdb"))
    wal = WriteAheadLog(tmp_path / "wal")
    pool = ConvertPool(1)
    pool.start()
    p = IngestPipeline(store, wal, Metrics(), pool=pool)
    (pid,) = list(pool._pool._processes)
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    req = trace_request(3)
    v = p.prepare(KIND_TRACES, req.SerializeToString(), PROTOBUF)  # prepared here instead
    assert v.accepted == 3 and v.tables.spans.num_rows == 3
    deadline = time.monotonic() + 30
    while not pool.running and time.monotonic() < deadline:  # new workers replace the broken pool
        time.sleep(0.1)
    assert pool.running and pid not in pool._pool._processes
    assert p.prepare(KIND_TRACES, req.SerializeToString(), PROTOBUF).accepted == 3
    p.close()
    wal.close(applied_all=True)
    store.close()


def test_an_idle_writer_gives_queries_their_threads_back(tmp_path):
    store = Store(str(tmp_path / "i.duckdb"), threads=2)
    wal = WriteAheadLog(tmp_path / "wal")
    p = IngestPipeline(store, wal, Metrics())
    p.start()
    r = trace_request(3)
    p.accept(KIND_TRACES, r, r.SerializeToString(), 3)
    assert p.wait_idle(30)

    def threads():
        return store.con.sql("SELECT current_setting('threads')").fetchall()[0][0]

    assert threads() == 1  # written on one thread
    deadline = time.monotonic() + 10
    while threads() != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert threads() == 2  # about a second without writes
    p.close()
    wal.close(applied_all=True)
    store.close()


def test_converter_processes_yield_the_cpu_to_the_receiver():
    """Converters run at a lower priority (nice +5 unless already near the floor) than the receiver."""
    import os

    pool = ConvertPool(1)
    pool.start()
    try:
        assert pool._pool is not None
        worker = pool._pool.submit(os.getpriority, os.PRIO_PROCESS, 0).result(timeout=60)
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert worker == min(19, mine + 5)
    finally:
        pool.close()
