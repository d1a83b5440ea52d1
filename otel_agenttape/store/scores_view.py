"""The ``scores`` view: every ``gen_ai.evaluation.result`` event, whoever sent it and however.

A score arrives as a span event (ours on the scored span, or on an ``agenttape.score`` span of the
giver's own tape that names what it scores; another instrumentation's on the span it scores) or as an
OTel log record parented to the scored span. Each row says which run (``run_ref``) and span it scores,
resolved from the ids the event carries: the scored span's ids, a run ref or run id
(``agenttape.score.of``), or a model response's ``gen_ai.response.id``.
"""

from __future__ import annotations

from otel_agenttape import semconv as sc
from otel_agenttape.store.runs_view import MODEL_OPS_SQL, RUN_OPS_SQL, json_paths, roles_select

_KEYS = [
    sc.GEN_AI_EVALUATION_NAME,  # 1
    sc.GEN_AI_EVALUATION_SCORE_VALUE,  # 2
    sc.GEN_AI_EVALUATION_SCORE_LABEL,  # 3
    sc.GEN_AI_EVALUATION_EXPLANATION,  # 4
    sc.GEN_AI_RESPONSE_ID,  # 5
    sc.ERROR_TYPE,  # 6
    sc.SCORE_SOURCE,  # 7
    sc.SCORE_OF,  # 8
    sc.SCORE_TRACE_ID,  # 9
    sc.SCORE_SPAN_ID,  # 10
    sc.LOG_EVENT_NAME,  # 11
    sc.SCORE_VERSION,  # 12
    sc.SCORE_ID,  # 13
]


def _s(i: int) -> str:
    """Attribute ``i`` of ``x`` as text: a string attribute (every score attribute but the value is one)."""
    return f"(x[{i}]->>'s')"


# The value may come as a double, an int or (from a careless sender) a string.
_VALUE = "TRY_CAST(coalesce(x[2]->>'d', x[2]->>'i', x[2]->>'s') AS DOUBLE)"
_EVENT_PATHS = json_paths(_KEYS)

