"""What a run is, in SQL: the ``span_roles`` and ``runs`` views, for every instrumentation's spans.

A span's role (run | model | tool | other) and source come from its attributes by the rules
``tape/foreign.py`` applies in Python, with the attribute names of ``semconv``, so every run this view
lists is the run a rebuild finds under the same ref (``RUN_ID@TRACE_ID``):

- an agenttape run: the spans carrying one ``agenttape.run.id`` in one trace (a run id reused in two
  traces is two runs);
- another instrumentation's run span (GenAI ``invoke_agent``/``create_agent``, OpenInference AGENT or a
  root CHAIN, OpenLLMetry agent or a root workflow): run id = its span id; it owns the model and tool
  spans below it up to the next run span;
- a trace with model or tool spans and no run span at all: one run whose id is the trace id.
"""

from __future__ import annotations

from otel_agenttape import semconv as sc

MODEL_OPS_SQL = ", ".join(f"'{op}'" for op in sorted(sc.MODEL_OPERATIONS))


def json_paths(keys: list[str]) -> str:
    """A DuckDB list of JSON paths, one per attribute key (keys hold dots: each is quoted whole)."""
    return "[" + ", ".join(f"'$.\"{k}\"'" for k in keys) + "]"


# A span's role (run | model | tool | other) and source, from attributes, as tape/foreign.py reads
# them: the same rules, one table of names (semconv), so a listed run is the run a rebuild finds.

_ROLE_KEYS = [
    sc.OPENINFERENCE_SPAN_KIND,  # 1
    sc.TRACELOOP_SPAN_KIND,  # 2
    sc.LLM_REQUEST_TYPE,  # 3
    sc.OI_LLM_MODEL_NAME,  # 4
    sc.GEN_AI_CONVERSATION_ID,  # 5
    sc.OI_SESSION_ID,  # 6
    sc.TRACELOOP_SESSION_ID,  # 7
    sc.OI_AGENT_NAME,  # 8
    sc.TRACELOOP_ENTITY_NAME,  # 9
    sc.TRACELOOP_WORKFLOW_NAME,  # 10
    sc.OI_TOKEN_PROMPT,  # 11
    sc.OI_TOKEN_COMPLETION,  # 12
    sc.GEN_AI_USAGE_PROMPT_TOKENS,  # 13
    sc.GEN_AI_USAGE_COMPLETION_TOKENS,  # 14
    sc.OI_TOOL_NAME,  # 15
    sc.TRACELOOP_CONVERSATION_ID,  # 16
    sc.OI_LLM_REQUEST_MODEL_NAME,  # 17
    sc.OI_LLM_RESPONSE_MODEL_NAME,  # 18
    sc.PREVIOUS_RUN_ID,  # 19
    sc.GEN_AI_HANDOFF_TO,  # 20
    sc.OI_GRAPH_NODE_PARENT_ID,  # 21
]


def _y(i: int) -> str:
    """A string attribute (every name, id and kind these rules read is a string)."""
    return f"(y[{i}]->>'s')"


def _yi(i: int) -> str:
    """An int or string attribute (token counts, session ids), as text."""
    return f"coalesce(y[{i}]->>'i', y[{i}]->>'s')"


def _quoted(values: object) -> str:
    return ", ".join(f"'{v}'" for v in sorted(values))  # type: ignore[attr-defined]


RUN_OPS_SQL = _quoted(sc.RUN_OPERATIONS)
_OI, _TL = "upper(oi_kind)", "lower(tl_kind)"
_INDEXED = (f"(contains(atext, '\"{sc.LEGACY_PROMPT_PREFIX}0.') "
            f"OR contains(atext, '\"{sc.LEGACY_COMPLETION_PREFIX}0.'))")
_SCOPE = "lower(coalesce(scope_name, ''))"
_SCOPE_SOURCE = (
    f"WHEN contains({_SCOPE}, 'openai_agents') OR contains({_SCOPE}, 'openai-agents') "
    f"THEN '{sc.SOURCE_OPENAI_AGENTS}' "
    f"WHEN contains({_SCOPE}, 'langgraph') OR (contains({_SCOPE}, 'langchain') AND contains(atext, 'langgraph')) "
    f"THEN '{sc.SOURCE_LANGGRAPH}' "
    f"WHEN contains({_SCOPE}, 'langchain') THEN '{sc.SOURCE_LANGCHAIN}'"
)

