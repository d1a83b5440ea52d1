"""Resume a crashed agent run without paying for completed model calls or repeating side effects.

Pure: no DuckDB and no servers. ``tape/resume_index.py`` rebuilds an index from the store.

    index = ResumeIndex("run-42", journal="agent.resume.sqlite")   # same run id when resuming
    model = ResumableModelClient(client, index)        # or adapters.resumable_openai(OpenAI(), index)
    tools = ResumableToolExecutor({"pay": pay}, index, policies={"pay": "reexecute_with_key"})
    stamp = Recorded(index).now()                      # recorded time: the resumed prompt matches
"""

from .entry import COMMITTED, FAILED, INTENT, Entry
from .errors import (
    DivergenceError,
    InDoubtError,
    InDoubtReport,
    RecordedToolError,
    ResumeError,
    UnrecordedCallError,
)
from .index import Call, ResumeIndex
from .journal import Journal
from .keys import MODEL, TOOL, VALUE, ResumeKey, canonical_json, request_hash, tool_request
from .model import AsyncResumableStream, ResumableModelClient, ResumableStream
from .nondeterminism import Recorded, now, random, time_ns, uuid4
from .spans import call_attributes, entry_from_span, node_feed
from .tools import InDoubtPolicy, ResumableToolExecutor

__all__ = [
    "COMMITTED", "FAILED", "INTENT", "MODEL", "TOOL", "VALUE",
    "AsyncResumableStream", "Call", "DivergenceError", "Entry", "InDoubtError", "InDoubtPolicy",
    "InDoubtReport", "Journal", "Recorded", "RecordedToolError", "ResumableModelClient",
    "ResumableStream", "ResumableToolExecutor", "ResumeError", "ResumeIndex", "ResumeKey",
    "UnrecordedCallError", "call_attributes", "canonical_json", "entry_from_span", "node_feed", "now",
    "random", "request_hash", "time_ns", "tool_request", "uuid4",
]
