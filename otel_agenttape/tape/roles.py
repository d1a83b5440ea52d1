"""What a span is, in any convention: its role (run, model, tool, other), its source and its session.

The same rules, in SQL, make the ``span_roles`` view (store/runs_view.py), with the attribute names of
``semconv``; docs/sources.md tabulates them.
"""

from __future__ import annotations

from typing import Any

from .. import semconv as sc
from .load import SpanRow

RUN = "run"
MODEL = "model"
TOOL = "tool"
OTHER = "other"

_OI_KINDS = {"LLM": MODEL, "TOOL": TOOL}
LLM_REQUEST_TYPE = sc.LLM_REQUEST_TYPE


def _first(a: dict[str, Any], *keys: str) -> Any:
    """The first of ``keys`` set to a non-empty value in ``a`` (foreign.py reads attributes with it too)."""
    for k in keys:
        v = a.get(k)
        if v is not None and v != "":
            return v
    return None


def _is_indexed(attrs: dict[str, Any], prefix: str) -> bool:
    n = len(prefix)
    for k in attrs:  # (a loop: asked of every model span's attributes, twice or more)
        if k.startswith(prefix) and k[n : n + 1].isdigit():
            return True
    return False


def convention(span: SpanRow) -> str:
    a = span.attrs
    if span.node_type or sc.RUN_ID in a or sc.NODE_TYPE in a:
        return "agenttape"
    if sc.OPENINFERENCE_SPAN_KIND in a:
        return "openinference"
    if (
        sc.TRACELOOP_SPAN_KIND in a
        or LLM_REQUEST_TYPE in a
        or _is_indexed(a, sc.LEGACY_PROMPT_PREFIX)
        or _is_indexed(a, sc.LEGACY_COMPLETION_PREFIX)
    ):
        return "openllmetry"
    return "genai"


def classify(span: SpanRow) -> str:
    """run | model | tool | other, from attributes (span names differ between conventions).

    The same rules, in SQL, make the ``span_roles`` view (store/runs_view.py). An OpenInference CHAIN or
    an OpenLLMetry workflow is a run only at the root of its trace (``span.is_root``)."""
    if span.role is None:
        span.role = _classify(span)
    return span.role


def _classify(span: SpanRow) -> str:
    a = span.attrs
    node_type = span.node_type or a.get(sc.NODE_TYPE)
    if node_type in (RUN, MODEL, TOOL):
        return node_type
    op = span.operation_name or a.get(sc.GEN_AI_OPERATION_NAME)
    if op in sc.RUN_OPERATIONS:
        return RUN
    if op in sc.MODEL_OPERATIONS:
        return MODEL
    if op == sc.OP_EXECUTE_TOOL:
        return TOOL
    oi = a.get(sc.OPENINFERENCE_SPAN_KIND)
    oi = oi.upper() if isinstance(oi, str) else None
    if oi in sc.OI_RUN_KINDS or (oi in sc.OI_ROOT_RUN_KINDS and span.is_root):
        return RUN
    if oi in _OI_KINDS:
        return _OI_KINDS[oi]
    tl = a.get(sc.TRACELOOP_SPAN_KIND)
    tl = tl.lower() if isinstance(tl, str) else None
    if tl in sc.TRACELOOP_RUN_KINDS or (tl in sc.TRACELOOP_ROOT_RUN_KINDS and span.is_root):
        return RUN
    if tl == "tool":
        return TOOL
    if a.get(LLM_REQUEST_TYPE) in ("chat", "completion"):
        return MODEL
    if _is_indexed(a, sc.LEGACY_PROMPT_PREFIX) or _is_indexed(a, sc.LEGACY_COMPLETION_PREFIX):
        return MODEL
    if sc.OI_LLM_MODEL_NAME in a and _is_indexed(a, sc.OI_LLM_INPUT_MESSAGES + "."):
        return MODEL
    return OTHER


def source(span: SpanRow) -> str:
    """Which instrumentation recorded the span (the ``source`` of a run), as ``span_roles`` says."""
    a = span.attrs
    if span.run_id or span.node_type:
        return sc.SOURCE_AGENTTAPE
    scope = (span.scope_name or "").lower()
    if "openai_agents" in scope or "openai-agents" in scope:
        return sc.SOURCE_OPENAI_AGENTS
    if "langgraph" in scope or ("langchain" in scope and _mentions(a, "langgraph")):
        return sc.SOURCE_LANGGRAPH
    if "langchain" in scope:
        return sc.SOURCE_LANGCHAIN
    if sc.OPENINFERENCE_SPAN_KIND in a:
        return sc.SOURCE_OPENINFERENCE
    if (sc.TRACELOOP_SPAN_KIND in a or LLM_REQUEST_TYPE in a or _is_indexed(a, sc.LEGACY_PROMPT_PREFIX)
            or _is_indexed(a, sc.LEGACY_COMPLETION_PREFIX) or any(k.startswith("traceloop.") for k in a)
            or sc.OPENLLMETRY_API_BASE in a
            or (scope.startswith("opentelemetry.instrumentation.") and scope.endswith(sc.OPENLLMETRY_SCOPE_SUFFIX))):
        return sc.SOURCE_OPENLLMETRY
    return sc.SOURCE_GENAI


def _mentions(attrs: dict[str, Any], word: str) -> bool:
    return any(word in k or (isinstance(v, str) and word in v) for k, v in attrs.items())


SESSION_KEYS = (sc.SESSION_ID, sc.GEN_AI_CONVERSATION_ID, sc.OI_SESSION_ID, sc.TRACELOOP_SESSION_ID,
                sc.TRACELOOP_CONVERSATION_ID)


def session_of(span: SpanRow) -> str | None:
    """The session (conversation) a span names, in any convention."""
    value = _first(span.attrs, *SESSION_KEYS)
    return None if value is None else str(value)
