"""Integrity benchmark: sealing cost per span against the plain SDK, and verifying a 1M-span tape.

Part 1 records the same 2.7 KB model-node span (GenAI messages, usage, one event) through a plain
``TracerProvider`` and through one whose processor is wrapped by ``SealingSpanProcessor``, both
ending in a no-op exporter, and prints the per-span difference (target: at most +10 us).
Part 2 writes a sealed tape of N spans (default 1,000,000) into a DuckDB store file and times
``agenttape verify``'s code path on it: every leaf recomputed from the stored rows, every link, the
Merkle root and the checkpoint (target: under 30 s on 2 cores).

Usage: ``python bench/integrity.py [--spans N] [--seal-iterations M] [--db PATH]``.
The line before the last says whether the compiled sealing path is in use (``native=yes``; it is
built by ``python setup.py build_ext --inplace`` and turned off by ``AGENTTAPE_NO_NATIVE=1``).
The last line reads ``integrity seal_extra_us=X verify_1m_s=Y`` (Y scaled to 1M spans if N differs).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

import duckdb
import orjson
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from otel_agenttape import semconv
from otel_agenttape.capture import sealing_fast as sealing_module
from otel_agenttape.capture.sealing import SealingSpanProcessor
from otel_agenttape.integrity import Signer, leaf_from_sdk, sign_note
from otel_agenttape.integrity import chain as chain_module
from otel_agenttape.integrity import leaf_fast as leaf_module
from otel_agenttape.integrity.checkpoint import Checkpoint
from otel_agenttape.store.reader import open_reader
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.verification import verify_store

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tape_rows import insert_rows, span_rows  # noqa: E402


class NullExporter(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


MESSAGES_IN = orjson.dumps([
    {"role": "system", "parts": [{"type": "text", "content": "You are a careful assistant. " * 8}]},
    {"role": "user", "parts": [{"type": "text", "content": "Summarise the attached report about quarterly sales. " * 12}]},
]).decode()
MESSAGES_OUT = orjson.dumps([
    {"role": "assistant", "parts": [{"type": "text", "content": "Revenue grew 12% with margins stable. " * 14}],
     "finish_reason": "stop"},
]).decode()


def node_attributes(i: int) -> dict:
    return {
        semconv.GEN_AI_OPERATION_NAME: "chat", semconv.GEN_AI_PROVIDER_NAME: "openai",
        semconv.GEN_AI_REQUEST_MODEL: "gpt-4o-mini", semconv.GEN_AI_RESPONSE_MODEL: "gpt-4o-mini-2024-07-18",
        semconv.GEN_AI_RESPONSE_ID: f"chatcmpl-{i:012d}", semconv.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
        semconv.GEN_AI_USAGE_INPUT_TOKENS: 812, semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 240,
        semconv.GEN_AI_REQUEST_TEMPERATURE: 0.2, semconv.GEN_AI_INPUT_MESSAGES: MESSAGES_IN,
        semconv.GEN_AI_OUTPUT_MESSAGES: MESSAGES_OUT, semconv.RUN_ID: "bench-run", semconv.TURN_ID: "t1",
        semconv.STEP: i, semconv.NODE_ID: f"model@bench-run|t1|{i}",
    }


def _span_loop(provider: TracerProvider, n: int) -> float:
    tracer = provider.get_tracer("otel_agenttape")
    attrs = node_attributes(1)
    ev = {semconv.EVENT_SEQ: 0, "text": "Revenue grew"}
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(n):
        span = tracer.start_span("chat gpt-4o-mini", attributes=attrs)
        span.add_event(semconv.EVENT_TEXT, ev)
        span.end()
    return (time.perf_counter() - t0) / n * 1e6


def bench_seal(iterations: int, repeats: int = 5) -> tuple[float, float, int]:
    plain = TracerProvider()
    plain.add_span_processor(SimpleSpanProcessor(NullExporter()))
    sealed = TracerProvider()
    sealer = SealingSpanProcessor(SimpleSpanProcessor(NullExporter()), checkpoint_on_nodes=False,
                                  signing_key=Signer.generate("bench.agenttape/key"))
    sealed.add_span_processor(sealer)
    with sealed.get_tracer("otel_agenttape").start_as_current_span("run", attributes={semconv.RUN_ID: "bench-run"}):
        best_plain, best_sealed = float("inf"), float("inf")
        for _ in range(repeats):  # interleaved, best of: both see the same machine load
            best_plain = min(best_plain, _span_loop(plain, iterations))
            best_sealed = min(best_sealed, _span_loop(sealed, iterations))
    if sealer.errors or sealer.sealed < repeats * iterations:  # a span forwarded unsealed is not measured
        print(f"  sealing FAILED: {sealer.errors} errors, {sealer.sealed} spans sealed", file=sys.stderr)
        sys.exit(1)
    probe: list = []
    sealer2 = SealingSpanProcessor(_Capture(probe), checkpoint_on_nodes=False)
    p2 = TracerProvider()
    p2.add_span_processor(sealer2)
    _span_loop(p2, 1)
    size = len(leaf_from_sdk(probe[0]))
    return best_plain, best_sealed, size


class _Capture(SimpleSpanProcessor):
    def __init__(self, out: list) -> None:
        self.out = out

    def on_end(self, span) -> None:
        self.out.append(span)

    def on_start(self, span, parent_context=None) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def native_status() -> str:
    """Which compiled sealing parts are in use: the leaf writer, the chain step, the sealing step."""
    parts = {"leaf": leaf_module.NATIVE, "chain": chain_module.NATIVE,
             "seal_step": sealing_module.step is not None}
    on = "yes" if all(parts.values()) else ("partly" if any(parts.values()) else "no")
    return f"native={on} (" + " ".join(f"{k}={'yes' if v else 'no'}" for k, v in parts.items()) + ")"


def write_tape(path: str, n: int, key: Signer) -> tuple[str, float]:
    """A sealed tape of n spans written straight into the store's tables (rows as the store keeps them)."""
    Store(path).close()  # schema
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    con = duckdb.connect(path)
    t0 = time.perf_counter()
    chain = None
    for start in range(0, n, 100_000):
        rows, chain = span_rows(min(100_000, n - start), trace_id, "bench-tape", False, start_index=start,
                                chain=chain, base=SHORT_TOOL_ATTRS)
        insert_rows(con, rows)
    note = sign_note(Checkpoint(chain.origin, chain.size, chain.root(), (f"chain {chain.head}",)).body(), [key])
    cp_file = path + ".checkpoints.jsonl"
    with open(cp_file, "wb") as fh:
        fh.write(orjson.dumps({"chain_id": "bench-tape", "epoch": 0, "size": chain.size, "note": note}) + b"\n")
    con.close()
    return cp_file, time.perf_counter() - t0


