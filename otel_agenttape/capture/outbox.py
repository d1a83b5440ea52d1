"""The durable outbox: sealed spans that could not be delivered are appended to local files
(``otel_agenttape.outboxfile``) and re-sent in order, with backoff, once the receiver answers again,
by this process or a later one started with the same outbox path.

Spans come here already sealed and encoded (OTLP requests of at most ``max_request_bytes``), so a
re-sent span keeps its ids and chain attributes and the receiver's dedup stores it once. A record is
removed (the acknowledged offset moves past it) only after the receiver acknowledged it. The outbox
is bounded (``max_bytes``): a request that does not fit is dropped and counted
(``outbox_dropped_full``). With ``fsync="batch"`` (the default) every record written is fsync'd
before it counts as written; ``"none"`` leaves it to the OS (it survives the process being killed,
not the machine losing power).
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from otel_agenttape import outboxfile
from otel_agenttape.capture.delivery import DEFAULT_MAX_REQUEST_BYTES, Sent, encode_bounded

_log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_SEGMENT_BYTES = 8 << 20
FSYNC_POLICIES = ("batch", "none")
RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 5.0
ADOPT_EVERY_S = 5.0
_COUNTERS = ("outbox_active", "outbox_spans_written", "outbox_records_written", "outbox_spans_delivered",
             "outbox_spans_pending", "outbox_bytes", "outbox_dropped_full", "outbox_write_errors",
             "outbox_resend_failures", "outbox_refused", "outbox_torn_bytes", "outbox_spill_dropped")

Deliver = Callable[[list[tuple[bytes, int]]], Sent]  # one attempt at the given requests


class Outbox:
    """Append undeliverable requests; a background thread re-sends them oldest first."""

    def __init__(self, path: str | Path, *, deliver: Deliver | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                 fsync: str = "batch", segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, spill_capacity: int = 8192,
                 kind: int = outboxfile.KIND_TRACES) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"outbox fsync must be one of {FSYNC_POLICIES}, got {fsync!r}")
        if max_bytes <= 0:
            raise ValueError("outbox max_bytes must be positive")
        self.path = Path(path)
        self.kind = kind  # what the records hold (the log records' outbox: KIND_LOGS)
        self.max_bytes = int(max_bytes)
        self.fsync = fsync == "batch"
        self.max_request_bytes = max_request_bytes
        self._deliver = deliver
        self._lock = threading.Lock()         # the lanes and the counters
        self._send_lock = threading.Lock()    # one resend at a time
        self.lane, self._adopted = outboxfile.open_lane(self.path, segment_bytes)
        self._segment_bytes = segment_bytes
        self._counts = collections.Counter(dict.fromkeys(_COUNTERS, 0))
        self._counts["outbox_active"] = 1
        self._counts["outbox_torn_bytes"] = self.lane.torn_bytes + sum(la.torn_bytes for la in self._adopted)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._spill: collections.deque[ReadableSpan] = collections.deque()
        self._spill_capacity = spill_capacity
        self._spill_wake = threading.Event()
        self._spill_room = threading.Event()
        self._idle = threading.Event()
        self._threads: list[threading.Thread] = []
        self._warned_full = -60.0
        self.receiver_ok = False  # the last re-send was acknowledged
        self._closed = False

    # ---- writing ---------------------------------------------------------------------------
    def write_requests(self, requests: Sequence[tuple[bytes, int]]) -> int:
        """Append encoded requests; returns the spans written (the rest: outbox full, counted)."""
        written = 0
        with self._lock:
            if self._closed:  # a late export after shutdown: its spans were already written or counted
                return 0
            for data, n in requests:
                if self._pending_bytes_locked() + len(data) + outboxfile.HEADER_SIZE > self.max_bytes:
                    self._counts["outbox_dropped_full"] += n
                    self._note_dropped_locked(n)
                    continue
                try:
                    self.lane.append(self.kind, n, data, fsync=self.fsync)
                except OSError as exc:
                    self._counts["outbox_write_errors"] += 1
                    self._counts["outbox_dropped_full"] += n
                    self._note_dropped_locked(n)
                    _log.warning("agenttape outbox: cannot write %s: %s (%d spans dropped)", self.path, exc, n)
                    continue
                written += n
                self._counts["outbox_spans_written"] += n
                self._counts["outbox_records_written"] += 1
        if written:
            self._wake.set()
        return written

    def _note_dropped_locked(self, n: int) -> None:
        try:
            outboxfile.add_dropped(self.lane.path, n)
        except OSError:
            pass
        now = time.monotonic()
        if now - self._warned_full >= 60.0:
            self._warned_full = now
            _log.warning("agenttape outbox %s is full (max_bytes %d): spans are dropped (outbox_dropped_full)",
                         self.path, self.max_bytes)

    def write_spans(self, spans: Sequence[ReadableSpan]) -> tuple[int, int]:
        """Encode and append; ``(spans written, spans too large for one request)``."""
        requests, too_large = encode_bounded(spans, self.max_request_bytes)
        return self.write_requests(requests), too_large

    def spill(self, span: ReadableSpan, timeout: float) -> bool:
        """A span the full export queue cannot take: hand it to the writer thread, waiting at most
        ``timeout`` seconds for room (the disk, never the network). False: not taken (counted)."""
        deadline = time.monotonic() + timeout
        while len(self._spill) >= self._spill_capacity:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stop.is_set():
                with self._lock:
                    self._counts["outbox_spill_dropped"] += 1
                return False
            self._spill_room.clear()
            self._spill_wake.set()
            self._spill_room.wait(min(remaining, 0.05))
        self._spill.append(span)
        if len(self._spill) >= 256:
            self._spill_wake.set()
        return True

    def _spill_loop(self) -> None:
        while True:
            self._spill_wake.wait(0.2)
            self._spill_wake.clear()
            self._drain_spill()
            if self._stop.is_set():
                self._drain_spill()
                return

    def _drain_spill(self) -> None:
        spill = self._spill
        while spill:
            batch = []
            while spill and len(batch) < 512:
                batch.append(spill.popleft())
            self._spill_room.set()
            try:
                _, too_large = self.write_spans(batch)
                if too_large:
                    with self._lock:
                        self._counts["outbox_dropped_full"] += too_large
            except Exception:  # noqa: BLE001 - never raise in a daemon thread; count what was lost
                with self._lock:
                    self._counts["outbox_write_errors"] += 1
                    self._counts["outbox_dropped_full"] += len(batch)

    # ---- state -----------------------------------------------------------------------------
    def _lanes_locked(self) -> list[outboxfile.Lane]:
        return [*self._adopted, self.lane]  # adopted lanes hold older records: they go first

    def _pending_bytes_locked(self) -> int:
        return sum(la.pending_bytes for la in self._lanes_locked())

    def backlog(self) -> bool:
        """Records wait to be re-sent (new spans then go behind them, to keep the order)."""
        return any(la.pending_records for la in self._lanes_locked()) or bool(self._spill)

    def counts(self) -> dict[str, int]:
        with self._lock:
            out = dict(self._counts)
            lanes = self._lanes_locked()
            out["outbox_spans_pending"] = sum(la.pending_items for la in lanes) + len(self._spill)
            out["outbox_bytes"] = sum(la.pending_bytes for la in lanes)
        return out

    # ---- re-sending ------------------------------------------------------------------------
    def start(self) -> None:
        for target, name in ((self._resend_loop, "AgentTapeOutbox"), (self._spill_loop, "AgentTapeOutboxWriter")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        if self.backlog():
            self._wake.set()

    def _resend_loop(self) -> None:
        backoff = RETRY_INITIAL_S
        last_adopt = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() - last_adopt >= ADOPT_EVERY_S:
                last_adopt = time.monotonic()
                self._adopt()
            progressed = self.resend_some()
            if progressed is None:  # nothing to send
                self._idle.set()
                self._wake.wait(ADOPT_EVERY_S)
                self._wake.clear()
                continue
            self._idle.clear()
            if progressed:
                backoff = RETRY_INITIAL_S
                continue
            if self._stop.wait(backoff * random.uniform(0.8, 1.2)):
                return
            backoff = min(backoff * 2, RETRY_MAX_S)

    def _adopt(self) -> None:
        try:
            with self._lock:
                held = {la.path for la in self._lanes_locked()}
                new = outboxfile.adopt_free_lanes(self.path, held, self._segment_bytes)
                if new:
                    self._adopted.extend(new)
                    self._counts["outbox_torn_bytes"] += sum(la.torn_bytes for la in new)
        except (OSError, ValueError) as exc:
            _log.debug("agenttape outbox: cannot adopt lanes: %s", exc)

    def resend_some(self, limit: int = 64) -> bool | None:
        """Re-send up to ``limit`` records, oldest first; None: nothing pending; False: the receiver
        did not take the first one (try later); True: some were acknowledged."""
        if self._deliver is None:
            return None
        with self._send_lock:
            sent_any = False
            for _ in range(limit):
                with self._lock:
                    lane = next((la for la in self._lanes_locked() if la.pending_records), None)
                    if lane is None:
                        self._retire_adopted_locked()
                        return sent_any if sent_any else None
                    try:  # consecutive records in one request: concatenated OTLP requests are one request
                        records = lane.first_records(self.max_request_bytes)
                    except OSError as exc:
                        _log.warning("agenttape outbox: cannot read %s: %s", lane.path, exc)
                        return sent_any
                if self._stop.is_set():
                    return sent_any
                items = sum(r.items for r in records)
                try:
                    sent = self._deliver([(b"".join(r.payload for r in records), items)])
                except Exception as exc:  # noqa: BLE001 - a failed attempt, tried again later
                    _log.debug("agenttape outbox: re-send failed: %s", exc)
                    sent = None
                if sent is None or sent.undelivered:
                    _log.debug("agenttape outbox: the receiver did not take %d records (%d spans)", len(records), items)
                    self.receiver_ok = False
                    with self._lock:
                        self._counts["outbox_resend_failures"] += 1
                    return sent_any
                self.receiver_ok = True
                with self._lock:
                    try:
                        lane.ack_first(fsync=self.fsync, count=len(records))
                    except OSError as exc:  # the record stays: it is sent again (dedup'd)
                        _log.warning("agenttape outbox: cannot acknowledge in %s: %s", lane.path, exc)
                        return sent_any
                    self._counts["outbox_spans_delivered"] += sent.delivered
                    self._counts["outbox_refused"] += sent.refused + sent.too_large
                sent_any = True
            return True

    def _retire_adopted_locked(self) -> None:
        keep = []
        for lane in self._adopted:
            if lane.pending_records:
                keep.append(lane)
            else:
                outboxfile.remove_lane(lane)
        self._adopted = keep

    def wait_drained(self, timeout: float) -> bool:
        """Wait until nothing is pending (for tests and ``agenttape demo``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.backlog():
                return True
            self._wake.set()
            time.sleep(0.05)
        return not self.backlog()

    def forked(self) -> "Outbox":
        """The outbox for a forked child: a lane of its own (the parent keeps writing its lane)."""
        for lane in self._lanes_locked():
            lane.forget()
        child = Outbox(self.path, deliver=self._deliver, max_bytes=self.max_bytes,
                       fsync="batch" if self.fsync else "none", segment_bytes=self._segment_bytes,
                       max_request_bytes=self.max_request_bytes, spill_capacity=self._spill_capacity, kind=self.kind)
        child.start()
        return child

    def close(self, deadline: float | None = None) -> None:
        """Write what the writer thread holds, stop re-sending, release the lane (records stay)."""
        self._stop.set()
        self._spill_wake.set()
        self._wake.set()
        end = deadline if deadline is not None else time.monotonic() + 5.0
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        if self._spill:
            self._drain_spill()
        with self._lock:
            self._closed = True
            for lane in self._lanes_locked():
                lane.close()


def outbox_from_options(path: str | Path, options: dict[str, Any] | None, deliver: Deliver | None,
                        max_request_bytes: int) -> Outbox:
    """An Outbox from the ``outbox_options`` keywords (``max_bytes``, ``fsync``, ``segment_bytes``)."""
    opts = dict(options or {})
    unknown = set(opts) - {"max_bytes", "fsync", "segment_bytes"}
    if unknown:
        raise TypeError(f"outbox_options: unknown keyword(s) {sorted(unknown)}")
    return Outbox(path, deliver=deliver, max_request_bytes=max_request_bytes, **opts)
