"""Evaluators over recorded runs: a function of a run whose answer is recorded as a score.

``evaluate(tapes, evaluator, tape=...)`` selects runs as ``Tapes.runs`` does, skips the runs this
evaluator (name and version) has already scored, calls it on the rest with bounded concurrency and records
each answer as a ``gen_ai.evaluation.result`` event in a score tape of its own, through the same path as
``tape.score`` (sealed, exported, outboxed), with the evaluator's ``NAME@VERSION`` as its source (the
scores of one call share score spans, up to ``Recorder.BATCH`` events each, so a thousand scores are not a
thousand tapes with a checkpoint each). An evaluator that fails (a judge that times out or answers
garbage) records ``error.type`` and no value: a failed evaluation never makes a score up, and the next
run is evaluated all the same.

Runs are read in chunks: the summaries of all selected runs first, then per chunk, only when an
evaluator asks, the rebuilt runs (``run.output``, ``run.tools``...) and their cost (``run.cost_usd``).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from .. import semconv as sc
from ..capture.scores import ScoreError, score_attributes
from .model import Run
from .read.filters import Filters, as_ns
from .read.listing import all_matching, by_refs
from .read.summary import RunSummary

CHUNK = 256
ERROR_INVALID_RESULT = "invalid_result"  # the evaluator answered something that is not a score


class EvaluationError(Exception):
    """An evaluation that could not give a score: recorded with ``error_type`` (low cardinality, as OTel's
    ``error.type``) and the message as its explanation, never as a value."""

    def __init__(self, error_type: str, message: str = "") -> None:
        super().__init__(message or error_type)
        self.error_type = error_type
        self.message = message


@dataclass(frozen=True)
class Result:
    """What an evaluator answers: a value, a label or both, with an explanation; or ``error_type``."""

    value: float | None = None
    label: str | None = None
    explanation: str | None = None
    error_type: str | None = None


EvalResult = Result  # the name the package exports


@dataclass
class Evaluator:
    """A named, versioned function of a run. ``fn(run)`` returns a number (the value), a bool (1.0/0.0 with
    label pass/fail), a string (the label), a dict or ``Result`` (value/label/explanation), or None (not
    applicable: nothing is recorded). Changing what it checks is a new ``version``: scores are kept per
    ``NAME@VERSION`` and a rerun of the same one adds nothing."""

    name: str
    fn: Callable[[Any], Any]
    version: str = "1"
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or "@" in self.name:
            raise ValueError(f"evaluator name {self.name!r}: give a non-empty name without '@'")
        self.name = self.name.strip()
        self.version = str(self.version).strip() or "1"

    @property
    def source(self) -> str:
        """Who gave the score, as the score records it: ``NAME@VERSION``."""
        return f"{self.name}@{self.version}"

    def __call__(self, run: Any) -> Result | None:
        """The evaluator's answer as a ``Result`` (exceptions become ``error_type``), or None."""
        try:
            answer = self.fn(run)
        except EvaluationError as exc:
            return Result(error_type=exc.error_type, explanation=exc.message or None)
        except Exception as exc:  # the evaluator's own bug or failure: recorded, the next run goes on
            return Result(error_type=type(exc).__name__, explanation=str(exc) or None)
        return as_result(answer)


def as_result(answer: Any) -> Result | None:
    """An evaluator's answer as a ``Result``; something that is not a score is an ``invalid_result``."""
    if answer is None or isinstance(answer, Result):
        return answer
    if isinstance(answer, bool):
        return Result(value=1.0 if answer else 0.0, label="pass" if answer else "fail")
    if isinstance(answer, (int, float)):
        return Result(value=float(answer))
    if isinstance(answer, str):
        return Result(label=answer)
    if isinstance(answer, dict):
        unknown = set(answer) - {"value", "label", "explanation", "error_type"}
        if not unknown:
            value = answer.get("value")
            if isinstance(value, bool):
                value = 1.0 if value else 0.0
            return Result(value=value, label=answer.get("label"), explanation=answer.get("explanation"),
                          error_type=answer.get("error_type"))
        return Result(error_type=ERROR_INVALID_RESULT, explanation=f"unknown keys {sorted(unknown)}")
    return Result(error_type=ERROR_INVALID_RESULT, explanation=f"not a score: {type(answer).__name__}")


