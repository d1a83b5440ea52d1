"""The compiled leaf writer (``integrity/_leaf.pyx``) gives the Python path's bytes or steps aside.

``_leaf.leaf_sdk(span)`` must return exactly ``leaf.python_leaf_from_sdk(span)`` whenever it returns
bytes, and ``None`` where the Python path would refuse the span (``NotOtlpSafe``/``CanonicalError``),
so sealing never depends on which path ran. ``leaf_hash_sdk`` must be the Merkle leaf hash of those
bytes. Checked on the leaf vectors, on SDK spans and on hypothesis-generated spans holding adversarial
values (int64 edges and beyond, -0.0, NaN, infinities, bools, bytes, nested arrays and maps, every
ASCII control character, non-ASCII and astral text, unpaired surrogates, empty strings and arrays).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from otel_agenttape.integrity import leaf_fast
from otel_agenttape.integrity.leaf import leaf_bytes, project_sdk
from otel_agenttape.integrity.leaf_fast import python_leaf_from_sdk

try:
    _leaf = importlib.import_module("otel_agenttape.integrity._leaf")
except ImportError:  # not built (no Cython or no compiler): only the Python path exists
    _leaf = None

needs_native = pytest.mark.skipif(
    _leaf is None, reason="the compiled leaf writer is not built (python setup.py build_ext --inplace)")
pytestmark = needs_native

VECTORS_GEN = Path(__file__).parent / "vectors" / "make_leaf_vectors.py"
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT = SpanContext(TRACE_ID, 0xB7AD6B7169203331, True, TraceFlags(TraceFlags.SAMPLED),
                     TraceState([("congo", "t61rcWkgMzE"), ("rojo", "00f067aa0ba902b7")]))
LIMITS = SpanLimits(max_attributes=10_000, max_events=10_000, max_links=1000, max_event_attributes=10_000,
                    max_link_attributes=10_000)


def _python(span: Any) -> bytes | None:
    try:
        return python_leaf_from_sdk(span)
    except Exception:  # noqa: BLE001 - the span has no canonical form: sealing makes it OTLP-safe first
        return None


def check(span: Any, *, taken: bool | None = None) -> bytes | None:
    """Both paths on one span: the compiled bytes are the Python bytes, or the compiled path steps aside."""
    native = _leaf.leaf_sdk(span)
    python = _python(span)
    if native is not None:
        assert native == python, (native, python)
        assert _leaf.leaf_hash_sdk(span) == hashlib.sha256(b"\x00" + native).digest()
    else:
        assert _leaf.leaf_hash_sdk(span) is None
    if taken is not None:
        assert (native is not None) is taken, (taken, python)
    if python is not None:
        assert leaf_fast.leaf_from_sdk(span) == python
        assert leaf_fast.leaf_hash_from_sdk(span) == hashlib.sha256(b"\x00" + python).digest()
    return native


def make_span(attrs: Any, *, name: Any = "span", events: Any = (), links: Any = (), status: Any = None,
              ctx: SpanContext | None = None, parent: Any = PARENT, kind: SpanKind = SpanKind.INTERNAL,
              start: Any = 1_764_450_000_123_456_789, end: Any = 1_764_450_000_987_654_321) -> ReadableSpan:
    return ReadableSpan(
        name=name, context=ctx or SpanContext(TRACE_ID, 0x83F49A6DA6B61AB4, False, TraceFlags(1), PARENT.trace_state),
        parent=parent, attributes=attrs, events=events, links=links, kind=kind,
        status=status or Status(StatusCode.UNSET), start_time=start, end_time=end,
    )


# --- fixtures of the repository ----------------------------------------------------------------------


def _vectors_module():
    spec = importlib.util.spec_from_file_location("make_leaf_vectors", VECTORS_GEN)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_leaf_vectors_give_the_recorded_bytes() -> None:
    gen = _vectors_module()
    import json

    taken = 0
    for name, (span_id, attrs) in gen.VECTORS.items():
        span = gen._span(name, span_id, attrs)
        native = check(span)
        recorded = json.loads((VECTORS_GEN.parent / "leaf" / f"{name}.json").read_text(encoding="utf-8"))["leaf"]
        if native is not None:
            taken += 1
            assert native == recorded.encode("utf-8")
    assert taken >= 3  # scalars, doubles, int64 edges: the compiled path writes them


def test_sdk_spans_through_bounded_attributes_and_lists() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_attributes=3, max_events=2, max_links=1,
                                                     max_event_attributes=1, max_link_attributes=1))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    for i in range(3):
        links = [Link(PARENT, {"a": 1, "b": "x"}), Link(PARENT)] if i else None
        with tracer.start_as_current_span(f"s{i}", links=links, kind=SpanKind(i)) as sp:
            for k in "abcde"[: i + 2]:
                sp.set_attribute(k, i)  # past max_attributes: dropped count
            for j in range(i + 1):
                sp.add_event(f"e{j}", {"x": j, "y": "two"})
            if i == 2:
                sp.set_status(Status(StatusCode.ERROR, "bad \u00e9\n"))
    provider.shutdown()
    for span in exporter.get_finished_spans():
        check(span, taken=True)
    assert any(s.dropped_attributes for s in exporter.get_finished_spans())
    assert any(e.dropped_attributes for s in exporter.get_finished_spans() for e in s.events)


def test_every_ascii_character_and_text_forms() -> None:
    texts = [chr(c) for c in range(128)] + [
        "", "\u0080", "\u00ff", "\u0100", "\u07ff", "\u0800", "\u2028\u2029", "\ufeff", "\uffff", "\ue000",
        "\U00010000", "\U0001f600", "\U0010ffff", "e\u0301", "\"\\/\b\f\n\r\t\x00\x1f\x7f",
        "x" * 7 + '"', "x" * 8 + '"', "x" * 9 + "\\" + "y" * 20, '"' * 40, "a" * 9000, "\u00e9" * 5000,
        "\u65e5" * 3000 + "\n", "\U0001f600" * 2500, "a\x01b" * 1000,
    ]
    for t in texts:
        assert check(make_span({"k": t, "arr": (t, t)}, name=t, status=Status(StatusCode.ERROR, t)),
                     taken=True) is not None
        check(make_span({t: 1}), taken=max(t, default="") <= "\uffff")  # keys are escaped alike (astral: refused)
    for bad in ["\ud800", "\udfff", "a\udc00b", "\ud83d\ude00", "\u00e9\ud800", "\U0001f600\udfff"]:
        check(make_span({"k": bad}), taken=False)
        check(make_span({}, name=bad), taken=False)
        check(make_span({bad: "v"}), taken=False)


def test_values_at_the_edges() -> None:
    taken = [0, -1, 1, 2**63 - 1, -(2**63), 2**53 + 1, -(2**53) - 1, 0.0, -0.0, math.nan, math.inf, -math.inf,
             5e-324, 1e300, 1 / 3, 1e-7, 1e16, 1e21, 123456789.0, True, False, None, (), [], ("a", 1, 1.5, True, None),
             ["", ""], ("\u00e9",)]
    refused = [2**63, -(2**63) - 1, 2**64, 10**40, -(10**40), b"", b"\x00\xff", bytearray(b"x"), {"k": "v"}, {},
               (("nested",),), ([1],), (b"x",), (2**63,), ({"k": 1},), object(), 1 + 2j]
    for v in taken:
        check(make_span({"v": v}), taken=True)
    for v in refused:
        check(make_span({"v": v}), taken=False)
    for v in (True, 1, 1.0):  # bools are not ints, ints are not floats
        leaf = check(make_span({"x": v}), taken=True)
        assert leaf == rfc8785.dumps(project_sdk(make_span({"x": v})))


def test_keys_the_compiled_path_leaves_alone() -> None:
    check(make_span({"\U0001f600": "x", "\ue000": "y"}), taken=False)  # UTF-16 order differs from code points
    check(make_span({"agenttape.chain.seq": 1, "k": 1}), taken=False)  # span attributes: the general path drops it
    check(make_span({"agenttape.chain.\u00e9": 1}), taken=False)
    check(make_span({1: "int key"}), taken=False)
    check(make_span({"agenttape.chain": 1, "agenttape.chaim.x": 2}), taken=True)
    ev = Event("e", {"agenttape.chain.seq": 1, "k": "v"}, 5)  # events keep chain keys (they are hashed)
    leaf = check(make_span({"k": 1}, events=(ev,)), taken=True)
    assert leaf is not None and b"agenttape.chain.seq" in leaf

    class Key(str):
        pass

    check(make_span({Key("k"): 1}), taken=False)
    check(make_span({"k": Key("v")}), taken=False)


def test_key_order_is_remembered_per_key_objects_not_per_text() -> None:
    """The remembered order is keyed by the very key objects: a new dict with other keys, or the same
    keys in another insertion order, gets its own order."""
    a, b, c = "alpha", "beta", "".join(["gam", "ma"])
    for attrs in ({a: 1, b: 2, c: 3}, {c: 3, b: 2, a: 1}, {a: 1, b: 2}, {a: 1, b: 2, "delta": 4},
                  {a: 1, b: 2, "".join(["gam", "ma"]): 3}, {"\U0001f600": 1, a: 2}, {a: 1, "agenttape.chain.x": 2}):
        for _ in range(2):
            check(make_span(attrs))
            check(make_span({}, events=(Event("e", attrs, 1),)))


def test_span_fields_at_the_edges() -> None:
    ctx = SpanContext(2**128 - 1, 2**64 - 1, False)
    check(make_span({}, ctx=ctx, parent=SpanContext(1, 1, True)), taken=True)
    check(make_span({}, ctx=SpanContext(1, 1, False), parent=None, kind=SpanKind.CONSUMER), taken=True)
    check(make_span({}, ctx=SpanContext(2**128, 1, False)), taken=False)  # ids out of range: Python decides
    check(make_span({}, ctx=SpanContext(-1, 1, False)), taken=False)
    check(make_span({}, parent=SpanContext(1, 2**64, False)), taken=False)
    check(make_span({}, start=None, end=None), taken=False)
    check(make_span({}, start=2**64), taken=False)
    check(make_span({}, start=-5, end=0), taken=True)
    check(make_span({}, name=None), taken=False)
    check(make_span({}, status=Status(StatusCode.OK)), taken=True)
    check(make_span({}, status=Status(StatusCode.ERROR, "")), taken=True)
    check(make_span({}, ctx=SpanContext(1, 2, False, trace_state=TraceState([("a", "b=c"), ("d", "\u00e9")]))))
    check(make_span({}, events=(Event("e", None, 1), Event("f", {}, 2), Event("g", BoundedAttributes(1, {"a": 1}), 3))),
          taken=True)
    check(make_span({}, links=(Link(PARENT), Link(SpanContext(5, 6, False), {"k": ("a", "b")}))), taken=True)
    check(make_span({}, links=(Link(SpanContext(5, 2**64 + 1, False)),)), taken=False)
    check(make_span(BoundedAttributes(None, {"k": 1})), taken=True)
    check(make_span(None), taken=True)


# --- generated spans ---------------------------------------------------------------------------------

SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d\ude00"])
TEXT = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(max_codepoint=0x7F), max_size=40),
    st.text(st.characters(min_codepoint=0x80, max_codepoint=0xFFFF, exclude_categories=("Cs",)), max_size=8),
    st.text(st.characters(min_codepoint=0x10000), max_size=4),
    st.builds(lambda a, s, b: a + s + b, st.text(max_size=4), SURROGATES, st.text(max_size=4)),
    st.sampled_from(["", "\x00", "\x1f", "\x7f", '"', "\\", "\u2028", '{"role":"user","content":"hi\\n"}']),
)
INTS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64 - 1, 2**64, 2**53 + 1, 0, -1]),
    st.integers(min_value=-(2**200), max_value=2**200),
)
FLOATS = st.one_of(st.floats(), st.sampled_from([-0.0, 0.0, math.nan, math.inf, -math.inf, 5e-324, 1e21, 1e-7]))
SCALARS = st.one_of(TEXT, INTS, FLOATS, st.booleans(), st.none(), st.binary(max_size=6))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
                            st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=8,
)
KEYS = st.one_of(TEXT, st.sampled_from(["gen_ai.request.model", "agenttape.chain.seq", "agenttape.chain", "a", "Z",
                                        "\ue000", "\U0001f600", "\uffff"]))
ATTRS = st.dictionaries(KEYS, VALUES, max_size=8)
PLAIN_ATTRS = st.dictionaries(
    st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)), max_size=10).filter(
        lambda k: not k.startswith("agenttape.chain.")),
    st.one_of(st.text(st.characters(exclude_categories=("Cs",)), max_size=30), st.integers(-(2**63), 2**63 - 1),
              st.floats(), st.booleans(), st.lists(st.one_of(st.text(st.characters(exclude_categories=("Cs",))),
                                                             st.integers(-(2**63), 2**63 - 1), st.floats(),
                                                             st.booleans()), max_size=3).map(tuple)),
    max_size=10,
)


@st.composite
def spans(draw, attrs=ATTRS, texts=TEXT):
    events = tuple(
        Event(draw(texts), draw(st.one_of(st.none(), attrs, attrs.map(lambda a: BoundedAttributes(None, a)))),
              draw(st.integers(0, 2**63 - 1)))
        for _ in range(draw(st.integers(0, 2)))
    )
    links = tuple(
        Link(SpanContext(draw(st.integers(1, 2**128 - 1)), draw(st.integers(1, 2**64 - 1)), True),
             draw(st.one_of(st.none(), attrs)))
        for _ in range(draw(st.integers(0, 2)))
    )
    status = draw(st.sampled_from([Status(StatusCode.UNSET), Status(StatusCode.OK), None]))
    if status is None:
        status = Status(StatusCode.ERROR, draw(texts))
    span_attrs = draw(attrs)
    return make_span(
        draw(st.sampled_from([lambda a: a, lambda a: BoundedAttributes(None, a)]))(span_attrs),
        name=draw(texts), events=events, links=links, status=status,
        ctx=SpanContext(draw(st.integers(1, 2**128 - 1)), draw(st.integers(1, 2**64 - 1)), False),
        parent=draw(st.one_of(st.none(), st.just(PARENT))), kind=draw(st.sampled_from(list(SpanKind))),
        start=draw(st.integers(0, 2**63 - 1)), end=draw(st.integers(0, 2**63 - 1)),
    )


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans())
def test_generated_adversarial_spans(span) -> None:
    check(span)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans(attrs=PLAIN_ATTRS, texts=st.text(st.characters(exclude_categories=("Cs",)), max_size=20)))
def test_generated_plain_spans_take_the_compiled_path(span) -> None:
    leaf = check(span, taken=True)
    assert leaf == rfc8785.dumps(project_sdk(span)) == leaf_bytes(project_sdk(span))


@pytest.mark.parametrize("direct_sha256", [True, False], ids=["libcrypto", "hashlib"])
def test_large_leaves_hash_in_one_or_many_pieces(direct_sha256) -> None:
    try:
        if _leaf.use_direct_sha256(direct_sha256) != direct_sha256:
            pytest.skip("no libcrypto with SHA256_Init in this process")
        for n in (0, 1, 2030, 2040, 2041, 4080, 4081, 8200, 65_000, 65_600, 70_000, 300_000):
            span = make_span({"big": "x" * n, "wide": "\u00e9" * (n // 3)})
            leaf = check(span, taken=True)
            assert leaf is not None and _leaf.leaf_hash_sdk(span) == hashlib.sha256(b"\x00" + leaf).digest()
    finally:
        _leaf.use_direct_sha256(True)


def test_attribute_sets_beyond_the_remembered_size() -> None:
    for n in (63, 64, 65, 200):
        attrs = {f"k{i:03d}\u00e9" if i % 2 else f"K{i}": (i if i % 3 else f"v{i}") for i in range(n)}
        check(make_span(attrs, events=(Event("e", dict(attrs), 1),)), taken=True)
        check(make_span({**attrs, "\U0001f600": 1}), taken=False)
        check(make_span({**attrs, "agenttape.chain.seq": 1}), taken=False)


def test_other_span_layouts_step_aside() -> None:
    class Odd:
        name = "odd"

    assert _leaf.leaf_sdk(Odd()) is None
    assert _leaf.leaf_hash_sdk(object()) is None
