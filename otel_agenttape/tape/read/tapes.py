"""``Tapes``: the read side of a tape store, whatever holds it, in the shape of the CLI's verbs.

``otel_agenttape.open(source)`` returns one. Each method answers what the matching ``agenttape``
command prints (``runs``, ``show``, ``replay``, ``diff``, ``dataset``, ``verify``, ``resume-index``,
``sql``); the CLI and the console call these methods, so they cannot disagree.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import IO, Any

import orjson

from ..dataset import DatasetResult, export_dataset
from ..diff import diff_runs
from ..load import Reader
from ..model import Run
from ..rebuild import reconstruct, reconstruct_tree, run_span_keys
from ..refs import RunNotFound, resolve
from ... import read_memory as memory
from ...pricing import Prices
from .cost import CALL_COSTS, add_tree_cost, call_costs, calls_of_runs, price_summaries, run_cost, total_of
from .filters import Filters, as_ns
from .kept import forget as forget_kept
from .kept import store_version
from .listing import all_matching, by_refs, page, trace_runs
from .otlp import spans_otlp
from .scores import forget as forget_scores
from .scores import label_filters, list_scores, score_filters, score_summaries
from .steps import step_dicts
from .summary import Page, RunSummary


MEMO_ENTRIES = 256
# A kept answer's Python objects take about 2.5 times its JSON text (measured with tracemalloc on a
# 100-node run's steps and a 1 + 20 tree: 2.47 and 2.67); counted at 3 times under the read model's bound.
MEMO_BYTES_PER_JSON_BYTE = 3

_ALL: weakref.WeakSet[Tapes] = weakref.WeakSet()
_ALL_LOCK = threading.Lock()


def _memo_held() -> int:
    with _ALL_LOCK:
        every = list(_ALL)
    return sum(t._memo_bytes for t in every)


def _drop_memos() -> None:
    with _ALL_LOCK:
        every = list(_ALL)
    for t in every:
        t._forget_memo()


memory.register(_memo_held, _drop_memos)


def _answer_bytes(value: Any) -> int:
    """What a kept answer is counted as under the read model's bound (``MEMO_BYTES_PER_JSON_BYTE``)."""
    try:
        return len(orjson.dumps(value, default=str)) * MEMO_BYTES_PER_JSON_BYTE
    except (TypeError, orjson.JSONEncodeError):
        return 1 << 62  # an answer that cannot be sized is not kept
COST_ENTRIES = 200_000  # runs whose cost is kept (about 100 bytes each)


def _calls_key(r: RunSummary) -> tuple[Any, ...]:
    """What a run's cost follows from, as its summary counts it."""
    return (r.ref, r.model_calls, r.input_tokens, r.output_tokens, tuple(r.models))


def _tree_total(doc: dict[str, Any]) -> dict[str, Any]:
    """The cost of a tree node's run and of every run below it (each counted once)."""
    usd = doc["cost_usd"] if doc["priced_calls"] else None
    priced, unpriced = doc["priced_calls"], doc["unpriced_calls"]
    for c in doc["children"]:
        t = c["tree_cost"]
        if t["priced_calls"]:
            usd = (usd or 0.0) + t["usd"]
        priced += t["priced_calls"]
        unpriced += t["unpriced_calls"]
    return {"usd": usd if usd is not None or unpriced else 0.0, "priced_calls": priced, "unpriced_calls": unpriced}


