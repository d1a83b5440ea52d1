"""Resumable OpenAI client: ``chat.completions.create`` and ``responses.create``, streams included."""

from __future__ import annotations

from typing import Any

from ..index import ResumeIndex
from ._proxy import Endpoint, Namespace


def _chat_accumulate(events: list[dict[str, Any]]) -> dict[str, Any]:
    text, finish, tool_calls = [], None, 0
    for ev in events:
        for ch in ev.get("choices") or []:
            delta = ch.get("delta") or {}
            if delta.get("content"):
                text.append(delta["content"])
            tool_calls += len(delta.get("tool_calls") or [])
            finish = ch.get("finish_reason") or finish
    return {"text": "".join(text), "finish_reason": finish, "events": len(events)}


def _responses_accumulate(events: list[dict[str, Any]]) -> dict[str, Any]:
    text, final = [], None
    for ev in events:
        if ev.get("type") == "response.output_text.delta":
            text.append(ev.get("delta", ""))
        if ev.get("type") in ("response.completed", "response.incomplete", "response.failed"):
            final = ev.get("response")
    return {"text": "".join(text), "response": final, "events": len(events)}


def _chat_text(event: dict[str, Any]) -> str:
    return "".join(((c.get("delta") or {}).get("content") or "") for c in event.get("choices") or [])


def _responses_text(event: dict[str, Any]) -> str:
    return event.get("delta", "") if event.get("type") == "response.output_text.delta" else ""


def resumable_openai(client: Any, index: ResumeIndex, *, run: Any = None) -> Any:
    """Wrap an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` client; other attributes pass through.

    A hit returns the recorded ``ChatCompletion``/``Response`` (or replays the recorded stream
    chunks/events) without a request to the server.
    """
    from openai._models import construct_type
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response, ResponseStreamEvent

    def lenient(tp: Any) -> Any:
        # The SDK builds live responses this way (no strict validation), so a replay gives the same
        # object a live call would, even when the server omits fields the types mark required.
        return lambda value: construct_type(type_=tp, value=value)

    completions = Endpoint(
        client.chat.completions, index, "openai.chat.completions",
        decode=lenient(ChatCompletion), decode_event=lenient(ChatCompletionChunk),
        accumulate=_chat_accumulate, delta_text=_chat_text, run=run,
    )
    responses = Endpoint(
        client.responses, index, "openai.responses",
        decode=lenient(Response), decode_event=lenient(ResponseStreamEvent),
        accumulate=_responses_accumulate, delta_text=_responses_text, run=run,
    )
    chat = Namespace(client.chat, completions=completions)
    return Namespace(client, chat=chat, responses=responses)
