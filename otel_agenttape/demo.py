"""The demo: a scripted, offline multi-agent program recorded through the capture API.

A coordinator plans with a (scripted) model, hands work to two specialists (child runs), and writes
the answer. On the way it shows every kind of node the tape records: streamed output, reasoning, a
model call that is retried after a transient error, parallel tool calls, and a tool that fails.

The agent code takes its model client and tools as arguments, so the same code runs against the
scripted model (``ScriptedModel``), or offline from a recording (``ReplayModelClient`` and
``ReplayToolExecutor`` from ``otel_agenttape.tape.cassette``): the cassette test re-runs it that way.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# The scripted model answers with the replay's result type, so the agent code reads a scripted, a replayed
# (``ReplayModelClient``) and a recorded answer alike.
from otel_agenttape.tape.replay import ModelResult

MODEL = "demo-model-1"
PROVIDER = "demo"
QUESTION = "Should our team adopt OpenTelemetry for agent traces?"


class TransientModelError(RuntimeError):
    """A retryable provider error (the scripted model raises it once, to show a retry)."""


class _Stream:
    def __init__(self, result: ModelResult) -> None:
        self._result = result
        self.result: ModelResult | None = None

    def __iter__(self) -> Iterator[str]:
        yield from self._result.deltas
        self.result = self._result


def _chunks(text: str, size: int = 12) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def _raw(text: str, tool_calls: list[dict[str, Any]], prompt_tokens: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if tool_calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], sort_keys=True)}}
            for c in tool_calls
        ]
    return {
        "id": f"demo-{prompt_tokens}",
        "model": MODEL,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max(1, len(text) // 4),
                  "total_tokens": prompt_tokens + max(1, len(text) // 4)},
    }


class ScriptedModel:
    """A deterministic offline model: answers depend only on the request, like a recorded model."""

    def __init__(self) -> None:
        self._failed_once: set[str] = set()

    def stream(self, request: dict[str, Any]) -> _Stream:
        return _Stream(self._answer(request))

    def create(self, request: dict[str, Any]) -> ModelResult:
        return self._answer(request)

    def _answer(self, request: dict[str, Any]) -> ModelResult:
        messages = request["messages"]
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        last = messages[-1]
        prompt_tokens = sum(len(str(m.get("content") or "")) for m in messages) // 4 + 1
        if "researcher" in system and last["role"] == "user":
            calls = [
                {"id": "call_search_1", "name": "web_search", "arguments": {"query": "OpenTelemetry GenAI semantic conventions"}},
                {"id": "call_search_2", "name": "web_search", "arguments": {"query": "OTLP collector load balancing"}},
                {"id": "call_fetch_1", "name": "fetch_page", "arguments": {"url": "https://example.invalid/otel"}},
            ]
            text, reasoning = "", "I need sources first: two searches and one page, in parallel."
        elif "researcher" in system:
            text = ("Findings: the GenAI conventions name model and tool spans (gen_ai.*), OTLP ships "
                    "them to any backend, and a collector can route by trace id. One source was unreachable.")
            calls, reasoning = [], "Two of three sources answered; enough to summarise."
        elif "critic" in system:
            key = json.dumps(messages, sort_keys=True)
            if key not in self._failed_once:
                self._failed_once.add(key)
                raise TransientModelError("429 rate limited (scripted)")
            text = "Risks: payload size limits and content capture must be opt-in; both are manageable."
            calls, reasoning = [], "Weigh the findings against operational risk."
        elif last["role"] == "user" and " says: " not in str(last.get("content")):
            text = "Plan: ask the researcher for facts and the critic for risks, then decide."
            calls, reasoning = [], "Split the question into facts and risks."
        else:
            text = ("Recommendation: adopt OpenTelemetry for agent traces. It is vendor-neutral, the GenAI "
                    "conventions cover model and tool calls, and the risks are manageable.")
            calls, reasoning = [], "Both specialists agree; write the decision."
        return ModelResult(text=text, raw=_raw(text, calls, prompt_tokens), tool_calls=calls,
                          reasoning=reasoning, deltas=_chunks(text))


def demo_tools() -> dict[str, Any]:
    """The specialists' tools: two that answer, one that fails."""

    def web_search(query: str) -> dict[str, Any]:
        return {"query": query, "results": [f"{query}: overview", f"{query}: reference"]}

    def fetch_page(url: str) -> str:
        raise ConnectionError(f"could not reach {url}")

    return {"web_search": web_search, "fetch_page": fetch_page}


class _ToolRunner:
    """Adapts a dict of functions to the executor interface the cassette also offers."""

    def __init__(self, tools: dict[str, Any]) -> None:
        self.tools = tools

    def execute(self, name: str, arguments: Any = None, *, call_id: str | None = None) -> Any:
        return self.tools[name](**(arguments or {}))


def _model_step(run: Any, model: Any, messages: list[dict[str, Any]], *, retries: int = 2) -> Any:
    """One model node: stream deltas, record reasoning, retry transient errors, finish with usage."""
    request = {"model": MODEL, "messages": messages}
    with run.model_call(model=MODEL, messages=messages, provider=PROVIDER, temperature=0.0) as call:
        for attempt in range(retries + 1):
            try:
                stream = model.stream(request)
                for delta in stream:
                    call.delta(delta)
                result = stream.result
                break
            except TransientModelError as exc:
                if attempt == retries:
                    raise
                call.retry(exc)
        if result.reasoning:
            call.reasoning(result.reasoning)
        call.finish(raw=result.raw, tool_calls=result.tool_calls or None)
        return result


