"""Local node-record sinks for users without a collector: in memory and JSONL (append-only)."""

from __future__ import annotations

import os
import threading
from typing import Protocol

import orjson

from otel_agenttape.capture.jsonutil import _default
from otel_agenttape.capture.records import NodeRecord


class NodeSink(Protocol):
    def write(self, record: NodeRecord) -> None: ...


class InMemorySink:
    """Keeps records in memory; query by node type ("model" / "tool")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[NodeRecord] = []

    def write(self, record: NodeRecord) -> None:
        with self._lock:
            self._records.append(record)

    def records(self, node_type: str | None = None) -> list[NodeRecord]:
        with self._lock:
            if node_type is None:
                return list(self._records)
            return [r for r in self._records if r.node_type == str(node_type).lower()]

    def clear(self) -> None:
        with self._lock:
            self._records.clear()


class JsonlSink:
    """One node record per JSON line, appended and flushed per record (a persistent audit artifact)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()

    def write(self, record: NodeRecord) -> None:
        line = orjson.dumps(record.to_dict(), default=_default, option=orjson.OPT_NON_STR_KEYS) + b"\n"
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)

    def read(self) -> list[dict]:
        """All records written so far, oldest first."""
        if not os.path.exists(self.path):
            return []
        with open(self.path, "rb") as fh:
            return [orjson.loads(line) for line in fh if line.strip()]
