"""``Tapes``: the read side of a tape store, whatever holds it, in the shape of the CLI's verbs.

``otel_agenttape.open(source)`` returns one. Each method answers what the matching ``agenttape``
command prints (``runs``, ``show``, ``replay``, ``diff``, ``dataset``, ``verify``, ``resume-index``,
``sql``); the CLI and the console call these methods, so they cannot disagree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import IO, Any

from ..dataset import DatasetResult, export_dataset
from ..diff import diff_runs
from ..load import Reader
from ..model import Run
from ..rebuild import reconstruct, reconstruct_tree, run_span_keys
from ..refs import RunNotFound, resolve
from .filters import Filters, as_ns
from .kept import store_version
from .listing import all_matching, by_refs, page, trace_runs
from .otlp import spans_otlp
from .steps import step_dicts
from .summary import Page, RunSummary


MEMO_ENTRIES = 256


class Tapes:
    """Runs, steps, trees, sessions, diffs and verification over one reader (DuckDB, lake, server, OTLP)."""

    def __init__(self, reader: Reader, *, owns: bool = True, closer: Any = None) -> None:
        self.reader = reader
        self._owns = owns
        self._closer = closer
        self._memo: dict[Any, Any] = {}
        self._memo_version: int | None = None

    @property
    def description(self) -> str:
        return str(getattr(self.reader, "description", "") or "")

    # --- lifetime ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the source (the file, the lake's connection, an in-memory store of OTLP files)."""
        if self._owns:
            close = getattr(self.reader, "close", None)
            if close is not None:
                close()
        if self._closer is not None:
            self._closer()
            self._closer = None

    def __enter__(self) -> Tapes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``, kept under ``key`` until the store changes (``kept.store_version``: a DuckDB
        store, which only ever gains spans); on a store without a version, computed every time. For
        answers that are not changed once returned (the console's JSON)."""
        version = store_version(self.reader)
        if version is None:
            return compute()
        if version != self._memo_version:
            self._memo, self._memo_version = {}, version
        if key in self._memo:
            return self._memo[key]
        value = compute()
        if store_version(self.reader) == version:  # not written to meanwhile
            if len(self._memo) >= MEMO_ENTRIES:
                self._memo.clear()
            self._memo[key] = value
        return value

    # --- runs -------------------------------------------------------------------------------------

    def runs(self, agent: str | None = None, status: str | None = None, source: str | None = None,
             session: str | None = None, service: str | None = None, model: str | None = None,
             tool: str | None = None, since: Any = None, until: Any = None, text: str | None = None,
             parent: str | None = None, limit: int = 50, cursor: str | None = None) -> Page:
        """Runs of every source, newest first; ``since``/``until``: ns, datetime or ISO text."""
        filters = Filters(agent=agent, status=status, source=source, session=session, service=service,
                          model=model, tool=tool, since=as_ns(since, "since"), until=as_ns(until, "until"),
                          text=text, parent=parent)
        return page(self.reader, filters, limit=limit, cursor=cursor)

    def locate(self, ref: str) -> str:
        """The ``RUN_ID@TRACE_ID`` a ref names (``RunNotFound``, ``AmbiguousRunError``)."""
        return self._locate(ref)[0]

    def _locate(self, ref: str) -> tuple[str, Any]:
        """The full ref and the time windows of its trace (which bound the scans that summarise it)."""
        target = resolve(self.reader, ref)
        if target.key is not None:
            return target.ref, target.windows
        rows = trace_runs(self.reader, target.trace_id, target.windows)
        tops = [r["ref"] for r in rows
                if not r["parent_ref"] or not r["parent_ref"].endswith("@" + target.trace_id)]
        if not tops:
            raise RunNotFound(ref)
        return tops[0], target.windows

    def run(self, ref: str) -> RunSummary:
        """One run's summary, as ``runs()`` lists it: computed from its trace's spans alone."""
        full, windows = self._locate(ref)
        found = by_refs(self.reader, [full], windows).get(full)
        if found is None:
            raise RunNotFound(ref)
        return found

    def session(self, session_id: str) -> list[RunSummary]:
        """The runs (turns) of one session, oldest first."""
        return all_matching(self.reader, Filters(session=session_id), oldest_first=True)

    # --- one run rebuilt ----------------------------------------------------------------------------

    def rebuild(self, ref: str) -> Run:
        """The rebuilt run (``tape.model.Run``): prompt, output, nodes, tool calls, steps."""
        return reconstruct(self.reader, ref)

    def steps(self, ref: str) -> list[dict[str, Any]]:
        """The run's ordered steps: input, text, reasoning, tool_call, tool_result, metadata, terminal."""
        return step_dicts(self.rebuild(ref))

    def replay(self, ref: str, tree: bool = False) -> dict[str, Any]:
        """What ``agenttape replay --json [--tree]`` prints."""
        if tree:
            return reconstruct_tree(self.reader, ref).root.to_json(children=True)
        return self.rebuild(ref).to_json(children=False)

    def tree(self, ref: str) -> dict[str, Any]:
        """The run's summary with ``children``: nested agents, handoffs, subgraphs, cross-trace child runs."""
        root = reconstruct_tree(self.reader, ref).root
        listed: list[Run] = []
        stack = [root]
        while stack:
            run = stack.pop()
            listed.append(run)
            stack.extend(run.children)
        known = by_refs(self.reader, [r.ref for r in listed])

        def node(run: Run, parent: str | None) -> dict[str, Any]:
            summary = known.get(run.ref) or RunSummary.from_run(run, parent)
            out = summary.to_dict()
            if parent is not None:
                out["parent_ref"] = parent
            out["children"] = [node(c, run.ref) for c in run.children]
            return out

        return node(root, None)

    def diff(self, ref_a: str, ref_b: str) -> dict[str, Any]:
        """What ``agenttape diff --json`` prints: the first node where the runs diverge, or none."""
        a, b = self.rebuild(ref_a), self.rebuild(ref_b)
        d = diff_runs(a, b)
        return {"run_a": a.run_id, "run_b": b.run_id, "ref_a": a.ref, "ref_b": b.ref, "diverged": d is not None,
                "first_divergence": d.to_json() if d else None, "nodes_a": len(a.nodes), "nodes_b": len(b.nodes)}

    def spans_otlp(self, ref: str) -> dict[str, Any]:
        """The run's own spans as an OTLP JSON ``ExportTraceServiceRequest`` (``agenttape ingest`` takes it)."""
        return spans_otlp(self.reader, run_span_keys(self.reader, ref))

    # --- experiments ---------------------------------------------------------------------------------

    def experiments(self) -> list[dict[str, Any]]:
        """One row per experiment recorded in the store (``agenttape experiment list``)."""
        from ..experiment import experiment_list

        return experiment_list(self)

    def experiment_runs(self, name: str) -> list[RunSummary]:
        """The runs of experiment ``name``, oldest first (``agenttape runs --experiment NAME``)."""
        from ..experiment import experiment_refs

        refs = list(experiment_refs(self, name))
        found = by_refs(self.reader, refs)
        return [found[r] for r in refs if r in found]

    def experiment_of(self, refs: Sequence[str]) -> dict[str, str]:
        """Which of ``refs`` are experiment runs: ref -> experiment name (``runs`` marks them)."""
        from ..experiment import experiment_refs

        mine = experiment_refs(self)
        return {r: mine[r]["name"] for r in refs if r in mine}

    def compare(self, name: str, *, baseline: str = "original", evals: Sequence[str] = ()) -> Any:
        """``agenttape experiment compare``: the experiment's answers against the originals or another experiment."""
        from ..experiment_compare import compare

        return compare(self, name, baseline=baseline, evals=evals)

    # --- many runs, tapes, SQL ------------------------------------------------------------------------

    def dataset(self, out: str | os.PathLike[str] | IO[str], *, agent: str | None = None,
                model: str | None = None, since: Any = None) -> DatasetResult:
        """Write completed runs as OpenAI chat fine-tuning JSONL (``agenttape dataset``)."""
        since_ns = as_ns(since, "since")
        if isinstance(out, (str, os.PathLike)):
            with open(out, "w", encoding="utf-8") as fh:
                return export_dataset(self.reader, fh, agent=agent, model=model, since_ns=since_ns)
        return export_dataset(self.reader, out, agent=agent, model=model, since_ns=since_ns)

    def verify(self, tape_id: str | None = None, *, keys: Sequence[Any] = (),
               checkpoint_files: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Per-tape verification results, as ``agenttape verify --json`` lists them under ``chains``."""
        from ..verification import verify_store

        reports = verify_store(self.reader, run=tape_id, verifiers=keys, checkpoint_files=checkpoint_files)
        return [r.to_json() for r in reports]

    def resume_index(self, ref: str, **kwargs: Any) -> Any:
        """The run's ``ResumeIndex``: a bare run id reads every trace of that run id (a resumed run goes on
        in a new trace), ``RUN_ID@TRACE_ID`` only that trace."""
        from ..refs import split_ref
        from ..resume_index import build_resume_index

        run_id, trace_id = split_ref(ref)
        return build_resume_index(self.reader, run_id, trace_id=trace_id, **kwargs)

    def write_resume_index(self, ref: str, out: str | os.PathLike[str]) -> Any:
        """Save the run's ``ResumeIndex`` as the JSON file ``ResumeIndex.load_json`` reads, and return it
        (``agenttape resume-index``). ``RunNotFound`` when no span has the run; ``ValueError`` when it has no
        model or tool node (nothing is written then)."""
        from ..refs import split_ref
        from ..resume_index import write_resume_index

        run_id, trace_id = split_ref(ref)
        try:
            return write_resume_index(self.reader, run_id, out, trace_id=trace_id)
        except ValueError:
            if not self.has_spans(ref):
                raise RunNotFound(ref) from None
            raise

    def has_spans(self, ref: str, *, tape: bool = False) -> bool:
        """Whether any span is recorded under ``ref``: as a run id (a ref's run part) or a trace id; with
        ``tape=True`` as a run id or a tape's id, the way ``verify --run`` names a tape."""
        from ..refs import split_ref

        where, key = ("run_id = ? OR chain_id = ?", ref) if tape else ("run_id = ? OR trace_id = ?", split_ref(ref)[0])
        return self.reader.query(f"SELECT 1 AS x FROM spans WHERE {where} LIMIT 1", [key, key]).num_rows > 0

    def sql(self, query: str, params: Sequence[Any] | None = None, timeout: float | None = 30.0) -> Any:
        """One read-only query (a ``pyarrow.Table``); writes and file access are refused, and the query is
        interrupted after ``timeout`` seconds (None or 0: no limit)."""
        from ...store.sql import run_readonly_sql

        return run_readonly_sql(self.reader, query, params, timeout=timeout)
