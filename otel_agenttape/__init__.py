"""otel-agenttape: an AI agent's run as a first-class OpenTelemetry artifact (a tape)."""

from __future__ import annotations

__version__ = "0.1.0"
