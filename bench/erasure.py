"""Erasure benchmark: what leaf v2 (salted content commitments) costs against v1, in the same run.

Part 1 (sealing) records the 2.7 KB model-node span of ``bench/integrity.py`` through a plain
``TracerProvider``, a sealer with no content keys (v1 leaves) and the default sealer (v2 leaves: the
two message attributes salted), interleaved, best of ``--repeats``; it prints each one's cost per
span and ``seal_extra_us``, v2 sealing over the plain SDK (target: at most +10 us), with v2 over v1
beside it.
Part 2 (verification) writes two sealed tapes of ``--spans`` tool spans (arguments and result are
content) into one DuckDB store, one with v1 leaves and one with v2 leaves, and times
``verify_store`` on each, alternating, best of ``--verify-repeats``: ``verify_ratio`` is v2 speed over
v1 speed (target: at least 0.9).
Part 3 (erasure) builds a store of ``--store-spans`` spans (default 1,000,000) in runs of 10 spans,
``--session-runs`` of them (default 1,000) in one session, and times ``Tapes.erase(session=...)``:
content values and salts removed, the erasure record written, the file checkpointed (target: <= 10 s).

Usage: ``python bench/erasure.py [--seal-iterations M] [--spans N] [--store-spans N] [--session-runs R]``.
Last line: ``erasure erase_session_s=X verify_ratio=R seal_extra_us=Y``.
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
from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from integrity import NullExporter, _span_loop, native_status  # noqa: E402
from tape_rows import insert_rows, span_rows  # noqa: E402

from otel_agenttape import semconv  # noqa: E402
from otel_agenttape.capture.sealing import SealingSpanProcessor  # noqa: E402
from otel_agenttape.integrity import Signer, sign_note  # noqa: E402
from otel_agenttape.integrity.checkpoint import Checkpoint  # noqa: E402
from otel_agenttape.store.reader import open_reader  # noqa: E402
from otel_agenttape.store.writer import Store  # noqa: E402
from otel_agenttape.tape.verification import verify_store  # noqa: E402


# --- part 1: sealing ---------------------------------------------------------------------------------


def bench_seal(iterations: int, repeats: int) -> tuple[float, float, float]:
    """Best per-span microseconds: plain SDK, sealing with v1 leaves, sealing with v2 leaves."""
    key = Signer.generate("bench.agenttape/key")
    plain = TracerProvider()
    plain.add_span_processor(SimpleSpanProcessor(NullExporter()))
    providers, sealers = [], []
    for keys in (frozenset(), None):
        p = TracerProvider()
        s = SealingSpanProcessor(SimpleSpanProcessor(NullExporter()), checkpoint_on_nodes=False,
                                 signing_key=key, content_keys=keys)
        p.add_span_processor(s)
        providers.append(p)
        sealers.append(s)
    best = [float("inf")] * 3
    # each loop's spans end inside an open run (the plain SDK's too, so that all three make child spans)
    runs = [p.get_tracer("otel_agenttape").start_span("run", attributes={semconv.RUN_ID: f"bench-run-{i}"})
            for i, p in enumerate([plain, *providers])]
    for _ in range(repeats):  # interleaved, best of: all three see the same machine load
        for j, (p, run) in enumerate(zip([plain, *providers], runs)):
            token = context.attach(trace.set_span_in_context(run))
            try:
                best[j] = min(best[j], _span_loop(p, iterations))
            finally:
                context.detach(token)
    for run in runs:
        run.end()
    for s in sealers:
        if s.errors or s.sealed < repeats * iterations:  # a span forwarded unsealed is not measured
            print(f"  sealing FAILED: {s.errors} errors, {s.sealed} spans sealed", file=sys.stderr)
            sys.exit(1)
    return best[0], best[1], best[2]


# --- part 2: verification ----------------------------------------------------------------------------

TRACE_V1, TRACE_V2 = "4bf92f3577b34da6a3ce929d0e0e4736", "5cf92f3577b34da6a3ce929d0e0e4737"


def write_tapes(path: str, n: int, key: Signer) -> str:
    Store(path).close()  # schema
    con = duckdb.connect(path)
    lines = []
    for trace_id, run_id, v2 in ((TRACE_V1, "tape-v1", False), (TRACE_V2, "tape-v2", True)):
        chain = None
        for start in range(0, n, 50_000):
            rows, chain = span_rows(min(50_000, n - start), trace_id, run_id, v2, start_index=start, chain=chain)
            insert_rows(con, rows)
        note = sign_note(Checkpoint(chain.origin, chain.size, chain.root(), (f"chain {chain.head}",)).body(), [key])
        lines.append(orjson.dumps({"chain_id": run_id, "epoch": 0, "size": chain.size, "note": note}))
    con.close()
    cp_file = path + ".checkpoints.jsonl"
    with open(cp_file, "wb") as fh:
        fh.write(b"\n".join(lines) + b"\n")
    return cp_file


def _verify_one(db: str, run_id: str, key: Signer, cp_file: str, n: int) -> float:
    gc.collect()
    t0 = time.perf_counter()
    reader = open_reader(db)
    try:
        reports = verify_store(reader, run=run_id, verifiers=[key.verifier()], checkpoint_files=[cp_file])
    finally:
        reader.close()
    took = time.perf_counter() - t0
    (r,) = reports
    if not r.valid or r.length != n or r.signed_size != n:
        print(f"  verification of {run_id} FAILED: {r.reason}", file=sys.stderr)
        sys.exit(1)
    return took


def bench_verify(n: int, repeats: int, workdir: str) -> tuple[float, float]:
    key = Signer.generate("bench.agenttape/key")
    db = os.path.join(workdir, "verify.duckdb")
    t0 = time.perf_counter()
    cp_file = write_tapes(db, n, key)
    print(f"  built a v1 and a v2 tape of {n:,} spans each in {time.perf_counter() - t0:.1f} s")
    best = {"tape-v1": float("inf"), "tape-v2": float("inf")}
    for i in range(repeats):  # interleaved, the order swapped each round: neither always runs second
        for run_id in ("tape-v1", "tape-v2") if i % 2 == 0 else ("tape-v2", "tape-v1"):
            best[run_id] = min(best[run_id], _verify_one(db, run_id, key, cp_file, n))
    return best["tape-v1"], best["tape-v2"]


# --- part 3: erasure ---------------------------------------------------------------------------------


def bench_erase(store_spans: int, session_runs: int, workdir: str) -> float:
    """Erase one session of ``session_runs`` 10-span runs from a store of ``store_spans`` spans."""
    import otel_agenttape

    path = os.path.join(workdir, "erase.duckdb")
    Store(path).close()
    con = duckdb.connect(path)
    t0 = time.perf_counter()
    runs = store_spans // 10
    every = max(1, runs // session_runs)  # the session's runs spread over the whole store
    batch: list[dict] = []
    in_session = 0
    for r in range(runs):
        session = None
        if r % every == 0 and in_session < session_runs:
            session, in_session = "bench-session", in_session + 1
        rows, _ = span_rows(10, f"{r:032x}", f"run-{r}", True, session=session)
        batch.extend(rows)
        if len(batch) >= 100_000:
            insert_rows(con, batch)
            batch = []
    if batch:
        insert_rows(con, batch)
    con.execute("CHECKPOINT")
    con.close()
    print(f"  built a {runs * 10:,}-span store ({runs:,} runs, {in_session:,} in the session) in "
          f"{time.perf_counter() - t0:.1f} s ({os.path.getsize(path) / 1e6:.0f} MB)")
    key = Signer.generate("bench.agenttape/key")
    gc.collect()
    t0 = time.perf_counter()
    with otel_agenttape.open(path) as tapes:
        result = tapes.erase(session="bench-session", reason="bench", signing_key=key)
    took = time.perf_counter() - t0
    if result["spans"] != in_session * 10:
        print(f"  erasure FAILED: {result}", file=sys.stderr)
        sys.exit(1)
    print(f"  erased {result['values']:,} values in {result['spans']:,} spans and rewrote the store in {took:.2f} s "
          f"(target <= 10 s)")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seal-iterations", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--spans", type=int, default=200_000, help="spans per tape for the verify ratio")
    ap.add_argument("--verify-repeats", type=int, default=5)
    ap.add_argument("--store-spans", type=int, default=1_000_000)
    ap.add_argument("--session-runs", type=int, default=1_000)
    ap.add_argument("--skip-erase", action="store_true")
    args = ap.parse_args()
    print(f"erasure benchmark (python {sys.version.split()[0]}, {os.cpu_count()} cpus, {native_status()})")
    plain, v1, v2 = bench_seal(args.seal_iterations, args.repeats)
    extra = v2 - plain
    print(f"  sealing per span: plain SDK {plain:.1f} us | v1 leaves {v1:.1f} us ({v1 - plain:+.1f}) | "
          f"v2 leaves {v2:.1f} us ({extra:+.1f}; {v2 - v1:+.1f} over v1) (target <= +10 us)")
    with tempfile.TemporaryDirectory() as workdir:
        t1, t2 = bench_verify(args.spans, args.verify_repeats, workdir)
        ratio = t1 / t2
        print(f"  verify {args.spans:,} spans: v1 {t1:.2f} s ({args.spans / t1:,.0f}/s) | v2 {t2:.2f} s "
              f"({args.spans / t2:,.0f}/s) | v2 speed / v1 speed {ratio:.2f} (target >= 0.9)")
        erase_s = float("nan")
        if not args.skip_erase:
            erase_s = bench_erase(args.store_spans, args.session_runs, workdir)
    print(f"erasure erase_session_s={erase_s:.2f} verify_ratio={ratio:.2f} seal_extra_us={extra:.1f}")


if __name__ == "__main__":
    main()
