"""The compiled sealing step (``capture/_sealing.pyx``) seals exactly as ``SealingSpanProcessor._seal``.

The same recorded spans (runs, nested nodes, foreign spans, values that must be made OTLP-safe, the
tape's root ending) go through a processor using the compiled step and one using only the Python
method; the forwarded spans, their chain fields and the signed checkpoints must be identical.
"""

from __future__ import annotations

import importlib

import pytest
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link

from otel_agenttape import semconv
from otel_agenttape.capture import sealing, sealing_fast
from otel_agenttape.integrity import Signer

try:
    importlib.import_module("otel_agenttape.capture._sealing")
except ImportError:
    built = False
else:
    built = True

pytestmark = pytest.mark.skipif(
    not built or sealing_fast.step is None,
    reason="the compiled sealing step is not built or turned off (AGENTTAPE_NO_NATIVE)")

KEY = Signer.generate("native.test/key")


class _Recorder(SpanProcessor):
    def __init__(self) -> None:
        self.calls: list = []

    def on_start(self, span, parent_context=None) -> None:
        self.calls.append(("start", span))

    def on_end(self, span) -> None:
        self.calls.append(("end", span))


def _record() -> list:
    rec = _Recorder()
    provider = TracerProvider()
    provider.add_span_processor(rec)
    ours, other = provider.get_tracer("otel_agenttape"), provider.get_tracer("someone.else")
    for r in range(2):
        with ours.start_as_current_span("run", attributes={semconv.RUN_ID: f"run-{r}"}) as run:
            for i in range(30):
                attrs = {semconv.NODE_TYPE: "tool" if i % 3 else "model", semconv.STEP: i,
                         "payload": f"v{i} \u00e9\n\"q\"", "ratio": i / 7, "tags": ("a", str(i))}
                links = [Link(run.get_span_context(), {"why": "retry"})] if i % 11 == 0 else None
                with ours.start_as_current_span(f"node {i}", attributes=attrs, links=links) as sp:
                    sp.add_event("agenttape.text", {"agenttape.seq": i, "text": "h\u00e9llo"})
                    if i == 7:
                        sp._attributes._dict["big"] = 2**70  # made OTLP-safe (coerced) before sealing
                    if i == 9:
                        sp._attributes._dict["bad"] = "x\ud800"
                    if i == 12:
                        sp._attributes._dict["blob"] = b"\x00\xff"  # the general path's value
                with other.start_as_current_span(f"foreign {i}"):
                    pass
    with other.start_as_current_span("foreign root"):
        with other.start_as_current_span("foreign child"):
            pass
    provider.shutdown()
    return rec.calls


CALLS = _record()


def _replay(monkeypatch, compiled: bool, **opts) -> tuple[list, dict, int]:
    exporter = InMemorySpanExporter()
    proc = sealing.SealingSpanProcessor(SimpleSpanProcessor(exporter), signing_key=KEY, checkpoint_interval_s=3600,
                                        **opts)
    python_calls = 0
    real = proc._seal

    def counted(span, lh=None):
        nonlocal python_calls
        python_calls += 1
        return real(span, lh)

    proc._seal = counted
    with monkeypatch.context() as m:
        if not compiled:
            m.setattr(sealing_fast, "step", None)
        for kind, span in CALLS:
            proc.on_start(span) if kind == "start" else proc.on_end(span)
        proc.shutdown()
    spans = [(s.name, dict(s.attributes)) for s in exporter.get_finished_spans()]
    counts = {"errors": proc.errors, "sealed": proc.sealed, "checkpoints": proc.checkpoints, "coerced": proc.coerced}
    return spans, counts, python_calls


@pytest.mark.parametrize("opts", [
    {"checkpoint_every": 8},
    {"checkpoint_every": 1},
    {"checkpoint_every": 256, "checkpoint_on_nodes": True},
    {"checkpoint_every": 5, "seal_foreign": False},
], ids=["every-8", "every-1", "on-nodes", "not-foreign"])
def test_compiled_step_seals_as_the_python_method(monkeypatch, opts) -> None:
    native_spans, native_counts, python_calls = _replay(monkeypatch, True, **opts)
    python_spans, python_counts, all_calls = _replay(monkeypatch, False, **opts)
    assert native_counts == python_counts and native_counts["errors"] == 0
    assert native_counts["coerced"] == 4  # two runs, two spans each
    assert native_spans == python_spans
    assert any(semconv.CHAIN_HASH in a for _, a in native_spans)
    assert all_calls == sum(1 for kind, _ in CALLS if kind == "end")
    if opts.get("checkpoint_every", 256) > 1 and not opts.get("checkpoint_on_nodes") and opts.get("seal_foreign", True):
        assert python_calls < all_calls / 2  # most spans took the compiled step


def test_compiled_step_reads_and_changes_only_the_state_it_is_given() -> None:
    """The step is given a ``SealState`` alone (no processor): it seals into an open tape's chain, and
    steps aside, changing nothing, where the Python step must act (no tape, no chain, a checkpoint due)."""
    import time

    from otel_agenttape.integrity.chain import Chain
    from otel_agenttape.integrity.leaf_fast import leaf_hash_from_sdk, native_module

    span = next(s for kind, s in CALLS if kind == "end" and s.name.startswith("node")
                and native_module.leaf_hash_sdk(s) is not None)
    lh = leaf_hash_from_sdk(span)
    state = sealing_fast.SealState(4, 3600.0, False, True)
    assert sealing_fast.step(state, span) == (None, (lh, None))  # no tape yet
    tape = sealing_fast.Tape(state, span.context.trace_id, "tape-1", True)
    state.tapes[tape.trace_id] = tape
    assert sealing_fast.step(state, span) == (None, (lh, None))  # no chain yet
    tape.chain, tape.resource = Chain("tape-1"), span.resource
    for seq in range(3):
        sealed, none = sealing_fast.step(state, span)
        assert none is None and sealed.attributes[semconv.CHAIN_SEQ] == seq
        assert sealed.attributes[semconv.CHAIN_HASH] == tape.chain.head
    assert sealing_fast.step(state, span) == (None, (lh, None))  # the 4th link: a checkpoint is due (every=4)
    assert state.sealed == tape.chain.size == 3
    state.schedule(tape, 3, time.monotonic())  # a checkpoint taken: the next is due at 7 spans
    assert sealing_fast.step(state, span)[0] is not None and tape.chain.size == 4
    tape.due_time = time.monotonic()  # the interval has passed
    assert sealing_fast.step(state, span) == (None, (lh, None)) and tape.chain.size == 4
    state.schedule(tape, 4, time.monotonic())
    state.on_nodes = True  # a node end may be due: the Python step decides
    assert sealing_fast.step(state, span) == (None, (lh, None)) and state.sealed == 4
