"""Log records sealed into the span they are emitted in (``Tape.log_processor()``), through a real
`agenttape serve` on 127.0.0.1: verify covers them, catches an altered, removed or added log row at the
span's seq, and says nothing of records it could not cover (no span, or written after the span ended),
which capture counts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import duckdb
import pytest
from faults_util import serve, stop
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

import otel_agenttape


def _verify(db: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "verify", "--db", db, "--json"],
                          capture_output=True, text=True, timeout=120)
    out = json.loads(done.stdout)
    assert (done.returncode == 0) == out["valid"], done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One app: a model call span with two content log events in it, one log after it ended and one
    with no span; redaction on."""
    db = str(tmp_path_factory.mktemp("logs") / "logs.duckdb")
    proc, info = serve(db)
    try:
        tape = otel_agenttape.setup(endpoint=info["url"], service_name="logs-app", redact=True)
        provider = LoggerProvider(resource=tape.tracer_provider.resource)
        assert tape.log_processor() is tape.log_processor()  # one per tape
        provider.add_log_record_processor(tape.log_processor())
        provider.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=info["url"] + "/v1/logs")))
        logger = provider.get_logger("genai-app")
        tracer = tape.tracer_provider.get_tracer("some.instrumentation")
        with tracer.start_as_current_span("chat gpt-x") as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            logger.emit(LogRecord(event_name="gen_ai.user.message", attributes={"gen_ai.system": "openai"},
                                  body={"content": "Weather in Paris? Mail me at ann@example.com"}))
            logger.emit(LogRecord(event_name="gen_ai.client.inference.operation.details",
                                  attributes={"gen_ai.output.messages": '[{"role":"assistant","content":"57F"}]'}))
        logger.emit(LogRecord(event_name="late", body="written after the span ended", context=None,
                              trace_id=span.get_span_context().trace_id, span_id=span.get_span_context().span_id))
        logger.emit(LogRecord(event_name="no.span", body="outside any span"))
        assert tape.force_flush()
        stats = tape.stats()
        tape.shutdown()
        provider.shutdown()
    finally:
        code, err = stop(proc)
    assert code == 0, err
    return db, stats


def test_logs_in_a_live_span_are_sealed_and_the_others_counted(recorded):
    db, stats = recorded
    assert stats["logs_sealed"] == 2 and stats["logs_unsealed"] == 2 and stats["log_sealing_errors"] == 0, stats
    with duckdb.connect(db, read_only=True) as con:
        rows = dict(con.execute("SELECT event_name, body FROM log_records").fetchall())
        (events,) = con.execute("SELECT attributes FROM span_events WHERE name = 'agenttape.logs'").fetchone()
    assert set(rows) == {"gen_ai.user.message", "gen_ai.client.inference.operation.details", "late", "no.span"}
    assert "ann@example.com" not in rows["gen_ai.user.message"]  # redacted like spans before it was sealed
    assert json.loads(events)["agenttape.logs.count"] == {"i": "2"}
    report = _verify(db)
    assert report["valid"], report


@pytest.mark.parametrize("change, finding", [
    ("UPDATE log_records SET attributes = replace(attributes, '57F', '75F') WHERE event_name LIKE 'gen_ai.client%'",
     "edited or added"),
    ("UPDATE log_records SET body = replace(body, 'Paris', 'Lyon') WHERE event_name = 'gen_ai.user.message'",
     "edited or added"),
    ("UPDATE log_records SET observed_time_unix_nano = observed_time_unix_nano + 1 WHERE event_name = 'gen_ai.user.message'",
     "edited or added"),
    # its seal mark removed too: the sealed record is missing
    ("UPDATE log_records SET attributes = '{}' WHERE event_name = 'gen_ai.user.message'", "missing: 1 of 2"),
    ("DELETE FROM log_records WHERE event_name = 'gen_ai.user.message'", "missing: 1 of 2"),
    ("INSERT INTO log_records SELECT * REPLACE (log_id || 'x' AS log_id, 'gen_ai.choice' AS event_name) "
     "FROM log_records WHERE event_name = 'gen_ai.user.message'", "edited or added"),
])
def test_a_changed_sealed_log_row_is_caught_at_its_spans_seq(recorded, tmp_path, change, finding):
    db = str(tmp_path / "changed.duckdb")
    shutil.copy(recorded[0], db)
    with duckdb.connect(db) as con:
        con.execute(change)
        (seq,) = con.execute("SELECT chain_seq FROM spans WHERE name = 'chat gpt-x'").fetchone()
    report = _verify(db)
    broken = [c for c in report["chains"] if not c["valid"]]
    assert len(broken) == 1 and broken[0]["first_broken_index"] == seq, report
    assert finding in broken[0]["reason"], broken[0]["reason"]


def test_an_unsealed_log_row_is_not_claimed_as_covered(recorded, tmp_path):
    """A record written after its span ended is stored, not covered: changing it is not a finding."""
    db = str(tmp_path / "late.duckdb")
    shutil.copy(recorded[0], db)
    with duckdb.connect(db) as con:
        con.execute("UPDATE log_records SET body = '{\"s\":\"changed\"}' WHERE event_name IN ('late', 'no.span')")
    assert _verify(db)["valid"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_agenttape.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_erasing_a_trace_removes_its_log_content_and_keeps_the_proof(recorded, tmp_path):
    db = str(tmp_path / "erased.duckdb")
    shutil.copy(recorded[0], db)
    with duckdb.connect(db, read_only=True) as con:
        (trace,) = con.execute("SELECT trace_id FROM spans WHERE name = 'chat gpt-x'").fetchone()
    done = _cli("erase", "--db", db, "--trace", trace, "--reason", "the user asked", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["values"] == 2 and result["spans"] == 1, result  # the two sealed records' content
    assert result["unsealed_values"] == 1, result  # the late record's body, under the same span
    raw = open(db, "rb").read()
    for text in (b"Weather in Paris", b"57F", b"written after the span ended"):
        assert text not in raw, text
    report = _verify(db)
    assert report["valid"], report
    (chain,) = [c for c in report["chains"] if c["erased_values"]]
    assert chain["erased_values"] == 2 and chain["erasures"], chain
    with duckdb.connect(db, read_only=True) as con:
        (attrs,) = con.execute("SELECT attributes FROM spans WHERE name = 'agenttape.erasure'").fetchone()
    assert "Paris" not in attrs and "57F" not in attrs  # the record names no content


def test_a_log_value_erased_without_a_record_is_caught(recorded, tmp_path):
    """Replacing a sealed log record's value by its commitment (what erasure does) without an erasure
    record that names it is a finding at the span's seq."""
    from otel_agenttape.integrity import log_leaf

    db = str(tmp_path / "forged.duckdb")
    shutil.copy(recorded[0], db)
    with duckdb.connect(db) as con:
        log_id, body, attrs = con.execute("SELECT log_id, body, attributes FROM log_records "
                                          "WHERE event_name = 'gen_ai.user.message'").fetchone()
        _, new_attrs, erased = log_leaf.erase_log(json.loads(body), json.loads(attrs))
        assert erased
        con.execute("UPDATE log_records SET body = NULL, attributes = ? WHERE log_id = ?",
                    [json.dumps(new_attrs), log_id])
        (seq,) = con.execute("SELECT chain_seq FROM spans WHERE name = 'chat gpt-x'").fetchone()
    report = _verify(db)
    (broken,) = [c for c in report["chains"] if not c["valid"]]
    assert broken["first_broken_index"] == seq and "no erasure record names it" in broken["reason"], broken
