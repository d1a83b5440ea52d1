"""Training data from tapes: one OpenAI chat fine-tuning example per completed run.

Each line is ``{"messages": [...], "tools": [...]}`` in the OpenAI chat format: system, user and
assistant messages, assistant ``tool_calls`` with their ``tool`` results, and the final answer.
Runs that did not complete, lack an input or an output, or hold cut payloads are skipped and
counted by reason, so a dataset never silently includes a partial run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from .. import semconv as sc
from ..codec.jsontext import dump_json
from ..codec.messages_read import Message, openai_tools
from .load import Reader
from .model import Run
from .rebuild import iter_runs


@dataclass
class DatasetResult:
    written: int = 0
    skipped: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        parts = [f"wrote {self.written} example(s)"]
        if self.skipped:
            parts.append(
                "skipped " + ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))
            )
        return "; ".join(parts)


def skip_reason(run: Run) -> str | None:
    if run.erased:  # content erased (agenttape erase): what is left is not the conversation
        return "erased"
    if run.status != sc.STATUS_COMPLETED:
        return f"status={run.status}"
    if not any(m.role in ("user", "system") and (m.content() or m.parts) for m in run.input):
        return "no_input"
    if not run.output and not any(n.output_text or n.requested_tool_calls for n in run.model_nodes):
        return "no_output"
    if run.truncated:
        return "truncated"
    return None


def _conversation(run: Run) -> list[Message]:
    """The last model call's prompt plus its answer: the whole conversation as the model saw it."""
    models = [n for n in run.model_nodes if n.input_messages or n.system_instructions]
    if models:
        last = models[-1]
        answer = list(last.output_messages) or [
            Message("assistant", [{"type": "text", "content": last.output_text}])
        ]
        convo = last.prompt + answer
        if run.output_messages and not answer[-1].text and not answer[-1].tool_calls:
            convo = last.prompt + run.output_messages
        return convo
    return list(run.input) + (
        list(run.output_messages) or [Message("assistant", [{"type": "text", "content": run.output}])]
    )


def example(run: Run) -> dict[str, Any]:
    """One fine-tuning example for a run (no filtering: see ``skip_reason``)."""
    messages = [o for m in _conversation(run) for o in m.to_openai()]
    out: dict[str, Any] = {"messages": messages}
    if run.tool_definitions:
        out["tools"] = openai_tools(run.tool_definitions)
    return out


def select_runs(reader: Reader, *, agent: str | None = None, model: str | None = None,
                since_ns: int | None = None, score: Sequence[str] | None = None,
                label: Sequence[str] | None = None, skipped: Counter | None = None) -> Iterable[Run]:
    """The runs a dataset is made of; with ``score``/``label`` filters (``NAME>=V``, ``NAME=LABEL``) only
    the runs whose latest scores pass, the others counted in ``skipped`` by reason before any is rebuilt."""
    from .read.filters import Filters
    from .read.listing import all_matching
    from .read.scores import parsed, score_summaries
    from .read.scores import skip_reason as score_skip

    picked = all_matching(reader, Filters(agent=agent, model=model, since=since_ns), oldest_first=True)
    wanted = parsed(score, label)
    if wanted:
        score_summaries(reader, picked)
        kept = []
        for r in picked:
            reason = score_skip(wanted, r.scores)
            if reason is None:
                kept.append(r)
            elif skipped is not None:
                skipped[reason] += 1
        picked = kept
    for run in iter_runs(reader, [r.ref for r in picked]):
        if model and model not in run.models:
            continue
        if agent and run.agent != agent:
            continue
        yield run


def export_dataset(reader: Reader, out: IO[str], *, agent: str | None = None, model: str | None = None,
                   since_ns: int | None = None, score: Sequence[str] | None = None,
                   label: Sequence[str] | None = None) -> DatasetResult:
    """Write one JSON line per usable run; return what was written and what was skipped, by reason."""
    result = DatasetResult()
    for run in select_runs(reader, agent=agent, model=model, since_ns=since_ns, score=score, label=label,
                           skipped=result.skipped):
        reason = skip_reason(run)
        if reason is not None:
            result.skipped[reason] += 1
            continue
        out.write(dump_json(example(run)) + "\n")
        result.written += 1
    return result