def _specialist(run: Any, model: Any, tools: Any, role: str, task: str) -> str:
    system = {"role": "system", "content": f"You are the {role}. Be brief."}
    messages: list[dict[str, Any]] = [system, {"role": "user", "content": task}]
    result = _model_step(run, model, messages)
    if result.tool_calls:
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], sort_keys=True)}}
            for c in result.tool_calls]})

        def one(call: dict[str, Any]) -> dict[str, Any]:
            try:
                with run.tool_call(call["name"], call["arguments"], call_id=call["id"]) as tool:
                    value = tools.execute(call["name"], call["arguments"], call_id=call["id"])
                    tool.result(value)
                    content = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
            except Exception as exc:  # a failing tool is reported to the model, not fatal
                content = f"error: {type(exc).__name__}: {exc}"
            return {"role": "tool", "tool_call_id": call["id"], "content": content}

        with ThreadPoolExecutor(max_workers=len(result.tool_calls)) as pool:
            futures = [pool.submit(contextvars.copy_context().run, one, c) for c in result.tool_calls]
            messages.extend(f.result() for f in futures)
        result = _model_step(run, model, messages)
    run.set_output(result.text)
    return result.text


def run_demo_agents(tape: Any, model: Any | None = None, tools: Any | None = None,
                    *, session_id: str = "demo-session") -> dict[str, Any]:
    """Run the coordinator and its two specialists; returns the run ids and every agent's output."""
    model = model if model is not None else ScriptedModel()
    tools = tools if tools is not None else _ToolRunner(demo_tools())
    outputs: dict[str, Any] = {}
    with tape.run(agent="coordinator", session_id=session_id, input=QUESTION) as run:
        system = {"role": "system", "content": "You are the coordinator. Delegate, then decide."}
        messages: list[dict[str, Any]] = [system, {"role": "user", "content": QUESTION}]
        plan = _model_step(run, model, messages)
        messages.append({"role": "assistant", "content": plan.text})
        children: dict[str, str] = {}
        for role, task in (("researcher", "Collect facts about OpenTelemetry for agents."),
                           ("critic", "List the risks of adopting OpenTelemetry for agents.")):
            with run.child(agent=role, input=task) as child:
                outputs[role] = _specialist(child, model, tools, role, task)
                children[role] = child.run_id
            messages.append({"role": "user", "content": f"{role} says: {outputs[role]}"})
        final = _model_step(run, model, messages)
        run.set_output(final.text)
        outputs["coordinator"] = final.text
    return {"run_id": run.run_id, "children": children, "outputs": outputs}


def run_demo(db: str, *, out: Any = None, keep_going: bool = True) -> dict[str, Any]:
    """Start a receiver on free loopback ports, record the demo through the real OTLP exporter (with
    the outbox ``<db>.outbox``, or ``$AGENTTAPE_OUTBOX``), wait until every span is stored, and report
    what is in the store."""
    import sys
    import time

    from otel_agenttape.capture.setup import setup
    from otel_agenttape.receiver.server import TapeServer

    out = out or sys.stdout
    started = time.monotonic()
    server = TapeServer(db, host="127.0.0.1", http_port=0, grpc_port=0)
    server.start()
    try:
        import os

        # the outbox is on: a span the receiver cannot take now is kept next to the store and re-sent
        box = os.environ.get("AGENTTAPE_OUTBOX") or f"{db}.outbox"
        tape = setup(endpoint=f"http://127.0.0.1:{server.http_port}", protocol="http/protobuf",
                     service_name="agenttape-demo", outbox=box)
        try:
            result = run_demo_agents(tape)
            tape.force_flush(30000)
            tape.wait_delivered(30)
        finally:
            tape.shutdown()
        stats = tape.stats()
        if not server.wait_idle(60):
            raise RuntimeError("the receiver did not store every span within 60 s")
        runs = server.query(
            "SELECT run_id, agent, status, model_nodes, tool_nodes, input_tokens, output_tokens "
            "FROM runs ORDER BY start_time_unix_nano", None)
        spans = server.query("SELECT count(*) AS n FROM spans", None).column("n")[0].as_py()
    finally:
        server.stop()
    result["runs"] = runs.to_pylist()
    result["spans"] = spans
    result["capture_stats"] = stats
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


class DemoError(RuntimeError):
    """The demo cannot run on this store: a server holds it, or it cannot be written or read back."""


def record_demo(db: str) -> dict[str, Any]:
    """``run_demo`` into ``db`` (which no running server may hold), then read the store back as a user would:
    ``run_demo``'s report plus ``tree`` (the ``RunTree`` rebuilt from the store, no model call), ``tapes``
    (the verification reports of the demo's tape, or of every tape when none is the demo run's) and
    ``verified`` (every one of them valid). ``agenttape demo`` prints this."""
    from otel_agenttape.receiver.server import read_discovery
    from otel_agenttape.store.reader import StoreError, open_reader
    from otel_agenttape.tape.rebuild import reconstruct_tree
    from otel_agenttape.tape.verification import verify_store

    holder = read_discovery(db)
    if holder is not None:
        raise DemoError(f"cannot run the demo: {db} is in use by `agenttape serve` (pid {holder['pid']} at "
                        f"{holder.get('url')}); use another --db")
    try:
        result = run_demo(db)
    except (OSError, StoreError) as exc:
        raise DemoError(f"cannot run the demo: {exc}") from None
    try:
        reader = open_reader(db)
    except StoreError as exc:
        raise DemoError(str(exc)) from None
    try:
        tree = reconstruct_tree(reader, result["run_id"])
        reports = verify_store(reader)
    finally:
        reader.close()
    tapes = [r for r in reports if r.chain_id == result["run_id"]] or reports
    result.update(tree=tree, tapes=tapes, verified=bool(tapes) and all(r.valid for r in tapes))
    return result
