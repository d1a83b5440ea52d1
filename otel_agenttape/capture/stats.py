"""Counters for everything capture drops, cuts, retries or swallows (readable via tape.stats())."""

from __future__ import annotations

import itertools
import threading
from typing import Callable

COUNTERS = (
    # listener / API
    "runs_started", "runs_ended",
    "nodes_captured", "model_nodes", "tool_nodes",
    "orphan_tool_results",       # TOOL_RESULT without TOOL_CALL (captured without input)
    "orphan_model_responses",    # MODEL_RESPONSE/REASONING without MODEL_REQUEST
    "listener_errors",           # an event the listener could not handle (swallowed)
    "api_errors",                # a context-manager step that failed inside capture (swallowed)
    "scores_invalid",            # run.score()/call.score() given wrongly (no name, no value or label): not recorded
    "sink_errors",               # a node sink that raised
    # content
    "redactions", "redactor_errors",
    "payloads_truncated",        # payloads cut by capture, with length + sha256 recorded
    "dropped_attributes", "dropped_events", "dropped_links",  # what the SDK limits still dropped
    # export queue
    "spans_queued", "spans_exported", "spans_export_failed",
    "spans_dropped_queue_full", "spans_dropped_shutdown",
    "queue_length", "enqueue_blocked",  # producer waited for room (blocking instead of dropping)
    "export_batches", "export_failures", "exporter_exceptions",
    "spans_rejected",            # exported, but the receiver answered that it rejected them (partial success)
    "processor_errors",          # an exception anywhere in the processor chain
    "spans_dropped_too_large",   # one span larger than a whole request may be (max_request_bytes / 413)
    "spans_refused",             # requests the receiver refused for good (HTTP 400 and the like)
    "requests_split",            # requests sent again in halves after a 413 / RESOURCE_EXHAUSTED
    "spans_to_outbox",           # undelivered spans written to the outbox (re-sent later)
    "spans_spilled",             # spans a full queue handed to the outbox's writer instead of waiting
    # outbox
    "outbox_active", "outbox_spans_written", "outbox_records_written", "outbox_spans_delivered",
    "outbox_spans_pending", "outbox_bytes", "outbox_dropped_full", "outbox_write_errors",
    "outbox_resend_failures", "outbox_refused", "outbox_torn_bytes", "outbox_spill_dropped",
    # sealing
    "sealing_active", "sealing_unavailable", "sealing_errors", "spans_sealed", "checkpoints",
)


class CaptureStats:
    """Thread-safe named counters; every name in COUNTERS is always present."""

    __slots__ = ("_lock", "_counts", "_ticks", "_sources")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        # Single increments (the per-node hot path) tick an itertools.count: atomic, no lock.
        self._ticks: dict[str, itertools.count] = {}
        self._sources: list[Callable[[], dict[str, int]]] = []

    def add_source(self, source: Callable[[], dict[str, int]]) -> None:
        """Counters kept elsewhere (lock-free on a hot path), summed into every snapshot."""
        self._sources.append(source)

    def incr(self, name: str, n: int = 1) -> None:
        if n == 1:
            ticks = self._ticks.get(name)
            if ticks is None:
                with self._lock:
                    ticks = self._ticks.setdefault(name, itertools.count())
            next(ticks)
            return
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + n

    def set(self, name: str, value: int) -> None:
        with self._lock:
            ticks = self._ticks.get(name)
            self._counts[name] = value - (_peek(ticks) if ticks is not None else 0)

    def get(self, name: str) -> int:
        return self.snapshot().get(name, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            out = dict(self._counts)
            ticks = list(self._ticks.items())
        for name, counter in ticks:
            out[name] = out.get(name, 0) + _peek(counter)
        for source in self._sources:
            try:
                for key, value in source().items():
                    out[key] = out.get(key, 0) + value
            except Exception:
                pass
        return out


def _peek(counter: itertools.count) -> int:
    """The next value of an itertools.count (the number of ticks so far), read without advancing it."""
    return int(repr(counter)[6:-1])
