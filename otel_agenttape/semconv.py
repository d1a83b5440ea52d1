"""Every attribute, event and span name the project reads or writes, in one place.

The GenAI names are pinned here rather than imported from ``opentelemetry-semantic-conventions``:
those constants are marked as moved and lag the GenAI repository (no ``cache_write``, for one).
"""

from __future__ import annotations

# --- GenAI semantic conventions (gen_ai.*) --------------------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_SYSTEM = "gen_ai.system"  # deprecated alias of provider.name, still emitted by older code
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_AGENT_ID = "gen_ai.agent.id"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
GEN_AI_TOOL_DEFINITIONS = "gen_ai.tool.definitions"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS = "gen_ai.usage.cache_write.input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"  # older name
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS = "gen_ai.usage.reasoning.output_tokens"
GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"  # deprecated (OpenLLMetry legacy)
GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"  # deprecated
ERROR_TYPE = "error.type"

# gen_ai.operation.name values we emit or classify
OP_INVOKE_AGENT = "invoke_agent"
OP_CHAT = "chat"
OP_EXECUTE_TOOL = "execute_tool"
MODEL_OPERATIONS = frozenset({"chat", "generate_content", "text_completion"})

# GenAI log-based event carrying inference content
EVENT_INFERENCE_DETAILS = "gen_ai.client.inference.operation.details"

# --- otel-agenttape (agenttape.*) -----------------------------------------------------------------
# Instrumentation scope names: the capture tracer's marks the spans we record ourselves (sealing and the
# export queue look for it); the checkpoint spans and the receiver's own metrics have theirs.
SCOPE_NAME = "otel_agenttape"
SCOPE_INTEGRITY = SCOPE_NAME + ".integrity"
SCOPE_RECEIVER = SCOPE_NAME + ".receiver"
RUN_ID = "agenttape.run.id"
SESSION_ID = "agenttape.session.id"
PARENT_RUN_ID = "agenttape.parent_run.id"
PREVIOUS_RUN_ID = "agenttape.previous_run.id"  # the run a later turn of the same session continues
RUN_STATUS = "agenttape.run.status"
TURN_ID = "agenttape.turn.id"
STEP = "agenttape.step"
NODE_TYPE = "agenttape.node.type"  # "model" | "tool"
NODE_ID = "agenttape.node.id"  # "model@<run>|<turn>|<step>" / "tool@<run>|<turn>|<step>|<call>"
RECORD_ID = "agenttape.record.id"
MODEL_RAW_OUTPUT = "agenttape.model.raw_output"
MODEL_OUTPUT_TEXT = "agenttape.model.output_text"
MODEL_REASONING = "agenttape.model.reasoning"
MODEL_RETRY_COUNT = "agenttape.model.retry_count"
TOOL_ERROR = "agenttape.tool.error"

# Truncation evidence: for a payload attribute K that had to be cut, these record the original.
PAYLOAD_LENGTH_SUFFIX = ".agenttape.length"  # K + suffix: original length in UTF-8 bytes
PAYLOAD_SHA256_SUFFIX = ".agenttape.sha256"  # K + suffix: sha256 hex of the original UTF-8 bytes
TRUNCATED = "agenttape.truncated"  # string[]: keys of attributes that were cut

# Span events on node spans
EVENT_TEXT = "agenttape.text"
EVENT_REASONING = "agenttape.reasoning"
EVENT_RETRY = "agenttape.retry"
EVENT_METADATA = "agenttape.metadata"
EVENT_SEQ = "agenttape.seq"
EVENT_SEGMENT = "agenttape.segment"
EVENT_REASON = "agenttape.reason"

# Run terminal statuses
STATUS_COMPLETED = "completed"
STATUS_ERROR = "error"
STATUS_CANCELLED = "cancelled"
STATUS_TRUNCATED = "truncated"
RUN_STATUSES = (STATUS_COMPLETED, STATUS_ERROR, STATUS_CANCELLED, STATUS_TRUNCATED)

# Integrity chain (excluded from the canonical leaf: they are its output)
CHAIN_PREFIX = "agenttape.chain."
CHAIN_ID = "agenttape.chain.id"
CHAIN_SEQ = "agenttape.chain.seq"
CHAIN_PREV = "agenttape.chain.prev"
CHAIN_HASH = "agenttape.chain.hash"
CHAIN_EPOCH = "agenttape.chain.epoch"
# Leaf v2 (docs/integrity.md): JSON maps beside the content they commit to, left out of the leaf like
# the chain fields. SALTS: label -> 32 hex digits of the value's salt; ERASED: label -> the 64 hex
# digits of an erased value's commitment. A label is the attribute key on the span, or
# ``event:<i>:<key>`` for an attribute of the span's i-th event.
CHAIN_SALTS = "agenttape.chain.salts"
CHAIN_ERASED = "agenttape.chain.erased"
# The attributes whose values are content (prompts, answers, tool arguments and results, streamed
# text): sealed as salted commitments, so erasure can remove them and the chain still verifies.
CONTENT_KEYS = frozenset({
    GEN_AI_INPUT_MESSAGES, GEN_AI_OUTPUT_MESSAGES, GEN_AI_SYSTEM_INSTRUCTIONS,
    GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_RESULT,
    MODEL_RAW_OUTPUT, MODEL_OUTPUT_TEXT, MODEL_REASONING,
    EVENT_SEGMENT,
    "gen_ai.prompt", "gen_ai.completion", "input.value", "output.value",
    "llm.input_messages", "llm.output_messages",
})
# ... and the sha256 of a cut payload's original (an unsalted hash of short content is guessable)
CONTENT_KEYS = CONTENT_KEYS | frozenset(k + PAYLOAD_SHA256_SUFFIX for k in CONTENT_KEYS)

