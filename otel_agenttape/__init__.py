"""otel-agenttape: an AI agent's run as a first-class OpenTelemetry artifact (a tape).

``otel_agenttape.setup(...)`` / ``otel_agenttape.instrument(provider)`` / ``otel_agenttape.register()``
return a Tape;
``otel_agenttape.open(source)`` reads tapes back (docs/api.md). These names load on first use, so
``import otel_agenttape`` pulls in neither the OTel SDK nor DuckDB.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_CAPTURE_EXPORTS = (
    "setup", "register", "instrument", "Tape", "Run", "ModelCall", "ToolCall", "AgentEvent", "EventType",
    "CaptureListener", "NodeRecord", "InMemorySink", "JsonlSink", "inject_context", "extract_context",
    "RemoteParent", "current_run",
)

_READ_EXPORTS = {
    "open": "otel_agenttape.sources",
    "Tapes": "otel_agenttape.tape.read",
    "RunSummary": "otel_agenttape.tape.read",
    "Page": "otel_agenttape.tape.read",
    "RunNotFound": "otel_agenttape.tape.refs",
    "AmbiguousRunError": "otel_agenttape.tape.refs",
    "experiment": "otel_agenttape.tape.experiment_api",
    "Candidate": "otel_agenttape.tape.experiment",
}

__all__ = ["__version__", *_CAPTURE_EXPORTS, *_READ_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _CAPTURE_EXPORTS:
        import importlib

        from otel_agenttape.capture import _EXPORTS

        module = importlib.import_module(f"otel_agenttape.capture.{_EXPORTS[name]}")
        value = getattr(module, name)
        globals()[name] = value
        return value
    if name in _READ_EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_READ_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'otel_agenttape' has no attribute {name!r}")
