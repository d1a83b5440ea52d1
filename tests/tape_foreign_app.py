"""An app using the real `openai` client under another vendor's instrumentation, exporting OTLP.

Usage: python tape_foreign_app.py CONVENTION RECEIVER_URL OPENAI_BASE_URL [MODES]
CONVENTION: genai (opentelemetry-instrumentation-genai-openai, content on spans), genai-events (the
same, content on log events), openinference (openinference-instrumentation-openai), openllmetry
(opentelemetry-instrumentation-openai). MODES, comma-separated: ``stream``; ``agent`` (the calls run
inside that convention's agent span, with a session: a GenAI ``invoke_agent`` span with
``gen_ai.conversation.id``, an OpenInference AGENT span under ``using_session``, an OpenLLMetry
workflow span with the association property ``session_id``, as the Traceloop SDK writes it).
Prints the trace id of the app's one trace.
"""

from __future__ import annotations

import json
import os
import sys


def instrument(convention: str, tracer_provider, logger_provider) -> None:
    if convention in ("genai", "genai-events"):
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = (
            "SPAN_ONLY" if convention == "genai" else "EVENT_ONLY")
        from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
    elif convention == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=tracer_provider)
    elif convention == "openllmetry":
        os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
    else:
        raise SystemExit(f"unknown convention {convention}")


def _root(tracer, convention: str, agent: bool):
    """The app's root span: a plain span, or the convention's agent span with a session."""
    import contextlib

    if not agent:
        return tracer.start_as_current_span("weather-app")
    if convention.startswith("genai"):
        return tracer.start_as_current_span("invoke_agent weather", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather",
            "gen_ai.provider.name": "openai", "gen_ai.conversation.id": f"conv-{convention}"})
    if convention == "openinference":
        from openinference.instrumentation import using_session

        stack = contextlib.ExitStack()
        stack.enter_context(using_session(f"sess-{convention}"))
        span = stack.enter_context(tracer.start_as_current_span("weather", attributes={
            "openinference.span.kind": "AGENT", "agent.name": "weather", "session.id": f"sess-{convention}"}))

        @contextlib.contextmanager
        def held():
            with stack:
                yield span

        return held()
    return tracer.start_as_current_span("weather.workflow", attributes={
        "traceloop.span.kind": "workflow", "traceloop.workflow.name": "weather", "traceloop.entity.name": "weather",
        "traceloop.association.properties.session_id": f"sess-{convention}"})


def main() -> int:
    convention, receiver, base_url = sys.argv[1:4]
    modes = set(sys.argv[4].split(",")) if len(sys.argv) > 4 else set()
    stream = "stream" in modes
    from opentelemetry import _logs
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    resource = Resource.create({"service.name": f"foreign-{convention}"})
    tp = TracerProvider(resource=resource)
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver}/v1/traces")))
    lp = LoggerProvider(resource=resource)
    lp.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"{receiver}/v1/logs")))
    _logs.set_logger_provider(lp)
    instrument(convention, tp, lp)

    import openai

    client = openai.OpenAI(base_url=base_url, api_key="test", max_retries=0)
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]
    tracer = tp.get_tracer("foreign-app")

    def chat():
        if not stream:
            return client.chat.completions.create(model="gpt-test", messages=messages, tools=tools)
        text, calls, finish = "", {}, None
        for chunk in client.chat.completions.create(model="gpt-test", messages=messages, tools=tools,
                                                    stream=True, stream_options={"include_usage": True}):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            text += delta.content or ""
            for tc in delta.tool_calls or []:
                calls[tc.index] = tc
            finish = chunk.choices[0].finish_reason or finish
        return text, list(calls.values())

    with _root(tracer, convention, "agent" in modes) as root:
        first = chat()
        tool_calls = first.choices[0].message.tool_calls if not stream else first[1]
        call = tool_calls[0]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]})
        result = {"city": json.loads(call.function.arguments)["city"], "temp": 57}
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
        chat()
        trace_id = format(root.get_span_context().trace_id, "032x")
    tp.force_flush()
    lp.force_flush()
    print(trace_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
