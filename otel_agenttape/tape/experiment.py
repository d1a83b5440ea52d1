"""Node-level experiments: every selected recorded model call's exact prompt sent to a candidate model.

An experiment is a set of new runs linked to the originals (DESIGN.md section 7): each answer is recorded
through capture as a sealed run of its own whose run span carries ``agenttape.experiment.name``,
``agenttape.experiment.of`` (the original run's ref) and ``agenttape.experiment.node`` (the original model
span's id). The originals are never touched. The resume journal (one SQLite file per experiment) keeps
what is done, so a rerun skips answered nodes and retries only the failed ones.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .. import semconv as sc
from ..resume.entry import COMMITTED, FAILED, Entry
from ..resume.journal import Journal
from ..resume.keys import request_hash
from .jsonl_file import jsonl_rows
from .model import Node
from .replay import recorded_request

EXPERIMENT_NAME = "agenttape.experiment.name"
EXPERIMENT_OF = "agenttape.experiment.of"  # the original run's ref, RUN_ID@TRACE_ID
EXPERIMENT_NODE = "agenttape.experiment.node"  # the original model span's id
EXPERIMENT_MODEL = "agenttape.experiment.model"
EXPERIMENT_KIND = "agenttape.experiment.kind"  # "node" | "program"
EXPERIMENT_SERVICE = "agenttape-experiment"
JOURNAL_KIND = "experiment"
SETTINGS = {sc.GEN_AI_REQUEST_TEMPERATURE: "temperature", sc.GEN_AI_REQUEST_MAX_TOKENS: "max_tokens",
            sc.GEN_AI_REQUEST_TOP_P: "top_p", "gen_ai.request.seed": "seed",
            "gen_ai.request.frequency_penalty": "frequency_penalty",
            "gen_ai.request.presence_penalty": "presence_penalty"}
DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
PROVIDERS = ("openai", "anthropic")


class ExperimentError(ValueError):
    """Bad experiment input: no such dataset file, nothing selected, a malformed name."""


@dataclass
class Candidate:
    """The model under test and the overrides applied to every recorded prompt.

    ``provider``: ``"openai"`` (any OpenAI-compatible endpoint) or ``"anthropic"`` (the Messages API
    through the Anthropic SDK, the prompt converted by ``experiment_anthropic``). ``client`` replaces the
    SDK client built from ``base_url``/``api_key_env`` (for ``"openai"``: any object with
    ``chat.completions.create``; for ``"anthropic"``: one with ``messages.create``)."""

    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    system_prompt: str | None = None
    temperature: float | None = None
    timeout: float = 60.0
    client: Any = None
    provider: str = "openai"

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ExperimentError(f"provider {self.provider!r}: one of {', '.join(PROVIDERS)}")

    def settings(self) -> dict[str, Any]:
        """What identifies the candidate in the journal: a changed override is another experiment item."""
        out = {"model": self.model, "base_url": self.base_url, "system_prompt": self.system_prompt,
               "temperature": self.temperature}
        if self.provider != "openai":  # the journals of OpenAI experiments keep their keys
            out["provider"] = self.provider
        return out

    def make_client(self) -> Any:
        """The SDK client: ``openai.OpenAI``, or for Anthropic an ``AnthropicChat`` (the Anthropic client
        with ``chat.completions.create`` too, so a program written against OpenAI runs unchanged)."""
        default_env = "ANTHROPIC_API_KEY" if self.provider == "anthropic" else "OPENAI_API_KEY"
        if self.client is not None:
            if self.provider == "anthropic" and not hasattr(self.client, "chat"):
                from .experiment_anthropic import AnthropicChat

                return AnthropicChat(self.client)
            return self.client
        key = os.environ.get(self.api_key_env or default_env)
        if self.api_key_env and not key:
            raise ExperimentError(f"${self.api_key_env} is not set")
        if self.provider == "anthropic":
            from .experiment_anthropic import anthropic_client

            return anthropic_client(self.base_url, key, self.timeout)
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=key or "unused", max_retries=0, timeout=self.timeout)


@dataclass
class Item:
    """One recorded model call to send: the original run's ref, agent and node (or a dataset row)."""

    of: str
    node_id: str
    agent: str | None
    request: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.of}#{self.node_id}"


@dataclass
class ExperimentResult:
    """What ``run_experiment`` did: counts and the candidate run of every item (its ref, or the error)."""

    name: str
    selected: int = 0
    answered: int = 0
    failed: int = 0
    skipped: int = 0
    runs: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "selected": self.selected, "answered": self.answered, "failed": self.failed,
                "skipped": self.skipped, "runs": self.runs}


def check_name(name: str) -> str:
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ExperimentError(f"experiment name {name!r}: use letters, digits, '-', '_' or '.'")
    return name