# Erasure records (docs/integrity.md, "Erasure"): a span named EVENT_ERASURE, scope SCOPE_INTEGRITY, in a
# trace of its own, holding the record (JSON, never content), the signed note that seals it and the
# verifier key of its signer
EVENT_ERASURE = "agenttape.erasure"
ERASURE_ID = "agenttape.erasure.id"
ERASURE_RECORD = "agenttape.erasure.record"
ERASURE_NOTE = "agenttape.erasure.note"
ERASURE_KEY = "agenttape.erasure.key"

# Checkpoints (exported as spans named agenttape.checkpoint)
EVENT_CHECKPOINT = "agenttape.checkpoint"
CHECKPOINT_NOTE = "agenttape.checkpoint.note"

# --- Foreign conventions read on ingest ----------------------------------------------------------
OPENINFERENCE_SPAN_KIND = "openinference.span.kind"
OI_INPUT_VALUE = "input.value"
OI_OUTPUT_VALUE = "output.value"
OI_LLM_MODEL_NAME = "llm.model_name"
OI_LLM_INPUT_MESSAGES = "llm.input_messages"
OI_LLM_OUTPUT_MESSAGES = "llm.output_messages"
OI_TOKEN_PROMPT = "llm.token_count.prompt"
OI_TOKEN_COMPLETION = "llm.token_count.completion"
OI_TOOL_NAME = "tool.name"
TRACELOOP_ENTITY_NAME = "traceloop.entity.name"
TRACELOOP_ENTITY_INPUT = "traceloop.entity.input"
TRACELOOP_ENTITY_OUTPUT = "traceloop.entity.output"
TRACELOOP_SPAN_KIND = "traceloop.span.kind"
LEGACY_PROMPT_PREFIX = "gen_ai.prompt."
LEGACY_COMPLETION_PREFIX = "gen_ai.completion."

# Integrity: keys whose live value OTLP cannot carry and that the sealer replaced before hashing
INTEGRITY_COERCED = "agenttape.integrity.coerced"
# Checkpoint span (named EVENT_CHECKPOINT) attributes: the note is self-describing, these help queries
CHECKPOINT_ORIGIN = "agenttape.checkpoint.origin"
CHECKPOINT_SIZE = "agenttape.checkpoint.size"
CHECKPOINT_KEY = "agenttape.checkpoint.key"  # verifier key (vkey) of the signer

# Resume: node spans recorded through a resumable client carry their resume key, so an index can be
# rebuilt from the tape store (or OTLP files) with the very keys the live run used.
RESUME_KEY = "agenttape.resume.key"  # "<tape>|<kind>|<sha256 of canonical request>|<occurrence>"
RESUME_POSITION = "agenttape.resume.position"  # ordinal of the call among calls of its kind in the run
RESUME_RESULT_ENCODING = "agenttape.resume.result_encoding"  # "text" (verbatim string) | "json"
RESUME_DELTAS = "agenttape.resume.deltas"  # JSON list of a streamed call's recorded deltas (SDK chunks)

# --- Foreign conventions read when rebuilding tapes (tape/foreign.py) ----------------------------
OI_INPUT_MIME_TYPE = "input.mime_type"
OI_OUTPUT_MIME_TYPE = "output.mime_type"
OI_SESSION_ID = "session.id"
OI_AGENT_NAME = "agent.name"
OI_GRAPH_NODE_PARENT_ID = "graph.node.parent_id"  # OpenInference: the agent that handed over to this one
OI_TOOL_ID = "tool.id"
OI_LLM_TOOLS = "llm.tools"  # llm.tools.N.tool.json_schema
OI_LLM_PROVIDER = "llm.provider"
OI_LLM_SYSTEM = "llm.system"
OI_LLM_REQUEST_MODEL_NAME = "llm.request.model_name"
OI_LLM_RESPONSE_MODEL_NAME = "llm.response.model_name"
OI_LLM_FINISH_REASON = "llm.finish_reason"
OI_TOKEN_CACHE_READ = "llm.token_count.prompt_details.cache_read"
OI_TOKEN_CACHE_WRITE = "llm.token_count.prompt_details.cache_write"
OI_TOKEN_REASONING = "llm.token_count.completion_details.reasoning"
LLM_REQUEST_TYPE = "llm.request.type"  # OpenLLMetry legacy: chat | completion | ...
LLM_REQUEST_FUNCTIONS_PREFIX = "llm.request.functions."  # OpenLLMetry legacy tool definitions
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS_LEGACY = "gen_ai.usage.cache_read_input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS_LEGACY = "gen_ai.usage.cache_creation_input_tokens"
# Deprecated per-message GenAI log events (still emitted by opentelemetry-instrumentation-openai-v2)
EVENT_SYSTEM_MESSAGE = "gen_ai.system.message"
EVENT_USER_MESSAGE = "gen_ai.user.message"
EVENT_ASSISTANT_MESSAGE = "gen_ai.assistant.message"
EVENT_TOOL_MESSAGE = "gen_ai.tool.message"
EVENT_CHOICE = "gen_ai.choice"
LOG_EVENT_NAME = "event.name"  # event name as a log attribute (older Logs API emitters)