# The role of one of our spans (it carries promoted columns, so no attribute is read): as roles_select.
OURS_ROLE = (
    "CASE WHEN node_type IN ('run', 'model', 'tool') THEN node_type "
    f"WHEN operation_name IN ({RUN_OPS_SQL}) THEN 'run' WHEN operation_name IN ({MODEL_OPS_SQL}) THEN 'model' "
    f"WHEN operation_name = '{sc.OP_EXECUTE_TOOL}' THEN 'tool' ELSE 'other' END"
)


def ours_roles_select(src: str) -> str:
    """``roles_select`` for our spans only (those with a run id): promoted columns, no attribute read."""
    return f"""
SELECT trace_id, span_id, parent_span_id, name, scope_name, service_name, start_time_unix_nano,
  end_time_unix_nano, status_code, status_message, run_id, node_type, operation_name, run_status, chain_id,
  parent_run_id, CAST(NULL AS BOOLEAN) AS is_root, {OURS_ROLE} AS role, '{sc.SOURCE_AGENTTAPE}' AS source,
  session_id, agent_name, coalesce(response_model, request_model) AS model, tool_name, input_tokens,
  output_tokens, CAST(NULL AS VARCHAR) AS handoff_to, CAST(NULL AS VARCHAR) AS handed_by
FROM {src} WHERE run_id IS NOT NULL
"""


