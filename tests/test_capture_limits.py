"""Capture against real receivers on 127.0.0.1: requests bounded in bytes (and split on 413), span ends
and shutdown bounded however slow or dead the receiver is, and counters that add up.

Timing bounds are generous (the machine is shared): they separate "bounded by the setting" from the
old behaviour (a request too large to ever be accepted; a producer held to the receiver's pace; a
shutdown of 30 s)."""

from __future__ import annotations

import logging
import time

import pytest
from capture_servers import SlowOtlpHttp, free_port

import otel_agenttape
from otel_agenttape.receiver.server import TapeServer

PROMPT = "p" * 160_000  # 150 calls of this: a 24 MB run


@pytest.fixture(autouse=True)
def _quiet():
    logger = logging.getLogger("opentelemetry")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def _endpoint(server: TapeServer, protocol: str) -> str:
    return server.url if protocol == "http/protobuf" else f"127.0.0.1:{server.grpc_port}"


def _big_run(tape, calls: int = 150, prompt: str = PROMPT) -> None:
    with tape.run(agent="big", run_id="big-1") as run:
        for i in range(calls):
            with run.model_call("m", [{"role": "user", "content": f"{i} {prompt}"}]) as call:
                call.finish(text=f"answer {i}")


def _stored(server: TapeServer) -> tuple[int, int]:
    assert server.wait_idle(60)
    row = server.query("SELECT count(*), count(DISTINCT span_id) FROM spans").to_pylist()[0]
    return tuple(row.values())


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_24_mb_run_goes_out_in_requests_the_receiver_takes(tmp_path, protocol):
    with TapeServer(db=str(tmp_path / "t.duckdb"), host="127.0.0.1", http_port=0, grpc_port=0) as server:
        tape = otel_agenttape.setup(_endpoint(server, protocol), protocol, insecure=True if protocol == "grpc" else None,
                                    timeout=30, queue_options={"schedule_delay_millis": 5000})
        _big_run(tape)  # all 152 spans in one batch (delay 5 s): 24 MB, over the receiver's 20 MiB
        tape.shutdown()
        stats = tape.stats()
        assert stats["spans_exported"] == stats["spans_queued"] >= 152
        assert stats["spans_export_failed"] == stats["spans_dropped_too_large"] == 0
        assert _stored(server) == (stats["spans_queued"],) * 2


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_413_splits_the_request_and_a_span_over_the_limit_is_dropped_and_counted(tmp_path, protocol):
    with TapeServer(db=str(tmp_path / "t.duckdb"), host="127.0.0.1", http_port=0, grpc_port=0,
                    max_body=1 << 20) as server:
        # the client's bound is above the receiver's: only the 413 / RESOURCE_EXHAUSTED tells
        tape = otel_agenttape.setup(_endpoint(server, protocol), protocol, insecure=True if protocol == "grpc" else None,
                                    timeout=30, max_request_bytes=64 << 20, seal=False,
                                    queue_options={"schedule_delay_millis": 5000})
        _big_run(tape, calls=40, prompt="q" * 60_000)  # 2.4 MB in one request
        with tape.run(agent="huge", run_id="huge-1") as run:
            with run.model_call("m", [{"role": "user", "content": "h" * (2 << 20)}]) as call:
                call.finish(text="too big for any request")
        tape.shutdown()
        stats = tape.stats()
        assert stats["requests_split"] > 0
        assert stats["spans_dropped_too_large"] == 1
        assert stats["spans_exported"] == stats["spans_queued"] - 1 == 42
        assert _stored(server) == (42, 42)


def _timed_runs(tape, n: int) -> float:
    worst = 0.0
    for i in range(n):
        start = time.monotonic()
        with tape.run(agent="a", run_id=f"r{i}") as run:
            with run.model_call("m", [{"role": "user", "content": "hi"}]) as call:
                call.finish(text="ok")
        worst = max(worst, time.monotonic() - start)
    return worst