def evaluator(name: str | None = None, version: str = "1",
              description: str = "") -> Callable[[Callable[[Any], Any]], Evaluator]:
    """``@evaluator("helpful", version="2")`` over ``def f(run): ...``: the function as an ``Evaluator``."""

    def wrap(fn: Callable[[Any], Any]) -> Evaluator:
        return Evaluator(name or fn.__name__, fn, version, description or (fn.__doc__ or "").strip())

    return wrap


def as_evaluator(obj: Any, name: str | None = None, version: str | None = None) -> Evaluator:
    """An ``Evaluator`` from one, or from a plain function (its ``evaluator_name`` and ``version``
    attributes when it has them, else its ``__name__`` and version 1)."""
    if isinstance(obj, Evaluator):
        if name is None and version is None:
            return obj
        return Evaluator(name or obj.name, obj.fn, version or obj.version, obj.description)
    if not callable(obj):
        raise TypeError(f"an evaluator is a function of a run, not {type(obj).__name__}")
    return Evaluator(name or getattr(obj, "evaluator_name", None) or getattr(obj, "__name__", None) or "custom",
                     obj, version or str(getattr(obj, "version", "1")), (getattr(obj, "__doc__", "") or "").strip())


# --- the run an evaluator sees ------------------------------------------------------------------------


class _Chunk:
    """Runs read together: rebuilt and priced once, when the first evaluator of the chunk asks."""

    def __init__(self, tapes: Any, summaries: list[RunSummary]) -> None:
        self.tapes = tapes
        self.summaries = summaries
        self._lock = threading.Lock()
        self._runs: dict[str, Run] | None = None
        self._priced = False

    def run(self, ref: str) -> Run | None:
        with self._lock:
            if self._runs is None:
                from .rebuild import iter_runs

                self._runs = {r.ref: r for r in iter_runs(self.tapes.reader, [s.ref for s in self.summaries])}
            return self._runs.get(ref)

    def price(self) -> None:
        with self._lock:
            if not self._priced:
                from .read.cost import price_summaries

                price_summaries(self.tapes.reader, self.summaries, self.tapes.prices)
                self._priced = True


class EvalRun:
    """One run as an evaluator sees it: its summary's fields (``ref``, ``agent``, ``status``,
    ``duration_ms``, ``errors``, ``tool_calls``...), its cost (``cost_usd``, ``unpriced_calls``), and every
    field of the rebuilt run (``output``, ``input``, ``tools``, ``nodes``, ``usage``; ``run`` is the
    ``tape.model.Run``), rebuilt on first use."""

    def __init__(self, summary: RunSummary, chunk: _Chunk) -> None:
        self.summary = summary
        self._chunk = chunk

    def __repr__(self) -> str:
        return f"EvalRun({self.summary.ref!r})"

    @property
    def run(self) -> Run:
        found = self._chunk.run(self.summary.ref)
        if found is None:
            raise EvaluationError("run_not_found", f"{self.summary.ref} could not be rebuilt")
        return found

    @property
    def cost_usd(self) -> float | None:
        self._chunk.price()
        return self.summary.cost_usd

    @property
    def unpriced_calls(self) -> int:
        self._chunk.price()
        return self.summary.unpriced_calls

    @property
    def priced_calls(self) -> int:
        self._chunk.price()
        return self.summary.priced_calls

    @property
    def input_text(self) -> str:
        """The last user message's text (what a reference file's ``input`` is matched with)."""
        return last_user_text(self.run.input)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _SUMMARY_FIELDS:
            return getattr(self.summary, name)
        return getattr(self.run, name)


# ``tools`` is the rebuilt run's (its calls, with arguments, results and errors); ``summary.tools`` names them
_SUMMARY_FIELDS = frozenset(RunSummary.__dataclass_fields__) - {"cost_usd", "priced_calls", "unpriced_calls",
                                                                 "tools"}


