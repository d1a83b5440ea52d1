"""Helpers shared by the integrity tests: SDK tapes, OTLP encodings, store round trips."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_agenttape.capture.sealing import SealingSpanProcessor


def sealed_provider(limits: SpanLimits | None = None, **seal_opts: Any):
    exporter = InMemorySpanExporter()
    sealer = SealingSpanProcessor(SimpleSpanProcessor(exporter), **seal_opts)
    provider = TracerProvider(span_limits=limits or SpanLimits(max_attributes=10_000, max_events=10_000,
                                                                max_links=1000, max_event_attributes=10_000,
                                                                max_link_attributes=10_000))
    provider.add_span_processor(sealer)
    return provider, sealer, exporter


def proto_spans(req: Any) -> list[Any]:
    return [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]


def otlp_json(req: Any) -> bytes:
    """OTLP/JSON as the spec wants it: hex ids, int64 as strings (protobuf JSON mapping otherwise)."""
    doc = json_format.MessageToDict(req)

    def hexify(obj: dict[str, Any], key: str) -> None:
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()

    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    hexify(sp, k)
                for lk in sp.get("links", []):
                    hexify(lk, "traceId")
                    hexify(lk, "spanId")
    return orjson.dumps(doc)


def encode(spans: Iterable[Any]) -> Any:
    return encode_spans(list(spans))


def edit_store(db: str, sql: str, params: Sequence[Any] = ()) -> None:
    """Run one statement on a store file (a test's tampering)."""
    import duckdb

    con = duckdb.connect(db)
    try:
        con.execute(sql, list(params))
    finally:
        con.close()


def stored_attributes(db: str, seq: int) -> dict:
    """The stored typed attributes of the span at chain seq ``seq``."""
    import duckdb

    con = duckdb.connect(db, read_only=True)
    try:
        (text,) = con.execute("SELECT attributes FROM spans WHERE chain_seq = ?", [seq]).fetchone()
    finally:
        con.close()
    return orjson.loads(text)


def set_stored_attributes(db: str, seq: int, text: str) -> None:
    edit_store(db, "UPDATE spans SET attributes = ? WHERE chain_seq = ?", [text, seq])
