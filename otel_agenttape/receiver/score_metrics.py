"""The scores in one stored batch (``gen_ai.evaluation.result``), for the receiver's evaluation series.

A score is a span event (ours, and other instrumentations') or a log record (other instrumentations';
ours copy a span event into a log record with the same ``agenttape.score.id``, so a log record with
that id is the same score and is not counted again). Each gets the agent and service of the span it
sits on when that span is in the batch (a score given during the run), else of its log record's
resource; a score given later, in a score tape of its own, has no agent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from otel_agenttape import semconv as sc
from otel_agenttape.receiver.span_labels import flat, true_mask

EVENT = sc.EVENT_EVALUATION_RESULT


def _typed(attrs: dict[str, Any], key: str) -> Any:
    v = attrs.get(key)
    if isinstance(v, dict):
        for k in ("s", "d", "i", "bool"):
            if k in v:
                return v[k]
        return None
    return v


def _score(attrs: dict[str, Any]) -> dict[str, Any] | None:
    name = _typed(attrs, sc.GEN_AI_EVALUATION_NAME)
    if not name:
        return None
    value = _typed(attrs, sc.GEN_AI_EVALUATION_SCORE_VALUE)
    try:
        value = float(value) if value is not None else None
    except (TypeError, ValueError):
        value = None
    return {"name": str(name), "value": value, "label": _typed(attrs, sc.GEN_AI_EVALUATION_SCORE_LABEL),
            "source": _typed(attrs, sc.SCORE_SOURCE) or "otel", "error_type": _typed(attrs, sc.ERROR_TYPE)}


def batch_scores(tables: dict[str, pa.Table]) -> list[dict[str, Any]]:
    """Each score of the batch: name, value (None without one), label, source, error_type, agent, service."""
    out: list[dict[str, Any]] = []
    spans = tables.get("spans")
    owner: dict[str, tuple[Any, Any]] = {}
    events = tables.get("span_events")
    if events is not None and events.num_rows:
        hits = np.flatnonzero(true_mask(pc.equal(flat(events.column("name")), EVENT)))  # no str per event
        if len(hits) and spans is not None and spans.num_rows:
            sid = flat(spans.column("span_id")).to_pylist()
            agents = flat(spans.column("agent_name")).to_pylist()
            services = flat(spans.column("service_name")).to_pylist()
            owner = {s: (a, v) for s, a, v in zip(sid, agents, services)}
        if len(hits):
            attrs = flat(events.column("attributes")).take(pa.array(hits)).to_pylist()
            span_ids = flat(events.column("span_id")).take(pa.array(hits)).to_pylist()
            for text, span_id in zip(attrs, span_ids):
                score = _score(orjson.loads(text) if text else {})
                if score is not None:
                    score["agent"], score["service"] = owner.get(span_id, (None, None))
                    out.append(score)
    logs = tables.get("log_records")
    if logs is not None and logs.num_rows and "event_name" in logs.column_names:
        hits = np.flatnonzero(true_mask(pc.equal(flat(logs.column("event_name")), EVENT)))
        if len(hits):
            attrs = flat(logs.column("attributes")).take(pa.array(hits)).to_pylist()
            services = flat(logs.column("service_name")).take(pa.array(hits)).to_pylist()
            for text, service in zip(attrs, services):
                doc = orjson.loads(text) if text else {}
                if sc.SCORE_ID in doc:  # our copy of a span event: counted there
                    continue
                score = _score(doc)
                if score is not None:
                    score["agent"], score["service"] = _typed(doc, sc.GEN_AI_AGENT_NAME), service
                    out.append(score)
    return out
