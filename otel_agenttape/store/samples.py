"""Realistic GenAI agent spans made with the OpenTelemetry SDK, for store benchmarks and tests.

A run is an ``invoke_agent`` span with model (``chat``) and tool (``execute_tool``) child spans that
carry the GenAI and agenttape attributes and events of DESIGN.md section 3. A model span with its
messages encodes to about 2.7 KB of OTLP protobuf, the size the store benchmarks are quoted for.
"""

from __future__ import annotations

import random
from typing import Any

import orjson

from otel_agenttape import semconv as sc

_WORDS = (
    "the agent reads the ticket then checks the order history and looks up the refund policy for "
    "damaged items before it drafts a reply that quotes the policy and offers a replacement or a "
    "refund within fourteen days of delivery customers who paid by card get the money back in five "
    "business days while store credit is immediate"
).split()


def _vocabulary(size: int = 4000, seed: int = 1) -> tuple[list[str], list[float]]:
    """Base words plus pseudo-words with Zipf weights: text about as compressible as real prose."""
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    words = list(dict.fromkeys(_WORDS))
    while len(words) < size:
        n = rng.randint(2, 10)
        words.append("".join(rng.choice(letters[: 8 + rng.randint(0, 18)]) for _ in range(n)))
    cum, total = [], 0.0
    for rank in range(1, len(words) + 1):
        total += 1.0 / rank
        cum.append(total)
    return words, cum


_VOCAB, _CUM = _vocabulary()


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(_VOCAB, cum_weights=_CUM, k=n)).capitalize() + "."


