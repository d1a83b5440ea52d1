"""What recording costs a framework run: the Agents SDK and LangGraph, offline on fake models, with
and without the adapter, interleaved in one process. The baseline is the same program with no
processor / no callback handler; the adapter exports through the full capture chain (redaction off,
sealing on) to an in-memory exporter, so the number is the adapter and capture, not a network.

    python bench/frameworks.py [--runs 200] [--rounds 5]

A LangGraph run with a no-op callback handler shows what LangChain itself spends once any handler
is attached. Last line (machine-readable): ``frameworks agents_ratio=... langgraph_ratio=...
langgraph_vs_noop=... agents_us=...``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def agents_round(runs: int, processor: object | None) -> float:
    from agents import Runner, set_trace_processors, set_tracing_disabled, trace

    from integrations_agents_app import trip_agents

    set_trace_processors([processor] if processor is not None else [])
    set_tracing_disabled(processor is None)

    async def go() -> None:
        for i in range(runs):
            planner, _ = trip_agents()
            with trace("trip", group_id=f"s-{i}"):
                await Runner.run(planner, "Plan a day in Lyon")

    start = time.perf_counter()
    asyncio.run(go())
    return (time.perf_counter() - start) / runs


def langgraph_round(runs: int, handler: object | None) -> float:
    from integrations_langgraph_app import question, trip_graph

    config = {"callbacks": [handler]} if handler is not None else {}
    graph = trip_graph()  # compiled once; its fake model cycles through its answers
    start = time.perf_counter()
    for _ in range(runs):
        graph.invoke(question(), config=config)
    return (time.perf_counter() - start) / runs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otel_agenttape
    from otel_agenttape.integrations.langchain import AgentTapeCallbackHandler
    from otel_agenttape.integrations.openai_agents import AgentTapeProcessor

    from langchain_core.callbacks import BaseCallbackHandler

    class Noop(BaseCallbackHandler):  # what LangChain itself spends once any handler is attached
        run_inline = True

    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter)
    processor, handler = AgentTapeProcessor(tape), AgentTapeCallbackHandler(tape)
    agents_round(5, processor), agents_round(5, None), langgraph_round(5, handler), langgraph_round(5, None)
    timings: dict[str, list[float]] = {k: [] for k in ("agents", "agents_tape", "graph", "graph_noop", "graph_tape")}
    for _ in range(args.rounds):  # interleaved, so both sides see the same machine
        timings["agents"].append(agents_round(args.runs, None))
        timings["agents_tape"].append(agents_round(args.runs, processor))
        exporter.clear()
        timings["graph"].append(langgraph_round(args.runs, None))
        timings["graph_noop"].append(langgraph_round(args.runs, Noop()))
        timings["graph_tape"].append(langgraph_round(args.runs, handler))
        exporter.clear()
    tape.shutdown()
    med = {k: statistics.median(v) * 1e6 for k, v in timings.items()}
    print(f"Agents SDK run (4 model calls, 3 tools, 3 agents): {med['agents']:.0f} us bare, "
          f"{med['agents_tape']:.0f} us recorded", flush=True)
    print(f"LangGraph run (2 model calls, 1 tool, a subgraph): {med['graph']:.0f} us bare, "
          f"{med['graph_noop']:.0f} us with a no-op handler, {med['graph_tape']:.0f} us recorded", flush=True)
    print(f"frameworks agents_ratio={med['agents_tape'] / med['agents']:.3f} "
          f"langgraph_ratio={med['graph_tape'] / med['graph']:.3f} "
          f"langgraph_vs_noop={med['graph_tape'] / med['graph_noop']:.3f} agents_us={med['agents']:.0f} "
          f"agents_tape_us={med['agents_tape']:.0f} langgraph_us={med['graph']:.0f} "
          f"langgraph_tape_us={med['graph_tape']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
