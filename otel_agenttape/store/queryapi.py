"""The server side of ``POST /api/query``: JSON {"sql", "params"} in, Arrow IPC stream out.

The receiver routes the request body here with a reader over its own database (``Store.reader()``),
so reads work while it holds the DuckDB file. Errors come back as JSON {"error": message}.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.ipc as ipc

from otel_agenttape.store.reader import ARROW_STREAM, QueryError, Reader
from otel_agenttape.store.sql import run_readonly_sql


def table_to_ipc(table: pa.Table) -> bytes:
    """Serialize a table as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _error(status: int, message: str) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps({"error": message}).encode()


def handle_query(reader: Reader, body: bytes) -> tuple[int, str, bytes]:
    """Answer one query request: (HTTP status, content type, body)."""
    try:
        req = json.loads(body or b"{}")
    except ValueError as exc:
        return _error(400, f"request body is not JSON: {exc}")
    if not isinstance(req, dict) or not isinstance(req.get("sql"), str):
        return _error(400, 'expected JSON {"sql": "...", "params": [...]}')
    params = req.get("params") or None
    if params is not None and not isinstance(params, list):
        return _error(400, "params must be a list")
    try:
        table = run_readonly_sql(reader, req["sql"], params)
    except QueryError as exc:
        return _error(400, str(exc))
    return 200, ARROW_STREAM, table_to_ipc(table)
