"""Write the log-record leaf test vectors in ``tests/vectors/log_leaf/`` (run:
``python tests/vectors/make_log_leaf_vectors.py``; ``--check`` compares instead of writing).

Each vector is one log record emitted with the OpenTelemetry Python SDK inside a live span and sealed
by ``SealingLogRecordProcessor`` (fixed salts: sha256 of the vector name and a counter), exported as
OTLP (shown as OTLP/JSON with hex ids) and turned into a ``log_records`` row by the receiver's decoder
and the store's row conversion. The file records the record in both forms, its canonical projection
(``integrity/log_leaf.py``: body and content attributes as salted commitments), the leaf (sha256 of
that projection's RFC 8785 bytes) and what the span's ``agenttape.logs`` event names. Ids, times and
the resource are fixed, so the output is reproducible.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # make_leaf_vectors
sys.path.insert(0, str(HERE.parent))  # tests/ (integrity_support, which make_leaf_vectors imports)

import orjson
from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator

from otel_agenttape import semconv
from otel_agenttape.capture.log_sealing import LogLeaves, SealingLogRecordProcessor
from otel_agenttape.codec.otlp_decode import JSON, decode_logs
from otel_agenttape.integrity import log_leaf
from otel_agenttape.integrity.jcs import dumps_ordered
from otel_agenttape.integrity.leaf import parse_commitments
from otel_agenttape.store.rows import logs_to_tables

from make_leaf_vectors import write_or_check  # noqa: E402

TRACE_ID = 0x5B8EFFF798038103D269B633813FC60C
SPAN_ID = 0xEEE19B7EC3C1B174
TIME, OBSERVED = 1_764_450_000_123_456_789, 1_764_450_000_223_456_789
RESOURCE = Resource({"service.name": "log-vectors", "telemetry.sdk.language": "python"})

# name -> the record's fields (besides ids and times)
VECTORS: dict[str, dict[str, Any]] = {
    "log_text_body": {  # a GenAI event whose body is its content
        "event_name": "gen_ai.user.message", "severity_number": SeverityNumber.INFO, "severity_text": "INFO",
        "body": "Weather in Paris? caf\u00e9 \u65e5\u672c \"quoted\" \\ tab\t", "attributes": {"gen_ai.system": "openai"},
    },
    "log_map_body_and_content_attribute": {  # a map body and a content attribute, both salted
        "event_name": "gen_ai.client.inference.operation.details", "severity_number": SeverityNumber.INFO,
        "severity_text": "", "body": {"content": "57F", "role": "assistant", "n": 2, "parts": ["a", 1.5, True]},
        "attributes": {semconv.GEN_AI_OUTPUT_MESSAGES: '[{"role":"assistant","content":"57F"}]',
                       "gen_ai.response.model": "gpt-4o-mini", "count": 3},
    },
    "log_no_content": {  # nothing salted: the leaf holds the values themselves
        "event_name": "", "severity_number": SeverityNumber.WARN, "severity_text": "WARNING", "body": None,
        "attributes": {"code.function": "plan", "retry": 1, "ratio": 0.5},
    },
}
LOG_COLS = ("trace_id", "span_id", "time_unix_nano", "observed_time_unix_nano", "severity_number",
            "severity_text", "event_name", "body", "attributes", "flags", "dropped_attributes_count")


class _FixedIds(IdGenerator):
    def generate_span_id(self) -> int:
        return SPAN_ID

    def generate_trace_id(self) -> int:
        return TRACE_ID


def _fixed_salts(name: str) -> Any:
    counter = iter(range(1 << 30))
    return lambda n: hashlib.sha256(f"{name}/{next(counter)}".encode()).digest()[:n]


def _otlp_json(req: Any) -> dict[str, Any]:
    """OTLP/JSON as the spec writes it: hex ids."""
    doc = json_format.MessageToDict(req)
    for rl in doc.get("resourceLogs", []):
        for sl in rl.get("scopeLogs", []):
            for rec in sl.get("logRecords", []):
                for key in ("traceId", "spanId"):
                    if key in rec:
                        rec[key] = base64.b64decode(rec[key]).hex()
    return doc


def vector(name: str) -> dict[str, Any]:
    fields = VECTORS[name]
    leaves = LogLeaves()
    exporter = InMemoryLogRecordExporter()
    logs = LoggerProvider(resource=RESOURCE)
    logs.add_log_record_processor(SealingLogRecordProcessor(leaves, salt_source=_fixed_salts(name)))
    logs.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    tracer = TracerProvider(resource=RESOURCE, id_generator=_FixedIds()).get_tracer("log-vectors")
    with tracer.start_as_current_span("chat gpt-4o-mini"):
        logs.get_logger("genai-app").emit(LogRecord(
            timestamp=TIME, observed_timestamp=OBSERVED, severity_number=fields["severity_number"],
            severity_text=fields["severity_text"], body=fields["body"], attributes=dict(fields["attributes"]),
            event_name=fields["event_name"] or None))
        named = leaves.take(SPAN_ID) or []
    (data,) = exporter.get_finished_logs()
    if leaves.unsealed or len(named) != 1:
        raise SystemExit(f"{name}: the record was not sealed into its span")
    req = encode_logs([data])
    doc = _otlp_json(req)
    tables = logs_to_tables([decode_logs(json.dumps(doc).encode(), JSON)])
    (row,) = [{c: r[c] for c in LOG_COLS} for r in tables.log_records.to_pylist()]
    raw = log_leaf.stored_attributes(row)
    salts_attr = raw.get(semconv.CHAIN_SALTS)
    salts, erased = parse_commitments(salts_attr["s"] if salts_attr else None, None)
    body = orjson.loads(row["body"]) if row["body"] else None
    from otel_agenttape.integrity.leaf import canonical_typed, leaf_attrs_stored

    proj = log_leaf.projection(
        trace_id=row["trace_id"], span_id=row["span_id"], time_unix_nano=row["time_unix_nano"],
        observed_time_unix_nano=row["observed_time_unix_nano"], severity_number=row["severity_number"],
        severity_text=row["severity_text"], event_name=row["event_name"],
        body=None if body is None else canonical_typed(body), attributes=leaf_attrs_stored(raw, skip_chain=True),
        flags=row["flags"], dropped_attributes_count=row["dropped_attributes_count"], salts=salts, erased=erased)
    canonical = dumps_ordered(proj)
    return {
        "description": f"{name}: a log record emitted with the OpenTelemetry Python SDK in a live span, sealed "
                       "into it (log leaf log1: body and content attributes as salted commitments)",
        "otlp_json": doc,
        "row": row,
        "projection": canonical.decode("utf-8"),
        "leaf": hashlib.sha256(canonical).hexdigest(),
        "span_logs_event": {log_leaf.LOGS_COUNT: len(named), log_leaf.LOGS_LEAVES: sorted(named)},
    }


def main(argv: list[str]) -> int:
    return write_or_check(HERE / "log_leaf", list(VECTORS), vector, "--check" in argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
