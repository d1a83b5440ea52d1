"""Erasing a trace reaches the content its log records hold, in the store and in every copy: the
Parquet export, a folder lake, the receiver's write-ahead log and an agent's outbox (its ``logs``
lane). Sealed log records keep their commitments, so the copies read as stores still verify."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agenttape
from otel_agenttape import outboxfile, walfile
from otel_agenttape.integrity.note import Signer
from otel_agenttape.store.lake.publish import LakePublisher
from otel_agenttape.store.parquet import export_parquet
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.verification import verify_store
from test_erasure_copies import _all_bytes

SECRET = "my passport number is X1234567"
KEPT = "the other trace keeps this"
KEY = Signer.generate("erasure-logs-test")


def _store_bytes(db: Path) -> bytes:
    """The file's bytes and its decoded log rows (DuckDB compresses strings: a raw scan can miss one)."""
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT body, attributes FROM log_records").fetchall()
    return db.read_bytes() + str(rows).encode()


def _recorded() -> tuple[bytes, bytes, str]:
    """OTLP request bodies of two model-call traces whose content is only in sealed log records."""
    spans = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=spans, service_name="logs-app", seal_options={"signing_key": KEY})
    logs = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=tape.tracer_provider.resource)
    provider.add_log_record_processor(tape.log_processor())
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    tracer = tape.tracer_provider.get_tracer("genai")
    logger = provider.get_logger("genai")
    for text in (SECRET, KEPT):
        with tracer.start_as_current_span("chat gpt-x"):
            logger.emit(LogRecord(event_name="gen_ai.user.message", body={"content": text}))
            logger.emit(LogRecord(event_name="gen_ai.client.inference.operation.details",
                                  attributes={"gen_ai.output.messages": f'[{{"content": "re: {text}"}}]'}))
    tape.force_flush()
    tape.shutdown()
    finished = spans.get_finished_spans()
    secret_trace = next(f"{r.log_record.trace_id:032x}" for r in logs.get_finished_logs()
                        if SECRET in str(r.log_record.body))
    return (encode_spans(finished).SerializeToString(), encode_logs(logs.get_finished_logs()).SerializeToString(),
            secret_trace)


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    d = tmp_path_factory.mktemp("logcopies")
    traces, logs, trace_id = _recorded()
    db = str(d / "tapes.duckdb")
    store = Store(db)
    store.write_traces([traces])
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    store.write_logs([ExportLogsServiceRequest.FromString(logs)])
    LakePublisher(store, str(d / "lake"), "r0").publish_all()
    store.close()
    with otel_agenttape.open(db) as tapes:
        export_parquet(tapes.reader, str(d / "export"))
    wal = Path(db + ".otlpwal")
    wal.mkdir()
    (wal / walfile.segment_name(1)).write_bytes(walfile.record_header(walfile.KIND_TRACES, traces) + traces
                                                + walfile.record_header(walfile.KIND_LOGS, logs) + logs)
    spans_lane, _ = outboxfile.open_lane(d / "outbox")
    spans_lane.append(outboxfile.KIND_TRACES, 4, traces)
    spans_lane.close()
    logs_lane, _ = outboxfile.open_lane(d / "outbox" / outboxfile.LOGS_FOLDER)
    logs_lane.append(outboxfile.KIND_LOGS, 4, logs)
    logs_lane.close()
    places = {"store": Path(db), "export": d / "export", "lake": d / "lake", "wal": wal, "outbox": d / "outbox"}
    before = {k: (_store_bytes(p) if p.is_file() else _all_bytes(p)) for k, p in places.items()}
    with otel_agenttape.open(db) as tapes:
        result = tapes.erase(trace=trace_id, reason="GDPR art. 17 request #9", signing_key=KEY,
                             parquet=[str(d / "export")], lakes=[str(d / "lake")], outbox=[str(d / "outbox")])
    return {"db": db, "places": places, "before": before, "result": result}


@pytest.mark.parametrize("place", ["store", "export", "lake", "wal", "outbox"])
def test_log_content_is_in_each_place_before_and_in_no_file_after(copies, place) -> None:
    p = copies["places"][place]
    assert SECRET.encode() in copies["before"][place]
    after = _store_bytes(p) if p.is_file() else _all_bytes(p)
    assert SECRET.encode() not in after
    assert KEPT.encode() in after  # the other trace is untouched


def test_the_erasure_counts_each_places_log_values(copies) -> None:
    result = copies["result"]
    assert result["values"] == 2, result  # the body and the output messages of the erased trace's records
    assert all(c["values"] == 2 for c in result["copies"]), result["copies"]


@pytest.mark.parametrize("place", ["store", "export", "lake"])
def test_each_place_read_as_a_store_verifies_with_the_erasure_reported(copies, place) -> None:
    with otel_agenttape.open(str(copies["places"][place])) as tapes:
        reports = verify_store(tapes.reader, verifiers=[KEY.verifier()])
    assert len(reports) == 2 and all(r.valid for r in reports), [(r.chain_id, r.reason) for r in reports]
    assert sorted(r.erased_values for r in reports) == [0, 2]


def test_an_iceberg_lake_loses_the_log_content_and_still_verifies(tmp_path) -> None:
    pytest.importorskip("pyiceberg")
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    from otel_agenttape.store.lake.iceberg_publish import IcebergPublisher

    traces, logs, trace_id = _recorded()
    url = f"iceberg+sql://{tmp_path}/catalog.db#tapes"
    db = str(tmp_path / "ice.duckdb")
    store = Store(db)
    store.write_traces([traces])
    store.write_logs([ExportLogsServiceRequest.FromString(logs)])
    IcebergPublisher(store, url, "r0").publish_all()
    store.close()
    lake_dir = tmp_path / "warehouse" if (tmp_path / "warehouse").exists() else tmp_path
    assert SECRET.encode() in _all_bytes(lake_dir)
    with otel_agenttape.open(db) as tapes:
        done = tapes.erase(trace=trace_id, reason="GDPR art. 17 request #10", signing_key=KEY, lakes=[url])
    (ice,) = done["copies"]
    assert ice["kind"] == "iceberg" and ice["values"] == 2, ice
    everything = b"".join(_all_bytes(p) for p in tmp_path.iterdir() if p.is_dir())
    assert SECRET.encode() not in everything and KEPT.encode() in everything
    with otel_agenttape.open(url) as tapes:
        reports = verify_store(tapes.reader, verifiers=[KEY.verifier()])
    assert all(r.valid for r in reports) and sorted(r.erased_values for r in reports) == [0, 2], \
        [(r.chain_id, r.reason) for r in reports]
