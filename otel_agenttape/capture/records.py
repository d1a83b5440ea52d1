"""The node record: one model or tool node with its full input and output (baseline fields)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from otel_agenttape.capture.usage import ABSENT

MODEL = "model"
TOOL = "tool"


@dataclass(slots=True)
class NodeRecord:
    """Self-describing node: cost accounting and audit work without decoding ``outputs``."""

    record_id: str
    run_id: str
    session_id: str | None
    turn_id: str | None
    step: int | None
    node_type: str
    node_id: str
    model_id: str | None = None
    tool_name: str | None = None
    call_id: str | None = None
    inputs: Any = None
    output_text: str = ""
    outputs: Any = None
    started_at_ms: int = 0
    captured_at_ms: int = 0
    reasoning_text: str = ""
    retry_count: int = 0
    input_tokens: int = ABSENT
    output_tokens: int = ABSENT
    error: str | None = None
    trace_id: str | None = None
    span_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_ms(self) -> int:
        return max(0, self.captured_at_ms - self.started_at_ms)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["duration_ms"] = self.duration_ms
        return data