def last_user_text(messages: Any) -> str:
    """The text of the last user message of ``messages`` ("" without one)."""
    for m in reversed(messages):
        if getattr(m, "role", None) == "user":
            return m.content()
    return ""


def message_text(message: Any) -> str:
    """A chat message's text: its content string, or its text parts joined."""
    content = message.get("content") if isinstance(message, dict) else message
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") or p.get("content") or "" if isinstance(p, dict) else str(p) for p in content]
        return "".join(str(p) for p in parts)
    return str(content)


# --- which runs, which are done -----------------------------------------------------------------------


def by_evaluator(tapes: Any, ev: Evaluator, *, errors: bool = False) -> tuple[str, list[Any]]:
    """SQL over the ``scores`` view: the rows this evaluator gave (without ``errors``: only scores, not
    failed evaluations), and its parameters. A score's source is ``NAME@VERSION`` as recorded; a view
    with a ``version`` column splits it into source NAME and version VERSION, and both forms are
    matched. The one place that reads the ``scores`` view directly, until ``Tapes.scores`` is there to ask."""
    kept = "" if errors else "error_type IS NULL AND "
    where = f"name = ? AND {kept}run_ref IS NOT NULL AND (source = ?"
    params: list[Any] = [ev.name, ev.source]
    columns = tapes.reader.query("SELECT * FROM scores LIMIT 0").column_names
    if "version" in columns:
        where += " OR (source = ? AND version = ?)"
        params += [ev.name, ev.version]
    return where + ")", params


def already_scored(tapes: Any, ev: Evaluator) -> set[str]:
    """The run refs this evaluator (name and version) has scored, read from the ``scores`` view. Failed
    evaluations (``error_type``) do not count: a rerun tries them again."""
    where, params = by_evaluator(tapes, ev)
    return set(tapes.reader.query(f"SELECT DISTINCT run_ref FROM scores WHERE {where}", params)
               .column("run_ref").to_pylist())


