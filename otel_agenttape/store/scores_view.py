"""The ``scores`` view: every ``gen_ai.evaluation.result`` event, whoever sent it and however.

A score arrives as a span event (ours on the scored span, or on an ``agenttape.score`` span of the
giver's own tape that names what it scores; another instrumentation's on the span it scores) or as an
OTel log record parented to the scored span. Each row says which run (``run_ref``) and span it scores,
resolved from the ids the event carries: the scored span's ids, a run ref or run id
(``agenttape.score.of``), or a model response's ``gen_ai.response.id``.
"""

from __future__ import annotations

from otel_agenttape import semconv as sc
from otel_agenttape.store.runs_view import MODEL_OPS_SQL, RUN_OPS_SQL, json_paths

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
]


def _t(i: int) -> str:
    """Attribute ``i`` of ``x`` as text (typed JSON: string, int, double or bool)."""
    e = f"x[{i}]"
    return f"coalesce({e}->>'s', {e}->>'i', {e}->>'d', {e}->>'bool')"


_FIELDS = f"""{_t(1)} AS name, TRY_CAST({_t(2)} AS DOUBLE) AS value, {_t(3)} AS label, {_t(4)} AS explanation,
    {_t(5)} AS response_id, {_t(6)} AS error_type, {_t(7)} AS source, {_t(8)} AS score_of"""

SCORES = f"""
CREATE OR REPLACE VIEW scores AS
WITH ev AS (
  SELECT 'span_event' AS via, trace_id AS given_trace_id, span_id AS given_span_id, time_unix_nano,
    {_FIELDS},
    coalesce({_t(9)}, CASE WHEN {_t(8)} IS NULL THEN trace_id END) AS t_trace,
    coalesce({_t(10)}, CASE WHEN {_t(8)} IS NULL THEN span_id END) AS t_span
  FROM (SELECT *, json_extract(attributes, {json_paths(_KEYS)}) AS x FROM span_events
        WHERE name = '{sc.EVENT_EVALUATION_RESULT}')
  UNION ALL
  SELECT 'log', trace_id, span_id, coalesce(time_unix_nano, observed_time_unix_nano), {_FIELDS},
    coalesce({_t(9)}, trace_id), coalesce({_t(10)}, span_id)
  FROM (SELECT *, json_extract(attributes, {json_paths(_KEYS)}) AS x FROM log_records
        WHERE event_name = '{sc.EVENT_EVALUATION_RESULT}'
           OR (event_name IS NULL AND attributes->'$."{sc.LOG_EVENT_NAME}"'->>'s' = '{sc.EVENT_EVALUATION_RESULT}'))
), by_response AS (  -- the model call a bare id names as its response id (only ids no run has)
  SELECT json_extract_string(s.attributes, '$."{sc.GEN_AI_RESPONSE_ID}".s') AS response_id,
    any_value(s.trace_id) AS trace_id, any_value(s.span_id) AS span_id, any_value(s.run_id) AS run_id
  FROM spans s
  WHERE (s.node_type = 'model' OR s.operation_name IN ({MODEL_OPS_SQL}))
    AND EXISTS (SELECT 1 FROM ev WHERE t_span IS NULL AND response_id IS NOT NULL)
    AND json_extract_string(s.attributes, '$."{sc.GEN_AI_RESPONSE_ID}".s') IN
      (SELECT response_id FROM ev WHERE t_span IS NULL AND response_id IS NOT NULL)
  GROUP BY 1
), by_run AS (  -- the run span of a run named by its bare id (its latest trace)
  SELECT run_id, arg_max(trace_id, start_time_unix_nano) AS trace_id, arg_max(span_id, start_time_unix_nano) AS span_id
  FROM spans
  WHERE run_id IN (SELECT score_of FROM ev WHERE score_of IS NOT NULL AND NOT contains(score_of, '@'))
    AND (node_type = 'run' OR operation_name IN ({RUN_OPS_SQL}))
  GROUP BY run_id
), by_ref AS (  -- the run span of a run named by its ref
  SELECT run_id || '@' || trace_id AS ref, any_value(span_id) AS span_id FROM spans
  WHERE run_id || '@' || trace_id IN (SELECT score_of FROM ev WHERE contains(score_of, '@'))
    AND (node_type = 'run' OR operation_name IN ({RUN_OPS_SQL}))
  GROUP BY 1
), targeted AS (
  SELECT ev.*,
    coalesce(ev.t_trace, br.trace_id, rr.trace_id) AS trace_id,
    coalesce(ev.t_span, bf.span_id, br.span_id, rr.span_id) AS span_id,
    CASE WHEN contains(ev.score_of, '@') THEN ev.score_of
         WHEN br.run_id IS NOT NULL THEN br.run_id || '@' || br.trace_id
         WHEN rr.response_id IS NOT NULL AND rr.run_id IS NOT NULL THEN rr.run_id || '@' || rr.trace_id END AS named_ref
  FROM ev
  LEFT JOIN by_ref bf ON bf.ref = ev.score_of
  LEFT JOIN by_run br ON br.run_id = ev.score_of
  LEFT JOIN by_response rr ON ev.t_span IS NULL AND br.run_id IS NULL AND rr.response_id = ev.response_id
)
SELECT
  coalesce(g.named_ref,
    coalesce(t.run_id, CASE WHEN t.operation_name IN ({RUN_OPS_SQL}) THEN t.span_id END,
             p.run_id, p.span_id) || '@' || g.trace_id) AS run_ref,
  g.trace_id, g.span_id, g.name, g.value, g.label, g.explanation,
  coalesce(g.source, 'otel') AS source,
  g.response_id, g.error_type, g.time_unix_nano, g.via, g.given_trace_id, g.given_span_id
FROM targeted g
LEFT JOIN spans t ON t.trace_id = g.trace_id AND t.span_id = g.span_id
LEFT JOIN spans p ON p.trace_id = t.trace_id AND p.span_id = t.parent_span_id AND t.run_id IS NULL
  AND p.operation_name IN ({RUN_OPS_SQL})
"""
