"""The sealing processor's fast path: the state its common step shares, and the compiled step.

``SealState`` is all that the common step of ``SealingSpanProcessor._seal`` reads or changes: the lock,
the open tapes (``Tape``), the cadence settings and the ``sealed`` count. The processor owns one and
hands it to the compiled step (``_sealing.pyx``) explicitly, so the C side reads no field of the
processor. The cadence rule lives in ``SealState.schedule``: at each checkpoint it sets the chain size
and the monotonic time at which the tape's next checkpoint falls due (``Tape.due_size``,
``Tape.due_time``); the Python step, the timer and the compiled step only compare against those.

``step(state, span)`` is the compiled step, or None where it is not built or turned off
(``AGENTTAPE_NO_NATIVE``). It returns ``(sealed, None)`` when it sealed the span, and ``(None, (leaf
hash, salts text or None) or None)`` when the span needs the Python step (a tape or chain to open, a checkpoint due, the
tape's root ending, a value to make OTLP-safe, a layout it does not know), having changed nothing.
``tests/test_sealing_native.py`` seals the same spans both ways.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from otel_agenttape import native
from otel_agenttape.capture.sealed_span import ATTRIBUTES_FIELD, ORIGINAL_FIELD, SealedSpan
from otel_agenttape.integrity import leaf_fast


class Tape:
    """One tape's chain and checkpoint cadence (``trace_id``: the trace whose local root it is)."""

    __slots__ = (
        "chain",
        "chain_id",
        "due_size",
        "due_time",
        "from_run",
        "last_cp_size",
        "resource",
        "restore_ext",
        "root_ctx",
        "root_span_id",
        "trace_id",
    )

    def __init__(self, state: SealState, trace_id: int, chain_id: str, from_run: bool) -> None:
        self.trace_id = trace_id
        self.chain_id = chain_id
        self.from_run = from_run
        self.root_span_id: int | None = None
        self.root_ctx: Any = None
        self.chain: Any = None  # integrity.chain.Chain, once the first span is sealed
        self.resource: Any = None
        self.last_cp_size = -1
        self.restore_ext: str | None = None
        state.schedule(self, 0, time.monotonic())


class SealState:
    """The lock, the open tapes by trace id, the cadence and the count of sealed spans."""

    __slots__ = ("every", "interval", "lock", "on_nodes", "seal_foreign", "seal_hash", "sealed", "tapes")

    def __init__(self, every: int, interval: float, on_nodes: bool, seal_foreign: bool) -> None:
        self.lock = threading.Lock()
        self.tapes: dict[int, Tape] = {}
        self.every = every  # a checkpoint at least every ``every`` spans ...
        self.interval = interval  # ... and every ``interval`` seconds
        self.on_nodes = on_nodes  # ... and at every model/tool node end
        self.seal_foreign = seal_foreign
        self.sealed = 0
        # the compiled step's leaf hash when it is not the configured v2 one (v1 leaves: no content keys)
        self.seal_hash: Any = None

    def schedule(self, tape: Tape, size: int, now: float) -> None:
        """The cadence rule: after a checkpoint at ``size`` (at ``now``), the next falls due ``every``
        spans or ``interval`` seconds later, whichever comes first."""
        tape.due_size = size + self.every
        tape.due_time = now + self.interval


def configure(compiled: Any) -> Any:
    """The compiled step of the module ``compiled``, set up with what it needs, or None: it needs the
    compiled leaf hash and the SDK ``SpanContext`` layout that the leaf writer checked on a probe."""
    leaf = leaf_fast.native_module
    if compiled is None or leaf is None or leaf.verified_span_context() is None:
        return None
    compiled.configure(leaf.seal_hash_sdk, SealedSpan, leaf.verified_span_context(), ORIGINAL_FIELD,
                       ATTRIBUTES_FIELD)
    return compiled.step


step = configure(native.load("otel_agenttape.capture._sealing"))
