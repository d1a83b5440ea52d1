"""Resume for the OpenAI Agents SDK: a ``Model`` that returns recorded results and function tools
whose committed side effects are not repeated.

    index = ResumeIndex("order-7", journal="agent.resume.sqlite")   # the same id when resuming
    agent = Agent(..., model=ResumableModel(OpenAIResponsesModel(...), index),
                  tools=resumable_tools([charge, lookup], index, policies={"charge": "raise"}))

A model call is keyed by everything that reaches the model (instructions, input items, settings,
tool and handoff schemas, output schema); a hit returns the recorded ``ModelResponse`` (or replays
the recorded stream events) without calling the wrapped model. A tool call is keyed by its name and
arguments: the journal holds an intent before the tool runs and its output after, so a committed
call returns its recorded output and an interrupted one is in doubt (see ``ResumableToolExecutor``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from otel_agenttape.resume import ResumableModelClient, ResumableToolExecutor, ResumeIndex

from ._common import mark_replayed

try:
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.tool import FunctionTool
    from agents.usage import Usage
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError('the OpenAI Agents SDK is needed: pip install "otel-agenttape[openai-agents]"') from exc

API = "openai-agents.model"


def _dump(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_unset=True)
    if isinstance(obj, (list, tuple)):
        return [_dump(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _dump(v) for k, v in obj.items()}
    return obj


def _tool_schema(tool: Any) -> dict[str, Any]:
    schema = getattr(tool, "params_json_schema", None)
    return {"name": getattr(tool, "name", type(tool).__name__), "parameters": schema}


def _request(system_instructions: str | None, input: Any, model_settings: Any, tools: Sequence[Any],
             output_schema: Any, handoffs: Sequence[Any], previous_response_id: str | None,
             conversation_id: str | None, prompt: Any) -> dict[str, Any]:
    """What the model is asked, as JSON: the hashed request."""
    settings = model_settings.to_json_dict() if hasattr(model_settings, "to_json_dict") else _dump(model_settings)
    schema = None
    if output_schema is not None and not getattr(output_schema, "is_plain_text", lambda: False)():
        schema = output_schema.json_schema()
    return {
        "$api": API, "system": system_instructions, "input": _dump(input), "settings": settings,
        "tools": [_tool_schema(t) for t in tools],
        "handoffs": [{"name": h.tool_name, "parameters": h.input_json_schema} for h in handoffs],
        "output_schema": schema, "previous_response_id": previous_response_id,
        "conversation_id": conversation_id, "prompt": _dump(prompt),
    }


def _encode(response: ModelResponse) -> dict[str, Any]:
    usage = response.usage
    return {
        "output": [_dump(o) for o in response.output],
        "usage": {"requests": usage.requests, "input_tokens": usage.input_tokens,
                  "output_tokens": usage.output_tokens, "total_tokens": usage.total_tokens},
        "response_id": response.response_id,
        "request_id": getattr(response, "request_id", None),
    }


def _decode(value: dict[str, Any]) -> ModelResponse:
    from pydantic import TypeAdapter

    from agents.items import TResponseOutputItem

    adapter = TypeAdapter(TResponseOutputItem)
    output = [adapter.validate_python(o) for o in value.get("output") or []]
    u = value.get("usage") or {}
    usage = Usage(requests=u.get("requests", 1), input_tokens=u.get("input_tokens", 0),
                  output_tokens=u.get("output_tokens", 0), total_tokens=u.get("total_tokens", 0))
    kwargs: dict[str, Any] = {"output": output, "usage": usage, "response_id": value.get("response_id")}
    if value.get("request_id") is not None:
        kwargs["request_id"] = value["request_id"]
    return ModelResponse(**kwargs)


def _decode_event(value: Any) -> Any:
    from pydantic import TypeAdapter

    from agents.items import TResponseStreamEvent

    return TypeAdapter(TResponseStreamEvent).validate_python(value)


def _stream_text(event: Any) -> str:
    return event.get("delta", "") if isinstance(event, dict) and event.get("type") == "response.output_text.delta" \
        else ""


def _accumulate(events: list[Any]) -> dict[str, Any]:
    done = [e for e in events if isinstance(e, dict) and e.get("type") == "response.completed"]
    return {"events": len(events), "response": done[-1].get("response") if done else None}


class ResumableModel(Model):
    """Wraps any Agents SDK ``Model``: completed calls come back from ``index`` without a request.

    Calls that miss go to the wrapped model (whose own spans, seen by ``AgentTapeProcessor``,
    record them); a hit makes no model span, as the run that paid for it recorded it.
    """

    def __init__(self, model: Model, index: ResumeIndex) -> None:
        self.model = model
        self.index = index
        self._plain = ResumableModelClient(None, index, encode=_encode, decode=_decode)
        self._streamed = ResumableModelClient(None, index, encode=_dump, encode_delta=_dump,
                                              decode_delta=_decode_event, accumulate=_accumulate,
                                              delta_text=_stream_text)

    async def get_response(self, system_instructions: str | None, input: Any, model_settings: Any,
                           tools: list[Any], output_schema: Any, handoffs: list[Any], tracing: Any, *,
                           previous_response_id: str | None = None, conversation_id: str | None = None,
                           prompt: Any = None, **kwargs: Any) -> ModelResponse:
        request = _request(system_instructions, input, model_settings, tools, output_schema, handoffs,
                           previous_response_id, conversation_id, prompt)
        live = lambda: self.model.get_response(  # noqa: E731
            system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
            previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt,
            **kwargs)
        return await self._plain.acreate(request, call=live)

    async def stream_response(self, system_instructions: str | None, input: Any, model_settings: Any,
                              tools: list[Any], output_schema: Any, handoffs: list[Any], tracing: Any, *,
                              previous_response_id: str | None = None, conversation_id: str | None = None,
                              prompt: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
        request = _request(system_instructions, input, model_settings, tools, output_schema, handoffs,
                           previous_response_id, conversation_id, prompt)
        request["$stream"] = True
        live = lambda: self.model.stream_response(  # noqa: E731
            system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
            previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt,
            **kwargs)
        async for event in self._streamed.astream(request, call=live):
            yield event

    async def close(self) -> None:
        await self.model.close()

    def get_retry_advice(self, request: Any) -> Any:
        return self.model.get_retry_advice(request)


def resumable_tool(tool: FunctionTool, index: ResumeIndex, *, in_doubt: str = "raise") -> FunctionTool:
    """A copy of a function tool whose calls go through the journal of ``index``."""
    from otel_agenttape.resume.keys import tool_request

    invoke = tool.on_invoke_tool

    async def on_invoke_tool(ctx: Any, input: str) -> Any:
        ran = []

        def live(**_: Any) -> Any:  # the journal passes the parsed arguments; the SDK tool takes the text
            ran.append(True)
            return invoke(ctx, input)

        executor = ResumableToolExecutor({tool.name: live}, index, in_doubt=in_doubt)
        arguments = tool_request(tool.name, input)["arguments"]
        result = await executor.aexecute(tool.name, arguments, call_id=getattr(ctx, "tool_call_id", None))
        if not ran:
            mark_replayed()
        return result

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


def resumable_tools(tools: Sequence[Any], index: ResumeIndex, *, in_doubt: str = "raise",
                    policies: Mapping[str, str] | None = None) -> list[Any]:
    """Every ``FunctionTool`` in ``tools`` made resumable (other tools pass through unchanged).

    ``in_doubt`` and ``policies`` (per tool name) decide what an interrupted call does on resume:
    ``"raise"`` (``InDoubtError``, the default) or ``"reexecute"``.
    """
    out = []
    for tool in tools:
        if isinstance(tool, FunctionTool):
            policy = (policies or {}).get(tool.name, in_doubt)
            out.append(resumable_tool(tool, index, in_doubt=policy))
        else:
            out.append(tool)
    return out
