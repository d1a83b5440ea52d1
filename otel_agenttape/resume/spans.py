"""Index entries to and from node-span attributes (no OTel SDK import: plain mappings only).

A resumable client that records through capture puts the call's resume key on the node span; the
sealing processor's ``on_node`` hook and the store rebuild (``tape/resume_index.py``) turn node spans
back into entries with the same keys. Spans recorded without a key (other instrumentations) still
give entries: tools are keyed by name + arguments, model calls are matched by position.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from .. import semconv as sc
from .entry import COMMITTED, FAILED, MATCH_CONTENT, MATCH_POSITION, Entry
from .index import Call
from .keys import MODEL, TOOL, ResumeKey, canonical_json, request_hash, tool_request

TEXT = "text"
JSON = "json"


def call_attributes(call: Call) -> dict[str, Any]:
    """Attributes a node span gets so the call can be found again from the tape."""
    return {sc.RESUME_KEY: str(call.key), sc.RESUME_POSITION: call.position}


def result_encoding(result: Any) -> str:
    """Capture stores a string payload verbatim and anything else as JSON; say which it was."""
    return TEXT if isinstance(result, str) else JSON


def _node_kind(attrs: Mapping[str, Any]) -> str | None:
    kind = attrs.get(sc.NODE_TYPE)
    if kind in (MODEL, TOOL):
        return kind
    op = attrs.get(sc.GEN_AI_OPERATION_NAME)
    if op == sc.OP_EXECUTE_TOOL:
        return TOOL
    if op in sc.MODEL_OPERATIONS:
        return MODEL
    return None


def _parse(text: Any, encoding: str | None) -> Any:
    """Decode a payload attribute. Without an encoding hint (foreign spans) text that parses as JSON
    is taken as JSON, since capture writes every non-string payload that way."""
    if not isinstance(text, str) or encoding == TEXT:
        return text
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _model_projection(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """What a foreign model span says about its request (used as its identity, not as a resume key)."""
    keep = (sc.GEN_AI_REQUEST_MODEL, sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_SYSTEM_INSTRUCTIONS,
            sc.GEN_AI_TOOL_DEFINITIONS)
    out = {k: _parse(attrs[k], None) for k in keep if k in attrs}
    out.update({k: v for k, v in attrs.items() if k.startswith("gen_ai.request.")})
    return out


def entry_from_span(
    attrs: Mapping[str, Any],
    events: Iterable[tuple[str, Mapping[str, Any]]] = (),
    *,
    tape: str | None = None,
    position: int | None = None,
    occurrence: int | None = None,
    failed: bool = False,
) -> Entry | None:
    """The index entry a finished node span stands for, or None for a span that is not a node.

    ``attrs`` are plain attribute values; ``events`` are (name, attributes) pairs in span order.
    ``tape``/``position``/``occurrence`` fill in what a span without a resume key cannot say.
    """
    kind = _node_kind(attrs)
    if kind is None:
        return None
    key_text = attrs.get(sc.RESUME_KEY)
    encoding = attrs.get(sc.RESUME_RESULT_ENCODING)
    name = attrs.get(sc.GEN_AI_TOOL_NAME) if kind == TOOL else attrs.get(sc.GEN_AI_REQUEST_MODEL)
    call_id = attrs.get(sc.GEN_AI_TOOL_CALL_ID) if kind == TOOL else None
    if kind == TOOL:
        request: Any = tool_request(str(name), attrs.get(sc.GEN_AI_TOOL_CALL_ARGUMENTS))
        raw_result = attrs.get(sc.GEN_AI_TOOL_CALL_RESULT)
    else:
        request = _model_projection(attrs)
        raw_result = attrs.get(sc.MODEL_RAW_OUTPUT, attrs.get(sc.GEN_AI_OUTPUT_MESSAGES))
    error = attrs.get(sc.TOOL_ERROR) or attrs.get(sc.ERROR_TYPE)
    state = FAILED if (failed or error) and kind == TOOL else COMMITTED
    if sc.RESUME_DELTAS in attrs:
        deltas = _parse(attrs[sc.RESUME_DELTAS], JSON)
    else:
        deltas = [ev.get(sc.EVENT_SEGMENT) for n, ev in events if n == sc.EVENT_TEXT]
    if key_text:
        key = ResumeKey.parse(str(key_text))
        match = MATCH_CONTENT
        pos = attrs.get(sc.RESUME_POSITION, position)
    else:
        match = MATCH_CONTENT if kind == TOOL else MATCH_POSITION
        digest = request_hash(request) if kind == TOOL else "span:" + hashlib.sha256(
            canonical_json(request)).hexdigest()
        key = ResumeKey(tape or str(attrs.get(sc.RUN_ID) or "default"), kind, digest, occurrence or 0)
        pos = position
    return Entry(
        tape=key.tape, kind=kind, request_hash=key.request_hash, occurrence=key.occurrence,
        position=int(pos if pos is not None else 0), request=request, result=_parse(raw_result, encoding),
        state=state, deltas=deltas or None, name=str(name) if name is not None else None,
        call_id=str(call_id) if call_id is not None else None,
        error={"type": "Error", "message": str(error)} if state == FAILED else None, match=match,
    )


def span_events(span: Any) -> list[tuple[str, Mapping[str, Any]]]:
    return [(ev.name, dict(ev.attributes or {})) for ev in (getattr(span, "events", None) or ())]


def node_feed(index: Any) -> Any:
    """A hook for ``SealingSpanProcessor(on_node=...)`` that feeds sealed node spans into ``index``.

    Only spans carrying a resume key of the index's tape are taken, and an entry already known (from
    the journal) is kept as is: the journal is the durable record, the feed a replica of it.
    """

    def feed(span: Any) -> None:
        attrs = dict(span.attributes or {})
        key_text = attrs.get(sc.RESUME_KEY)
        if not key_text:
            return
        key = ResumeKey.parse(str(key_text))
        if key.tape != index.tape or index.get(key) is not None:
            return
        status = getattr(getattr(span, "status", None), "status_code", None)
        failed = getattr(status, "name", "") == "ERROR"
        entry = entry_from_span(attrs, span_events(span), failed=failed)
        if entry is not None:
            index.add(entry, durable=False)

    return feed