def node_request(node: Node, candidate: Candidate | None = None) -> dict[str, Any]:
    """The recorded chat request (messages, tools, settings) with the candidate's overrides applied."""
    request = recorded_request(node)
    for attr, key in SETTINGS.items():
        value = node.attributes.get(attr)
        if value is not None:
            request[key] = value
    return apply_overrides(request, candidate)


def apply_overrides(request: dict[str, Any], candidate: Candidate | None) -> dict[str, Any]:
    request = dict(request)
    if candidate is None:
        return request
    request["model"] = candidate.model
    if candidate.temperature is not None:
        request["temperature"] = candidate.temperature
    if candidate.system_prompt is not None:
        rest = [m for m in request.get("messages") or [] if m.get("role") not in ("system", "developer")]
        request["messages"] = [{"role": "system", "content": candidate.system_prompt}, *rest]
    return request


def experiment_refs(tapes: Any, name: str | None = None) -> dict[str, dict[str, Any]]:
    """Every experiment run (of ``name``, or of all experiments): ref -> its name, original and node."""
    where, params = "node_type = 'run' AND json_extract_string(attributes, ?) IS NOT NULL", [f'$."{EXPERIMENT_NAME}".s']
    if name is not None:
        where += " AND json_extract_string(attributes, ?) = ?"
        params += [f'$."{EXPERIMENT_NAME}".s', name]
    rows = tapes.reader.query(
        "SELECT run_id, trace_id, start_time_unix_nano AS start_ns, "
        f"json_extract_string(attributes, '$.\"{EXPERIMENT_NAME}\".s') AS name, "
        f"json_extract_string(attributes, '$.\"{EXPERIMENT_OF}\".s') AS of, "
        f"json_extract_string(attributes, '$.\"{EXPERIMENT_NODE}\".s') AS node, "
        f"json_extract_string(attributes, '$.\"{EXPERIMENT_MODEL}\".s') AS model, "
        f"json_extract_string(attributes, '$.\"{EXPERIMENT_KIND}\".s') AS kind "
        f"FROM spans WHERE {where} ORDER BY start_time_unix_nano", params).to_pylist()
    return {f"{r['run_id']}@{r['trace_id']}": r for r in rows}


def select_items(tapes: Any, *, refs: Sequence[str] = (), filters: dict[str, Any] | None = None,
                 dataset: str | os.PathLike[str] | None = None, limit: int = 1000) -> list[Item]:
    """The recorded model calls an experiment sends: those of the runs named or matched (experiment runs
    excluded), or the rows of a dataset file (``agenttape dataset`` JSONL, or lines with a ``ref``)."""
    if dataset is not None:
        return _dataset_items(tapes, dataset)
    chosen = list(refs)
    if not chosen:
        mine = experiment_refs(tapes)
        page = tapes.runs(limit=limit + len(mine), **{k: v for k, v in (filters or {}).items() if v is not None})
        chosen = [r.ref for r in page.runs if r.ref not in mine][:limit]
    from .rebuild import iter_runs

    full = [r if "@" in r else tapes.locate(r) for r in chosen]
    built = {run.ref: run for run in iter_runs(tapes.reader, full)}  # traces loaded in batches, not one by one
    items: list[Item] = []
    for ref in full:
        run = built.get(ref) or tapes.rebuild(ref)  # not in the batch: rebuild says why (RunNotFound)
        for node in run.model_nodes:
            if node.prompt:
                items.append(Item(run.ref, node.span_id, run.agent, node_request(node)))
    return items


def _dataset_items(tapes: Any, dataset: str | os.PathLike[str]) -> list[Item]:
    path = Path(dataset)
    items: list[Item] = []
    for n, row in jsonl_rows(path, "dataset", ExperimentError):
        if isinstance(row, dict) and row.get("ref"):
            items += select_items(tapes, refs=[str(row["ref"])])
            continue
        messages = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(messages, list) or not messages:
            raise ExperimentError(f"{path}:{n}: needs \"messages\" (a chat example) or \"ref\" (a run)")
        if messages[-1].get("role") == "assistant":  # a fine-tuning example: the prompt is what precedes the answer
            messages = messages[:-1]
        request: dict[str, Any] = {"model": None, "messages": messages}
        if row.get("tools"):
            request["tools"] = row["tools"]
        items.append(Item(f"dataset:{path.name}", f"line-{n}", None, request))
    return items


def default_endpoint(source: Any) -> str:
    """Where experiment runs are exported: the receiver serving ``source`` (its discovery file), else
    ``$OTEL_EXPORTER_OTLP_ENDPOINT``, else the local receiver's default."""
    if isinstance(source, (str, os.PathLike)) and not str(source).startswith(("http://", "https://")):
        from ..store.readers import discovery_path

        try:
            info = json.loads(discovery_path(source).read_text(encoding="utf-8"))
            if isinstance(info, dict) and info.get("url"):
                return str(info["url"])
        except (OSError, ValueError):
            pass
    elif isinstance(source, str):
        return source.rstrip("/")
    return os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT


