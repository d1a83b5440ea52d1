"""Write the leaf test vectors in ``tests/vectors/leaf/`` (run: ``python tests/vectors/make_leaf_vectors.py``).

Each vector is one span sealed by ``SealingSpanProcessor`` as the first entry of its own tape, then
exported as OTLP (protobuf, shown as OTLP/JSON with hex ids) and turned into store rows by the
receiver's decoder and the store's row conversion. The file records the span in both forms, its
canonical leaf (v1, or v2 for the ``v2_*`` vectors, whose content values are salted commitments made
with fixed salts), the leaf's SHA-256 and Merkle leaf hash, and the chain fields of seq 0. Spans are built
as ``ReadableSpan`` objects so that values the SDK's attribute checks refuse (maps, mixed arrays)
can be covered; ids, times and the resource are fixed, so the output is reproducible.
``--check`` compares instead of writing.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/ (integrity_support)

import orjson
from integrity_support import encode, otlp_json
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from otel_agenttape import semconv
from otel_agenttape.capture.sealing import SealingSpanProcessor
from otel_agenttape.codec.otlp_decode import JSON, decode_traces
from otel_agenttape.integrity import Signer, genesis, leaf_from_sdk
from otel_agenttape.store.rows import traces_to_tables

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT = SpanContext(TRACE_ID, 0xB7AD6B7169203331, True, TraceFlags(TraceFlags.SAMPLED),
                     TraceState([("congo", "t61rcWkgMzE")]))
START, END = 1_764_450_000_123_456_789, 1_764_450_000_987_654_321
RESOURCE = Resource({
    "telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry", "telemetry.sdk.version": "1.45.2",
    "service.instance.id": "2b27776f-bca8-4c8d-b0f7-0784c88db310", "service.name": "unknown_service:python",
})
SCOPE = InstrumentationScope("otel_agenttape")

# name -> (span id, attributes after agenttape.run.id)
VECTORS: dict[str, tuple[int, dict[str, Any]]] = {
    "scalars": (0x83F49A6DA6B61AB4, {
        "s": "text", "i": 42, "neg": -7, "d": 1.5, "one_int": 1, "one_double": 1.0, "t": True, "f": False,
    }),
    "bytes_and_arrays": (0xB720482040C7ABCB, {
        "b": b"\x00\x01\xfe\xff", "empty_b": b"", "arr_s": ("a", "b"), "arr_i": (1, 2, 3),
        "arr_mixed": (1, "1", 1.0, True), "empty_arr": (),
    }),
    "doubles_special": (0xEBCFDD340A0A2DE5, {
        "neg_zero": -0.0, "nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"), "tiny": 5e-324,
        "big": 1e300, "third": 1 / 3, "e_minus_7": 1e-07,
    }),
    "int64_edges": (0x4738C573596B22B3, {"max": 2**63 - 1, "min": -(2**63), "past_2_53": 2**53 + 1}),
    "nested_maps": (0x53093FC238DC6DB5, {
        "m": {"z": 1, "a": {"deep": (1, {"k": "v"})}, "B": None},
    }),
    "unicode": (0x9938A51B32F7CA08, {
        "caf\u00e9": "na\u00efve \u65e5\u672c", "\U0001f600": "astral key", "\ue000": "private use key",
        "nfd": "e\u0301", "ctl": "tab\tnl\n\x00\x1f\"\\/",
    }),
}
# leaf v2: content values (semconv.CONTENT_KEYS) enter the leaf as salted commitments; the salts are
# fixed here (sha256 of the vector name and a counter) so that the vectors are reproducible
V2_VECTORS: dict[str, tuple[int, dict[str, Any]]] = {
    "v2_content": (0x2F1E8C3B7A6D5E40, {
        semconv.GEN_AI_INPUT_MESSAGES: '[{"role":"user","parts":[{"type":"text","content":"my card is 4111"}]}]',
        semconv.GEN_AI_OUTPUT_MESSAGES: '[{"role":"assistant","parts":[{"type":"text","content":"noted \u00e9"}]}]',
        semconv.GEN_AI_REQUEST_MODEL: "gpt-4o-mini", "gen_ai.usage.input_tokens": 12,
    }),
    "v2_tool": (0x6C5B4A3928171605, {
        semconv.GEN_AI_TOOL_CALL_ARGUMENTS: '{"q":"caf\u00e9 near me"}', semconv.GEN_AI_TOOL_CALL_RESULT: ("a", "b"),
        semconv.GEN_AI_TOOL_NAME: "search",
    }),
}
SPAN_COLS = (
    "trace_id", "span_id", "parent_span_id", "trace_state", "name", "kind", "start_time_unix_nano",
    "end_time_unix_nano", "status_code", "status_message", "attributes", "dropped_attributes_count",
    "dropped_events_count", "dropped_links_count", "chain_id", "chain_seq", "chain_prev", "chain_hash",
    "chain_epoch",
)
EVENT_COLS = ("trace_id", "span_id", "event_index", "time_unix_nano", "name", "attributes", "dropped_attributes_count")
LINK_COLS = ("trace_id", "span_id", "link_index", "linked_trace_id", "linked_span_id", "trace_state", "attributes",
             "dropped_attributes_count")


def _span(name: str, span_id: int, attrs: dict[str, Any]) -> ReadableSpan:
    event = {semconv.EVENT_SEQ: 0, "text": "h\u00e9"}
    if name in V2_VECTORS:  # a streamed segment: content of an event
        event = {semconv.EVENT_SEQ: 0, semconv.EVENT_SEGMENT: "h\u00e9"}
    ctx = SpanContext(TRACE_ID, span_id, False, TraceFlags(TraceFlags.SAMPLED), PARENT.trace_state)
    return ReadableSpan(
        name=f"vector {name}", context=ctx, parent=PARENT, resource=RESOURCE,
        attributes={semconv.RUN_ID: f"vec-{name}", **attrs},
        events=(Event(semconv.EVENT_TEXT, event, START + 1),),
        links=(Link(PARENT, {"link.attr": 1}),), kind=SpanKind.CLIENT,
        status=Status(StatusCode.ERROR, "failed \u00e9"), start_time=START, end_time=END,
        instrumentation_scope=SCOPE,
    )


def _rows(table: Any, cols: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{c: r[c] for c in cols} for r in table.to_pylist()]


def _fixed_salts(name: str) -> Any:
    counter = iter(range(1 << 30))
    return lambda n: hashlib.sha256(f"{name}/{next(counter)}".encode()).digest()[:n]


def vector(name: str) -> dict[str, Any]:
    span_id, attrs = {**VECTORS, **V2_VECTORS}[name]
    exporter = InMemorySpanExporter()
    sealer = SealingSpanProcessor(SimpleSpanProcessor(exporter), signing_key=Signer.generate("vectors"),
                                  export_checkpoints=False,
                                  salt_source=_fixed_salts(name) if name in V2_VECTORS else None)
    span = _span(name, span_id, attrs)
    sealer.on_start(span)
    sealer.on_end(span)
    (sealed,) = exporter.get_finished_spans()
    if sealer.errors or sealer.coerced:
        raise SystemExit(f"{name}: sealing failed or coerced values")
    leaf = leaf_from_sdk(sealed)
    doc = json.loads(otlp_json(encode([sealed])))
    tables = traces_to_tables([decode_traces(json.dumps(doc).encode(), JSON)])
    (row,) = _rows(tables.spans, SPAN_COLS)
    row["events"] = _rows(tables.span_events, EVENT_COLS)
    row["links"] = _rows(tables.span_links, LINK_COLS)
    a = sealed.attributes
    if (semconv.CHAIN_SALTS in a) != (name in V2_VECTORS):
        raise SystemExit(f"{name}: expected a leaf v{2 if name in V2_VECTORS else 1}")
    return {
        "description": f"{name}: a sealed span built with the OpenTelemetry Python SDK 1.45"
                       + (" (leaf v2: content values as salted commitments)" if name in V2_VECTORS else ""),
        "otlp_json": doc,
        "row": row,
        "leaf": leaf.decode("utf-8"),
        "leaf_sha256": hashlib.sha256(leaf).hexdigest(),
        "merkle_leaf_hash": hashlib.sha256(b"\x00" + leaf).hexdigest(),
        "chain": {
            "chain_id": a[semconv.CHAIN_ID], "epoch": a[semconv.CHAIN_EPOCH], "genesis": genesis(a[semconv.CHAIN_ID]),
            "seq": a[semconv.CHAIN_SEQ], "prev": a[semconv.CHAIN_PREV], "hash": a[semconv.CHAIN_HASH],
        },
    }


def write_or_check(folder: Path, names: list[str], make: Any, check: bool) -> int:
    """Write ``make(name)`` for each name into ``folder/NAME.json``, or (``check``) say which differ."""
    stale = []
    folder.mkdir(exist_ok=True)
    for name in names:
        data = orjson.dumps(make(name), option=orjson.OPT_INDENT_2) + b"\n"
        path = folder / f"{name}.json"
        if check:
            if not path.exists() or path.read_bytes() != data:
                stale.append(path.name)
        else:
            path.write_bytes(data)
    if stale:
        print("stale vectors:", ", ".join(stale))
        return 1
    return 0


def main(argv: list[str]) -> int:
    return write_or_check(HERE / "leaf", [*VECTORS, *V2_VECTORS], vector, "--check" in argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
