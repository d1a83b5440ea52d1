"""Log records sealed into the span they are emitted in.

``SealingLogRecordProcessor`` goes first on a logger provider (``Tape.log_processor()``; the distro and
``register()`` add it). For each log record emitted while its span is live it draws a salt for the
body and for each content attribute (``agenttape.chain.salts`` on the record), computes the record's
leaf from its OTLP encoding (``integrity.log_leaf``), marks it ``agenttape.chain.log_sealed`` and
files the leaf hash under the span in
``LogLeaves`` (with a redactor, the body and content attributes of every record are redacted first,
as other instrumentations' spans are). When the span ends, the sealing span processor takes the span's leaves and adds an
``agenttape.logs`` event naming them (count and sorted hashes) before sealing the span, so the
span's chain entry covers its log records: ``agenttape verify`` then catches a log row edited,
removed or added under that span.

Not sealed (counted in ``logs_unsealed``): records with no span, or whose span has already ended
(a log written after ``span.end()``), or beyond ``MAX_PENDING_SPANS`` spans waiting to end. Nothing
here raises into the app: an internal error leaves the record unsealed and counts ``log_sealing_errors``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs import LogRecordProcessor

from otel_agenttape import semconv
from otel_agenttape.capture.redact import REDACT_KEYS, REDACT_PREFIXES, redact_value
from otel_agenttape.integrity import log_leaf
from otel_agenttape.integrity.leaf_fast import CONTENT_KEYS

MAX_PENDING_SPANS = 65536  # spans with sealed log records that have not ended yet


class LogLeaves:
    """The leaf hashes of log records filed under live spans, until each span ends (thread-safe).

    ``add`` checks that the span is still recording under the same lock ``take`` runs under, so a
    record is either taken with its span or reported unsealed, never filed under a span already sealed."""

    def __init__(self, max_spans: int = MAX_PENDING_SPANS) -> None:
        self._lock = threading.Lock()
        self._by_span: dict[int, list[str]] = {}
        self.max_spans = max_spans
        self.sealed = 0
        self.unsealed = 0

    def __bool__(self) -> bool:  # the sealer's cheap check on every span end
        return bool(self._by_span)

    def add(self, span: Any, span_id: int, leaf: str) -> bool:
        with self._lock:
            leaves = self._by_span.get(span_id)
            if not span.is_recording() or (leaves is None and len(self._by_span) >= self.max_spans):
                self.unsealed += 1
                return False
            if leaves is None:
                self._by_span[span_id] = [leaf]
            else:
                leaves.append(leaf)
            self.sealed += 1
            return True

    def take(self, span_id: int) -> list[str] | None:
        if not self._by_span:
            return None
        with self._lock:
            return self._by_span.pop(span_id, None)

    def count_unsealed(self) -> None:
        with self._lock:
            self.unsealed += 1

    def counts(self) -> dict[str, int]:
        return {"logs_sealed": self.sealed, "logs_unsealed": self.unsealed}


def logs_event_attributes(leaves: list[str]) -> dict[str, Any]:
    """The ``agenttape.logs`` event's attributes for a span's log leaves (sorted: export order does not matter)."""
    return {log_leaf.LOGS_COUNT: len(leaves), log_leaf.LOGS_LEAVES: tuple(sorted(leaves))}


class SealingLogRecordProcessor(LogRecordProcessor):
    """Seal each log record emitted in a live span into that span (see the module doc). Add it to the
    logger provider before the processor that exports."""

    def __init__(self, leaves: LogLeaves, *, content_keys: frozenset[str] | None = None,
                 salt_source: Callable[[int], bytes] | None = None,
                 redactor: Callable[[str], str] | None = None) -> None:
        self.leaves = leaves
        self.redactor = redactor
        self.content_keys = CONTENT_KEYS if content_keys is None else frozenset(content_keys)
        self.salt_source = salt_source or os.urandom
        self.errors = 0

    def on_emit(self, log_record: Any) -> None:
        try:
            self._seal(log_record)
        except Exception:  # never into the app
            self.errors += 1
            self.leaves.count_unsealed()

    def _redact(self, rec: Any) -> None:
        """The body and the content attributes redacted in place (every record, sealed or not)."""
        redactor = self.redactor
        if rec.body is not None:
            rec.body = redact_value(rec.body, redactor)
        attrs = rec.attributes
        if attrs:
            for key in [k for k in attrs if k in REDACT_KEYS or k.startswith(REDACT_PREFIXES)]:
                attrs[key] = redact_value(attrs[key], redactor)

    def _seal(self, log_record: Any) -> None:
        rec = log_record.log_record
        if self.redactor is not None:
            self._redact(rec)
        span_id = rec.span_id
        if not span_id:  # no span to seal it into (bridged logging outside any span)
            self.leaves.count_unsealed()
            return
        span = trace_api.get_current_span(getattr(rec, "context", None))
        ctx = span.get_span_context()
        if ctx.span_id != span_id or ctx.trace_id != rec.trace_id or not span.is_recording():
            self.leaves.count_unsealed()
            return
        attrs = rec.attributes
        labels = log_leaf.content_labels(rec.body is not None, list(attrs or ()), self.content_keys)
        salts = {label: self.salt_source(16) for label in labels}
        if salts:
            attrs[semconv.CHAIN_SALTS] = log_leaf.salts_text(salts)
        attrs[log_leaf.LOG_SEALED] = True
        encoded = encode_logs([log_record]).resource_logs[0].scope_logs[0].log_records[0]
        if not self.leaves.add(span, span_id, log_leaf.leaf_from_proto(encoded, salts)):
            del attrs[log_leaf.LOG_SEALED]  # its span ended meanwhile: exported as not sealed

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
