"""The ``runs``, ``nodes`` and ``steps`` views, computed from spans and span events.

The same SQL runs over the DuckDB tables and over a Parquet lake (views named like the tables), so
every rebuilt record has one definition. Attribute values are read from the typed JSON with one
``json_extract`` per row and turned into text: strings as is, ints/doubles as their decimal text,
bools as ``true``/``false``, arrays and kvlists as their typed JSON.
"""

from __future__ import annotations

from otel_agenttape import semconv as sc
# the model operations' SQL list and the json_extract paths of attribute keys: one rule for both view modules
from otel_agenttape.store.runs_view import MODEL_OPS_SQL, RUNS, SPAN_ROLES, json_paths
from otel_agenttape.store.scores_view import SCORES


def _typed_text(expr: str) -> str:
    return (
        f"coalesce({expr}->>'s', {expr}->>'i', {expr}->>'d', {expr}->>'bool', "
        f"CASE WHEN {expr} IS NOT NULL AND {expr}::VARCHAR <> '{{}}' THEN {expr}::VARCHAR END)"
    )


_NODE_KEYS = [
    sc.GEN_AI_INPUT_MESSAGES,  # 1
    sc.GEN_AI_OUTPUT_MESSAGES,  # 2
    sc.MODEL_RAW_OUTPUT,  # 3
    sc.MODEL_OUTPUT_TEXT,  # 4
    sc.MODEL_REASONING,  # 5
    sc.MODEL_RETRY_COUNT,  # 6
    sc.GEN_AI_TOOL_CALL_ARGUMENTS,  # 7
    sc.GEN_AI_TOOL_CALL_RESULT,  # 8
    sc.RECORD_ID,  # 9
    sc.NODE_ID,  # 10
    sc.TOOL_ERROR,  # 11
    sc.GEN_AI_SYSTEM_INSTRUCTIONS,  # 12
]


def _x(i: int) -> str:
    return _typed_text(f"x[{i}]")


NODE_SPANS = f"""
CREATE OR REPLACE VIEW node_spans AS
SELECT s.*,
  coalesce(s.node_type,
    CASE WHEN s.operation_name IN ({MODEL_OPS_SQL}) THEN 'model'
         WHEN s.operation_name = '{sc.OP_EXECUTE_TOOL}' THEN 'tool' END) AS resolved_node_type,
  coalesce(s.run_id, p.run_id, p.span_id) AS resolved_run_id,
  coalesce(s.session_id, p.session_id) AS resolved_session_id
FROM spans s
LEFT JOIN spans p
  ON p.trace_id = s.trace_id AND p.span_id = s.parent_span_id
  AND p.operation_name = '{sc.OP_INVOKE_AGENT}'
WHERE s.node_type IN ('model', 'tool')
   OR (s.node_type IS NULL AND (s.operation_name IN ({MODEL_OPS_SQL})
                                OR s.operation_name = '{sc.OP_EXECUTE_TOOL}'))
"""

_EVENT_KEYS = [sc.EVENT_SEGMENT, sc.EVENT_SEQ]

NODE_EVENTS = f"""
CREATE OR REPLACE VIEW node_events AS
SELECT e.trace_id, e.span_id, e.event_index, e.time_unix_nano, e.name,
  {_typed_text("y[1]")} AS segment,
  TRY_CAST({_typed_text("y[2]")} AS BIGINT) AS seq,
  e.attributes
FROM (SELECT *, json_extract(attributes, {json_paths(_EVENT_KEYS)}) AS y FROM span_events
      WHERE name IN ('{sc.EVENT_TEXT}', '{sc.EVENT_REASONING}', '{sc.EVENT_RETRY}', '{sc.EVENT_METADATA}')) e
"""

NODES = f"""
CREATE OR REPLACE VIEW nodes AS
WITH ev AS (
  SELECT trace_id, span_id,
    string_agg(segment, '' ORDER BY seq, event_index) FILTER (WHERE name = '{sc.EVENT_TEXT}') AS text,
    string_agg(segment, chr(10) ORDER BY seq, event_index)
      FILTER (WHERE name = '{sc.EVENT_REASONING}') AS reasoning,
    count(*) FILTER (WHERE name = '{sc.EVENT_RETRY}') AS retries
  FROM node_events GROUP BY trace_id, span_id
), n AS (
  SELECT ns.*, json_extract(ns.attributes, {json_paths(_NODE_KEYS)}) AS x FROM node_spans ns
)
SELECT
  coalesce({_x(9)}, n.span_id) AS record_id,
  n.resolved_run_id AS run_id,
  n.resolved_session_id AS session_id,
  n.turn_id,
  n.step,
  n.resolved_node_type AS node_type,
  coalesce({_x(10)},
    n.resolved_node_type || '@' || coalesce(n.resolved_run_id, '') || '|' || coalesce(n.turn_id, '') || '|'
    || coalesce(CAST(n.step AS VARCHAR), '')
    || CASE WHEN n.resolved_node_type = 'tool'
            THEN '|' || coalesce(n.tool_call_id, n.tool_name, 'anon') ELSE '' END) AS node_id,
  CASE WHEN n.resolved_node_type = 'model' THEN coalesce(n.request_model, n.response_model) END AS model_id,
  CASE WHEN n.resolved_node_type = 'model' THEN {_x(1)} ELSE {_x(7)} END AS inputs,
  CASE WHEN n.resolved_node_type = 'model' THEN {_x(12)} END AS system_instructions,
  CASE WHEN n.resolved_node_type = 'model' THEN coalesce(ev.text, {_x(4)}) END AS output_text,
  CASE WHEN n.resolved_node_type = 'model' THEN coalesce({_x(3)}, {_x(2)}) ELSE {_x(8)} END AS raw_output,
  n.start_time_unix_nano,
  n.end_time_unix_nano,
  n.duration_ms,
  CASE WHEN n.resolved_node_type = 'model' THEN coalesce(ev.reasoning, {_x(5)}) END AS reasoning,
  CASE WHEN n.resolved_node_type = 'model'
       THEN coalesce(TRY_CAST({_x(6)} AS BIGINT), ev.retries, 0) END AS retry_count,
  n.input_tokens,
  n.output_tokens,
  n.trace_id,
  n.span_id,
  n.parent_span_id,
  n.agent_name,
  n.provider_name,
  n.response_model,
  n.tool_name,
  n.tool_call_id,
  n.status_code,
  n.status_message,
  {_x(11)} AS tool_error,
  n.name AS span_name
FROM n LEFT JOIN ev ON ev.trace_id = n.trace_id AND ev.span_id = n.span_id
"""

