"""Resumable Anthropic client: ``messages.create``, streams included."""

from __future__ import annotations

from typing import Any

from ..index import ResumeIndex
from ._proxy import Endpoint, Namespace


def _accumulate(events: list[dict[str, Any]]) -> dict[str, Any]:
    text, stop = [], None
    for ev in events:
        if ev.get("type") == "content_block_delta" and (ev.get("delta") or {}).get("type") == "text_delta":
            text.append(ev["delta"].get("text", ""))
        if ev.get("type") == "message_delta":
            stop = (ev.get("delta") or {}).get("stop_reason") or stop
    return {"text": "".join(text), "stop_reason": stop, "events": len(events)}


def _text(event: dict[str, Any]) -> str:
    delta = event.get("delta") or {}
    return delta.get("text", "") if event.get("type") == "content_block_delta" else ""


def resumable_anthropic(client: Any, index: ResumeIndex, *, run: Any = None) -> Any:
    """Wrap an ``anthropic.Anthropic`` or ``anthropic.AsyncAnthropic`` client."""
    from anthropic._models import construct_type
    from anthropic.types import Message, RawMessageStreamEvent

    def lenient(tp: Any) -> Any:
        # Built as the SDK builds live responses (no strict validation).
        return lambda value: construct_type(type_=tp, value=value)

    messages = Endpoint(
        client.messages, index, "anthropic.messages",
        decode=lenient(Message), decode_event=lenient(RawMessageStreamEvent), accumulate=_accumulate,
        delta_text=_text, run=run,
    )
    return Namespace(client, messages=messages)