def default_journal(name: str) -> Path:
    """``$AGENTTAPE_EXPERIMENTS`` (default ``./.agenttape/experiments``) / NAME.sqlite."""
    folder = Path(os.environ.get("AGENTTAPE_EXPERIMENTS") or ".agenttape/experiments")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.sqlite"


def _response_dict(response: Any) -> Any:
    return response.model_dump() if hasattr(response, "model_dump") else response


def _error_text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Progress:
    """One line on stderr, rewritten in place, only when stderr is a terminal."""

    def __init__(self, name: str, total: int, stream: IO[str] | None) -> None:
        self.name, self.total = name, total
        self.stream = stream if stream is not None else (sys.stderr if sys.stderr.isatty() else None)
        self.done = self.failed = 0
        self._lock = threading.Lock()

    def tick(self, ok: bool) -> None:
        with self._lock:
            self.done += 1
            self.failed += 0 if ok else 1
            if self.stream is not None:
                width = 30
                filled = int(width * self.done / max(1, self.total))
                self.stream.write(f"\r{self.name} [{'#' * filled}{'.' * (width - filled)}] "
                                  f"{self.done}/{self.total} failed {self.failed}")
                self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.total:
            self.stream.write("\n")
            self.stream.flush()


def record_answer(tape: Any, name: str, item: Item, candidate: Candidate, client: Any, *,
                  run_id: str) -> tuple[str, str | None]:
    """Send one item's request to the candidate and record it as a run of its own: (run id, error or None)."""
    request = apply_overrides(item.request, candidate)
    params = {k: v for k, v in request.items() if k not in ("model", "messages", "tools")}
    attributes = {EXPERIMENT_NAME: name, EXPERIMENT_OF: item.of, EXPERIMENT_NODE: item.node_id,
                  EXPERIMENT_MODEL: candidate.model, EXPERIMENT_KIND: "node"}
    error: str | None = None
    try:
        with tape.run(agent=item.agent, run_id=run_id, input=request["messages"], model=candidate.model,
                      attributes=attributes) as run:
            if candidate.provider == "anthropic":
                run.set_output(_ask_anthropic(run, request, candidate, client))
                return run_id, None
            with run.model_call(model=candidate.model, messages=request["messages"], provider="openai",
                                tools=request.get("tools"), **params) as call:
                raw = _ask_openai(client, request)
                call.finish(raw=raw)
            choices = raw.get("choices") if isinstance(raw, dict) else None
            if choices:
                run.set_output((choices[0].get("message") or {}).get("content") or "")
    except Exception as exc:  # recorded on the run as its error; the experiment goes on
        error = _error_text(exc)
    return run_id, error


def _ask_openai(client: Any, request: dict[str, Any]) -> Any:
    """The candidate's answer as the JSON it sent. An ``openai.OpenAI`` client posts the recorded request
    as it is (it is JSON already) and the answer is read as JSON: the SDK's request transform and response
    models cost about 2 ms of CPU a call, which its other workers wait for; its auth, timeouts and errors
    still apply. Any other client is asked through ``chat.completions.create``."""
    try:
        import httpx
        import openai
    except ImportError:  # pragma: no cover - openai is what make_client builds
        openai = None  # type: ignore[assignment]
    if openai is not None and isinstance(client, openai.OpenAI):
        return client.post("/chat/completions", body=request, cast_to=httpx.Response).json()
    return _response_dict(client.chat.completions.create(**request))


def _ask_anthropic(run: Any, request: dict[str, Any], candidate: Candidate, client: Any) -> str:
    """The request converted to the Messages API, sent, and recorded as Claude was asked (system, messages,
    tools as sent; the Message as the raw response): the answer's text."""
    from .experiment_anthropic import to_anthropic

    params = to_anthropic(request)
    settings = {k: params[k] for k in ("max_tokens", "temperature", "top_p") if k in params}
    with run.model_call(model=candidate.model, messages=params["messages"], provider="anthropic",
                        system=params.get("system"), tools=params.get("tools"), **settings) as call:
        raw = _response_dict(client.messages.create(**params))
        call.finish(raw=raw)
    blocks = raw.get("content") if isinstance(raw, dict) else None
    return "".join(b.get("text") or "" for b in blocks or [] if isinstance(b, dict) and b.get("type") == "text")


