"""The server side of ``POST /api/query``: JSON {"sql", "params"} in, Arrow IPC stream out.

The receiver routes the request body here with a reader over its own database (``Store.reader()``),
so reads work while it holds the DuckDB file. Each query runs on a cursor of its own (``sql.py``), so
a long query holds no lock that other queries or ``/metrics`` wait for, and it is interrupted at the
server's timeout; a request may ask for a shorter one with ``"timeout": SECONDS``. Errors come back
as JSON {"error": message}: 400 for a refused or failed query, 408 for one interrupted at its timeout,
503 when every query slot is taken or the file is being rewritten (an erasure, retention) for longer
than a read waits (``store/rewrite_gate.py``). A reader's first request says ``"settle": true``: the
receiver first waits (a bounded time) until what it acknowledged before is in the store.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from otel_agenttape.store.reader import ARROW_STREAM, QueryError, Reader
from otel_agenttape.store.rewrite_gate import StoreBusy
from otel_agenttape.store.sql import DEFAULT_QUERY_TIMEOUT, QueryTimeout, run_readonly_sql


def table_to_ipc(table: pa.Table) -> bytes:
    """Serialize a table as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _error(status: int, message: str) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps({"error": message}).encode()


def busy(message: str) -> tuple[int, str, bytes]:
    """503: every query slot is taken, or the store is being rewritten for longer than a read waits."""
    return _error(503, message)


def handle_query(reader: Reader, body: bytes, timeout: float | None = DEFAULT_QUERY_TIMEOUT,
                 settle: Callable[[], Any] | None = None) -> tuple[int, str, bytes]:
    """Answer one query request: (HTTP status, content type, body). ``timeout`` is the server's limit
    (None or 0: none); the request's own ``timeout`` can only lower it. A request with ``"settle": true``
    (a reader's first) has ``settle()`` run first: the server then waits, for a bounded time, until
    what it acknowledged before is in the store."""
    try:
        req = json.loads(body or b"{}")
    except ValueError as exc:
        return _error(400, f"request body is not JSON: {exc}")
    if not isinstance(req, dict) or not isinstance(req.get("sql"), str):
        return _error(400, 'expected JSON {"sql": "...", "params": [...]}')
    params = req.get("params") or None
    if params is not None and not isinstance(params, list):
        return _error(400, "params must be a list")
    asked = req.get("timeout")
    if asked is not None:
        if isinstance(asked, bool) or not isinstance(asked, (int, float)) or asked <= 0:
            return _error(400, "timeout must be a positive number of seconds")
        timeout = min(float(asked), timeout) if timeout else float(asked)
    if req.get("settle") is True and settle is not None:
        settle()
    try:
        table = run_readonly_sql(reader, req["sql"], params, timeout=timeout)
    except QueryTimeout as exc:
        return _error(408, str(exc))
    except StoreBusy as exc:  # the file is being rewritten (an erasure, retention) for longer than a read waits
        return busy(str(exc))
    except QueryError as exc:
        return _error(400, str(exc))
    return 200, ARROW_STREAM, table_to_ipc(table)