# --- what makes a run in each source (read by store/views.py and tape/foreign.py alike) ------------
OP_CREATE_AGENT = "create_agent"
RUN_OPERATIONS = frozenset({OP_INVOKE_AGENT, OP_CREATE_AGENT})
TRACELOOP_WORKFLOW_NAME = "traceloop.workflow.name"
TRACELOOP_SESSION_ID = "traceloop.association.properties.session_id"
TRACELOOP_CONVERSATION_ID = "traceloop.association.properties.conversation_id"
# OpenInference span kinds: always a run / a run when it is the root of its trace
OI_RUN_KINDS = frozenset({"AGENT"})
OI_ROOT_RUN_KINDS = frozenset({"CHAIN"})
TRACELOOP_RUN_KINDS = frozenset({"agent"})
TRACELOOP_ROOT_RUN_KINDS = frozenset({"workflow"})
# run sources (the `source` column of the runs view)
SOURCE_AGENTTAPE = "agenttape"
SOURCE_GENAI = "otel-genai"
SOURCE_OPENINFERENCE = "openinference"
SOURCE_OPENLLMETRY = "openllmetry"
SOURCE_OPENAI_AGENTS = "openai-agents"
SOURCE_LANGGRAPH = "langgraph"
SOURCE_LANGCHAIN = "langchain"
# OpenLLMetry's own instrumentations now write GenAI attributes; they are told apart by their scope
# (``opentelemetry.instrumentation.openai.v1``) and the attribute OpenLLMetry alone adds
OPENLLMETRY_SCOPE_SUFFIX = ".v1"
OPENLLMETRY_API_BASE = "gen_ai.openai.api_base"

# --- framework adapters (otel_agenttape.integrations) --------------------------------------------
FRAMEWORK = "agenttape.framework"  # on run spans: "openai-agents", "langgraph", "langchain"
FRAMEWORK_AGENT_TOOLS = "agenttape.agent.tools"  # the tool names an agent had
FRAMEWORK_AGENT_HANDOFFS = "agenttape.agent.handoffs"  # the agents it could hand off to
FRAMEWORK_HANDOFF_TO = "agenttape.handoff.to"  # on a handoff's tool span: the agent handed to
GEN_AI_HANDOFF_TO = "gen_ai.handoff.to_agent"
FRAMEWORK_MCP_SERVER = "agenttape.mcp.server"  # on a tool span: the MCP server that ran it
GRAPH_NODE = "agenttape.graph.node"  # a LangGraph node span: the node's name
GRAPH_STEP = "agenttape.graph.step"  # and its superstep
RESUME_REPLAYED = "agenttape.resume.replayed"  # on a tool span: its result came from the resume journal

# Scores (OTel GenAI evaluation events). A score is a ``gen_ai.evaluation.result`` event: on the span it
# scores while that span is open, else on a small sealed ``agenttape.score`` span in the giver's own tape
# that names what it scores (``agenttape.score.of``, the scored span's trace and span ids).
EVENT_EVALUATION_RESULT = "gen_ai.evaluation.result"
GEN_AI_EVALUATION_NAME = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_EXPLANATION = "gen_ai.evaluation.explanation"
SCORE_SPAN_NAME = "agenttape.score"
SCORE_OF = "agenttape.score.of"  # the scored run's ref (RUN_ID@TRACE_ID, or a bare run id)
SCORE_TRACE_ID = "agenttape.score.trace_id"  # the scored span's trace id (hex), when known
SCORE_SPAN_ID = "agenttape.score.span_id"  # the scored span's span id (hex), when known
SCORE_SOURCE = "agenttape.score.source"  # who gave it: human, llm, code, or an evaluator's name
SCORE_VERSION = "agenttape.score.version"  # the evaluator's version, when one gave it
SCORE_ID = "agenttape.score.id"  # one score's id: its span event and its log-record copy share it
SCORE_SOURCES = frozenset({"human", "llm", "code"})