def roles_select(src: str) -> str:
    """One row per span of ``src`` (a relation shaped like ``spans``) with its role and source.

    Only spans that are not ours (no ``agenttape.run.id``, no ``agenttape.node.type``) have their JSON
    attributes read, and only in their traces is "is this a root span" asked."""
    cols = ("s.trace_id, s.span_id, s.parent_span_id, s.name, s.scope_name, s.service_name, "
            "s.start_time_unix_nano, s.end_time_unix_nano, s.status_code, s.status_message, s.run_id, s.node_type, "
            "s.operation_name, s.agent_name, s.session_id, s.parent_run_id, s.run_status, s.request_model, "
            "s.response_model, s.tool_name, s.input_tokens, s.output_tokens, s.chain_id")
    # two scans, so that the attributes column is read for other instrumentations' spans only
    return f"""
WITH src AS NOT MATERIALIZED (SELECT * FROM {src}),
a AS (
  SELECT {cols}, CAST(NULL AS VARCHAR) AS atext, CAST(NULL AS JSON[]) AS y
  FROM src s WHERE s.run_id IS NOT NULL OR s.node_type IS NOT NULL
  UNION ALL
  SELECT {cols}, CAST(s.attributes AS VARCHAR), json_extract(s.attributes, {json_paths(_ROLE_KEYS)})
  FROM src s WHERE s.run_id IS NULL AND s.node_type IS NULL
), ft AS (
  SELECT DISTINCT a.trace_id, a.span_id FROM a SEMI JOIN (SELECT DISTINCT trace_id FROM a WHERE atext IS NOT NULL) f
    ON f.trace_id = a.trace_id
), b AS (
  SELECT a.*, {_y(1)} AS oi_kind, {_y(2)} AS tl_kind, {_y(3)} AS llm_request_type,
    a.atext IS NOT NULL AND (a.parent_span_id IS NULL OR a.parent_span_id = '' OR p.span_id IS NULL) AS is_root
  FROM a LEFT JOIN ft p ON p.trace_id = a.trace_id AND p.span_id = a.parent_span_id
)
SELECT trace_id, span_id, parent_span_id, name, scope_name, service_name, start_time_unix_nano,
  end_time_unix_nano, status_code, status_message, run_id, node_type, operation_name, run_status, chain_id,
  parent_run_id, is_root,
  CASE
    WHEN node_type IN ('run', 'model', 'tool') THEN node_type
    WHEN operation_name IN ({RUN_OPS_SQL}) THEN 'run'
    WHEN operation_name IN ({MODEL_OPS_SQL}) THEN 'model'
    WHEN operation_name = '{sc.OP_EXECUTE_TOOL}' THEN 'tool'
    WHEN atext IS NULL THEN 'other'
    WHEN {_OI} IN ({_quoted(sc.OI_RUN_KINDS)}) THEN 'run'
    WHEN {_OI} IN ({_quoted(sc.OI_ROOT_RUN_KINDS)}) AND is_root THEN 'run'
    WHEN {_OI} = 'LLM' THEN 'model'
    WHEN {_OI} = 'TOOL' THEN 'tool'
    WHEN {_TL} IN ({_quoted(sc.TRACELOOP_RUN_KINDS)}) THEN 'run'
    WHEN {_TL} IN ({_quoted(sc.TRACELOOP_ROOT_RUN_KINDS)}) AND is_root THEN 'run'
    WHEN {_TL} = 'tool' THEN 'tool'
    WHEN llm_request_type IN ('chat', 'completion') THEN 'model'
    WHEN {_INDEXED} THEN 'model'
    WHEN {_y(4)} IS NOT NULL AND contains(atext, '"{sc.OI_LLM_INPUT_MESSAGES}.0.') THEN 'model'
    ELSE 'other' END AS role,
  CASE
    WHEN run_id IS NOT NULL OR node_type IS NOT NULL THEN '{sc.SOURCE_AGENTTAPE}'
    {_SCOPE_SOURCE}
    WHEN oi_kind IS NOT NULL THEN '{sc.SOURCE_OPENINFERENCE}'
    WHEN tl_kind IS NOT NULL OR llm_request_type IS NOT NULL OR {_INDEXED}
      OR contains(atext, '"traceloop.') OR contains(atext, '"{sc.OPENLLMETRY_API_BASE}"')
      OR (starts_with({_SCOPE}, 'opentelemetry.instrumentation.') AND ends_with({_SCOPE}, '{sc.OPENLLMETRY_SCOPE_SUFFIX}'))
      THEN '{sc.SOURCE_OPENLLMETRY}'
    ELSE '{sc.SOURCE_GENAI}' END AS source,
  coalesce(session_id, {_yi(5)}, {_yi(6)}, {_yi(7)}, {_yi(16)}) AS session_id,
  coalesce(agent_name, {_y(8)},
    CASE WHEN {_TL} IN ('agent', 'workflow') THEN coalesce({_y(9)}, {_y(10)}) END) AS agent_name,
  coalesce(response_model, {_y(18)}, {_y(4)}, request_model, {_y(17)}) AS model,
  coalesce(tool_name, {_y(15)}, CASE WHEN {_TL} = 'tool' THEN {_y(9)} END) AS tool_name,
  coalesce(input_tokens, TRY_CAST({_yi(13)} AS BIGINT), TRY_CAST({_yi(11)} AS BIGINT)) AS input_tokens,
  coalesce(output_tokens, TRY_CAST({_yi(14)} AS BIGINT), TRY_CAST({_yi(12)} AS BIGINT)) AS output_tokens,
  {_y(20)} AS handoff_to, {_y(21)} AS handed_by
FROM b
"""


SPAN_ROLES = "CREATE OR REPLACE VIEW span_roles AS " + roles_select("spans")

# Node columns aggregated per run from the spans it owns (``o``: role, model, tool_name, tokens, status).
_NODE_AGGS = """
    count(*) FILTER (WHERE o.role = 'model') AS model_nodes,
    count(*) FILTER (WHERE o.role = 'tool') AS tool_nodes,
    count(*) FILTER (WHERE o.role = 'tool' AND o.status_code = 2) AS tool_errors,
    count(*) FILTER (WHERE o.role IN ('model', 'tool') AND o.status_code = 2) AS errors,
    CAST(sum(o.input_tokens) FILTER (WHERE o.role = 'model') AS BIGINT) AS input_tokens,
    CAST(sum(o.output_tokens) FILTER (WHERE o.role = 'model') AS BIGINT) AS output_tokens,
    list(DISTINCT o.model) FILTER (WHERE o.role = 'model' AND o.model IS NOT NULL) AS models_all,
    list(DISTINCT o.tool_name) FILTER (WHERE o.role = 'tool' AND o.tool_name IS NOT NULL) AS tools_all,
    arg_min(o.chain_id, o.start_time_unix_nano) FILTER (WHERE o.chain_id IS NOT NULL) AS tape_id,
    arg_min(o.session_id, o.start_time_unix_nano) FILTER (WHERE o.session_id IS NOT NULL) AS any_session,
    arg_min(o.agent_name, o.start_time_unix_nano) FILTER (WHERE o.agent_name IS NOT NULL) AS any_agent"""