def select_runs(tapes: Any, *, refs: Sequence[str] = (), limit: int | None = None,
                **filters: Any) -> list[RunSummary]:
    """The runs to evaluate, oldest first: those ``refs`` name, else those the filters select (the
    keywords of ``Tapes.runs``: agent, status, source, session, service, model, tool, since, until, text,
    parent); score tapes and checkpoints are never runs."""
    if refs:
        full = [tapes.locate(r) for r in refs]
        found = by_refs(tapes.reader, full)
        chosen = [found[r] for r in dict.fromkeys(full) if r in found]
    else:
        unknown = set(filters) - set(Filters.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown run filter {', '.join(sorted(unknown))}")
        values = {k: v for k, v in filters.items() if v is not None}
        for key in ("since", "until"):
            if key in values:
                values[key] = as_ns(values[key], key)
        chosen = all_matching(tapes.reader, Filters(**values), oldest_first=True)
    if limit is not None:
        chosen = chosen[: max(0, int(limit))]
    return chosen


# --- recording ----------------------------------------------------------------------------------------


def _tracer(tape: Any) -> Any:
    from .. import __version__

    return tape.tracer_provider.get_tracer(sc.SCOPE_NAME, __version__)


class Recorder:
    """Scores on their way out: each a ``gen_ai.evaluation.result`` event naming the run it scores (its ref,
    trace and span ids, as ``tape.score`` writes them), carried by an ``agenttape.score`` span of a score
    tape of its own, sealed and exported through ``tape`` like every span. Up to ``BATCH`` scores share a
    span (one tape and one checkpoint for them, not one each); a span leaves at the latest
    ``FLUSH_SECONDS`` after its first score was given, and at ``flush()``. Without a tape the scores are
    kept until ``record_kept(tape)`` (a store that can be written only once it is no longer read)."""

    BATCH = 100
    FLUSH_SECONDS = 2.0

    def __init__(self, tape: Any, ev: Evaluator) -> None:
        self.ev = ev
        self.tracer = _tracer(tape) if tape is not None else None
        self._events: list[tuple[dict[str, Any], int]] = []
        self.kept: list[tuple[dict[str, Any], int]] = []  # without a tape: every score, in order
        self._since = 0.0
        self.spans = 0

    def record_kept(self, tape: Any) -> None:
        """Record the scores kept so far through ``tape`` (in spans of ``BATCH``)."""
        self.tracer = _tracer(tape)
        kept, self.kept = self.kept, []
        for lo in range(0, len(kept), self.BATCH):
            self._events = kept[lo: lo + self.BATCH]
            self.flush()

    def attributes(self, result: Result) -> tuple[Result, dict[str, Any]]:
        """The event's attributes for ``result``; a result that is not a score becomes ``invalid_result``."""
        try:
            return result, score_attributes(self.ev.name, result.value, result.label, result.explanation,
                                            source=self.ev.source, error_type=result.error_type)
        except ScoreError as exc:
            bad = Result(error_type=ERROR_INVALID_RESULT, explanation=str(exc).removeprefix(f"{self.ev.name}: "))
            return bad, score_attributes(self.ev.name, None, None, bad.explanation, source=self.ev.source,
                                         error_type=bad.error_type)

    def add(self, summary: RunSummary, attrs: dict[str, Any]) -> None:
        attrs[sc.SCORE_OF] = summary.ref
        attrs[sc.SCORE_TRACE_ID] = summary.trace_id
        if summary.span_id:
            attrs[sc.SCORE_SPAN_ID] = summary.span_id
        if self.tracer is None:
            self.kept.append((attrs, time.time_ns()))
            return
        if not self._events:
            self._since = time.monotonic()
        self._events.append((attrs, time.time_ns()))
        if len(self._events) >= self.BATCH or time.monotonic() - self._since >= self.FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        events, self._events = self._events, []
        if not events or self.tracer is None:
            return
        from opentelemetry.context import Context

        span = self.tracer.start_span(sc.SCORE_SPAN_NAME, context=Context(), attributes={
            sc.GEN_AI_EVALUATION_NAME: self.ev.name, sc.SCORE_SOURCE: self.ev.source})
        try:
            for attrs, when in events:
                span.add_event(sc.EVENT_EVALUATION_RESULT, attrs, timestamp=when)
        finally:
            span.end()
        self.spans += 1


# --- the run over many runs ---------------------------------------------------------------------------


@dataclass
class EvalSummary:
    """What ``evaluate`` did: runs selected, evaluated (a score recorded), skipped as already scored,
    not applicable (the evaluator answered None), errors (``error.type`` recorded), and the errors' kinds."""

    evaluator: str
    selected: int = 0
    evaluated: int = 0
    skipped: int = 0
    not_applicable: int = 0
    errors: int = 0
    error_types: dict[str, int] = field(default_factory=dict)
    labels: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    failed: list[dict[str, Any]] = field(default_factory=list)  # the first errors: ref, error_type, explanation
    readable: bool | None = None  # every score read back from the store (None: not waited for, a tape was given)
    scored: set[str] = field(default_factory=set, repr=False)  # refs this evaluator has scored, these included

    def to_json(self) -> dict[str, Any]:
        return {"evaluator": self.evaluator, "selected": self.selected, "evaluated": self.evaluated,
                "skipped": self.skipped, "not_applicable": self.not_applicable, "errors": self.errors,
                "error_types": self.error_types, "labels": self.labels, "seconds": round(self.seconds, 3),
                "failed": self.failed, "readable": self.readable}


class Progress:
    """One line on stderr, rewritten in place, only when stderr is a terminal (or ``stream`` is given)."""

    def __init__(self, name: str, total: int, stream: IO[str] | None) -> None:
        self.name, self.total = name, total
        self.stream = stream if stream is not None else (sys.stderr if sys.stderr.isatty() else None)
        self.done = self.failed = 0
        self._started = time.monotonic()
        self._shown = 0.0

    def tick(self, n: int, failed: int) -> None:
        self.done += n
        self.failed += failed
        now = time.monotonic()
        if self.stream is None or (now - self._shown < 0.1 and self.done < self.total):
            return
        self._shown = now
        width = 30
        filled = int(width * self.done / max(1, self.total))
        rate = self.done / max(1e-9, now - self._started)
        self.stream.write(f"\r{self.name} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                          f"errors {self.failed} ({rate:,.0f} runs/s)")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.total:
            self.stream.write("\n")
            self.stream.flush()


MAX_FAILED_LISTED = 20
_DONE = object()


def bounded_map(fn: Callable[[Any], Any], items: Iterable[Any], workers: int) -> Iterator[Any]:
    """``fn`` over ``items`` on at most ``workers`` threads, results in the order they finish. Each
    worker takes the next item when it is free (no task object per item, so a cheap check is not
    dominated by handing it out); ``fn`` must not raise. One worker: in this thread."""
    workers = max(1, int(workers))
    if workers == 1:
        yield from map(fn, items)
        return
    source = iter(items)
    take = threading.Lock()
    results: queue.SimpleQueue[Any] = queue.SimpleQueue()
    stop = threading.Event()

    def work() -> None:
        try:
            while not stop.is_set():
                with take:
                    item = next(source, _DONE)
                if item is _DONE:
                    return
                results.put((fn(item),))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            results.put(exc)
        finally:
            results.put(_DONE)

    threads = [threading.Thread(target=work, name=f"agenttape-eval-{i}", daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    running = workers
    try:
        while running:
            got = results.get()
            if got is _DONE:
                running -= 1
            elif isinstance(got, BaseException):
                raise got
            else:
                yield got[0]
    finally:
        stop.set()
        for t in threads:
            t.join()


def run_evaluation(tapes: Any, ev: Evaluator, tape: Any, runs: Iterable[RunSummary], *, concurrency: int = 4,
                   progress: IO[str] | None = None, rescore: bool = False,
                   recorder: Recorder | None = None) -> EvalSummary:
    """Evaluate ``runs`` (summaries) with ``ev`` and record each answer through ``tape`` (or ``recorder``:
    a ``Recorder(None, ev)`` keeps them for ``record_kept``)."""
    started = time.monotonic()
    listed = list(runs)
    out = EvalSummary(ev.source, selected=len(listed))
    done = set() if rescore else already_scored(tapes, ev)
    todo = [r for r in listed if r.ref not in done]
    out.skipped = len(listed) - len(todo)
    out.scored = set(done)
    bar = Progress(ev.source, len(todo), progress)
    recorder = recorder if recorder is not None else Recorder(tape, ev)

    def one(item: EvalRun) -> tuple[RunSummary, Result | None, dict[str, Any] | None]:
        result = ev(item)
        if result is None:
            return item.summary, None, None
        return (item.summary, *recorder.attributes(result))

    def items() -> Iterator[EvalRun]:
        for lo in range(0, len(todo), CHUNK):
            chunk = _Chunk(tapes, todo[lo: lo + CHUNK])
            yield from (EvalRun(s, chunk) for s in chunk.summaries)

    try:
        for summary, result, attrs in bounded_map(one, items(), concurrency):
            if result is None or attrs is None:
                out.not_applicable += 1
                bar.tick(1, 0)
                continue
            recorder.add(summary, attrs)
            if result.error_type:
                out.errors += 1
                out.error_types[result.error_type] = out.error_types.get(result.error_type, 0) + 1
                if len(out.failed) < MAX_FAILED_LISTED:
                    out.failed.append({"ref": summary.ref, "error_type": result.error_type,
                                       "explanation": result.explanation})
            else:
                out.evaluated += 1
                out.scored.add(summary.ref)
                if result.label is not None:
                    out.labels[result.label] = out.labels.get(result.label, 0) + 1
            bar.tick(1, 1 if result.error_type else 0)
    finally:
        recorder.flush()
        bar.close()
    out.seconds = time.monotonic() - started
    return out


def evaluate(tapes: Any, evaluator: Any, *, tape: Any = None, endpoint: str | None = None,
             token: str | None = None, outbox: str | None = None, refs: Sequence[str] = (),
             limit: int | None = None, concurrency: int = 4, progress: IO[str] | None = None,
             rescore: bool = False, name: str | None = None, version: str | None = None,
             runs: Sequence[RunSummary] | None = None, **filters: Any) -> EvalSummary:
    """Evaluate the runs of ``tapes`` (a ``Tapes``, or a source ``otel_agenttape.open`` takes) that ``refs``
    or the run filters select (``Tapes.runs``' keywords) with ``evaluator`` (an ``Evaluator`` or a plain
    function of a run), recording each result as a score through ``tape`` (a capture ``Tape``), else
    through a tape of this call exporting over OTLP/HTTP to ``endpoint``, by default the receiver the store
    is read through (``agenttape serve``), with ``outbox`` (else ``$AGENTTAPE_OUTBOX``) keeping what cannot
    be delivered for later, flushed and shut down before returning. Runs this evaluator's
    ``NAME@VERSION`` already scored are skipped (``rescore``: score them again). ``progress``: where the
    progress line goes (default stderr when it is a terminal). ``runs``: summaries selected already
    (``select_runs``), instead of ``refs`` and the filters."""
    import otel_agenttape

    ev = as_evaluator(evaluator, name, version)
    opened = not hasattr(tapes, "reader")
    if opened:
        tapes = otel_agenttape.open(tapes)
    own = tape is None
    try:
        chosen = list(runs) if runs is not None else select_runs(tapes, refs=refs, limit=limit, **filters)
        if own:
            tape = score_tape(*_endpoint_of(tapes, endpoint, token), outbox=outbox)
        try:
            summary = run_evaluation(tapes, ev, tape, chosen, concurrency=concurrency, progress=progress,
                                     rescore=rescore)
            tape.force_flush()
            if own:
                tape.wait_delivered(30)
                # a receiver acknowledges before the rows are queryable: wait, so that a rerun finds them
                summary.readable = wait_readable(tapes, ev, len(summary.scored))
            return summary
        finally:
            if own:
                tape.shutdown()
    finally:
        if opened:
            tapes.close()


def score_tape(endpoint: str, token: str | None = None, *, outbox: str | None = None) -> Any:
    """A capture tape that seals scores and sends them over OTLP/HTTP to ``endpoint`` (``outbox``: where
    what cannot be delivered is kept and sent later)."""
    import otel_agenttape

    headers = {"Authorization": f"Bearer {token}"} if token else None
    return otel_agenttape.setup(endpoint=endpoint, protocol="http/protobuf", service_name=EVAL_SERVICE,
                                headers=headers, outbox=outbox)


def wait_readable(tapes: Any, ev: Evaluator, count: int, timeout: float = 30.0) -> bool:
    """Poll until the store holds scores of ``count`` runs from ``ev`` (export and storing are
    asynchronous); False when they are not all readable within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    where, params = by_evaluator(tapes, ev)
    while True:
        n = tapes.reader.query(f"SELECT count(DISTINCT run_ref) AS n FROM scores WHERE {where}",
                               params).column("n")[0].as_py()
        if n >= count:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _endpoint_of(tapes: Any, endpoint: str | None, token: str | None) -> tuple[str, str | None]:
    """Where scores go when no tape is given: ``endpoint``, else the server the store is read through."""
    reader = tapes.reader
    if endpoint:
        return endpoint, token
    if getattr(reader, "kind", "") == "server" and getattr(reader, "url", None):
        return str(reader.url), token or getattr(reader, "token", None)
    raise ValueError(f"evaluate(): {tapes.description or 'this store'} is not read through a receiver: serve it "
                     "(`agenttape serve --db FILE`), run `agenttape eval` (which starts one), or give "
                     "tape= (a capture Tape) or endpoint= (an OTLP/HTTP receiver)")


EVAL_SERVICE = "agenttape-eval"
