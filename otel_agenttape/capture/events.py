"""The agent event stream a runtime feeds into capture: one model for every runtime."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Mapping


class EventType(str, enum.Enum):
    """Kinds of agent events, as emitted by an agent runtime (baseline names)."""

    RUN_START = "RUN_START"
    MODEL_REQUEST = "MODEL_REQUEST"
    MODEL_RESPONSE = "MODEL_RESPONSE"
    MODEL_REASONING = "MODEL_REASONING"
    MODEL_RETRY = "MODEL_RETRY"
    TOOL_CALL = "TOOL_CALL"
    TOOL_RESULT = "TOOL_RESULT"
    STEP_END = "STEP_END"
    RUN_END = "RUN_END"
    METADATA = "METADATA"


@dataclass(slots=True)
class AgentEvent:
    """One event of an agent run.

    ``payload`` depends on ``type``: MODEL_REQUEST the prompt (a dict with ``messages``, ``model``,
    ``system``, ``tools``... or a plain message list); MODEL_RESPONSE the raw provider payload of this
    chunk (may be empty); TOOL_CALL the arguments; TOOL_RESULT the tool's output; RUN_START the run
    input; RUN_END the run output; METADATA a mapping. ``text`` is the streamed delta text
    (MODEL_RESPONSE), the reasoning segment (MODEL_REASONING) or the retry reason (MODEL_RETRY).
    ``usage`` is an explicit usage block (any provider shape). ``details`` overrides what is parsed
    from the raw response: ``tool_calls``, ``finish_reason``, ``response_model``, ``response_id``.
    ``attributes`` are extra span attributes for the node or run.
    """

    type: EventType
    run_id: str
    session_id: str | None = None
    turn_id: str | None = None
    step: int | None = None
    payload: Any = None
    text: str | None = None
    model: str | None = None
    provider: str | None = None
    tool_name: str | None = None
    call_id: str | None = None
    agent: str | None = None
    status: str | None = None
    error: str | None = None
    parent_run_id: str | None = None
    usage: Mapping[str, Any] | None = None
    details: Mapping[str, Any] | None = None
    attributes: Mapping[str, Any] | None = None
    time_ns: int = field(default_factory=time.time_ns)
