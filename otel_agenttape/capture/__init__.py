"""Capture: agent events become OpenTelemetry GenAI spans (listener, context-manager API, setup).

Names are loaded on first use so ``import otel_agenttape.capture`` stays light. Note that
``otel_agenttape.capture.setup`` is the module once imported; the function is ``otel_agenttape.setup``
(or ``otel_agenttape.capture.setup.setup``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AgentEvent": "events",
    "EventType": "events",
    "CaptureListener": "listener",
    "NodeRecord": "records",
    "InMemorySink": "sinks",
    "JsonlSink": "sinks",
    "Usage": "usage",
    "parse_usage": "usage",
    "Redactor": "redact",
    "build_redactor": "redact",
    "BUILTIN_PATTERNS": "redact",
    "Run": "api",
    "ModelCall": "api",
    "ToolCall": "api",
    "current_run": "api",
    "RemoteParent": "propagation",
    "inject_context": "propagation",
    "extract_context": "propagation",
    "QueueingSpanProcessor": "pipeline",
    "build_processor_chain": "pipeline",
    "CaptureStats": "stats",
    "Tape": "setup",
    "setup": "setup",
    "instrument": "setup",
    "make_exporter": "setup",
    "register": "distro",
    "configured_tape": "distro",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'otel_agenttape.capture' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"otel_agenttape.capture.{module}"), name)
    globals()[name] = value
    return value