SHORT_TOOL_ATTRS = {
    semconv.GEN_AI_OPERATION_NAME: "execute_tool", semconv.GEN_AI_TOOL_NAME: "search",
    semconv.GEN_AI_TOOL_CALL_ARGUMENTS: '{"q":"weather in Paris"}', semconv.GEN_AI_TOOL_CALL_RESULT: '{"t":21.5}',
    semconv.NODE_TYPE: "tool", "ratio": 0.25,
}


def bench_verify(n: int, db: str | None) -> float:
    key = Signer.generate("bench.agenttape/key")
    tmp = None
    if db is None:
        tmp = tempfile.TemporaryDirectory()
        db = os.path.join(tmp.name, "tape.duckdb")
    cp_file, build_s = write_tape(db, n, key)
    print(f"  built a {n:,}-span sealed tape in {build_s:.1f} s ({os.path.getsize(db) / 1e6:.0f} MB)")
    gc.collect()
    t0 = time.perf_counter()
    reader = open_reader(db)
    reports = verify_store(reader, verifiers=[key.verifier()], checkpoint_files=[cp_file])
    reader.close()
    took = time.perf_counter() - t0
    (r,) = reports
    if not r.valid or r.length != n or r.signed_size != n:
        print(f"  verification FAILED: {r.reason}", file=sys.stderr)
        sys.exit(1)
    print(f"  verified {r.length:,} entries (links, leaves from rows, Merkle root, signed checkpoint) "
          f"in {took:.1f} s = {r.length / took:,.0f} spans/s")
    if tmp is not None:
        tmp.cleanup()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--seal-iterations", type=int, default=20_000)
    ap.add_argument("--db", default=None, help="DuckDB file to build (default: a temporary file)")
    args = ap.parse_args()
    print(f"integrity benchmark (python {sys.version.split()[0]}, {os.cpu_count()} cpus)")
    plain, sealed, size = bench_seal(args.seal_iterations)
    extra = sealed - plain
    print(f"  per span ({size} B leaf): plain SDK {plain:.1f} us | with sealing {sealed:.1f} us | "
          f"extra {extra:+.1f} us (target <= +10 us)")
    took = bench_verify(args.spans, args.db)
    per_1m = took * 1_000_000 / args.spans
    print(f"  verify: {took:.1f} s for {args.spans:,} spans -> {per_1m:.1f} s per 1M (target < 30 s)")
    print(f"  compiled sealing path: {native_status()}")
    print(f"integrity seal_extra_us={extra:.1f} verify_1m_s={per_1m:.1f}")


if __name__ == "__main__":
    main()
