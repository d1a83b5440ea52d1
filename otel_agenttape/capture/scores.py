"""Scores as telemetry: a ``gen_ai.evaluation.result`` event for a run or one of its nodes.

A score given while the scored span is open is an event on that span, sealed with it. A score given
later, or from another process (a web app's thumbs-up minutes after the run), never touches the
sealed run: it is an event on a small ``agenttape.score`` span in a tape of its own, which names the
run it scores and links to the scored span. Both go through the same exporter and outbox as spans, so
a score is sealed, covered by ``verify`` and kept while the receiver is down.

When the process also has an OpenTelemetry SDK ``LoggerProvider`` (``register()`` sets one up, or the
application's own), the same event is emitted as an OTel log record parented to the scored span, the
form the GenAI semantic conventions give it, for collectors that read evaluations from logs. Both carry
one ``agenttape.score.id``, and the ``scores`` view lists each score once.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from typing import Any, Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags

from otel_agenttape import semconv as sc

SOURCE_DEFAULT = "code"
_log = logging.getLogger(__name__)


class ScoreError(ValueError):
    """A score that cannot be recorded as given (no name, neither value nor label, a bad value)."""


def check_source(source: str | None, version: str | None = None) -> tuple[str, str | None]:
    """(source, version): ``human``, ``llm``, ``code`` or an evaluator's name (any other non-empty text),
    and the evaluator's version; ``NAME@VERSION`` is split when no version is given."""
    text = (source if source is not None else SOURCE_DEFAULT).strip()
    if version is None and "@" in text:
        text, _, version = text.partition("@")
        text = text.strip()
    if not text:
        raise ScoreError("source: give human, llm, code or an evaluator's name (NAME or NAME@VERSION)")
    version = str(version).strip() if version is not None else None
    return text, version or None


