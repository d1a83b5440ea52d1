"""Resume costs: the journal's price per call, and a resumed run's wall time against the original.

(a) journal: a no-op tool through ``ResumableToolExecutor`` (an intent and a commit) and a model call
    (one commit), per-call wall time p50/p99, without a journal and with the SQLite WAL journal in
    each durability mode: ``full`` (default: every record fsync'd), ``intent`` (the intent is fsync'd
    before the side effect, commits ride on the next fsync), ``process`` (no fsync: survives kill -9,
    not power loss). ``raw_fsync`` is one append + fsync on the same disk: the floor under ``intent``.
(b) resume: a 20-step agent (a model call of ``--model-ms`` and a tool of ``--tool-ms`` per step, as
    sleeps standing in for the network and the side effect) runs once, then again on the same journal
    as a resumed run (every call a hit). Reported: resumed wall time / original wall time.
Last line: ``resume journal_p99_ms=X resumed_over_original=R`` (X: the default mode, ``full``, the
slower of the tool and model call p99).
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import tempfile
import time
from pathlib import Path

from otel_agenttape.resume import ResumableModelClient, ResumableToolExecutor, ResumeIndex
from otel_agenttape.resume.journal import Journal

DEFAULT_DURABILITY = inspect.signature(Journal).parameters["durability"].default


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


CPU: dict[int, list[float]] = {}  # id(wall list) -> per-call CPU time of this thread, ms


def per_call(fn, n: int) -> list[float]:
    """Per-call wall time in ms; this thread's CPU time per call is kept in ``CPU`` (wall time on a
    loaded machine includes waiting for a core, CPU time does not)."""
    out, cpu = [], []
    for i in range(n):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.thread_time() - c0) * 1000)
    CPU[id(out)] = cpu
    return out


def raw_fsync(directory: Path, n: int) -> list[float]:
    """What the disk charges for one fsync of a small append: the floor under a durable intent."""
    path = directory / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        def one(i: int) -> None:
            os.write(fd, b"x" * 256)
            os.fsync(fd)

        return per_call(one, n)
    finally:
        os.close(fd)


def journal_costs(directory: Path, n: int) -> dict[str, list[float]]:
    results = {"raw_fsync": raw_fsync(directory, n)}
    for label in ("memory", "intent", "full", "process"):
        journal = None if label == "memory" else directory / f"bench-{label}.sqlite"
        index = ResumeIndex(f"bench-{label}", journal=journal, durability="intent" if journal is None else label)
        tools = ResumableToolExecutor({"noop": lambda i: i}, index)
        model = ResumableModelClient(lambda req: {"text": "ok", "usage": {"input_tokens": 10}}, index)
        payload = [{"role": "user", "content": "x" * 2000}]  # a ~2 KB prompt
        results[f"tool_{label}"] = per_call(lambda i: tools.execute("noop", {"i": i}), n)
        results[f"model_{label}"] = per_call(
            lambda i: model.create({"model": "m", "messages": payload + [{"role": "user", "content": str(i)}]}), n)
        index.close()
    return results


def agent(index: ResumeIndex, model_ms: float, tool_ms: float, steps: int) -> None:
    def call_model(req):
        time.sleep(model_ms / 1000)
        return {"text": f"step {req['messages'][-1]['content']}"}

    def act(step: int) -> str:
        time.sleep(tool_ms / 1000)
        return f"done {step}"

    model = ResumableModelClient(call_model, index)
    tools = ResumableToolExecutor({"act": act}, index)
    for step in range(steps):
        model.create({"model": "m", "messages": [{"role": "user", "content": str(step)}]})
        tools.execute("act", {"step": step})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model-ms", type=float, default=200.0)
    ap.add_argument("--tool-ms", type=float, default=20.0)
    ap.add_argument("--dir", default=None, help="where the journal lives (default: a temp dir)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        costs = journal_costs(Path(d), args.calls)
        for key, values in costs.items():
            cpu = CPU[id(values)]
            print(f"{key:15s} n={len(values)} wall p50={statistics.median(values):.3f} ms "
                  f"p99={pct(values, 0.99):.3f} ms max={max(values):.3f} ms | "
                  f"cpu p50={statistics.median(cpu):.3f} ms p99={pct(cpu, 0.99):.3f} ms")

        journal = Path(d) / "agent.sqlite"
        t0 = time.perf_counter()
        agent(ResumeIndex("run", journal=journal), args.model_ms, args.tool_ms, args.steps)
        original = time.perf_counter() - t0
        resumed_index = ResumeIndex("run", journal=journal)
        t0 = time.perf_counter()
        agent(resumed_index, args.model_ms, args.tool_ms, args.steps)
        resumed = time.perf_counter() - t0
        assert resumed_index.model_misses == 0 and resumed_index.tool_misses == 0
        print(f"agent {args.steps} steps (model {args.model_ms:g} ms, tool {args.tool_ms:g} ms): "
              f"original {original * 1000:.1f} ms, resumed {resumed * 1000:.1f} ms "
              f"({resumed_index.model_hits} model + {resumed_index.tool_hits} tool hits, 0 real calls)")
    p99 = max(pct(costs[f"tool_{DEFAULT_DURABILITY}"], 0.99), pct(costs[f"model_{DEFAULT_DURABILITY}"], 0.99))
    print(f"resume journal_p99_ms={p99:.3f} resumed_over_original={resumed / original:.4f}")


if __name__ == "__main__":
    main()