_KIND_RANK = (
    "CASE kind WHEN 'tool_result' THEN 0 WHEN 'input' THEN 1 WHEN 'tool_call' THEN 1 "
    "WHEN 'terminal' THEN 9 ELSE 2 END"
)

STEPS = f"""
CREATE OR REPLACE VIEW steps AS
WITH nd AS (
  SELECT n.*, json_extract(n.attributes, {json_paths(_NODE_KEYS)}) AS x FROM node_spans n
), ev AS (
  SELECT e.*, nd.resolved_run_id, nd.resolved_node_type, nd.turn_id, nd.step
  FROM node_events e JOIN nd ON nd.trace_id = e.trace_id AND nd.span_id = e.span_id
), raw AS (
  SELECT resolved_run_id AS run_id, trace_id, span_id, 'input' AS kind, start_time_unix_nano AS time_unix_nano,
    resolved_node_type AS node_type, turn_id, step, CAST(NULL AS BIGINT) AS seq,
    CAST(NULL AS INTEGER) AS event_index, coalesce(request_model, response_model) AS name,
    {_x(1)} AS content, CAST(NULL AS VARCHAR) AS status
  FROM nd WHERE resolved_node_type = 'model'
  UNION ALL
  SELECT resolved_run_id, trace_id, span_id, 'text', end_time_unix_nano, resolved_node_type, turn_id, step,
    NULL, NULL, '{sc.MODEL_OUTPUT_TEXT}', {_x(4)}, NULL
  FROM nd WHERE resolved_node_type = 'model' AND {_x(4)} IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM node_events t WHERE t.trace_id = nd.trace_id AND t.span_id = nd.span_id
                    AND t.name = '{sc.EVENT_TEXT}')
  UNION ALL
  SELECT resolved_run_id, trace_id, span_id,
    CASE name WHEN '{sc.EVENT_TEXT}' THEN 'text' WHEN '{sc.EVENT_REASONING}' THEN 'reasoning'
              ELSE 'metadata' END,
    time_unix_nano, resolved_node_type, turn_id, step, seq, event_index, name,
    CASE WHEN name IN ('{sc.EVENT_TEXT}', '{sc.EVENT_REASONING}') THEN segment
         ELSE CAST(attributes AS VARCHAR) END,
    NULL
  FROM ev
  UNION ALL
  SELECT resolved_run_id, trace_id, span_id, 'tool_call', start_time_unix_nano, resolved_node_type, turn_id,
    step, NULL, NULL, tool_name, {_x(7)}, NULL
  FROM nd WHERE resolved_node_type = 'tool'
  UNION ALL
  SELECT resolved_run_id, trace_id, span_id, 'tool_result', end_time_unix_nano, resolved_node_type, turn_id,
    step, NULL, NULL, tool_name, coalesce({_x(8)}, {_x(11)}, status_message),
    CASE WHEN status_code = 2 THEN 'error' ELSE 'ok' END
  FROM nd WHERE resolved_node_type = 'tool'
  UNION ALL
  SELECT coalesce(run_id, span_id), trace_id, span_id, 'terminal', end_time_unix_nano, 'run', turn_id, step,
    NULL, NULL, agent_name, status_message,
    coalesce(run_status, CASE WHEN status_code = 2 THEN '{sc.STATUS_ERROR}' ELSE '{sc.STATUS_COMPLETED}' END)
  FROM spans WHERE operation_name = '{sc.OP_INVOKE_AGENT}'
)
SELECT run_id,
  CAST(row_number() OVER (PARTITION BY run_id, trace_id
        ORDER BY time_unix_nano, {_KIND_RANK}, seq NULLS FIRST, event_index NULLS FIRST, span_id) - 1
       AS BIGINT) AS step_index,
  kind, time_unix_nano, trace_id, span_id, node_type, turn_id, step, seq, event_index, name, content, status
FROM raw
"""

VIEWS: list[tuple[str, str]] = [
    ("node_spans", NODE_SPANS),
    ("node_events", NODE_EVENTS),
    ("nodes", NODES),
    ("span_roles", SPAN_ROLES),
    ("runs", RUNS),
    ("steps", STEPS),
    ("scores", SCORES),
]


def create_views(con: object) -> None:
    """Create (or replace) the views on a DuckDB connection whose tables/views are named like the store's."""
    for _, sql in VIEWS:
        con.execute(sql)  # type: ignore[attr-defined]