def _messages(rng: random.Random, n_words: int) -> str:
    msgs = [
        {"role": "system", "parts": [{"type": "text", "content": _sentence(rng, n_words // 4)}]},
        {"role": "user", "parts": [{"type": "text", "content": _sentence(rng, n_words // 4)}]},
        {"role": "assistant", "parts": [{"type": "text", "content": _sentence(rng, n_words // 4)}]},
        {"role": "user", "parts": [{"type": "text", "content": _sentence(rng, n_words // 4)}]},
    ]
    return orjson.dumps(msgs).decode()


def genai_requests(
    n_runs: int = 1,
    models_per_run: int = 2,
    tools_per_run: int = 1,
    seed: int = 7,
    start_ns: int | None = None,
    with_events: bool = True,
) -> list[Any]:
    """Build runs with the SDK and return them as ``ExportTraceServiceRequest`` messages (one per run)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, Status, StatusCode

    rng = random.Random(seed)
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "support-agent", "deployment.environment": "test"}),
        span_limits=SpanLimits(max_attribute_length=None, max_events=1024),
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("otel_agenttape.samples", "0.1.0")
    t = start_ns if start_ns is not None else 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
    requests = []
    for r in range(n_runs):
        run_id = f"run-{seed}-{r}"
        session = f"sess-{seed}-{r % 7}"
        run = tracer.start_span(
            "invoke_agent support",
            kind=SpanKind.INTERNAL,
            start_time=t,
            attributes={
                sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
                sc.GEN_AI_AGENT_NAME: "support",
                sc.RUN_ID: run_id,
                sc.SESSION_ID: session,
                sc.RUN_STATUS: sc.STATUS_COMPLETED,
            },
        )
        from opentelemetry import trace

        ctx = trace.set_span_in_context(run)
        t += 1_000_000
        step = 0
        for m in range(models_per_run):
            step += 1
            span = tracer.start_span(
                "chat gpt-4o-mini",
                context=ctx,
                kind=SpanKind.CLIENT,
                start_time=t,
                attributes={
                    sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
                    sc.GEN_AI_PROVIDER_NAME: "openai",
                    sc.GEN_AI_REQUEST_MODEL: "gpt-4o-mini",
                    sc.GEN_AI_RESPONSE_MODEL: "gpt-4o-mini-2024-07-18",
                    sc.GEN_AI_RESPONSE_ID: f"chatcmpl-{rng.getrandbits(64):016x}",
                    sc.GEN_AI_REQUEST_TEMPERATURE: 0.2,
                    sc.GEN_AI_REQUEST_MAX_TOKENS: 1024,
                    sc.GEN_AI_INPUT_MESSAGES: _messages(rng, 200),
                    sc.GEN_AI_OUTPUT_MESSAGES: orjson.dumps(
                        [
                            {
                                "role": "assistant",
                                "parts": [{"type": "text", "content": _sentence(rng, 60)}],
                                "finish_reason": "stop",
                            }
                        ]
                    ).decode(),
                    sc.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"],
                    sc.GEN_AI_USAGE_INPUT_TOKENS: 300 + rng.randrange(200),
                    sc.GEN_AI_USAGE_OUTPUT_TOKENS: 40 + rng.randrange(80),
                    sc.RUN_ID: run_id,
                    sc.SESSION_ID: session,
                    sc.TURN_ID: "turn-1",
                    sc.STEP: step,
                    sc.NODE_TYPE: "model",
                    sc.NODE_ID: f"model@{run_id}|turn-1|{step}",
                    sc.MODEL_RETRY_COUNT: 1 if m == 0 else 0,
                },
            )
            if with_events:
                span.add_event(sc.EVENT_REASONING, {sc.EVENT_SEQ: 0, sc.EVENT_SEGMENT: "Check policy."}, t + 10)
                if m == 0:
                    span.add_event(sc.EVENT_RETRY, {sc.EVENT_SEQ: 1, sc.EVENT_REASON: "rate_limited"}, t + 20)
                span.add_event(sc.EVENT_TEXT, {sc.EVENT_SEQ: 2, sc.EVENT_SEGMENT: "Hello, "}, t + 30)
                span.add_event(sc.EVENT_TEXT, {sc.EVENT_SEQ: 3, sc.EVENT_SEGMENT: "world."}, t + 40)
            t += 2_000_000
            span.end(end_time=t)
            if m < tools_per_run:
                step += 1
                call_id = f"call_{r}_{m}"
                tool = tracer.start_span(
                    "execute_tool lookup_order",
                    context=ctx,
                    start_time=t,
                    attributes={
                        sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
                        sc.GEN_AI_TOOL_NAME: "lookup_order",
                        sc.GEN_AI_TOOL_CALL_ID: call_id,
                        sc.GEN_AI_TOOL_CALL_ARGUMENTS: '{"order_id": "A-1001"}',
                        sc.GEN_AI_TOOL_CALL_RESULT: '{"status": "delivered", "damaged": true}',
                        sc.RUN_ID: run_id,
                        sc.SESSION_ID: session,
                        sc.TURN_ID: "turn-1",
                        sc.STEP: step,
                        sc.NODE_TYPE: "tool",
                    },
                )
                t += 500_000
                if m == 1:
                    tool.set_status(Status(StatusCode.ERROR, "lookup failed"))
                tool.end(end_time=t)
        t += 1_000_000
        run.end(end_time=t)
        requests.append(encode_spans(exporter.get_finished_spans()))
        exporter.clear()
    provider.shutdown()
    return requests


def model_span_request(seed: int = 1) -> Any:
    """One ``ExportTraceServiceRequest`` holding a single ~2.7 KB model span."""
    req = genai_requests(n_runs=1, models_per_run=1, tools_per_run=0, seed=seed)[0]
    spans = req.resource_spans[0].scope_spans[0].spans
    keep = [s for s in spans if s.kind == 3]  # CLIENT: the chat span
    del spans[:]
    spans.extend(keep)
    return req


def sdk_requests(build: Any, service_name: str = "test-service") -> list[Any]:
    """Run ``build(tracer)`` against a fresh SDK provider and return the finished spans as OTLP requests."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        span_limits=SpanLimits(max_attribute_length=None, max_events=1024),
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build(provider.get_tracer("otel_agenttape.tests", "1.0"))
    spans = exporter.get_finished_spans()
    provider.shutdown()
    return [encode_spans(spans)] if spans else []