def run_experiment(source: Any, name: str, candidate: Candidate, *, refs: Sequence[str] = (),
                   filters: dict[str, Any] | None = None, dataset: str | os.PathLike[str] | None = None,
                   endpoint: str | None = None, journal: str | os.PathLike[str] | None = None,
                   concurrency: int = 4, limit: int = 1000, progress: IO[str] | None = None,
                   tape: Any = None, seal: bool = True) -> ExperimentResult:
    """Send every selected recorded model call to ``candidate`` and record each answer as a sealed run.

    Items the journal holds as answered are skipped; failed ones are sent again. ``tape`` (a capture Tape)
    replaces the OTLP export to ``endpoint``; ``progress``: where the progress line goes (default stderr
    when it is a terminal)."""
    import otel_agenttape

    check_name(name)
    with otel_agenttape.open(source) as tapes:
        items = select_items(tapes, refs=refs, filters=filters, dataset=dataset, limit=limit)
    result = ExperimentResult(name, selected=len(items))
    if not items:
        return result
    client = candidate.make_client()
    own_tape = tape is None
    if own_tape:
        tape = otel_agenttape.setup(endpoint=endpoint or default_endpoint(source), protocol="http/protobuf",
                                    service_name=EXPERIMENT_SERVICE, seal=seal)
    book = Journal(journal or default_journal(name), durability="process")
    settings = candidate.settings()
    done = {e.request_hash: e for e in book.load(name)}
    todo: list[tuple[Item, str, int]] = []
    for item in items:
        h = request_hash({"item": item.key, "candidate": settings})
        entry = done.get(h)
        if entry is not None and entry.state == COMMITTED:
            result.skipped += 1
            result.runs.append({"of": item.of, "node": item.node_id, "run": (entry.result or {}).get("ref"),
                                "skipped": True})
            continue
        attempt = int((entry.extra or {}).get("attempt", 0)) + 1 if entry is not None else 1
        todo.append((item, h, attempt))
    bar = _Progress(name, len(todo), progress)
    lock = threading.Lock()

    def one(job: tuple[Item, str, int]) -> None:
        item, h, attempt = job
        run_id = f"exp-{h[:16]}-{attempt}"
        _, error = record_answer(tape, name, item, candidate, client, run_id=run_id)
        entry = Entry(tape=name, kind=JOURNAL_KIND, request_hash=h, occurrence=0, position=0,
                      request={"of": item.of, "node": item.node_id}, name=item.key,
                      state=FAILED if error else COMMITTED, result={"run_id": run_id},
                      error={"message": error} if error else None, extra={"attempt": attempt})
        book.put(entry, sync=False)
        with lock:
            result.failed += bool(error)
            result.answered += not error
            result.runs.append({"of": item.of, "node": item.node_id, "run_id": run_id, "error": error})
        bar.tick(not error)

    try:
        with ThreadPoolExecutor(max_workers=max(1, int(concurrency))) as pool:
            list(pool.map(one, todo))
    finally:
        bar.close()
        book.close()
        if own_tape:
            tape.force_flush()
            tape.shutdown()
    return result


def experiment_list(tapes: Any) -> list[dict[str, Any]]:
    """One row per experiment: its name, kind, candidate models, runs, originals covered, first/last start."""
    by: dict[str, dict[str, Any]] = {}
    for ref, row in experiment_refs(tapes).items():
        e = by.setdefault(row["name"], {"name": row["name"], "kind": row["kind"] or "node", "models": [], "runs": 0,
                                        "originals": set(), "first_ns": row["start_ns"], "last_ns": row["start_ns"]})
        e["runs"] += 1
        e["originals"].add(row["of"])
        if row["model"] and row["model"] not in e["models"]:
            e["models"].append(row["model"])
        e["first_ns"], e["last_ns"] = min(e["first_ns"], row["start_ns"]), max(e["last_ns"], row["start_ns"])
    return [{**e, "originals": len(e["originals"])} for e in sorted(by.values(), key=lambda e: -e["last_ns"])]


def latest_per_node(rows: Iterable[tuple[str, dict[str, Any]]]) -> dict[tuple[str, str], str]:
    """(original ref, node) -> the newest experiment run's ref: a retried item's last attempt wins."""
    out: dict[tuple[str, str], tuple[int, str]] = {}
    for ref, row in rows:
        key = (row["of"], row["node"] or "")
        if key not in out or row["start_ns"] >= out[key][0]:
            out[key] = (row["start_ns"], ref)
    return {k: v[1] for k, v in out.items()}


def wait_for_runs(tapes: Any, name: str, count: int, timeout: float = 10.0,
                  sleep: Callable[[float], None] = time.sleep) -> int:
    """Poll until ``count`` experiment runs of ``name`` are readable (export is asynchronous): how many are."""
    deadline = time.monotonic() + timeout
    while True:
        n = len(experiment_refs(tapes, name))
        if n >= count or time.monotonic() > deadline:
            return n
        sleep(0.05)
