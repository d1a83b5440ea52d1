"""DuckDB tables of the tape store.

Ids are lowercase hex, times are integer nanoseconds since the epoch, and every attribute set is
stored as typed JSON (see ``otel_agenttape.codec.typed``) so that an int stays an int, a double a double
and bytes stay bytes: integrity verification recomputes span hashes from these rows.
Promoted columns copy what queries filter on out of ``attributes``; ``attributes`` stays the truth.
``docs/schema.md`` documents every column.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

SPANS_COLUMNS: list[tuple[str, str]] = [
    ("trace_id", "VARCHAR NOT NULL"),
    ("span_id", "VARCHAR NOT NULL"),
    ("parent_span_id", "VARCHAR"),  # NULL for a root span
    ("trace_state", "VARCHAR"),
    ("flags", "UINTEGER"),
    ("name", "VARCHAR NOT NULL"),
    ("kind", "TINYINT NOT NULL"),  # OTLP SpanKind: 0 unspecified .. 5 consumer
    ("start_time_unix_nano", "BIGINT NOT NULL"),
    ("end_time_unix_nano", "BIGINT NOT NULL"),
    ("duration_ms", "DOUBLE"),
    ("status_code", "TINYINT NOT NULL"),  # 0 unset, 1 ok, 2 error
    ("status_message", "VARCHAR"),
    ("attributes", "JSON NOT NULL"),
    ("dropped_attributes_count", "UINTEGER"),
    ("dropped_events_count", "UINTEGER"),
    ("dropped_links_count", "UINTEGER"),
    ("resource_id", "VARCHAR"),
    ("scope_name", "VARCHAR"),
    ("scope_version", "VARCHAR"),
    ("service_name", "VARCHAR"),
    # promoted from attributes
    ("operation_name", "VARCHAR"),
    ("agent_name", "VARCHAR"),
    ("run_id", "VARCHAR"),
    ("session_id", "VARCHAR"),
    ("parent_run_id", "VARCHAR"),
    ("run_status", "VARCHAR"),
    ("turn_id", "VARCHAR"),
    ("step", "BIGINT"),
    ("node_type", "VARCHAR"),  # 'model' | 'tool' | 'run' | NULL
    ("provider_name", "VARCHAR"),
    ("request_model", "VARCHAR"),
    ("response_model", "VARCHAR"),
    ("tool_name", "VARCHAR"),
    ("tool_call_id", "VARCHAR"),
    ("input_tokens", "BIGINT"),
    ("output_tokens", "BIGINT"),
    ("chain_id", "VARCHAR"),
    ("chain_seq", "BIGINT"),
    ("chain_prev", "VARCHAR"),
    ("chain_hash", "VARCHAR"),
    ("chain_epoch", "BIGINT"),
    ("date", "DATE NOT NULL"),  # UTC date of start_time_unix_nano; the Parquet partition key
]

SPAN_EVENTS_COLUMNS: list[tuple[str, str]] = [
    ("trace_id", "VARCHAR NOT NULL"),
    ("span_id", "VARCHAR NOT NULL"),
    ("event_index", "INTEGER NOT NULL"),  # position within the span, from 0
    ("time_unix_nano", "BIGINT NOT NULL"),
    ("name", "VARCHAR NOT NULL"),
    ("attributes", "JSON NOT NULL"),
    ("dropped_attributes_count", "UINTEGER"),
    ("date", "DATE NOT NULL"),
]

SPAN_LINKS_COLUMNS: list[tuple[str, str]] = [
    ("trace_id", "VARCHAR NOT NULL"),
    ("span_id", "VARCHAR NOT NULL"),
    ("link_index", "INTEGER NOT NULL"),
    ("linked_trace_id", "VARCHAR NOT NULL"),
    ("linked_span_id", "VARCHAR NOT NULL"),
    ("trace_state", "VARCHAR"),
    ("flags", "UINTEGER"),
    ("attributes", "JSON NOT NULL"),
    ("dropped_attributes_count", "UINTEGER"),
    ("date", "DATE NOT NULL"),
]

LOG_RECORDS_COLUMNS: list[tuple[str, str]] = [
    ("log_id", "VARCHAR NOT NULL"),  # sha256 of the record's content: re-sent records are stored once
    ("time_unix_nano", "BIGINT"),
    ("observed_time_unix_nano", "BIGINT"),
    ("severity_number", "INTEGER"),
    ("severity_text", "VARCHAR"),
    ("event_name", "VARCHAR"),
    ("body", "JSON"),  # one typed value, or NULL
    ("attributes", "JSON NOT NULL"),
    ("trace_id", "VARCHAR"),
    ("span_id", "VARCHAR"),
    ("flags", "UINTEGER"),
    ("dropped_attributes_count", "UINTEGER"),
    ("resource_id", "VARCHAR"),
    ("scope_name", "VARCHAR"),
    ("scope_version", "VARCHAR"),
    ("service_name", "VARCHAR"),
    ("date", "DATE NOT NULL"),
]

RESOURCES_COLUMNS: list[tuple[str, str]] = [
    ("resource_id", "VARCHAR NOT NULL"),  # sha256 hex of (schema_url, typed attributes JSON)
    ("attributes", "JSON NOT NULL"),
    ("schema_url", "VARCHAR"),
    ("dropped_attributes_count", "UINTEGER"),
]

TABLES: dict[str, list[tuple[str, str]]] = {
    "spans": SPANS_COLUMNS,
    "span_events": SPAN_EVENTS_COLUMNS,
    "span_links": SPAN_LINKS_COLUMNS,
    "log_records": LOG_RECORDS_COLUMNS,
    "resources": RESOURCES_COLUMNS,
}


def _column_ddl(col: str, typ: str) -> str:
    # JSON columns hold the bulk of a span (messages, tool results): zstd packs them about twice as
    # tight as DuckDB's default string compression; the other columns keep DuckDB's own choice
    # (dictionary, FSST, bit-packing), which suits ids, names and numbers better than zstd.
    if typ.startswith("JSON"):
        return f"{col} {typ} USING COMPRESSION zstd"
    return f"{col} {typ}"


def table_ddl(name: str) -> str:
    cols = ",\n  ".join(_column_ddl(col, typ) for col, typ in TABLES[name])
    return f"CREATE TABLE IF NOT EXISTS {name} (\n  {cols}\n)"


def column_names(name: str) -> list[str]:
    return [col for col, _ in TABLES[name]]
