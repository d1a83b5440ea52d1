"""Lake benchmark: N receivers' stores published into one lake, read as one, against one DuckDB file.

Synthesizes ``--spans`` spans (default 10,000,000) in the store's column contract (bench/replay.py's
builder: 10-span background runs, one 100-node run, a coordinator with 20 child runs each in its own
trace), routes every trace to one of ``--receivers`` stores by trace id (as the Collector's
load-balancing exporter does) and also writes every span into one DuckDB file, the baseline. A
share of the background runs (``--sealed-runs``) is sealed, chain hashes computed from the stored
rows exactly as capture would have sealed them, so ``verify`` has tapes to check. Each receiver's store
is then published into the lake by ``LakePublisher`` (the receiver's own publication path, batches
of ``--batch`` spans), and the lake compacted once (``lake compact``).

Then, through ``otel_agenttape.open`` on the lake and on the DuckDB file in the same run: the first
``runs`` page (20 newest) of a fresh reader (median of ``--repeat`` readers), a ``runs`` page once the
reader keeps every run's keys, the replay of the 100-node run, the 1 + 20 tree (``replay --tree``; ``Tapes.tree``, which
adds each run's summary from the ``runs`` view, is printed beside it), and ``verify`` of every sealed tape.
Targets: replay <= 200 ms, tree <= 500 ms, runs page <= 300 ms, bytes per span <= 700.

``--iceberg`` publishes into Iceberg tables instead (``IcebergPublisher``; a SQLite catalog in the
folder), compacts them (``lake compact`` as an Iceberg overwrite) and reads those; the folder lake is
published from the same stores too, so the last line adds both lakes' bytes per span and publication
cost per span (target: the Iceberg lake's bytes no more than 5% above the folder lake's).

    python bench/lake.py [--spans 10000000] [--receivers 3] [--repeat 7] [--dir DIR] [--reuse] [--iceberg]

``--reuse`` measures the lake and DuckDB file already built in ``--dir`` (their ids are kept in
``ids.json`` there), so two versions of the read code can be timed on the same data.

Last line: ``lake runs_ms=.. replay_ms=.. tree_ms=.. verify_spans_per_s=.. bytes_per_span=.. runs_first_ms=..
duckdb_runs_first_ms=..
duckdb_runs_ms=.. duckdb_replay_ms=.. duckdb_tree_ms=.. duckdb_verify_spans_per_s=.. duckdb_bytes_per_span=..
spans=.. publish_us_per_span=..`` and, with ``--iceberg``, `` iceberg=1 folder_bytes_per_span=..
folder_publish_us_per_span=..``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import string
import sys
import tempfile
import time
from typing import Any

import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from replay import RUN_EVERY_NS, T0, Builder  # noqa: E402

from otel_agenttape.codec import typed as anyvalue  # noqa: E402
from otel_agenttape import semconv as sc  # noqa: E402
from otel_agenttape.integrity.chain import genesis, link_hash  # noqa: E402
from otel_agenttape.integrity.leaf import leaf_bytes, project_row  # noqa: E402

CHUNK = 200_000
_rng = random.Random(7)
# A vocabulary of made-up words: prompts and answers differ run to run as real ones do, so the
# compression measured is not that of one repeated template.
WORDS = ["".join(_rng.choices(string.ascii_lowercase, k=_rng.randint(2, 9))) for _ in range(4000)]


def _text(n_words: int) -> str:
    return " ".join(_rng.choices(WORDS, k=n_words))


class VariedBuilder(Builder):
    """bench/replay.py's builder with each run's messages, answer and tool result made of fresh text."""

    def run(self, run_id: str, trace_id: str, start: int, n_nodes: int, **kw: Any) -> int:
        question, answer = _text(40), _text(25)
        self.model_base = {
            **self.model_base,
            sc.GEN_AI_INPUT_MESSAGES: orjson.dumps([
                {"role": "system", "parts": [{"type": "text", "content": "You answer support tickets."}]},
                {"role": "user", "parts": [{"type": "text", "content": question}]}]).decode(),
            sc.GEN_AI_OUTPUT_MESSAGES: orjson.dumps([{"role": "assistant", "parts": [
                {"type": "text", "content": answer}], "finish_reason": "stop"}]).decode(),
            sc.MODEL_OUTPUT_TEXT: answer,
        }
        self.tool_base = {**self.tool_base, sc.GEN_AI_TOOL_CALL_ARGUMENTS: orjson.dumps({"order": _rng.randint(1, 10**6)}).decode(),
                          sc.GEN_AI_TOOL_CALL_RESULT: orjson.dumps({"status": _text(6)}).decode()}
        self.event_attrs = [anyvalue.dumps(anyvalue.attrs_from_python({sc.EVENT_SEQ: i + 1,
                                                                       sc.EVENT_SEGMENT: answer[i * 40:(i + 1) * 40]}))
                            for i in range(4)]
        return super().run(run_id, trace_id, start, n_nodes, **kw)


class Routed:
    """One builder per receiver; a run (its whole trace) goes where its trace id hashes."""

    def __init__(self, n: int) -> None:
        self.parts = [VariedBuilder() for _ in range(n)]

    def part(self, trace_id: str) -> Builder:
        return self.parts[int(trace_id[:8], 16) % len(self.parts)]

    def __len__(self) -> int:
        return sum(len(b) for b in self.parts)


def seal_last_run(b: Builder, first_row: int) -> None:
    """Seal the spans from ``first_row`` on (one run, nodes then its run span) as one tape."""
    s, ev = b.spans, b.events
    events: dict[str, list[dict[str, Any]]] = {}
    n_ev = len(ev["span_id"])
    for j in range(n_ev - 1, -1, -1):  # the run's events are the last ones
        if ev["trace_id"][j] != s["trace_id"][first_row]:
            break
        events.setdefault(ev["span_id"][j], []).append({k: ev[k][j] for k in ev})
    run_id = s["run_id"][first_row]
    prev = genesis(run_id, 0)
    for seq, i in enumerate(range(first_row, len(s["span_id"]))):
        row = {k: s[k][i] for k in s}
        leaf = leaf_bytes(project_row(row, events.get(row["span_id"], ())))
        h = link_hash(prev, leaf)
        attrs = orjson.loads(row["attributes"])
        attrs.update(anyvalue.attrs_from_python({sc.CHAIN_ID: run_id, sc.CHAIN_SEQ: seq, sc.CHAIN_PREV: prev,
                                                 sc.CHAIN_HASH: h, sc.CHAIN_EPOCH: 0}))
        s["attributes"][i] = anyvalue.dumps(attrs)
        s["chain_id"][i], s["chain_seq"][i], s["chain_prev"][i], s["chain_hash"][i] = run_id, seq, prev, h
        s["chain_epoch"][i] = 0
        prev = h


def build(folder: str, total: int, receivers: int, sealed_runs: int) -> dict[str, Any]:
    from otel_agenttape.store.writer import Store

    stores = [Store(os.path.join(folder, f"r{i}.duckdb")) for i in range(receivers)]
    single = Store(os.path.join(folder, "single.duckdb"))
    ids: dict[str, Any] = {"sealed_spans": 0}
    t = T0
    written = 0
    r = Routed(receivers)
    seal_every = max(1, (total // 10) // max(1, sealed_runs)) if sealed_runs else 0
    background = 0

    def flush() -> None:
        nonlocal written, r
        for store, b in zip(stores, r.parts):
            if len(b):
                tables = b.tables()
                store.write_tables(tables)
                single.write_tables(tables)
                written += len(b)
        r = Routed(receivers)
        print(f"  {written} spans written", file=sys.stderr, flush=True)

    while written + len(r) < total:
        if "run" not in ids and written + len(r) >= total // 2:
            b0 = VariedBuilder()
            ids["run"], trace = b0.new_id(16), b0.new_id(16)
            r.part(trace).run(ids["run"], trace, t, 100, agent="big")
            ids["tree"], trace = b0.new_id(16), b0.new_id(16)
            r.part(trace).run(ids["tree"], trace, t, 2, agent="coordinator")
            child_t = t + 300_000_000
            homes = set()
            for i in range(20):
                trace = b0.new_id(16)
                homes.add(int(trace[:8], 16) % receivers)
                child_t = r.part(trace).run(b0.new_id(16), trace, child_t, 4, agent=f"child-{i}",
                                            parent_run_id=ids["tree"]) + 10_000_000
            ids["child_receivers"] = len(homes)
        trace = os.urandom(16).hex()
        b = r.part(trace)
        first = len(b)
        b.run(os.urandom(16).hex(), trace, t, 9)
        if seal_every and background % seal_every == 0 and ids["sealed_spans"] < sealed_runs * 10:
            seal_last_run(b, first)
            ids["sealed_spans"] += 10
        background += 1
        t += RUN_EVERY_NS
        if len(r) >= CHUNK:
            flush()
    flush()
    ids["spans"] = written
    ids["stores"] = stores
    ids["single"] = single
    return ids


def median_ms(fn: Any, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(source: Any, ids: dict[str, Any], repeat: int, label: str) -> dict[str, float]:
    import otel_agenttape

    firsts = []
    for _ in range(repeat):  # the first page of a fresh reader (each `agenttape runs --lake` is one)
        with otel_agenttape.open(source) as tapes:
            start = time.perf_counter()
            page = tapes.runs(limit=20)
            firsts.append((time.perf_counter() - start) * 1000)
            assert len(page.runs) == 20, len(page.runs)
    first_ms = statistics.median(firsts)
    with otel_agenttape.open(source) as tapes:
        tapes.runs(limit=20)
        tapes.runs(limit=20)  # the second page asked reads every run's keys; the read model keeps them
        replay = tapes.replay(ids["run"])
        tree = tapes.replay(ids["tree"], tree=True)
        assert len(tree["children"]) == 20, tree.keys()
        out = {
            "runs_first_ms": first_ms,
            "runs_ms": median_ms(lambda: tapes.runs(limit=20), repeat),
            "replay_ms": median_ms(lambda: tapes.replay(ids["run"]), repeat),
            "tree_ms": median_ms(lambda: tapes.replay(ids["tree"], tree=True), repeat),  # replay --tree
            "summary_tree_ms": median_ms(lambda: tapes.tree(ids["tree"]), repeat),  # with runs-view summaries
        }
        start = time.perf_counter()
        reports = tapes.verify()
        took = time.perf_counter() - start
    assert replay and reports and all(rep["valid"] for rep in reports), [
        rep["reason"] for rep in reports if not rep["valid"]][:3]
    checked = sum(rep["length"] for rep in reports)
    assert checked == ids["sealed_spans"], (checked, ids["sealed_spans"])
    out["verify_spans_per_s"] = checked / took
    print(f"{label}: runs page {out['runs_ms']:.1f} ms (first page {out['runs_first_ms']:.1f} ms), replay {out['replay_ms']:.1f} ms, tree {out['tree_ms']:.1f} ms "
          f"(Tapes.tree with summaries {out['summary_tree_ms']:.1f} ms), "
          f"verify {out['verify_spans_per_s']:.0f} spans/s ({checked} sealed spans)", flush=True)
    return out


def publish(stores: list[Any], lake: str, args: Any, iceberg: bool) -> dict[str, float]:
    """Publish every store into one lake (the receivers' own publication path), compact it once; the
    publication's cost per span, the compaction's time and the lake's bytes and files."""
    if iceberg:
        from otel_agenttape.store.lake.iceberg_maintain import compact, status
        from otel_agenttape.store.lake.iceberg_publish import IcebergPublisher as Publisher
    else:
        from otel_agenttape.store.lake import LakePublisher as Publisher
        from otel_agenttape.store.lake.maintain import compact, status

    start = time.perf_counter()
    for i, store in enumerate(stores):
        Publisher(store, lake, f"r{i}", max_spans=args.batch).publish_all()
    published = time.perf_counter() - start
    start = time.perf_counter()
    merged = compact(lake, grace_seconds=0)
    compacted = time.perf_counter() - start
    st = status(lake)
    out = {"bytes": sum(v["bytes"] for v in st["tables"].values()),
           "files": sum(v["files"] for v in st["tables"].values()), "published_s": published}
    print(f"{'iceberg' if iceberg else 'folder'} lake: published in {published:.0f} s, compacted "
          f"{merged['merged_files']} files into {merged['written_files']} in {compacted:.0f} s; "
          f"{out['bytes'] / 1e6:.1f} MB in {out['files']} files", flush=True)
    return out


def build_and_publish(folder: str, lake: str, args: Any) -> dict[str, Any]:
    """Build the receivers' stores and the single file, publish and compact the lake (with ``--iceberg``
    also the folder lake, for its bytes and publication cost); the ids are saved."""
    start = time.perf_counter()
    ids = build(folder, args.spans, args.receivers, args.sealed_runs)
    built = time.perf_counter() - start
    print(f"built {ids['spans']} spans in {args.receivers} receiver stores and one DuckDB file in {built:.0f} s "
          f"(tree children on {ids['child_receivers']} receivers)", flush=True)
    stores = ids.pop("stores")
    got = publish(stores, lake, args, args.iceberg)
    ids["lake_bytes"] = got["bytes"]
    ids["publish_us_per_span"] = got["published_s"] * 1e6 / ids["spans"]
    if args.iceberg:
        folder_lake = publish(stores, os.path.join(folder, "lake"), args, False)
        ids["folder_bytes"] = folder_lake["bytes"]
        ids["folder_publish_us_per_span"] = folder_lake["published_s"] * 1e6 / ids["spans"]
    for store in stores:
        store.close()
    single = ids.pop("single")
    single.con.execute("CHECKPOINT")
    single.close()
    with open(os.path.join(folder, "ids.json"), "wb") as fh:
        fh.write(orjson.dumps(ids))
    return ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=10_000_000)
    ap.add_argument("--receivers", type=int, default=3)
    ap.add_argument("--sealed-runs", type=int, default=10_000, help="background runs sealed (10 spans each)")
    ap.add_argument("--batch", type=int, default=1_000_000, help="spans per published batch")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--dir", default=None, help="where to build (default: a temp folder, removed after)")
    ap.add_argument("--reuse", action="store_true", help="measure what an earlier run built in --dir")
    ap.add_argument("--iceberg", action="store_true",
                    help="publish into Iceberg tables (a SQLite catalog in --dir) and read those; the folder lake "
                         "is published too, for its bytes and publication cost")
    args = ap.parse_args()

    folder = args.dir or tempfile.mkdtemp(prefix="agenttape-lake-bench-")
    lake = f"iceberg+sql://{os.path.abspath(folder)}/catalog.db#bench" if args.iceberg else os.path.join(folder, "lake")
    db = os.path.join(folder, "single.duckdb")
    saved = os.path.join(folder, "ids.json")
    reuse = bool(args.reuse and args.dir and os.path.exists(saved))
    if args.dir and os.path.exists(folder) and not reuse:
        shutil.rmtree(folder)
    os.makedirs(folder, exist_ok=True)
    try:
        if reuse:
            with open(saved, "rb") as fh:
                ids = orjson.loads(fh.read())
            print(f"reusing {ids['spans']} spans in {folder}", flush=True)
        else:
            ids = build_and_publish(folder, lake, args)
        lake_bytes = ids["lake_bytes"]
        db_bytes = os.path.getsize(db)
        n = ids["spans"]
        lk = measure(lake, ids, args.repeat, "iceberg lake" if args.iceberg else "lake")
        dd = measure(db, ids, args.repeat, "duckdb")
        print(f"lake runs_ms={lk['runs_ms']:.1f} replay_ms={lk['replay_ms']:.1f} tree_ms={lk['tree_ms']:.1f} "
              f"verify_spans_per_s={lk['verify_spans_per_s']:.0f} bytes_per_span={lake_bytes / n:.0f} "
              f"runs_first_ms={lk['runs_first_ms']:.1f} duckdb_runs_first_ms={dd['runs_first_ms']:.1f} "
              f"duckdb_runs_ms={dd['runs_ms']:.1f} duckdb_replay_ms={dd['replay_ms']:.1f} "
              f"duckdb_tree_ms={dd['tree_ms']:.1f} duckdb_verify_spans_per_s={dd['verify_spans_per_s']:.0f} "
              f"duckdb_bytes_per_span={db_bytes / n:.0f} spans={n}"
              + (f" publish_us_per_span={ids['publish_us_per_span']:.2f}" if "publish_us_per_span" in ids else "")
              + (f" iceberg=1 folder_bytes_per_span={ids['folder_bytes'] / n:.0f} "
                 f"folder_publish_us_per_span={ids['folder_publish_us_per_span']:.2f}" if "folder_bytes" in ids else ""))
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