ENQUEUE_MS = 2000


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_span_end_waits_at_most_the_enqueue_timeout_when_the_receiver_is_down(protocol):
    endpoint = f"http://127.0.0.1:{free_port()}" if protocol != "grpc" else f"127.0.0.1:{free_port()}"
    tape = otel_agenttape.setup(endpoint, protocol, insecure=True if protocol == "grpc" else None, queue_options={
        "max_queue_size": 16, "max_export_batch_size": 8, "enqueue_timeout_millis": ENQUEUE_MS,
        "shutdown_timeout_millis": 3000})
    worst = _timed_runs(tape, 60)  # each run: 3 spans (run, model call, checkpoint), all in one call
    start = time.monotonic()
    tape.shutdown()
    took = time.monotonic() - start
    stats = tape.stats()
    # before: a run end waited for the run span and again for its checkpoint (2 x 2 s and more)
    assert worst < 1.6 * ENQUEUE_MS / 1000, worst
    assert took < 3 + 2, took
    assert stats["spans_dropped_queue_full"] > 0
    assert stats["processor_errors"] == stats["api_errors"] == 0


def test_a_slow_receiver_does_not_hold_the_agent_to_its_pace_and_shutdown_keeps_its_bound():
    slow = SlowOtlpHttp(delay=0.5)  # 16 spans per 0.5 s: the agent would be held to 32 spans/s
    try:
        tape = otel_agenttape.setup(slow.url, seal=False, queue_options={
            "max_queue_size": 64, "max_export_batch_size": 16, "enqueue_timeout_millis": 1000,
            "shutdown_timeout_millis": 3000})
        start = time.monotonic()
        for i in range(2000):
            with tape.run(agent="a", run_id=f"r{i}") as run:
                run.set_output("ok")
        produced = time.monotonic() - start
        start = time.monotonic()
        tape.shutdown()
        took = time.monotonic() - start
        stats = tape.stats()
    finally:
        slow.close()
    assert produced < 15, produced  # held to the receiver's pace it takes over 60 s
    assert took < 3 + 2, took
    assert stats["spans_dropped_queue_full"] > 0  # no outbox: dropped, and counted
    accounted = (stats["spans_exported"] + stats["spans_export_failed"] + stats["spans_dropped_shutdown"]
                 + stats["spans_dropped_queue_full"])
    assert accounted == 2000


def test_stats_tell_agent_spans_from_checkpoints_and_count_each_span_once():
    """Every run is a tape whose end is signed: a one-span run exports two spans (the run and its
    checkpoint). The counters say which is which, and each span is counted in exactly one outcome."""
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens: every export fails
    tape = otel_agenttape.setup(endpoint, timeout=0.5, queue_options={"shutdown_timeout_millis": 2000})
    for i in range(50):
        with tape.run(agent="a", run_id=f"one-{i}") as run:
            run.set_output("ok")
    tape.shutdown()
    stats = tape.stats()
    assert stats["spans_sealed"] == 50 and stats["checkpoints"] == 50
    assert stats["spans_queued"] == stats["spans_sealed"] + stats["checkpoints"] == 100
    outcomes = (stats["spans_exported"] + stats["spans_export_failed"] + stats["spans_dropped_shutdown"]
                + stats["spans_dropped_too_large"] + stats["spans_to_outbox"])
    assert outcomes == stats["spans_queued"]


def test_with_an_outbox_a_slow_receiver_costs_no_span_and_shutdown_keeps_its_bound(tmp_path):
    slow = SlowOtlpHttp(delay=0.5)
    try:
        tape = otel_agenttape.setup(slow.url, seal=False, outbox=tmp_path / "outbox", queue_options={
            "max_queue_size": 64, "max_export_batch_size": 16, "shutdown_timeout_millis": 3000})
        start = time.monotonic()
        for i in range(2000):
            with tape.run(agent="a", run_id=f"r{i}") as run:
                run.set_output("ok")
        produced = time.monotonic() - start
        start = time.monotonic()
        tape.shutdown()
        took = time.monotonic() - start
        stats = tape.stats()
    finally:
        slow.close()
    assert produced < 15, produced
    assert took < 3 + 2, took
    assert stats["spans_dropped_queue_full"] == stats["spans_dropped_shutdown"] == stats["outbox_dropped_full"] == 0
    # what the receiver did not take yet is in the outbox, for this or the next process to send
    assert stats["spans_exported"] + stats["outbox_spans_delivered"] + stats["outbox_spans_pending"] == 2000
    assert stats["spans_spilled"] > 0
