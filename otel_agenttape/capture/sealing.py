"""The sealing span processor: every ended span becomes the next link of its tape's chain.

It wraps the next processor (normally the export queue). The SDK's ``on_end`` span is read-only, so
it forwards a copy that carries ``agenttape.chain.id/seq/prev/hash/epoch``. One chain per tape: the
tape is the local root of a trace, its id the first ``agenttape.run.id`` seen starting in the trace
(the root run) or else the trace id. At least every ``checkpoint_every`` spans or
``checkpoint_interval_s`` seconds (optionally at every model/tool node end), and at run end it signs a C2SP
checkpoint, appends it to a local checkpoint file and exports it as an ``agenttape.checkpoint`` span.
The checkpoint's contents (size, Merkle root, chain head) are fixed in the thread that ends the span; it
is signed, filed and exported by the processor's checkpoint thread within ``checkpoint_delay_s`` (0.05 s),
so an app whose every model call is a trace of its own does not sign in its own thread (``force_flush``
and ``shutdown`` sign what is still waiting, in the caller's thread, before they return).
Values OTLP cannot carry (integers beyond int64, unpaired surrogates, odd types) are replaced before
hashing so that the leaf matches what the exporter sends; their keys are listed in
``agenttape.integrity.coerced``. Content values (``semconv.CONTENT_KEYS``) enter the leaf as salted
commitments (leaf v2), their fresh salts forwarded in ``agenttape.chain.salts``, so that erasure can
remove a value and its salt and the chain still verifies. Nothing here raises into the agent: on an internal error the span
is forwarded unsealed and counted in ``errors``.
"""

from __future__ import annotations

import base64
import collections
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_agenttape import semconv
from otel_agenttape.capture import sealing_fast as _fast
from otel_agenttape.capture.log_sealing import LogLeaves, logs_event_attributes
from otel_agenttape.capture.sealed_span import SealedSpan, make_otlp_safe
from otel_agenttape.capture.sealing_fast import SealState, Tape
from otel_agenttape.codec.typed import NotOtlpSafe
from otel_agenttape.integrity import leaf_fast
from otel_agenttape.integrity.chain import Chain
from otel_agenttape.integrity.checkpoint import Checkpoint, origin_for, read_checkpoint_file
from otel_agenttape.integrity.jcs import CanonicalError
from otel_agenttape.integrity.leaf import raw_attributes
from otel_agenttape.integrity.merkle import EMPTY_ROOT
from otel_agenttape.integrity.log_leaf import EVENT_LOGS
from otel_agenttape.integrity.leaf_fast import CONTENT_KEYS, leaf_hash_from_sdk, python_seal_hash_sdk, seal_hash_sdk
from otel_agenttape.integrity.note import Signer, sign_note

_log = logging.getLogger(__name__)
SCOPE = InstrumentationScope(semconv.SCOPE_INTEGRITY)
NODE_TYPES = frozenset({"model", "tool"})
MAX_PENDING = 1024  # checkpoints waiting for the checkpoint thread; past it, the span's thread signs
# Tapes whose last checkpoint is remembered (about 200 bytes each), so that the same tape id sealed
# again in this process opens its next epoch; an app whose every call is a trace of its own would
# otherwise keep one entry per trace for as long as it runs.
MAX_REMEMBERED_TAPES = 65536
_CHAIN_ID, _CHAIN_SEQ, _CHAIN_PREV, _CHAIN_HASH, _CHAIN_EPOCH = (
    semconv.CHAIN_ID, semconv.CHAIN_SEQ, semconv.CHAIN_PREV, semconv.CHAIN_HASH, semconv.CHAIN_EPOCH)
_CHAIN_SALTS = semconv.CHAIN_SALTS
_monotonic = time.monotonic


def load_signer(key: Signer | str | os.PathLike[str] | None) -> Signer | None:
    """A ``Signer`` from a signer, a ``PRIVATE+KEY+...`` string or a path to a file holding one."""
    if key is None or isinstance(key, Signer):
        return key
    text = str(key)
    if not text.startswith("PRIVATE+KEY+"):
        text = Path(text).read_text(encoding="utf-8").strip()
    return Signer.parse(text)