class Tapes:
    """Runs, steps, trees, sessions, diffs and verification over one reader (DuckDB, lake, server, OTLP)."""

    def __init__(self, reader: Reader, *, owns: bool = True, closer: Any = None,
                 prices: Prices | str | os.PathLike[str] | None = None) -> None:
        self.reader = reader
        self._owns = owns
        self._closer = closer
        self._memo: dict[Any, Any] = {}
        self._memo_version: int | None = None
        self._memo_bytes = 0  # what ``_memo`` is counted as under the read model's bound
        with _ALL_LOCK:
            _ALL.add(self)
        self._prices: Prices | None = None
        self._costs_of: dict[tuple[Any, ...], tuple[Any, int, int]] | None = None
        self._experiment_summaries: dict[str, Any] = {}  # name -> (its runs' key, prices, summary)
        if prices is not None:
            self.use_prices(prices)

    # --- prices -------------------------------------------------------------------------------------

    @property
    def prices(self) -> Prices:
        """The prices costs are computed with: genai-prices plus the overrides of ``use_prices`` (or of
        ``$AGENTTAPE_PRICES`` when none were given), read once."""
        if self._prices is None:
            self._prices = Prices.load()
        return self._prices

    def use_prices(self, prices: Prices | str | os.PathLike[str] | None) -> None:
        """Price with these overrides (a ``Prices``, or a JSON/YAML file of per-model prices per million
        tokens); None: genai-prices and ``$AGENTTAPE_PRICES`` again. Answers kept so far are dropped."""
        self._prices = prices if isinstance(prices, Prices) or prices is None else Prices.load(prices)
        self._forget_memo()
        self._costs_of = None
        self._experiment_summaries = {}

    @property
    def description(self) -> str:
        return str(getattr(self.reader, "description", "") or "")

    # --- lifetime ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the source (the file, the lake's connection, an in-memory store of OTLP files) and
        what the read model keeps for it."""
        forget_kept(self.reader)
        forget_scores(self.reader)
        self._forget_memo()
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
        answers that are not changed once returned (the console's JSON). Kept answers count under the
        read model's bound (``read_memory``): one that does not fit is returned, not kept."""
        version = store_version(self.reader)
        if version is None:
            return compute()
        if version != self._memo_version:
            self._forget_memo()
            self._memo_version = version
        kept = self._memo.get(key)
        if kept is not None:
            return kept[0]
        value = compute()
        if store_version(self.reader) == version:  # not written to meanwhile
            if len(self._memo) >= MEMO_ENTRIES:
                self._forget_memo()
                self._memo_version = version
            size = _answer_bytes(value)
            if memory.fits(size):
                self._memo[key] = (value, size)
                self._memo_bytes += size
        return value

    def _forget_memo(self) -> None:
        """Let go of every kept answer (the store changed, prices changed, or the read model's memory is
        released)."""
        self._memo, self._memo_version, self._memo_bytes = {}, None, 0

    # --- runs -------------------------------------------------------------------------------------

    def runs(self, agent: str | None = None, status: str | None = None, source: str | None = None,
             session: str | None = None, service: str | None = None, model: str | None = None,
             tool: str | None = None, since: Any = None, until: Any = None, text: str | None = None,
             parent: str | None = None, limit: int = 50, cursor: str | None = None,
             score: str | Sequence[str] | None = None, label: str | Sequence[str] | None = None) -> Page:
        """Runs of every source, newest first; ``since``/``until``: ns, datetime or ISO text. ``score``:
        ``"helpfulness>=0.8"`` (``>=``, ``>``, ``<=``, ``<``, ``=``) and ``label``: ``"correctness=pass"``,
        one or a list, each passed by the run's latest score of that name."""
        filters = Filters(agent=agent, status=status, source=source, session=session, service=service,
                          model=model, tool=tool, since=as_ns(since, "since"), until=as_ns(until, "until"),
                          text=text, parent=parent, score=score_filters(score), label=label_filters(label))
        found = page(self.reader, filters, limit=limit, cursor=cursor)
        self._complete(found.runs)
        return found

    def _complete(self, runs: Sequence[RunSummary]) -> None:
        """What a summary carries beyond the ``runs`` view's row: its cost and its scores."""
        self._price(runs)
        score_summaries(self.reader, runs)

    def _price(self, runs: Sequence[RunSummary]) -> None:
        """``price_summaries``, each run priced once: a run's cost is kept under what its summary says of
        its model calls (their count and tokens: a call that arrives changes the count, a stored span
        never changes), so a page read again runs no pricing query, on every kind of store;
        ``use_prices`` forgets them all."""
        if self._costs_of is None or len(self._costs_of) > COST_ENTRIES:
            self._costs_of = {}
        known = self._costs_of
        todo = [r for r in runs if _calls_key(r) not in known]
        if todo:
            price_summaries(self.reader, todo, self.prices)
            for r in todo:
                known[_calls_key(r)] = (r.cost_usd, r.priced_calls, r.unpriced_calls)
        for r in runs:
            r.cost_usd, r.priced_calls, r.unpriced_calls = known[_calls_key(r)]

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
        self._complete([found])
        return found

    def session(self, session_id: str) -> list[RunSummary]:
        """The runs (turns) of one session, oldest first."""
        turns = all_matching(self.reader, Filters(session=session_id), oldest_first=True)
        self._complete(turns)
        return turns

    # --- cost ---------------------------------------------------------------------------------------

    def cost(self, ref: str | None = None, *, session: str | None = None, agent: str | None = None,
             tree: bool = False, since: Any = None, until: Any = None) -> dict[str, Any]:
        """What model calls cost, in USD, priced now (``prices``): one run's own calls (``ref``), its whole
        tree with ``tree=True`` (each run once), a session's turns, or every run of an agent. ``usd`` is
        None when no call had a price; ``unpriced_calls`` counts the calls without one (never as 0)."""
        if ref is not None:
            if tree:
                return self.replay(ref, tree=True)["tree_cost"]
            return run_cost(self.rebuild(ref), self.prices, calls=False)
        if session is None and agent is None:
            raise ValueError("cost(): give a run ref, session= or agent=")
        filters = Filters(session=session, agent=agent, since=as_ns(since, "since"), until=as_ns(until, "until"))
        runs = all_matching(self.reader, filters)
        price_summaries(self.reader, runs, self.prices)
        out = total_of(runs)
        out["runs"] = len(runs)
        return out

    def model_calls(self, refs: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The model calls of these runs (provider, model, tokens with cache reads and writes, start), by
        ref, priced: each with ``usd`` (None: no price)."""
        summaries = list(by_refs(self.reader, [self.locate(r) for r in refs]).values())
        calls = calls_of_runs(self.reader, summaries)
        for rows in calls.values():
            for c in rows:
                c["usd"] = self.prices.call_usd(c["provider"], c["model"], c["input_tokens"], c["output_tokens"],
                                                c["cache_read_tokens"], c["cache_write_tokens"], c["start_ns"])
        return calls

    # --- scores -------------------------------------------------------------------------------------

    def scores(self, ref: str | None = None, *, name: str | None = None, source: str | None = None,
               span_id: str | None = None, errors: bool = True) -> list[dict[str, Any]]:
        """Every ``gen_ai.evaluation.result`` score recorded (``scores`` view rows), oldest first: of one
        run (``ref``, any form ``locate`` takes), one name, one source (``human``, ``llm``, ``code``, an
        evaluator's name; ``otel`` for another instrumentation's) or one scored span. ``errors=False``
        leaves out evaluations that failed (``error_type`` set, no value or label)."""
        full = self.locate(ref) if ref is not None else None
        return list_scores(self.reader, ref=full, name=name, source=source, span_id=span_id, errors=errors)

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
            root = reconstruct_tree(self.reader, ref).root
            doc = root.to_json(children=True)
            add_tree_cost(doc, root, self.prices)
            return doc
        run = self.rebuild(ref)
        doc = run.to_json(children=False)
        doc["cost"] = run_cost(run, self.prices)
        return doc

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
        self._complete(list(known.values()))

        def node(run: Run, parent: str | None) -> dict[str, Any]:
            summary = known.get(run.ref)
            if summary is None:
                summary = RunSummary.from_run(run, parent)
                own = run_cost(run, self.prices, calls=False)
                summary.cost_usd, summary.priced_calls = own["usd"], own["priced_calls"]
                summary.unpriced_calls = own["unpriced_calls"]
            out = summary.to_dict()
            if parent is not None:
                out["parent_ref"] = parent
            out["children"] = [node(c, run.ref) for c in run.children]
            out["tree_cost"] = _tree_total(out)
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

    def experiments(self, *, summary: bool = False) -> list[dict[str, Any]]:
        """One row per experiment recorded in the store (``agenttape experiment list``); with ``summary``
        each row also holds its comparison with the originals (the console's Experiments page), kept per
        experiment until its runs change (``experiment_overview``)."""
        if summary:
            from ..experiment_compare import experiment_overview

            return experiment_overview(self, cache=self._experiment_summaries)
        from ..experiment import experiment_list

        return experiment_list(self)

    def experiment_runs(self, name: str) -> list[RunSummary]:
        """The runs of experiment ``name``, oldest first (``agenttape runs --experiment NAME``)."""
        from ..experiment import experiment_refs

        refs = list(experiment_refs(self, name))
        found = by_refs(self.reader, refs)
        listed = [found[r] for r in refs if r in found]
        score_summaries(self.reader, listed)
        return listed

    def experiment_of(self, refs: Sequence[str]) -> dict[str, str]:
        """Which of ``refs`` are experiment runs: ref -> experiment name (``runs`` marks them)."""
        from ..experiment import experiment_refs

        mine = experiment_refs(self)
        return {r: mine[r]["name"] for r in refs if r in mine}

    def compare(self, name: str, *, baseline: str = "original", evals: Sequence[str] = (),
                prompts: bool | None = None) -> Any:
        """``agenttape experiment compare``: the experiment's answers against the originals or another
        experiment; ``prompts=True`` also reads each side's prompt (default: when evaluators are named)."""
        from ..experiment_compare import compare

        return compare(self, name, baseline=baseline, evals=evals, prompts=prompts)

    def experiment_detail(self, name: str, *, baseline: str = "original", evals: Sequence[str] = ()) -> dict[str, Any]:
        """``compare`` as JSON, each pair's sides with the prompt sent and the stored scores of the runs
        (the console's side-by-side page)."""
        from ..experiment_compare import experiment_detail

        return experiment_detail(self, name, baseline=baseline, evals=evals)

    # --- many runs, tapes, SQL ------------------------------------------------------------------------

    def dataset(self, out: str | os.PathLike[str] | IO[str], *, agent: str | None = None,
                model: str | None = None, since: Any = None, score: str | Sequence[str] | None = None,
                label: str | Sequence[str] | None = None) -> DatasetResult:
        """Write completed runs as OpenAI chat fine-tuning JSONL (``agenttape dataset``); with ``score``/
        ``label`` (as ``runs()`` takes them) only the runs that pass, the others counted by reason."""
        since_ns = as_ns(since, "since")
        kw = {"agent": agent, "model": model, "since_ns": since_ns, "score": score_filters(score),
              "label": label_filters(label)}
        if isinstance(out, (str, os.PathLike)):
            with open(out, "w", encoding="utf-8") as fh:
                return export_dataset(self.reader, fh, **kw)
        return export_dataset(self.reader, out, **kw)

    def verify(self, tape_id: str | None = None, *, keys: Sequence[Any] = (),
               checkpoint_files: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Per-tape verification results, as ``agenttape verify --json`` lists them under ``chains``."""
        from ..verification import verify_store

        reports = verify_store(self.reader, run=tape_id, verifiers=keys, checkpoint_files=checkpoint_files)
        return [r.to_json() for r in reports]

    def erase(self, *, session: str | None = None, run: str | None = None, trace: str | None = None,
              before: Any = None, where: str | None = None, reason: str, signing_key: Any = None, by: str | None = None,
              dry_run: bool = False, parquet: Sequence[str] = (), lakes: Sequence[str] = (),
              wal: Sequence[str] = (), outbox: Sequence[str] = ()) -> dict[str, Any]:
        """Erase the content of a session's, run's or trace's spans, of spans started ``before`` a time, or
        of the spans a read-only SQL predicate over ``spans`` selects (``where``), from this DuckDB store (``agenttape erase``): values and salts removed, the tapes still verify, a
        signed erasure record written, the file rewritten so no copy remains. The same spans (and any the
        selection picks there) are erased in the copies named: Parquet export folders (``parquet``),
        folder or S3 lakes (``lakes``), receiver WAL folders (``wal``; ``DB.otlpwal`` always) and outbox
        folders (``outbox``), under the same record. Returns the counts, per copy under ``copies``
        (``dry_run``: what would be erased, nothing changed). A store a running receiver holds is erased
        by that receiver (``POST /api/erase``) while it keeps ingesting, with the copies it writes itself
        (its WAL and spool, its Parquet export and lake)."""
        from ...store.reader import open_duckdb
        from ..erase import erase_file, erase_via_server, held_by_server, selection, signer_from, store_path

        if held_by_server(self.reader):  # a running receiver holds the file: it erases while it ingests
            if parquet or lakes or wal or outbox:
                raise ValueError("a running receiver erases the copies it writes itself (its WAL, spool, "
                                 "--parquet-dir and --lake); other copies are erased with the receiver stopped")
            cond, params, selector = selection(self.reader, session=session, run=run, trace=trace, before=before,
                                               where=where)
            return erase_via_server(self.reader, cond, params, selector, reason=reason, signing_key=signing_key,
                                    by=by, dry_run=dry_run)
        path = store_path(self.reader)
        where, params, selector = selection(self.reader, session=session, run=run, trace=trace, before=before,
                                             where=where)
        signer = signer_from(signing_key)
        self.reader.close()  # a read-only and a read-write connection cannot share a file in one process
        try:
            result = erase_file(path, where, params, selector, reason=reason, signer=signer, by=by, dry_run=dry_run,
                                parquet=parquet, lakes=lakes, wal=wal, outbox=outbox)
        finally:
            self.reader = open_duckdb(path)
            self._forget_memo()
            self._experiment_summaries = {}
        return result.to_json()

    def retain(self, *, older_than_days: int, reason: str, content_only: bool = False, signing_key: Any = None,
               by: str | None = None, dry_run: bool = False, today: Any = None) -> dict[str, Any]:
        """Apply the retention rule of ``lake retain`` to this DuckDB store (``agenttape retain``): spans
        dated before UTC today minus ``older_than_days`` are dropped with their events, links and old log
        records, recorded so ``verify`` reports them as removed by retention; with ``content_only`` their
        content is erased instead (a signed erasure record; the spans and their proofs stay). A store a
        running receiver holds is rewritten by that receiver (``POST /api/retain``) while it keeps ingesting."""
        from ...store.reader import open_duckdb
        from ...store.retention import retain_duckdb
        from ..erase import default_by, held_by_server, retain_via_server, signer_from, store_path

        if held_by_server(self.reader):  # a running receiver holds the file: it applies the rule while it ingests
            return retain_via_server(self.reader, int(older_than_days), reason=reason, content_only=content_only,
                                     signing_key=signing_key, by=by, dry_run=dry_run, today=today)
        path = store_path(self.reader)
        signer = signer_from(signing_key) if content_only else None
        self.reader.close()
        try:
            return retain_duckdb(path, int(older_than_days), reason=reason, by=by or default_by(), signer=signer,
                                 content_only=content_only, dry_run=dry_run, today=today)
        finally:
            self.reader = open_duckdb(path)
            self._forget_memo()

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
        interrupted after ``timeout`` seconds (None or 0: no limit). Besides the store's tables and views
        it may read ``call_costs`` (every model call priced now by ``prices``), computed only when named."""
        import re

        from ...store.sql import run_readonly_sql

        relations = None
        if re.search(rf"\b{CALL_COSTS}\b", query, re.IGNORECASE):
            relations = {CALL_COSTS: call_costs(self.reader, self.prices)}
        return run_readonly_sql(self.reader, query, params, timeout=timeout, relations=relations)
