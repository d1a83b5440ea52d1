"""Local node-record sinks for users without a collector: in memory and JSONL (append-only)."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from otel_agenttape.capture.records import NodeRecord
from otel_agenttape.capture.stats import CaptureStats
from otel_agenttape.codec.jsontext import json_default


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
        line = orjson.dumps(record.to_dict(), default=json_default, option=orjson.OPT_NON_STR_KEYS) + b"\n"
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


class RecordFanout:
    """Writes each completed node record to every sink in ``sinks`` (a list the owner may append to),
    redacted like the exported spans so secrets never reach disk either. A sink that raises is counted
    in ``sink_errors``; a record whose redaction fails is counted in ``redactor_errors`` and written
    nowhere (never unredacted when redaction was asked for)."""

    __slots__ = ("sinks", "redactor", "stats")

    def __init__(self, sinks: list[NodeSink], redactor: Callable[[str], str] | None, stats: CaptureStats) -> None:
        self.sinks = sinks
        self.redactor = redactor
        self.stats = stats

    def write(self, record: NodeRecord) -> None:
        if self.redactor is not None:
            try:
                record = self._redacted(record)
            except Exception:
                self.stats.incr("redactor_errors")
                return
        for sink in self.sinks:
            try:
                sink.write(record)
            except Exception:
                self.stats.incr("sink_errors")

    def _redacted(self, record: NodeRecord) -> NodeRecord:
        deep = self._redact_deep
        return dataclasses.replace(record, inputs=deep(record.inputs), outputs=deep(record.outputs),
                                   output_text=deep(record.output_text), reasoning_text=deep(record.reasoning_text),
                                   error=deep(record.error))

    def _redact_deep(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redactor(value) if value else value  # type: ignore[misc]
        if isinstance(value, dict):
            return {k: self._redact_deep(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._redact_deep(v) for v in value]
        return value