def score_attributes(name: str, value: float | int | None = None, label: str | None = None,
                     explanation: str | None = None, *, source: str | None = None, version: str | None = None,
                     response_id: str | None = None, error_type: str | None = None,
                     extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The event's attributes, with a fresh ``agenttape.score.id``. A score has a value, a label or both,
    unless it records an evaluation that failed (``error_type``), which has neither: a failed judge never
    makes a score up."""
    if not isinstance(name, str) or not name.strip():
        raise ScoreError("name: a score needs a non-empty name")
    who, version = check_source(source, version)
    attrs: dict[str, Any] = {sc.GEN_AI_EVALUATION_NAME: name.strip(), sc.SCORE_SOURCE: who}
    if version:
        attrs[sc.SCORE_VERSION] = version
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                value = float(value)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise ScoreError(f"value: not a number: {value!r}") from None
        if not math.isfinite(float(value)):
            raise ScoreError(f"value: not a finite number: {value!r}")
    if error_type:
        if value is not None or label is not None:
            raise ScoreError(f"{name}: a failed evaluation (error_type) has neither a value nor a label")
        attrs[sc.ERROR_TYPE] = str(error_type)
    elif value is None and (label is None or not str(label).strip()):
        raise ScoreError(f"{name}: give a value, a label or both")
    if value is not None:
        attrs[sc.GEN_AI_EVALUATION_SCORE_VALUE] = float(value)
    if label is not None:
        attrs[sc.GEN_AI_EVALUATION_SCORE_LABEL] = str(label)
    if explanation:
        attrs[sc.GEN_AI_EVALUATION_EXPLANATION] = str(explanation)
    if response_id:
        attrs[sc.GEN_AI_RESPONSE_ID] = str(response_id)
    for k, v in (extra or {}).items():
        attrs.setdefault(k, v)
    attrs[sc.SCORE_ID] = uuid.uuid4().hex
    return attrs


def _hex_ctx(trace_id: str | None, span_id: str | None) -> SpanContext | None:
    try:
        if trace_id and span_id:
            return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                               trace_flags=TraceFlags(TraceFlags.SAMPLED))
    except ValueError:
        return None
    return None


def check_ids(trace_id: str | None, span_id: str | None) -> None:
    """Hex trace (32) and span (16) ids, or ScoreError."""
    for what, text, width in (("trace id", trace_id, 32), ("span id", span_id, 16)):
        if text is None:
            continue
        try:
            ok = len(text) == width and int(text, 16) != 0
        except ValueError:
            ok = False
        if not ok:
            raise ScoreError(f"{what}: not {width} hex digits: {text!r}")


def _sdk_logger() -> Any:
    """The OTel SDK logger of the process's logger provider, or None when none is configured (the API's
    default provider records nothing, and a score is then a span event only)."""
    try:
        from opentelemetry import _logs
        from opentelemetry.sdk._logs import LoggerProvider
    except ImportError:  # pragma: no cover - the SDK is a dependency
        return None
    provider = _logs.get_logger_provider()
    if not isinstance(provider, LoggerProvider):
        return None
    return provider.get_logger(sc.SCOPE_NAME)


def emit_log_copy(attrs: Mapping[str, Any], trace_id: str | None, span_id: str | None) -> bool:
    """The score as an OTel log record parented to the scored span, when a LoggerProvider is configured.
    Never raises: the sealed span event is the score of record, this copy is for log pipelines."""
    try:
        logger = _sdk_logger()
        target = _hex_ctx(trace_id, span_id)
        if logger is None or target is None:
            return False
        from opentelemetry._logs import LogRecord

        logger.emit(LogRecord(timestamp=time.time_ns(), trace_id=target.trace_id, span_id=target.span_id,
                              trace_flags=target.trace_flags, event_name=sc.EVENT_EVALUATION_RESULT,
                              attributes=dict(attrs)))
        return True
    except Exception:
        _log.debug("score log record not emitted", exc_info=True)
        return False


def emit_score_span(tracer: trace.Tracer, attrs: Mapping[str, Any], *, of: str | None = None,
                    trace_id: str | None = None, span_id: str | None = None) -> Any:
    """A score in a tape of its own: a root ``agenttape.score`` span (new trace, no run id) carrying
    the event, linked to the scored span when its ids are known. Returns the ended span."""
    event = dict(attrs)
    span_attrs: dict[str, Any] = {sc.GEN_AI_EVALUATION_NAME: attrs[sc.GEN_AI_EVALUATION_NAME]}
    if of:
        event[sc.SCORE_OF] = span_attrs[sc.SCORE_OF] = of
    if trace_id:
        event[sc.SCORE_TRACE_ID] = span_attrs[sc.SCORE_TRACE_ID] = trace_id
    if span_id:
        event[sc.SCORE_SPAN_ID] = span_attrs[sc.SCORE_SPAN_ID] = span_id
    target = _hex_ctx(trace_id, span_id)
    links = [Link(target)] if target is not None else []
    span = tracer.start_span(sc.SCORE_SPAN_NAME, context=Context(), links=links, attributes=span_attrs)
    try:
        span.add_event(sc.EVENT_EVALUATION_RESULT, event, timestamp=time.time_ns())
    finally:
        span.end()
    emit_log_copy(event, trace_id, span_id)
    return span


def score_span_or_own(tracer: trace.Tracer | None, span: Any, owner: Any, attrs: Mapping[str, Any], *,
                      of: str | None) -> bool:
    """Put the event on ``span`` while it records; else on ``owner`` (the open run span) naming ``span``;
    else in a tape of its own. False when there was no way to record it (no tracer)."""
    ctx = span.get_span_context() if span is not None else None
    ids: dict[str, str] = {}
    if ctx is not None and ctx.is_valid:
        ids = {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}
    if span is not None and not isinstance(span, NonRecordingSpan) and span.is_recording():
        span.add_event(sc.EVENT_EVALUATION_RESULT, dict(attrs))
        emit_log_copy(attrs, ids.get("trace_id"), ids.get("span_id"))
        return True
    if owner is not None and owner is not span and owner.is_recording() and ids:
        event = dict(attrs)
        event[sc.SCORE_TRACE_ID], event[sc.SCORE_SPAN_ID] = ids["trace_id"], ids["span_id"]
        owner.add_event(sc.EVENT_EVALUATION_RESULT, event)
        emit_log_copy(event, ids["trace_id"], ids["span_id"])
        return True
    if tracer is None:
        return False
    emit_score_span(tracer, attrs, of=of, **ids)
    return True
