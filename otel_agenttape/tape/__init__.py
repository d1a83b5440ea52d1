"""Tapes rebuilt from the store: runs, run trees, node replay, cassettes, datasets.

Everything here reads stored spans (ours or another instrumentation's) through a reader with
``query(sql, params) -> pyarrow.Table``; nothing needs the live objects that produced them.
"""

from __future__ import annotations

from ..codec.messages_read import Message
from ..resume.errors import RecordedToolError
from .cassette import Cassette, ReplayModelClient, ReplayStream, ReplayToolExecutor
from .dataset import DatasetResult, example, export_dataset
from .diff import RunDiff, diff_runs
from .model import Node, Run, RunTree, Step, ToolCall, Usage
from .rebuild import iter_runs, reconstruct, reconstruct_tree
from .refs import AmbiguousRunError, RunNotFound
from .replay import (
    ModelResult,
    TruncatedPayloadError,
    recorded_failure,
    replay_model_live,
    replay_model_mock,
    replay_tool_live,
    replay_tool_mock,
)

__all__ = [
    "AmbiguousRunError",
    "Cassette",
    "DatasetResult",
    "Message",
    "ModelResult",
    "Node",
    "RecordedToolError",
    "ReplayModelClient",
    "ReplayStream",
    "ReplayToolExecutor",
    "Run",
    "RunDiff",
    "RunNotFound",
    "RunTree",
    "Step",
    "ToolCall",
    "TruncatedPayloadError",
    "Usage",
    "diff_runs",
    "example",
    "export_dataset",
    "iter_runs",
    "reconstruct",
    "reconstruct_tree",
    "recorded_failure",
    "replay_model_live",
    "replay_model_mock",
    "replay_tool_live",
    "replay_tool_mock",
]
