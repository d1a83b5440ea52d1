"""otel-agenttape: an AI agent's run as a first-class OpenTelemetry artifact (a tape).

``otel_agenttape.setup(...)`` / ``otel_agenttape.instrument(provider)`` return a Tape; the capture
names below load on first use, so ``import otel_agenttape`` does not pull in the OTel SDK.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_CAPTURE_EXPORTS = (
    "setup", "instrument", "Tape", "Run", "ModelCall", "ToolCall", "AgentEvent", "EventType",
    "CaptureListener", "NodeRecord", "InMemorySink", "JsonlSink", "inject_context", "extract_context",
    "RemoteParent", "current_run",
)

__all__ = ["__version__", *_CAPTURE_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _CAPTURE_EXPORTS:
        import importlib

        from otel_agenttape.capture import _EXPORTS

        module = importlib.import_module(f"otel_agenttape.capture.{_EXPORTS[name]}")
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'otel_agenttape' has no attribute {name!r}")
