"""Shutdown and force_flush against backends that are down: the official OTLP/HTTP exporter against a
port where nothing listens and a listener that accepts but never answers, both on 127.0.0.1.

Timing bounds are generous (the machine is shared): they only separate "bounded by the configured
timeout" from the old behaviour of several seconds per queued batch.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time

import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import otel_agenttape
from otel_agenttape.capture.pipeline import QueueingSpanProcessor
from test_capture_e2e import http_collector  # noqa: F401 - a fixture

SHUTDOWN_MS = 2000
BOUND = 2 * SHUTDOWN_MS / 1000  # shutdown must return well within twice its configured timeout


@pytest.fixture(autouse=True)
def _quiet_exporter():
    # the exporter logs every retry; the failures are what these tests are about
    logger = logging.getLogger("opentelemetry.exporter")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


@pytest.fixture
def dead_endpoint():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there any more: connections are refused
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def blackhole_endpoint():
    """Accepts connections and reads nothing, answers nothing."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.1)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conns.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(2)
    for conn in conns:
        conn.close()
    server.close()


def _produce(tape, runs: int) -> None:
    for i in range(runs):
        with tape.run(agent="a", run_id=f"r{i}") as run:  # one span per run (sealing is off)
            run.set_output("ok")


def _accounted(stats: dict) -> int:
    return (stats["spans_exported"] + stats["spans_export_failed"] + stats["spans_dropped_shutdown"]
            + stats["spans_dropped_queue_full"])


@pytest.mark.parametrize("backend", ["dead_endpoint", "blackhole_endpoint"])
def test_shutdown_is_bounded_by_its_timeout_and_accounts_for_every_span(backend, request):
    endpoint = request.getfixturevalue(backend)
    tape = otel_agenttape.setup(endpoint, seal=False, queue_options={
        "max_export_batch_size": 64, "shutdown_timeout_millis": SHUTDOWN_MS})
    _produce(tape, 300)  # 5 batches: about 7 s each (refused) or 10 s each (no answer) if retried in turn
    start = time.monotonic()
    tape.shutdown()
    elapsed = time.monotonic() - start
    stats = tape.stats()
    assert elapsed < BOUND, elapsed
    assert stats["spans_exported"] == 0 and stats["queue_length"] == 0
    assert stats["spans_dropped_shutdown"] > 0
    assert stats["spans_queued"] == 300 == _accounted(stats)
    assert stats["processor_errors"] == 0 and stats["api_errors"] == 0


def test_shutdown_stops_at_the_first_failure_when_the_exporter_gives_up_early(dead_endpoint):
    # exporter timeout 0.5 s: the first batch fails at once; the rest is not tried batch after batch
    tape = otel_agenttape.setup(dead_endpoint, seal=False, timeout=0.5, queue_options={"max_export_batch_size": 32})
    _produce(tape, 600)  # about 19 batches of about 0.5 s each: plenty still queued after the first failure
    give_up = time.monotonic() + 10
    while tape.stats()["export_failures"] == 0 and time.monotonic() < give_up:
        time.sleep(0.02)
    before = tape.stats()
    assert before["export_failures"] > 0 and before["queue_length"] > 0
    start = time.monotonic()
    tape.shutdown()
    elapsed = time.monotonic() - start
    stats = tape.stats()
    assert elapsed < 5, elapsed  # default budget is 30 s
    # at most the batch already in flight finishes; the queue is not tried again batch after batch
    assert stats["export_batches"] <= before["export_batches"] + 1 and stats["spans_dropped_shutdown"] > 0
    assert _accounted(stats) == 600


@pytest.mark.parametrize("backend", ["dead_endpoint", "blackhole_endpoint"])
def test_force_flush_returns_false_within_its_timeout_on_a_dead_backend(backend, request):
    endpoint = request.getfixturevalue(backend)
    tape = otel_agenttape.setup(endpoint, seal=False, queue_options={
        "schedule_delay_millis": 60000, "shutdown_timeout_millis": SHUTDOWN_MS})
    _produce(tape, 300)
    start = time.monotonic()
    assert tape.force_flush(timeout_millis=1000) is False
    assert time.monotonic() - start < 3
    tape.shutdown()
    assert _accounted(tape.stats()) == 300


def test_force_flush_is_false_when_the_export_failed_even_though_the_queue_is_empty(dead_endpoint):
    tape = otel_agenttape.setup(dead_endpoint, seal=False, timeout=0.5)
    _produce(tape, 50)
    start = time.monotonic()
    assert tape.force_flush(timeout_millis=20000) is False  # returns on the failure, not the timeout
    assert time.monotonic() - start < 10
    stats = tape.stats()
    assert stats["queue_length"] == 0 and stats["spans_export_failed"] == 50
    tape.shutdown()


def test_force_flush_is_true_against_a_live_collector(http_collector):  # noqa: F811 - the fixture
    endpoint, collected = http_collector
    tape = otel_agenttape.setup(endpoint, seal=False, queue_options={"max_export_batch_size": 64})
    _produce(tape, 300)
    assert tape.force_flush(timeout_millis=30000) is True
    assert len(collected.spans()) == 300
    _produce(tape, 10)
    tape.shutdown()  # a healthy backend gets everything at shutdown too
    stats = tape.stats()
    assert len(collected.spans()) == 310 == stats["spans_exported"] == _accounted(stats)
    assert stats["spans_dropped_shutdown"] == 0