def _first_seen(col: str) -> str:
    """A list without repeats, sorted (lambdas differ between DuckDB versions, so no first-seen order)."""
    return f"list_sort(list_distinct(coalesce({col}, [])))"


def runs_select(src: str = "spans", *, ours: bool = True, theirs: bool = True) -> str:
    """The runs of the spans in ``src`` (``spans``, or the spans of some traces: every span of a trace
    must be there). Parents in other traces are looked up in the whole store. ``ours=False`` leaves out
    agenttape runs; ``theirs=False`` other instrumentations' runs and bare traces (a much smaller query,
    exact for traces whose every span has a run id, and for the agenttape runs of any trace)."""
    ours_only = "" if ours else " AND false"
    text = RUNS_SQL.replace("@OURS_ONLY@", ours_only)
    if not theirs:
        head, rest = text.split("ft AS MATERIALIZED (", 1)
        rest = "base AS (" + rest.split("base AS (", 1)[1]
        text = (head + rest).replace(_THEIRS_BASE, "").replace("@SR@", ours_roles_select(src))
    return text.replace("@SR@", roles_select(src))


_THEIRS_BASE = """
  UNION ALL BY NAME SELECT * FROM theirs
  UNION ALL BY NAME SELECT * FROM traces"""

RUNS_SQL = f"""
WITH RECURSIVE
sr AS MATERIALIZED (@SR@),
ours AS (
  SELECT o.run_id AS key, o.trace_id,
    count(*) FILTER (WHERE o.role = 'run') AS run_spans,
    arg_min(o.span_id, o.start_time_unix_nano) FILTER (WHERE o.role = 'run') AS run_span,
    arg_min(o.span_id, o.start_time_unix_nano) AS first_span,
    coalesce(min(o.start_time_unix_nano) FILTER (WHERE o.role = 'run'), min(o.start_time_unix_nano)) AS start_ns,
    coalesce(max(o.end_time_unix_nano) FILTER (WHERE o.role = 'run'), max(o.end_time_unix_nano)) AS end_ns,
    arg_max(o.run_status, o.start_time_unix_nano) FILTER (WHERE o.role = 'run' AND o.run_status IS NOT NULL)
      AS run_status,
    coalesce(bool_or(o.status_code = 2) FILTER (WHERE o.role = 'run'), false) AS run_failed,
    arg_max(o.status_message, o.start_time_unix_nano)
      FILTER (WHERE o.role = 'run' AND o.status_message IS NOT NULL) AS status_message,
    arg_min(o.agent_name, o.start_time_unix_nano) FILTER (WHERE o.role = 'run' AND o.agent_name IS NOT NULL)
      AS run_agent,
    arg_min(o.session_id, o.start_time_unix_nano) FILTER (WHERE o.role = 'run') AS run_session,
    coalesce(arg_min(o.parent_run_id, o.start_time_unix_nano) FILTER (WHERE o.role = 'run'),
             arg_min(o.parent_run_id, o.start_time_unix_nano) FILTER (WHERE o.parent_run_id IS NOT NULL))
      AS parent_run_id,
    coalesce(arg_min(o.service_name, o.start_time_unix_nano) FILTER (WHERE o.role = 'run'),
             arg_min(o.service_name, o.start_time_unix_nano)) AS service_name,
    'agenttape' AS source,{_NODE_AGGS}
  FROM sr o WHERE o.run_id IS NOT NULL@OURS_ONLY@
  GROUP BY o.run_id, o.trace_id
),
ft AS MATERIALIZED (
  SELECT sr.* FROM sr SEMI JOIN (SELECT DISTINCT trace_id FROM sr WHERE role = 'run' AND run_id IS NULL) t
    ON t.trace_id = sr.trace_id
),
down(trace_id, span_id, owner, role) AS (
  SELECT trace_id, span_id, coalesce(run_id, span_id), role FROM ft WHERE role = 'run'
  UNION
  SELECT c.trace_id, c.span_id, d.owner, c.role
  FROM down d JOIN ft c ON c.trace_id = d.trace_id AND c.parent_span_id = d.span_id
  WHERE c.role <> 'run' AND c.run_id IS NULL
),
owners AS (SELECT trace_id, span_id, any_value(owner) AS owner FROM down GROUP BY trace_id, span_id),
-- a handoff makes the agent handed to a child run of the one that handed over (as tape/rebuild.py)
hand AS (
  SELECT h.trace_id, h.start_time_unix_nano AS at, h.handoff_to AS agent, w.owner AS by_key
  FROM ft h JOIN owners w ON w.trace_id = h.trace_id AND w.span_id = h.span_id
  WHERE h.handoff_to IS NOT NULL AND h.role <> 'run'
),
agents AS (SELECT trace_id, span_id, agent_name, start_time_unix_nano AS at FROM ft
  WHERE role = 'run' AND run_id IS NULL AND agent_name IS NOT NULL),
fr AS (
  SELECT f.*, coalesce(
      CASE WHEN f.handed_by IS DISTINCT FROM f.agent_name AND g.span_id <> f.span_id THEN g.span_id END,
      CASE WHEN f.handed_by IS NULL AND h.by_key <> f.span_id THEN h.by_key END,
      CASE WHEN p.role = 'run' THEN coalesce(p.run_id, p.span_id) END, w.owner, p.run_id) AS parent_key
  FROM ft f
  LEFT JOIN ft p ON p.trace_id = f.trace_id AND p.span_id = f.parent_span_id
  LEFT JOIN owners w ON w.trace_id = f.trace_id AND w.span_id = f.parent_span_id
  ASOF LEFT JOIN agents g ON g.trace_id = f.trace_id AND g.agent_name = f.handed_by
    AND f.start_time_unix_nano >= g.at
  ASOF LEFT JOIN hand h ON h.trace_id = f.trace_id AND h.agent = f.agent_name AND f.start_time_unix_nano >= h.at
  WHERE f.role = 'run' AND f.run_id IS NULL
),
theirs AS (
  SELECT f.span_id AS key, f.trace_id, 1 AS run_spans, f.span_id AS run_span, f.span_id AS first_span,
    f.start_time_unix_nano AS start_ns, f.end_time_unix_nano AS end_ns, f.run_status,
    f.status_code = 2 AS run_failed, f.status_message, coalesce(f.agent_name, f.name) AS run_agent,
    f.session_id AS run_session, f.parent_run_id, f.service_name, f.source, f.parent_key,{_NODE_AGGS}
  FROM fr f
  LEFT JOIN owners w ON w.trace_id = f.trace_id AND w.owner = f.span_id
  LEFT JOIN ft o ON o.trace_id = w.trace_id AND o.span_id = w.span_id AND o.span_id <> f.span_id
  GROUP BY ALL
),
bare AS (
  SELECT trace_id FROM sr GROUP BY trace_id
  HAVING count(*) FILTER (WHERE role = 'run') = 0 AND count(run_id) = 0
     AND count(*) FILTER (WHERE role IN ('model', 'tool')) > 0
),
traces AS (
  SELECT o.trace_id AS key, o.trace_id, 0 AS run_spans, CAST(NULL AS VARCHAR) AS run_span,
    arg_min(o.span_id, struct_pack(r := NOT o.is_root, t := o.start_time_unix_nano)) AS first_span,
    min(o.start_time_unix_nano) AS start_ns, max(o.end_time_unix_nano) AS end_ns,
    CAST(NULL AS VARCHAR) AS run_status,
    coalesce(arg_min(o.status_code = 2, o.start_time_unix_nano) FILTER (WHERE o.is_root), false) AS run_failed,
    arg_min(o.status_message, o.start_time_unix_nano) FILTER (WHERE o.is_root) AS status_message,
    CAST(NULL AS VARCHAR) AS run_agent, CAST(NULL AS VARCHAR) AS run_session,
    CAST(NULL AS VARCHAR) AS parent_run_id,
    arg_min(coalesce(o.service_name, o.name), struct_pack(r := NOT o.is_root, t := o.start_time_unix_nano))
      AS service_name,
    arg_min(o.source, o.start_time_unix_nano) FILTER (WHERE o.role IN ('model', 'tool')) AS source,{_NODE_AGGS}
  FROM sr o SEMI JOIN bare b ON b.trace_id = o.trace_id
  GROUP BY o.trace_id
),
base AS (
  SELECT *, CAST(NULL AS VARCHAR) AS parent_key FROM ours
  UNION ALL BY NAME SELECT * FROM theirs
  UNION ALL BY NAME SELECT * FROM traces
),
links AS MATERIALIZED (
  SELECT l.trace_id, l.span_id, l.link_index, l.linked_trace_id, l.linked_span_id
  FROM span_links l SEMI JOIN (SELECT run_span, trace_id FROM base) b ON b.trace_id = l.trace_id AND b.run_span = l.span_id
  WHERE (l.attributes->'$."{sc.PREVIOUS_RUN_ID}"') IS NULL  -- a session's next turn links the run it follows
),
linked AS (
  SELECT l.trace_id, l.span_id,
    arg_min(coalesce(t.run_id, t.span_id) || '@' || l.linked_trace_id, l.link_index) AS link_ref
  FROM links l JOIN spans t ON t.trace_id = l.linked_trace_id AND t.span_id = l.linked_span_id
  WHERE t.run_id IS NOT NULL OR t.operation_name IN ({RUN_OPS_SQL})
  GROUP BY l.trace_id, l.span_id
),
keys AS (
  SELECT run_id AS key, trace_id, min(start_time_unix_nano) AS start_ns FROM spans
  WHERE run_id IN (SELECT parent_run_id FROM base WHERE parent_run_id IS NOT NULL)
  GROUP BY run_id, trace_id
),
parents AS (
  SELECT b.key, b.trace_id,
    arg_max(k.trace_id, struct_pack(same := k.trace_id = b.trace_id, before := k.start_ns <= b.start_ns,
                                    t := k.start_ns)) AS parent_trace
  FROM base b JOIN keys k ON k.key = b.parent_run_id
  WHERE b.parent_run_id IS NOT NULL
  GROUP BY b.key, b.trace_id
)
SELECT
  b.key AS run_id,
  b.trace_id,
  coalesce(b.run_span, b.first_span) AS span_id,
  coalesce(b.run_agent, b.any_agent, CASE WHEN b.run_spans = 0 AND b.source <> 'agenttape' THEN b.service_name END)
    AS agent,
  coalesce(b.run_session, b.any_session) AS session_id,
  coalesce(b.parent_run_id, b.parent_key, split_part(lk.link_ref, '@', 1)) AS parent_run_id,
  coalesce(b.run_status,
           CASE WHEN b.run_spans = 0 AND b.source = 'agenttape' THEN 'incomplete'
                WHEN b.run_failed THEN '{sc.STATUS_ERROR}' ELSE '{sc.STATUS_COMPLETED}' END) AS status,
  b.start_ns AS start_time_unix_nano,
  b.end_ns AS end_time_unix_nano,
  make_timestamp(b.start_ns // 1000) AS start_time,
  greatest(b.end_ns - b.start_ns, 0) / 1e6 AS duration_ms,
  b.model_nodes,
  b.tool_nodes,
  b.tool_errors,
  b.input_tokens,
  b.output_tokens,
  b.service_name,
  b.status_message,
  b.key || '@' || b.trace_id AS ref,
  b.source,
  CASE WHEN b.parent_key IS NOT NULL THEN b.parent_key || '@' || b.trace_id
       WHEN b.parent_run_id IS NOT NULL THEN b.parent_run_id || '@' || coalesce(p.parent_trace, b.trace_id)
       ELSE lk.link_ref END AS parent_ref,
  b.errors,
  b.tape_id,
  {_first_seen("b.models_all")} AS models,
  {_first_seen("b.tools_all")} AS tools,
  b.run_spans = 0 AND b.source = 'agenttape' AS incomplete
FROM base b
LEFT JOIN parents p ON p.key = b.key AND p.trace_id = b.trace_id
LEFT JOIN linked lk ON lk.trace_id = b.trace_id AND lk.span_id = b.run_span AND b.parent_run_id IS NULL
  AND b.parent_key IS NULL
"""


RUNS = "CREATE OR REPLACE VIEW runs AS " + runs_select("spans")