SCORES = f"""
CREATE OR REPLACE VIEW scores AS
WITH RECURSIVE raw AS (
  SELECT 'span_event' AS via, trace_id, span_id, time_unix_nano, json_extract(attributes, {_EVENT_PATHS}) AS x
  FROM span_events WHERE name = '{sc.EVENT_EVALUATION_RESULT}'
  UNION ALL
  SELECT 'log', trace_id, span_id, coalesce(time_unix_nano, observed_time_unix_nano),
    json_extract(attributes, {_EVENT_PATHS})
  FROM log_records WHERE event_name = '{sc.EVENT_EVALUATION_RESULT}'
    OR (event_name IS NULL AND attributes->'$."{sc.LOG_EVENT_NAME}"'->>'s' = '{sc.EVENT_EVALUATION_RESULT}')
), ev AS (
  -- a span event names the span it is on, unless it is a score tape's (``agenttape.score.of``); a log
  -- record is parented to the span it scores
  SELECT via, trace_id AS given_trace_id, span_id AS given_span_id, time_unix_nano,
    {_s(1)} AS name, {_VALUE} AS value, {_s(3)} AS label, {_s(4)} AS explanation, {_s(5)} AS response_id,
    {_s(6)} AS error_type, {_s(7)} AS source, {_s(8)} AS score_of, {_s(12)} AS version, {_s(13)} AS score_id,
    coalesce({_s(9)}, CASE WHEN via = 'log' OR {_s(8)} IS NULL THEN trace_id END) AS t_trace,
    coalesce({_s(10)}, CASE WHEN via = 'log' OR {_s(8)} IS NULL THEN span_id END) AS t_span
  FROM raw
), one AS (  -- a score emitted both ways (span event and log record) is listed once, as its span event
  SELECT * FROM ev WHERE via = 'span_event' OR score_id IS NULL
    OR score_id NOT IN (SELECT score_id FROM ev WHERE via = 'span_event' AND score_id IS NOT NULL)
), by_response AS (  -- the model call a bare id names as its response id (only ids no run has)
  SELECT json_extract_string(s.attributes, '$."{sc.GEN_AI_RESPONSE_ID}".s') AS response_id,
    any_value(s.trace_id) AS trace_id, any_value(s.span_id) AS span_id, any_value(s.run_id) AS run_id
  FROM spans s
  WHERE (s.node_type = 'model' OR s.operation_name IN ({MODEL_OPS_SQL}))
    AND EXISTS (SELECT 1 FROM one WHERE t_span IS NULL AND response_id IS NOT NULL)
    AND json_extract_string(s.attributes, '$."{sc.GEN_AI_RESPONSE_ID}".s') IN
      (SELECT response_id FROM one WHERE t_span IS NULL AND response_id IS NOT NULL)
  GROUP BY 1
), by_run AS (  -- the run span of a run named by its bare id (its latest trace)
  SELECT run_id, arg_max(trace_id, start_time_unix_nano) AS trace_id, arg_max(span_id, start_time_unix_nano) AS span_id
  FROM spans
  WHERE run_id IN (SELECT score_of FROM one WHERE score_of IS NOT NULL AND NOT contains(score_of, '@'))
    AND (node_type = 'run' OR operation_name IN ({RUN_OPS_SQL}))
  GROUP BY run_id
), by_ref AS (  -- the run span of a run named by its ref
  SELECT run_id || '@' || trace_id AS ref, any_value(span_id) AS span_id FROM spans
  WHERE run_id || '@' || trace_id IN (SELECT score_of FROM one WHERE contains(score_of, '@'))
    AND (node_type = 'run' OR operation_name IN ({RUN_OPS_SQL}))
  GROUP BY 1
), targeted AS (
  SELECT one.*,
    coalesce(one.t_trace, br.trace_id, rr.trace_id) AS trace_id,
    coalesce(one.t_span, bf.span_id, br.span_id, rr.span_id) AS span_id,
    CASE WHEN contains(one.score_of, '@') THEN one.score_of
         WHEN br.run_id IS NOT NULL THEN br.run_id || '@' || br.trace_id
         WHEN rr.response_id IS NOT NULL AND rr.run_id IS NOT NULL THEN rr.run_id || '@' || rr.trace_id END AS named_ref
  FROM one
  LEFT JOIN by_ref bf ON bf.ref = one.score_of
  LEFT JOIN by_run br ON br.run_id = one.score_of
  LEFT JOIN by_response rr ON one.t_span IS NULL AND br.run_id IS NULL AND rr.response_id = one.response_id
), sr AS (  -- the spans of the scored traces, with their roles (another source's run spans)
  {roles_select("(SELECT * FROM spans WHERE trace_id IN (SELECT trace_id FROM targeted WHERE named_ref IS NULL))")}
), up(trace_id, from_span, span_id, run_id, role, parent_span_id, depth) AS (  -- up to the run that owns it
  SELECT s.trace_id, s.span_id, s.span_id, s.run_id, s.role, s.parent_span_id, 0
  FROM sr s SEMI JOIN (SELECT trace_id, span_id FROM targeted WHERE named_ref IS NULL) g
    ON g.trace_id = s.trace_id AND g.span_id = s.span_id
  UNION ALL
  SELECT u.trace_id, u.from_span, p.span_id, p.run_id, p.role, p.parent_span_id, u.depth + 1
  FROM up u JOIN sr p ON p.trace_id = u.trace_id AND p.span_id = u.parent_span_id
  WHERE u.run_id IS NULL AND u.role <> 'run' AND u.depth < 256
), owner AS (
  SELECT trace_id, from_span, arg_min(coalesce(run_id, span_id), depth) AS run_key FROM up
  WHERE run_id IS NOT NULL OR role = 'run' GROUP BY trace_id, from_span
), bare AS (  -- a trace with no run span and no run id is one run of its own (``runs`` lists it so)
  SELECT trace_id FROM sr GROUP BY trace_id HAVING count(*) FILTER (WHERE role = 'run') = 0 AND count(run_id) = 0
)
SELECT
  coalesce(g.named_ref, o.run_key || '@' || g.trace_id, b.trace_id || '@' || b.trace_id) AS run_ref,
  g.trace_id, g.span_id, g.name, g.value, g.label, g.explanation,
  coalesce(g.source, 'otel') AS source, g.version,
  g.response_id, g.error_type, g.time_unix_nano, g.score_id, g.via, g.given_trace_id, g.given_span_id
FROM targeted g
LEFT JOIN owner o ON g.named_ref IS NULL AND o.trace_id = g.trace_id AND o.from_span = g.span_id
LEFT JOIN bare b ON g.named_ref IS NULL AND o.run_key IS NULL AND b.trace_id = g.trace_id
  AND EXISTS (SELECT 1 FROM sr WHERE sr.trace_id = g.trace_id AND sr.span_id = g.span_id)
"""