AT_EXIT_AGENT = """
import sys, time, otel_agenttape
tape = otel_agenttape.setup(sys.argv[1], seal=False, queue_options={"max_export_batch_size": 64,
                                                                     "shutdown_timeout_millis": %d})
for i in range(300):
    with tape.run(agent="x", run_id=f"n{i}") as run:
        run.set_output("ok")
print("done", flush=True)
"""  # no tape.shutdown(): the SDK's at-exit hook shuts the provider down


@pytest.mark.parametrize("backend", ["dead_endpoint", "blackhole_endpoint"])
def test_exit_without_shutdown_is_bounded_too(backend, request):
    endpoint = request.getfixturevalue(backend)
    proc = subprocess.Popen([sys.executable, "-c", AT_EXIT_AGENT % SHUTDOWN_MS, endpoint],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "done"
        start = time.monotonic()
        assert proc.wait(60) == 0
        assert time.monotonic() - start < BOUND + 1  # + interpreter teardown
    finally:
        proc.kill()
        proc.wait()


class _Stuck(SpanExporter):
    """Blocks in export until released and ignores shutdown: the worst case for shutdown."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.shutdown_calls = 0

    def export(self, spans):
        self.entered.set()
        self.release.wait(30)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.shutdown_calls += 1


def test_a_batch_still_in_flight_at_the_deadline_is_counted_once_as_dropped():
    exporter = _Stuck()
    queue = QueueingSpanProcessor(exporter, max_export_batch_size=10, schedule_delay_millis=10,
                                  shutdown_timeout_millis=500)
    tape = otel_agenttape.setup(exporter=False)
    tape.tracer_provider.add_span_processor(queue)
    tracer = tape.tracer_provider.get_tracer("t")
    for i in range(25):
        tracer.start_span(f"s{i}").end()
    assert exporter.entered.wait(5)
    start = time.monotonic()
    queue.shutdown()
    assert time.monotonic() - start < 2
    assert exporter.shutdown_calls == 1
    stats = queue.stats_source()
    assert stats["spans_dropped_shutdown"] == 25 and stats["queue_length"] == 0
    exporter.release.set()  # the late answer must not be counted a second time
    time.sleep(0.3)
    stats = queue.stats_source()
    assert stats["spans_exported"] == 0 and stats["spans_dropped_shutdown"] == 25
    tracer.start_span("late").end()
    assert queue.stats_source()["spans_dropped_shutdown"] == 26


def test_force_flush_waits_only_for_what_was_queued_before_it():
    exporter = _Stuck()
    queue = QueueingSpanProcessor(exporter, max_export_batch_size=10, schedule_delay_millis=10)
    tape = otel_agenttape.setup(exporter=False)
    tape.tracer_provider.add_span_processor(queue)
    tracer = tape.tracer_provider.get_tracer("t")
    tracer.start_span("first").end()
    assert exporter.entered.wait(5)
    start = time.monotonic()
    assert queue.force_flush(300) is False  # the export does not come back in time
    assert time.monotonic() - start < 2
    exporter.release.set()
    assert queue.force_flush(5000) is True
    assert queue.stats_source()["spans_exported"] == 1
    queue.shutdown()


def test_negative_shutdown_timeout_is_refused():
    with pytest.raises(ValueError):
        QueueingSpanProcessor(_Stuck(), shutdown_timeout_millis=-1)


class _Slow(SpanExporter):
    """Takes 30 ms an export (an HTTP round trip to a busy receiver) and records each batch."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, int]] = []

    def export(self, spans):
        time.sleep(0.03)
        self.batches.append((time.monotonic(), len(spans)))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def test_spans_ending_during_an_export_wait_for_the_next_tick_not_a_request_each():
    """An app that ends a span every few ms while each export takes 30 ms: the worker sends what was
    queued when it woke and sleeps until the next tick, so requests follow the schedule delay (one
    every 200 ms), not the pace of the exports (one per span or two, each costing the app a request's
    CPU). Nothing waits longer than about one tick, and a flush still sends everything."""
    exporter = _Slow()
    queue = QueueingSpanProcessor(exporter, max_export_batch_size=512, schedule_delay_millis=200)
    tape = otel_agenttape.setup(exporter=False)
    tape.tracer_provider.add_span_processor(queue)
    tracer = tape.tracer_provider.get_tracer("t")
    ended: list[float] = []
    start = time.monotonic()
    while time.monotonic() - start < 1.0:
        tracer.start_span("call").end()
        ended.append(time.monotonic())
        time.sleep(0.003)
    assert queue.force_flush(5000) is True
    n = len(ended)
    assert sum(c for _, c in exporter.batches) == n == queue.stats_source()["spans_exported"]
    assert len(exporter.batches) <= 10, exporter.batches  # about 1.0 s / 0.2 s, not 1.0 s / 0.03 s
    # the latest any span waited: from its end to the export that carried it
    i, worst = 0, 0.0
    for t, count in exporter.batches:
        worst = max(worst, t - ended[i])
        i += count
    assert worst < 1.0, worst
    queue.shutdown()
