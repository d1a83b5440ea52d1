"""A small store of priced runs for the cost tests: OpenAI- and Anthropic-shaped usage with cached tokens,
a model genai-prices does not know, a child run and a session, recorded through the capture API and
loaded into a real DuckDB file the way ``agenttape ingest`` loads an exporter's file."""

from __future__ import annotations

import sys
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agenttape
from otel_agenttape.receiver.files import ingest_files

# genai-prices 0.2 (USD per million tokens), written out so every expected cost below is computed by hand:
# gpt-4o: input 2.5, cached input 1.25, output 10; claude-3-5-sonnet: input 3, cache read 0.3,
# cache write 3.75, output 15.
OPENAI_USAGE = {"prompt_tokens": 1000, "completion_tokens": 500, "prompt_tokens_details": {"cached_tokens": 200}}
OPENAI_USD = (800 * 2.5 + 200 * 1.25 + 500 * 10) / 1e6  # 0.00725
ANTHROPIC_USAGE = {"input_tokens": 700, "output_tokens": 500, "cache_read_input_tokens": 200,
                   "cache_creation_input_tokens": 100}  # Anthropic's input_tokens leave the cache out
ANTHROPIC_USD = (700 * 3 + 200 * 0.3 + 100 * 3.75 + 500 * 15) / 1e6  # 0.010035
LOCAL_MODEL = "acme-local-llama-70b"  # no price anywhere but an override


def record(tmp: Path) -> str:
    """Record the runs and store them in ``tmp/cost.duckdb``; returns the db path.

    Runs: ``planner`` (session s1: one OpenAI call, one Anthropic call) with child ``helper`` (one call
    to the local model and one OpenAI call), and ``second`` (session s1: the local model only)."""
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, memory=True, service_name="cost-svc")
    try:
        with tape.run(agent="planner", run_id="run-planner", session_id="s1") as run:
            with run.model_call(model="gpt-4o", provider="openai", messages="plan") as call:
                call.finish(text="a plan", usage=OPENAI_USAGE)
            with run.model_call(model="claude-3-5-sonnet-20241022", provider="anthropic", messages="check") as call:
                call.finish(text="checked", usage=ANTHROPIC_USAGE)
            with run.child(agent="helper", run_id="run-helper") as child:
                with child.model_call(model=LOCAL_MODEL, provider="vllm", messages="help") as call:
                    call.finish(text="helped", usage={"prompt_tokens": 2000, "completion_tokens": 1000})
                with child.model_call(model="gpt-4o", provider="openai", messages="again") as call:
                    call.finish(text="again", usage=OPENAI_USAGE)
            run.set_output("done")
        with tape.run(agent="second", run_id="run-second", session_id="s1") as run:
            with run.model_call(model=LOCAL_MODEL, provider="vllm", messages="hi") as call:
                call.finish(text="hello", usage={"prompt_tokens": 10, "completion_tokens": 5})
            run.set_output("hello")
        assert tape.force_flush()
    finally:
        tape.shutdown()
    pb = tmp / "cost.pb"
    pb.write_bytes(encode_spans(list(exporter.get_finished_spans())).SerializeToString())
    db = str(tmp / "cost.duckdb")
    ingest_files([str(pb)], db)
    return db


if __name__ == "__main__":  # a store to look at by hand
    print(record(Path(sys.argv[1])))