class SealingSpanProcessor(SpanProcessor):
    """Seal each ended span into its tape's chain and forward the sealed copy to ``next_processor``.

    Arguments (all optional after ``next_processor``):
    ``signing_key``: a ``Signer``, a ``PRIVATE+KEY+...`` string or a key file path (default: the
    ``AGENTTAPE_SIGNING_KEY`` file, else a per-process ephemeral key whose vkey rides on the checkpoint
    span); ``checkpoint_file``: local JSON-lines file the checkpoints are appended to (default
    ``AGENTTAPE_CHECKPOINTS``, else none); ``checkpoint_every`` (256) and ``checkpoint_interval_s``
    (1.0); ``checkpoint_on_nodes`` (False; True also checkpoints at every model/tool node end, which
    doubles the exported spans of a run);
    ``seal_foreign`` (True: spans of other instrumentations are sealed into the trace's tape too);
    ``export_checkpoints`` (True: forward checkpoint spans); ``on_node(span)``: called with each
    sealed model/tool node span; ``on_checkpoint(record)``: called with each checkpoint record;
    ``fsync`` (False): fsync the checkpoint file after each append; ``content_keys``: the attribute
    keys sealed as salted commitments (default ``semconv.CONTENT_KEYS``; an empty set seals v1 leaves);
    ``salt_source(n)``: n random bytes (default ``os.urandom``; fixed salts are for test vectors only);
    ``checkpoint_delay_s`` (0.05): the longest a due checkpoint waits for the checkpoint thread to sign
    and export it (0: signed at once in the thread that ends the span); ``log_leaves``: the log records
    sealed into live spans (``log_sealing``), named by an ``agenttape.logs`` event on each span as it
    ends. At most ``MAX_PENDING``
    checkpoints wait; beyond that the span's thread signs them itself. An opening checkpoint (filed at
    once so that a restart opens the next epoch) is signed in the span's thread, with any waiting before it.
    """

    def __init__(
        self,
        next_processor: SpanProcessor,
        *,
        signing_key: Signer | str | os.PathLike[str] | None = None,
        checkpoint_file: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 256,
        checkpoint_interval_s: float = 1.0,
        checkpoint_on_nodes: bool = False,
        seal_foreign: bool = True,
        export_checkpoints: bool = True,
        on_node: Callable[[ReadableSpan], Any] | None = None,
        on_checkpoint: Callable[[dict[str, Any]], Any] | None = None,
        fsync: bool = False,
        content_keys: frozenset[str] | None = None,
        salt_source: Callable[[int], bytes] | None = None,
        checkpoint_delay_s: float = 0.05,
        log_leaves: LogLeaves | None = None,
    ) -> None:
        self.next_processor = next_processor
        self.log_leaves = log_leaves
        self.content_keys = CONTENT_KEYS if content_keys is None else frozenset(content_keys)
        self.salt_source = salt_source or os.urandom
        # the compiled step (and compiled leaf) seal with the default keys and os.urandom, or v1 leaves
        self._default_salting = content_keys is None and salt_source is None
        v1_native = getattr(leaf_fast.native_module, "seal_hash_v1_sdk", None)
        self._v1_native = v1_native if not self.content_keys and salt_source is None else None
        self._compiled_ok = self._default_salting or self._v1_native is not None
        self._next_on_ending = getattr(next_processor, "_on_ending", None)
        if signing_key is None and os.environ.get("AGENTTAPE_SIGNING_KEY"):
            signing_key = os.environ["AGENTTAPE_SIGNING_KEY"]
        signer = load_signer(signing_key)
        self.ephemeral_key = signer is None
        self.signer = signer or Signer.generate("agenttape.ephemeral")
        self.vkey = self.signer.verifier().vkey()
        if checkpoint_file is None and os.environ.get("AGENTTAPE_CHECKPOINTS"):
            checkpoint_file = os.environ["AGENTTAPE_CHECKPOINTS"]
        self.checkpoint_file = Path(checkpoint_file) if checkpoint_file else None
        # the lock, the tapes, the cadence and the sealed count: shared with the compiled step
        self._state = SealState(max(1, int(checkpoint_every)), float(checkpoint_interval_s),
                                bool(checkpoint_on_nodes), bool(seal_foreign))
        self._state.seal_hash = self._v1_native
        self.export_checkpoints = export_checkpoints
        self.on_node = on_node
        self.on_checkpoint = on_checkpoint
        self.fsync = fsync
        self.errors = 0
        self.checkpoints = 0
        self.coerced = 0
        self._file_lock = threading.Lock()
        self._last_epochs = self._read_epochs()
        self.checkpoint_delay_s = max(0.0, float(checkpoint_delay_s))
        # checkpoints fixed but not yet signed, in the order they were taken (appended under the
        # state's lock); signed one at a time, in that order, under _emit_lock
        self._pending: collections.deque[tuple[Tape, Checkpoint, int]] = collections.deque()
        self._emit_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._timer: threading.Thread | None = None
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (ref() or (lambda: None))())

    # the settings and the count live in the state the compiled step reads (sealing_fast.SealState)
    checkpoint_every = property(lambda self: self._state.every, doc="a checkpoint at least every N spans")
    checkpoint_interval_s = property(lambda self: self._state.interval, doc="... and every N seconds")
    checkpoint_on_nodes = property(lambda self: self._state.on_nodes, doc="... and at every node end")
    seal_foreign = property(lambda self: self._state.seal_foreign, doc="seal other scopes' spans too")
    sealed = property(lambda self: self._state.sealed, doc="spans sealed so far")

    # --- SpanProcessor ---------------------------------------------------------------------------

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        try:
            tape = self._state.tapes.get(span.context.trace_id)
            # the common case inside a run: nothing to record (these fields are only ever set once)
            if tape is None or tape.root_span_id is None or not (tape.from_run or tape.chain is not None):
                self._register(span)
            self.next_processor.on_start(span, parent_context=parent_context)
        except Exception:  # never into the agent
            self.errors += 1

    def _on_ending(self, span: Any) -> None:
        hook = self._next_on_ending
        if hook is not None:
            hook(span)

    def on_end(self, span: ReadableSpan) -> None:
        leaves = self.log_leaves
        if leaves:  # log records were sealed into live spans: this one may be among them
            try:
                span = self._with_logs(span, leaves.take(span.context.span_id))
            except Exception:
                self.errors += 1
        try:
            step = _fast.step
            if step is None or not self._compiled_ok:
                sealed, due = self._seal(span)
            else:
                sealed, sealed_hash = step(self._state, span)
                due = None
                if sealed is None:  # the compiled step left it (and changed nothing): the Python step
                    sealed, due = self._seal(span, sealed_hash)
        except Exception:
            self.errors += 1
            _log.debug("sealing failed; forwarding the span unsealed", exc_info=True)
            sealed, due = span, None
        try:
            self.next_processor.on_end(sealed)
        except Exception:
            self.errors += 1
        if due is not None:
            self._checkpoint_due()
        if self.on_node is not None and sealed is not span:
            if raw_attributes(sealed).get(semconv.NODE_TYPE) in NODE_TYPES:
                try:
                    self.on_node(sealed)
                except Exception:
                    self.errors += 1

    @staticmethod
    def _with_logs(span: ReadableSpan, taken: list[str] | None) -> ReadableSpan:
        """``span`` with the ``agenttape.logs`` event naming its sealed log records (if any)."""
        if not taken:
            return span
        event = Event(EVENT_LOGS, logs_event_attributes(taken), span.end_time)
        return SealedSpan(span, dict(raw_attributes(span)), (*span.events, event))

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        try:
            self.checkpoint_all(close=True)
        except Exception:
            self.errors += 1
        self.next_processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            self.checkpoint_all(close=False)
        except Exception:
            self.errors += 1
        return self.next_processor.force_flush(timeout_millis)

    # --- tapes -------------------------------------------------------------------------------------

    def _register(self, span: Any) -> None:
        ctx = span.context
        parent = span.parent
        run_id = raw_attributes(span).get(semconv.RUN_ID)
        tape = self._state.tapes.get(ctx.trace_id)
        if tape is not None and tape.root_span_id is not None and (not run_id or tape.from_run or tape.chain is not None):
            return  # the common case inside a run: nothing to record (these fields are only ever set once)
        with self._state.lock:
            tape = self._state.tapes.get(ctx.trace_id)
            if tape is None:
                if run_id is None and not self.seal_foreign and not _ours(span):
                    return
                tape = Tape(self._state, ctx.trace_id, str(run_id) if run_id else f"{ctx.trace_id:032x}", bool(run_id))
                self._state.tapes[ctx.trace_id] = tape
            elif run_id and not tape.from_run and tape.chain is None:
                tape.chain_id, tape.from_run = str(run_id), True  # the outermost run names the tape
            if (parent is None or parent.is_remote) and tape.root_span_id is None:
                tape.root_span_id = ctx.span_id
                tape.root_ctx = ctx

    def _leaf_hash(self, span: ReadableSpan) -> tuple[bytes, str | None]:
        if self._default_salting:
            return seal_hash_sdk(span)
        if not self.content_keys:
            return leaf_hash_from_sdk(span), None
        return python_seal_hash_sdk(span, self.content_keys, self.salt_source)

    def _seal(self, span: ReadableSpan, sealed_hash: tuple[bytes, str | None] | None = None
              ) -> tuple[ReadableSpan, tuple | None]:
        """The sealed copy of ``span`` and the checkpoint now due, if one is (``sealed_hash``: its leaf
        hash and salts attribute, if known). A due checkpoint is already queued for signing."""
        state = self._state
        if not state.seal_foreign and not _ours(span):
            return span, None
        events = None
        try:
            if sealed_hash is None:
                sealed_hash = self._leaf_hash(span)
        except (NotOtlpSafe, CanonicalError, UnicodeEncodeError):
            span = make_otlp_safe(span)
            events = span._events
            self.coerced += 1
            sealed_hash = self._leaf_hash(span)
        lh, salts = sealed_hash
        attrs = raw_attributes(span)
        ctx = span.context
        trace_id = ctx.trace_id
        now = _monotonic()
        opening = None
        with state.lock:
            tape = state.tapes.get(trace_id)
            if tape is None:
                tape = Tape(state, trace_id, f"{trace_id:032x}", False)
                state.tapes[trace_id] = tape
            chain = tape.chain
            if chain is None:
                opening = self._open_chain(tape)
                chain = tape.chain
            cid, epoch, seq, prev, h = chain.append_hash(lh)
            if tape.resource is None:
                tape.resource = span.resource
            state.sealed += 1
            closing = ctx.span_id == tape.root_span_id
            due = None
            if (  # (the compiled step compares with the same deadlines: SealState.schedule sets them)
                closing
                or chain.size >= tape.due_size
                or now >= tape.due_time
                or (state.on_nodes and attrs.get(semconv.NODE_TYPE) in NODE_TYPES)
            ):
                due = self._snapshot(tape, now)
            if closing:
                del state.tapes[trace_id]
        if opening is not None:  # filed now (with any waiting before it): see _open_chain
            self._sign_pending(upto=opening)
        if self._timer is None:  # (started by the first span sealed: the compiled step needs an open chain)
            self._ensure_timer()
        # the forwarded copy: one new attribute dict, one shallow copy of the span
        out = attrs.copy()
        out[_CHAIN_ID] = cid
        out[_CHAIN_SEQ] = seq
        out[_CHAIN_PREV] = prev
        out[_CHAIN_HASH] = h
        out[_CHAIN_EPOCH] = epoch
        if salts is not None:
            out[_CHAIN_SALTS] = salts
        return SealedSpan(span, out, events), due

    def _open_chain(self, tape: Tape) -> tuple | None:
        last = self._last_epochs.get(tape.chain_id)
        epoch = 0 if last is None else last[0] + 1
        tape.chain = Chain(tape.chain_id, epoch)
        self._remember(tape.chain_id, (epoch, 0, EMPTY_ROOT))
        if last is None:
            # With a checkpoint file, the opening (size 0) checkpoint is recorded there at once: a
            # process that dies before its first regular checkpoint still leaves the epoch behind,
            # so a restart of the same tape opens the next epoch instead of re-using seq 0.
            return self._snapshot(tape, time.monotonic()) if self.checkpoint_file is not None else None
        # A tape id seen before: a restored tape starts a new epoch, opened by a signed statement
        # that names the previous epoch's last checkpoint.
        last_epoch, last_size, last_root = last
        tape.restore_ext = (f"restore {origin_for(tape.chain_id, last_epoch)} {last_size} "
                            f"{base64.b64encode(last_root).decode()}")
        return self._snapshot(tape, time.monotonic())

    def _remember(self, chain_id: str, last: tuple[int, int, bytes]) -> None:
        """Record a tape's newest ``(epoch, size, root)``: what a later epoch of the same tape id names
        as its predecessor. Bounded: the ``MAX_REMEMBERED_TAPES`` most recently checkpointed tapes."""
        known = self._last_epochs
        if chain_id in known:
            known.move_to_end(chain_id)
        known[chain_id] = last
        if len(known) > MAX_REMEMBERED_TAPES:
            known.popitem(last=False)

    def _snapshot(self, tape: Tape, now: float) -> tuple | None:
        """Fix the tape's checkpoint at its chain's current size and queue it for signing (called
        under the state's lock, so the queue holds the checkpoints in the order they were taken)."""
        chain = tape.chain
        if chain is None or chain.size == tape.last_cp_size:
            return None
        tape.last_cp_size = chain.size
        self._state.schedule(tape, chain.size, now)
        ext = [f"chain {chain.head}"]
        if chain.size == 0 and tape.restore_ext:
            ext.append(tape.restore_ext)
        root = chain.root()
        cp = Checkpoint(chain.origin, chain.size, root, tuple(ext))
        # what a later epoch of this tape id names as its predecessor: known now, signed or not yet
        self._remember(tape.chain_id, (chain.epoch, chain.size, root))
        due = (tape, cp, chain.epoch)
        self._pending.append(due)
        return due

    def _checkpoint_due(self) -> None:
        """A checkpoint was queued in the span's thread: wake the checkpoint thread, or sign here when
        there is none (``checkpoint_delay_s`` 0, no thread yet) or too many wait."""
        if (self.checkpoint_delay_s <= 0 or self._timer is None or self._stop.is_set()
                or len(self._pending) > MAX_PENDING):
            self._sign_pending()
        elif not self._wake.is_set():
            self._wake.set()

    def _sign_pending(self, upto: tuple | None = None) -> int:
        """Sign, file and export the queued checkpoints, oldest first (any thread): all of them, or
        those up to and including ``upto``."""
        done = 0
        pending = self._pending
        with self._emit_lock:
            while pending:
                try:
                    due = pending.popleft()
                except IndexError:
                    break
                self._emit_checkpoint(*due)
                done += 1
                if due is upto:
                    break
        return done

    def _emit_checkpoint(self, tape: Tape, cp: Checkpoint, epoch: int) -> None:
        try:
            note = sign_note(cp.body(), [self.signer])
            record = {
                "origin": cp.origin, "chain_id": tape.chain_id, "epoch": epoch, "size": cp.size,
                "root": base64.b64encode(cp.root).decode(), "head": cp.chain_head,
                "time_unix_nano": time.time_ns(), "vkey": self.vkey, "note": note,
            }
            self.checkpoints += 1
            if self.checkpoint_file is not None:
                self._append(record)
            if self.export_checkpoints:
                self.next_processor.on_end(self._checkpoint_span(tape, cp, note))
            if self.on_checkpoint is not None:
                self.on_checkpoint(record)
        except Exception:
            self.errors += 1
            _log.debug("checkpoint failed", exc_info=True)

    def _checkpoint_span(self, tape: Tape, cp: Checkpoint, note: str) -> ReadableSpan:
        now = time.time_ns()
        ctx = trace_api.SpanContext(
            trace_id=tape.trace_id, span_id=random.getrandbits(64) or 1, is_remote=False,
            trace_flags=trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED),
        )
        parent = tape.root_ctx
        return ReadableSpan(
            name=semconv.EVENT_CHECKPOINT, context=ctx, parent=parent, resource=tape.resource,
            attributes={
                semconv.CHECKPOINT_NOTE: note, semconv.CHECKPOINT_ORIGIN: cp.origin,
                semconv.CHECKPOINT_SIZE: cp.size, semconv.CHECKPOINT_KEY: self.vkey,
            },
            kind=trace_api.SpanKind.INTERNAL, start_time=now, end_time=now, instrumentation_scope=SCOPE,
        )

    def checkpoint_all(self, close: bool = False) -> int:
        """Checkpoint every open tape with unsigned entries (``close``: and forget the tapes), and sign
        every checkpoint still waiting for the checkpoint thread, before returning."""
        count = 0
        with self._state.lock:
            now = time.monotonic()
            for tape in list(self._state.tapes.values()):
                if self._snapshot(tape, now) is not None:
                    count += 1
            if close:
                self._state.tapes.clear()
        self._sign_pending()
        return count

    # --- checkpoint file and timer ------------------------------------------------------------------

    def _append(self, record: Mapping[str, Any]) -> None:
        line = orjson.dumps(record) + b"\n"
        assert self.checkpoint_file is not None
        with self._file_lock:
            self.checkpoint_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.checkpoint_file, "ab") as fh:
                fh.write(line)
                if self.fsync:
                    fh.flush()
                    os.fsync(fh.fileno())

    def _read_epochs(self) -> collections.OrderedDict[str, tuple[int, int, bytes]]:
        """Each tape's newest ``(epoch, size, root)`` in the checkpoint file (the newest
        ``MAX_REMEMBERED_TAPES`` tapes), so a restarted process opens the next epoch of a tape."""
        out: collections.OrderedDict[str, tuple[int, int, bytes]] = collections.OrderedDict()
        if self.checkpoint_file is None or not self.checkpoint_file.exists():
            return out
        for rec in read_checkpoint_file(self.checkpoint_file):
            cid = rec.get("chain_id")
            try:
                last = (int(rec.get("epoch", 0)), int(rec.get("size", 0)), base64.b64decode(rec.get("root") or ""))
            except (TypeError, ValueError):
                continue
            prev = out.get(cid)
            if prev is None or last[:2] >= prev[:2]:
                out[cid] = last
                out.move_to_end(cid)
                if len(out) > MAX_REMEMBERED_TAPES:
                    out.popitem(last=False)
        return out

    def _ensure_timer(self) -> None:
        if self._timer is not None or (self.checkpoint_interval_s <= 0 and self.checkpoint_delay_s <= 0):
            return
        with self._state.lock:
            if self._timer is not None or self._stop.is_set():
                return
            self._timer = threading.Thread(target=self._tick, name="agenttape-checkpoints", daemon=True)
            self._timer.start()

    def _tick(self) -> None:
        """The checkpoint thread: signs queued checkpoints ``checkpoint_delay_s`` after the first of
        them woke it (those queued meanwhile with it), and takes the checkpoints due by time every
        ``checkpoint_interval_s``."""
        interval = self.checkpoint_interval_s
        next_scan = time.monotonic() + interval
        while not self._stop.is_set():
            try:
                timeout = max(0.0, next_scan - time.monotonic()) if interval > 0 else None
                if self._wake.wait(timeout):
                    if self._stop.is_set() or self._stop.wait(self.checkpoint_delay_s):
                        return  # shutdown signs what waits, in its own thread
                    self._wake.clear()
                    self._sign_pending()
                if interval > 0 and time.monotonic() >= next_scan:
                    with self._state.lock:
                        now = time.monotonic()
                        for tape in self._state.tapes.values():
                            if now >= tape.due_time:
                                self._snapshot(tape, now)
                    self._sign_pending()
                    next_scan = time.monotonic() + interval
            except Exception:
                self.errors += 1

    def _after_fork(self) -> None:
        # The child has no checkpoint thread, and the parent signs the checkpoints it had queued.
        self._pending.clear()
        self._emit_lock = threading.Lock()
        self._wake = threading.Event()
        self._timer = None


def _ours(span: Any) -> bool:
    scope = span.instrumentation_scope
    return scope is not None and scope.name == semconv.SCOPE_NAME
