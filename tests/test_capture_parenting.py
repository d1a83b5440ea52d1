"""A node of a run is a child of its run span, in its trace, whatever context the calling thread or
task has; nested calls inside a node, in the node's context, keep parenting to the node."""

from __future__ import annotations

import asyncio
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agenttape
from otel_agenttape import semconv as sc


@pytest.fixture
def cap(monkeypatch):
    monkeypatch.setitem(sys.modules, "otel_agenttape.capture.sealing", None)
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter)
    yield tape, exporter
    tape.shutdown()


def spans_of(tape, exporter):
    assert tape.force_flush()
    return exporter.get_finished_spans()


def one(spans, name):
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def assert_child(child, parent):
    assert child.context.trace_id == parent.context.trace_id
    assert child.parent is not None and child.parent.span_id == parent.context.span_id


def tool_with_nested_model(run, i):
    with run.tool_call(f"tool{i}", {"i": i}) as tool:
        with run.model_call(model=f"m{i}", messages=[{"role": "user", "content": str(i)}]) as call:
            call.finish(text=f"out{i}")
        tool.result(i)
    return i


def test_plain_thread_nodes_are_children_of_the_run(cap):
    tape, exporter = cap
    with tape.run(agent="threads") as run:
        worker = threading.Thread(target=tool_with_nested_model, args=(run, 0))
        worker.start()
        worker.join()
    spans = spans_of(tape, exporter)
    root = one(spans, "invoke_agent threads")
    tool, chat = one(spans, "execute_tool tool0"), one(spans, "chat m0")
    assert_child(tool, root)
    assert_child(chat, tool)
    assert len({s.context.trace_id for s in spans}) == 1


def test_thread_pool_parallel_tool_calls_without_copied_context(cap):
    tape, exporter = cap
    with tape.run(agent="pool") as run:
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(lambda i: tool_with_nested_model(run, i), range(12)))
    assert results == list(range(12))
    spans = spans_of(tape, exporter)
    root = one(spans, "invoke_agent pool")
    for i in range(12):
        tool = one(spans, f"execute_tool tool{i}")
        assert_child(tool, root)
        assert_child(one(spans, f"chat m{i}"), tool)
        assert tool.attributes[sc.RUN_ID] == run.run_id
    assert len({s.context.trace_id for s in spans}) == 1


def test_leftover_context_of_another_run_is_ignored(cap):
    tape, exporter = cap
    with tape.run(agent="first") as first:
        leaked = otel_context.get_current()
    ready, go, done = threading.Event(), threading.Event(), threading.Event()
    holder = {}

    def worker():
        otel_context.attach(leaked)  # a context left attached in a pool thread (never detached)
        ready.set()
        go.wait(5)
        with holder["run"].tool_call("late", {}) as tool:
            tool.result("ok")
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    assert ready.wait(5)
    with tape.run(agent="second") as second:
        holder["run"] = second
        go.set()
        assert done.wait(5)
    thread.join()
    spans = spans_of(tape, exporter)
    assert_child(one(spans, "execute_tool late"), one(spans, "invoke_agent second"))
    assert first.run_id != second.run_id


def test_otel_context_carried_into_a_thread_keeps_the_node_parent(cap):
    tape, exporter = cap
    with tape.run(agent="carry") as run:
        with run.tool_call("outer", {}) as tool:
            ctx = otel_context.get_current()

            def inner():
                token = otel_context.attach(ctx)  # only the OTel context is propagated
                try:
                    with run.model_call(model="inner", messages="hi") as call:
                        call.finish(text="x")
                finally:
                    otel_context.detach(token)

            worker = threading.Thread(target=inner)
            worker.start()
            worker.join()
            tool.result("done")
    spans = spans_of(tape, exporter)
    assert_child(one(spans, "chat inner"), one(spans, "execute_tool outer"))


def test_foreign_span_inside_a_node_stays_the_parent(cap):
    tape, exporter = cap
    tracer = tape.tracer_provider.get_tracer("app")
    with tape.run(agent="foreign") as run:
        with run.tool_call("outer", {}) as tool:
            with tracer.start_as_current_span("http get"):
                with run.model_call(model="deep", messages="hi") as call:
                    call.finish(text="x")
            tool.result("done")
    spans = spans_of(tape, exporter)
    http = one(spans, "http get")
    assert_child(http, one(spans, "execute_tool outer"))
    assert_child(one(spans, "chat deep"), http)


def test_unrelated_current_span_in_a_thread_does_not_capture_the_node(cap):
    tape, exporter = cap
    tracer = tape.tracer_provider.get_tracer("app")

    with tape.run(agent="own") as run:
        def worker():
            with tracer.start_as_current_span("background job"):
                with run.tool_call("t", {}) as tool:
                    tool.result(1)

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    spans = spans_of(tape, exporter)
    assert_child(one(spans, "execute_tool t"), one(spans, "invoke_agent own"))
    assert one(spans, "background job").context.trace_id != one(spans, "invoke_agent own").context.trace_id


async def test_tasks_created_before_the_run_parent_to_the_run(cap):
    tape, exporter = cap
    queue: asyncio.Queue = asyncio.Queue()

    async def consumer():
        run, i = await queue.get()
        async with run.tool_call(f"tool{i}", {"i": i}) as tool:
            async with run.model_call(model=f"m{i}", messages="hi") as call:
                call.finish(text="x")
            tool.result(i)

    workers = [asyncio.create_task(consumer()) for _ in range(3)]
    await asyncio.sleep(0)
    async with tape.run(agent="async") as run:
        for i in range(3):
            queue.put_nowait((run, i))
        await asyncio.gather(*workers)
    spans = spans_of(tape, exporter)
    root = one(spans, "invoke_agent async")
    for i in range(3):
        tool = one(spans, f"execute_tool tool{i}")
        assert_child(tool, root)
        assert_child(one(spans, f"chat m{i}"), tool)


async def test_tasks_inside_a_node_parent_to_the_node(cap):
    tape, exporter = cap

    async def model(run, i):
        async with run.model_call(model=f"m{i}", messages="hi") as call:
            await asyncio.sleep(0)
            call.finish(text="x")

    async with tape.run(agent="fanout") as run:
        async with run.tool_call("fan", {}) as tool:
            await asyncio.gather(*(model(run, i) for i in range(4)))
            tool.result("ok")
    spans = spans_of(tape, exporter)
    fan = one(spans, "execute_tool fan")
    for i in range(4):
        assert_child(one(spans, f"chat m{i}"), fan)


def test_child_run_nodes_from_a_pool_parent_to_the_child_run(cap):
    tape, exporter = cap
    with tape.run(agent="coordinator") as run:
        with run.child("specialist") as child:
            with ThreadPoolExecutor(max_workers=2) as pool:
                list(pool.map(lambda i: tool_with_nested_model(child, i), range(2)))
    spans = spans_of(tape, exporter)
    specialist = one(spans, "invoke_agent specialist")
    assert_child(specialist, one(spans, "invoke_agent coordinator"))
    for i in range(2):
        assert_child(one(spans, f"execute_tool tool{i}"), specialist)


def test_parent_run_node_called_inside_child_context_goes_to_the_parent_run(cap):
    tape, exporter = cap
    with tape.run(agent="coordinator") as run:
        with run.child("specialist"):
            with run.tool_call("coord_tool", {}) as tool:
                tool.result(1)
    spans = spans_of(tape, exporter)
    assert_child(one(spans, "execute_tool coord_tool"), one(spans, "invoke_agent coordinator"))
    assert trace.get_current_span() is trace.INVALID_SPAN
