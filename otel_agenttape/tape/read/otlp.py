"""A run's stored spans back as OTLP JSON (an ``ExportTraceServiceRequest``), which ``agenttape ingest``
takes: a run moves from one store to another with its attributes (and so its seals) unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ...codec.typed import attrs_to_otlp_json
from ..load import Reader, _rows


def _attrs(text: Any) -> list[dict[str, Any]]:
    return attrs_to_otlp_json(orjson.loads(text) if text else {})


def _where(keys: Sequence[tuple[str, str]]) -> tuple[str, list[str]]:
    traces = sorted({t for t, _ in keys})
    spans = sorted({s for _, s in keys})
    sql = (f"trace_id IN ({', '.join('?' for _ in traces)}) AND span_id IN ({', '.join('?' for _ in spans)})")
    return sql, [*traces, *spans]


def spans_otlp(reader: Reader, keys: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """These stored spans (trace id, span id) with their events, links, scopes and resources."""
    if not keys:
        return {"resourceSpans": []}
    wanted = set(keys)
    where, params = _where(keys)
    spans = [r for r in _rows(reader, (
        "SELECT trace_id, span_id, parent_span_id, trace_state, flags, name, kind, start_time_unix_nano, "
        "end_time_unix_nano, status_code, status_message, CAST(attributes AS VARCHAR) AS attributes, "
        "dropped_attributes_count, dropped_events_count, dropped_links_count, resource_id, scope_name, "
        f"scope_version FROM spans WHERE {where} ORDER BY start_time_unix_nano, span_id"), params)
        if (r["trace_id"], r["span_id"]) in wanted]
    events: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in _rows(reader, "SELECT trace_id, span_id, time_unix_nano, name, CAST(attributes AS VARCHAR) AS attributes, "
                   f"dropped_attributes_count FROM span_events WHERE {where} ORDER BY event_index", params):
        events.setdefault((e["trace_id"], e["span_id"]), []).append({
            "timeUnixNano": str(e["time_unix_nano"]), "name": e["name"], "attributes": _attrs(e["attributes"]),
            "droppedAttributesCount": int(e["dropped_attributes_count"] or 0)})
    links: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for k in _rows(reader, "SELECT trace_id, span_id, linked_trace_id, linked_span_id, trace_state, flags, "
                   "CAST(attributes AS VARCHAR) AS attributes, dropped_attributes_count FROM span_links "
                   f"WHERE {where} ORDER BY link_index", params):
        link: dict[str, Any] = {"traceId": k["linked_trace_id"], "spanId": k["linked_span_id"],
                                "attributes": _attrs(k["attributes"]),
                                "droppedAttributesCount": int(k["dropped_attributes_count"] or 0)}
        if k["trace_state"]:
            link["traceState"] = k["trace_state"]
        if k["flags"] is not None:
            link["flags"] = int(k["flags"])
        links.setdefault((k["trace_id"], k["span_id"]), []).append(link)
    rids = sorted({r["resource_id"] for r in spans if r["resource_id"]})
    resources = {r["resource_id"]: r for r in _rows(
        reader, "SELECT resource_id, CAST(attributes AS VARCHAR) AS attributes, schema_url, dropped_attributes_count "
        f"FROM resources WHERE resource_id IN ({', '.join('?' for _ in rids)})", rids)} if rids else {}
    grouped: dict[Any, dict[Any, list[dict[str, Any]]]] = {}
    for r in spans:
        key = (r["trace_id"], r["span_id"])
        span: dict[str, Any] = {
            "traceId": r["trace_id"], "spanId": r["span_id"], "name": r["name"], "kind": int(r["kind"]),
            "startTimeUnixNano": str(r["start_time_unix_nano"]), "endTimeUnixNano": str(r["end_time_unix_nano"]),
            "attributes": _attrs(r["attributes"]), "events": events.get(key, []), "links": links.get(key, []),
            "status": {"code": int(r["status_code"] or 0), **({"message": r["status_message"]}
                                                              if r["status_message"] else {})},
            "droppedAttributesCount": int(r["dropped_attributes_count"] or 0),
            "droppedEventsCount": int(r["dropped_events_count"] or 0),
            "droppedLinksCount": int(r["dropped_links_count"] or 0),
        }
        if r["parent_span_id"]:
            span["parentSpanId"] = r["parent_span_id"]
        if r["trace_state"]:
            span["traceState"] = r["trace_state"]
        if r["flags"] is not None:
            span["flags"] = int(r["flags"])
        grouped.setdefault(r["resource_id"], {}).setdefault((r["scope_name"], r["scope_version"]), []).append(span)
    out = []
    for rid, scopes in grouped.items():
        res = resources.get(rid)
        block: dict[str, Any] = {
            "resource": {"attributes": _attrs(res["attributes"]) if res else [],
                         "droppedAttributesCount": int(res["dropped_attributes_count"] or 0) if res else 0},
            "scopeSpans": [{"scope": {k: v for k, v in (("name", name), ("version", version)) if v},
                            "spans": items} for (name, version), items in scopes.items()],
        }
        if res and res["schema_url"]:
            block["schemaUrl"] = res["schema_url"]
        out.append(block)
    return {"resourceSpans": out}
