"""Resume index rules: hits and misses, repeats, reordering, nondeterminism, divergence, streams."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from otel_agenttape.resume import (
    DivergenceError,
    Recorded,
    ResumableModelClient,
    ResumableToolExecutor,
    ResumeIndex,
    UnrecordedCallError,
)
from otel_agenttape.resume.errors import RecordedToolError


class FakeModel:
    """Counts real calls; every answer carries a fresh counter so replays are distinguishable."""

    def __init__(self) -> None:
        self.calls = 0

    def create(self, request):
        self.calls += 1
        return {"text": f"answer {self.calls} to {request['messages'][-1]['content']}"}

    def stream(self, request):
        self.calls += 1
        for piece in ("al", "pha", f" {self.calls}"):
            yield piece


class Tools:
    def __init__(self) -> None:
        self.effects: list[tuple] = []

    def mapping(self):
        def send(to: str, body: str) -> dict:
            self.effects.append(("send", to, body))
            return {"sent": len(self.effects)}

        def charge(amount: int) -> int:
            self.effects.append(("charge", amount))
            return len(self.effects)

        def fail(x: int) -> None:
            self.effects.append(("fail", x))
            raise ValueError(f"bad {x}")

        return {"send": send, "charge": charge, "fail": fail}


def run_agent(index: ResumeIndex, model: FakeModel, tools: Tools) -> list:
    m = ResumableModelClient(model, index)
    t = ResumableToolExecutor(tools.mapping(), index)
    out = []
    for step in range(3):
        out.append(m.create({"model": "m", "messages": [{"role": "user", "content": f"step {step}"}]}))
        out.append(t.execute("send", {"to": "a", "body": f"b{step}"}))
    out.append(t.execute("charge", {"amount": 5}))
    out.append(t.execute("charge", {"amount": 5}))  # identical repeated side effect
    return out


def test_second_run_makes_zero_real_calls(tmp_path):
    model, tools = FakeModel(), Tools()
    index = ResumeIndex("run-1")
    first = run_agent(index, model, tools)
    assert (model.calls, len(tools.effects)) == (3, 5)
    assert (index.model_misses, index.tool_misses, index.model_hits, index.tool_hits) == (3, 5, 0, 0)
    path = tmp_path / "resume.json"
    index.save_json(path)

    loaded = ResumeIndex.load_json(path)
    second = run_agent(loaded, model, tools)
    assert second == first
    assert (model.calls, len(tools.effects)) == (3, 5)
    assert (loaded.model_hits, loaded.tool_hits, loaded.model_misses, loaded.tool_misses) == (3, 5, 0, 0)


def test_missing_json_file_loads_empty(tmp_path):
    index = ResumeIndex.load_json(tmp_path / "nope.json")
    assert len(index) == 0


def test_remove_last_model_entry_reruns_only_the_last_model_step():
    model, tools = FakeModel(), Tools()
    index = ResumeIndex("r")
    run_agent(index, model, tools)
    removed = index.remove_last_model_entry()
    assert removed is not None and "step 2" in str(removed.request)
    index.reset_run()
    run_agent(index, model, tools)
    assert model.calls == 4 and index.model_hits == 2 and index.model_misses == 1
    assert len(tools.effects) == 5  # no side effect repeated


def test_identical_calls_run_n_times_and_replay_in_order():
    tools = Tools()
    index = ResumeIndex("r")
    t = ResumableToolExecutor(tools.mapping(), index)
    first = [t.execute("charge", {"amount": 5}) for _ in range(4)]
    assert first == [1, 2, 3, 4] and len(tools.effects) == 4
    index.reset_run()
    assert [t.execute("charge", {"amount": 5}) for _ in range(4)] == [1, 2, 3, 4]
    assert len(tools.effects) == 4
    # a fifth identical call is new work, not a replay of an earlier one
    assert t.execute("charge", {"amount": 5}) == 5


async def test_parallel_calls_finishing_in_another_order_still_match():
    effects = []

    async def work(name: str, delay: float) -> str:
        await asyncio.sleep(delay)
        effects.append(name)
        return f"done {name}"

    index = ResumeIndex("r")
    t = ResumableToolExecutor({"work": work}, index)
    r1 = await asyncio.gather(t.aexecute("work", {"name": "a", "delay": 0.02}),
                              t.aexecute("work", {"name": "b", "delay": 0.0}))
    assert effects == ["b", "a"]
    index.reset_run()
    # replay starts them in the other order: no divergence, all hits
    r2 = await asyncio.gather(t.aexecute("work", {"name": "b", "delay": 0.0}),
                              t.aexecute("work", {"name": "a", "delay": 0.02}))
    assert r2 == list(reversed(r1)) and index.tool_hits == 2 and effects == ["b", "a"]


async def test_identical_parallel_calls_finishing_out_of_order_replay_by_occurrence():
    """Two identical calls in flight at once: each keeps the result of its own occurrence (start
    order), even though the second finished first, and a replay makes no real call."""
    finished = []
    delays = iter([0.03, 0.0])  # the first started finishes last

    async def tick(label: str) -> int:
        await asyncio.sleep(next(delays))
        finished.append(label)
        return len(finished)  # 2 for the first started, 1 for the second

    index = ResumeIndex("r")
    t = ResumableToolExecutor({"tick": tick}, index)
    first = await asyncio.gather(t.aexecute("tick", {"label": "x"}), t.aexecute("tick", {"label": "x"}))
    assert first == [2, 1] and index.tool_misses == 2
    index.reset_run()
    again = await asyncio.gather(t.aexecute("tick", {"label": "x"}), t.aexecute("tick", {"label": "x"}))
    assert again == [2, 1] and index.tool_hits == 2 and len(finished) == 2


def test_timestamped_prompt_resumes_with_all_hits(tmp_path):
    model = FakeModel()
    journal = tmp_path / "j.sqlite"

    def agent(index: ResumeIndex) -> list:
        rec = Recorded(index)
        m = ResumableModelClient(model, index)
        out = []
        for step in range(5):
            system = f"Now: {rec.now()} request id {rec.uuid()} r={rec.random()}"
            out.append(m.create({"messages": [{"role": "system", "content": system},
                                              {"role": "user", "content": f"s{step}"}]}))
        return out

    first_index = ResumeIndex("t", journal=journal)
    first = agent(first_index)
    first_index.close()
    resumed = ResumeIndex("t", journal=journal)
    assert agent(resumed) == first
    assert resumed.model_hits == 5 and resumed.model_misses == 0 and model.calls == 5

    # without the recorded helpers the resumed prompt differs: no hit, a divergence instead
    import time
    import uuid
    plain = ResumeIndex("t2")
    m = ResumableModelClient(model, plain)
    m.create({"messages": [{"role": "system", "content": f"{time.time()} {uuid.uuid4()}"}]})
    plain.reset_run()
    with pytest.raises(DivergenceError):
        m.create({"messages": [{"role": "system", "content": f"{time.time()} {uuid.uuid4()}"}]})
    assert plain.model_hits == 0


def test_model_divergence_raises_with_diff():
    model = FakeModel()
    index = ResumeIndex("r")
    m = ResumableModelClient(model, index)
    m.create({"messages": [{"role": "user", "content": "hello"}], "temperature": 0})
    m.create({"messages": [{"role": "user", "content": "second"}]})
    index.reset_run()
    m.create({"messages": [{"role": "user", "content": "hello"}], "temperature": 0})
    with pytest.raises(DivergenceError) as err:
        m.create({"messages": [{"role": "user", "content": "something else"}]})
    assert err.value.kind == "model" and err.value.position == 1
    assert '-      "content": "second"' in err.value.diff
    assert '+      "content": "something else"' in err.value.diff
    assert model.calls == 2  # never ran silently


def test_tool_divergence_by_call_id_and_position():
    tools = Tools()
    index = ResumeIndex("r")
    t = ResumableToolExecutor(tools.mapping(), index)
    t.execute("send", {"to": "a", "body": "x"}, call_id="call_1")
    t.execute("charge", {"amount": 1})
    index.reset_run()
    with pytest.raises(DivergenceError) as err:
        t.execute("send", {"to": "b", "body": "x"}, call_id="call_1")
    assert '"to": "b"' in err.value.diff
    index.reset_run()
    t.execute("send", {"to": "a", "body": "x"}, call_id="call_1")
    with pytest.raises(DivergenceError):
        t.execute("charge", {"amount": 2})
    assert len(tools.effects) == 2


def test_replay_only_fails_on_unrecorded_call():
    model = FakeModel()
    rec = ResumeIndex("r")
    ResumableModelClient(model, rec).create({"messages": [{"role": "user", "content": "a"}]})
    replay = ResumeIndex("r", entries=rec.entries(), replay_only=True)
    m = ResumableModelClient(model, replay)
    m.create({"messages": [{"role": "user", "content": "a"}]})
    with pytest.raises(UnrecordedCallError):
        m.create({"messages": [{"role": "user", "content": "b"}]})
    assert model.calls == 1


def test_tapes_do_not_leak_into_each_other():
    model = FakeModel()
    a = ResumeIndex("run-a")
    ResumableModelClient(model, a).create({"messages": [{"role": "user", "content": "q"}]})
    b = ResumeIndex("run-b", entries=a.entries())
    ResumableModelClient(model, b).create({"messages": [{"role": "user", "content": "q"}]})
    assert model.calls == 2 and b.model_misses == 1


def test_streaming_hit_replays_deltas_then_terminal_result():
    model = FakeModel()
    index = ResumeIndex("r")
    m = ResumableModelClient(model, index)
    s = m.stream({"messages": [{"role": "user", "content": "stream"}]})
    live = list(s)
    assert live == ["al", "pha", " 1"] and s.result == "alpha 1" and not s.replayed
    index.reset_run()
    seen = []
    s2 = m.stream({"messages": [{"role": "user", "content": "stream"}]})
    for d in s2:
        seen.append(d)
        assert s2.result is None  # the terminal result comes after every delta
    assert seen == live and s2.result == "alpha 1" and s2.replayed and model.calls == 1


async def test_async_client_and_stream():
    class AsyncModel:
        calls = 0

        async def acreate(self, request):
            AsyncModel.calls += 1
            return {"n": AsyncModel.calls}

        async def astream(self, request):
            AsyncModel.calls += 1
            for p in ("x", "y"):
                yield p

    index = ResumeIndex("r")
    m = ResumableModelClient(AsyncModel(), index)
    assert await m.acreate({"q": 1}) == {"n": 1}
    s = m.astream({"q": 2})
    assert [d async for d in s] == ["x", "y"] and s.result == "xy"
    index.reset_run()
    assert await m.acreate({"q": 1}) == {"n": 1}
    s = m.astream({"q": 2})
    assert [d async for d in s] == ["x", "y"] and s.replayed
    assert AsyncModel.calls == 2 and index.model_hits == 2


def test_tool_failure_is_recorded_and_replayed():
    tools = Tools()
    index = ResumeIndex("r")
    t = ResumableToolExecutor(tools.mapping(), index)
    with pytest.raises(ValueError):
        t.execute("fail", {"x": 1})
    index.reset_run()
    with pytest.raises(RecordedToolError, match="bad 1"):
        t.execute("fail", {"x": 1})
    assert len(tools.effects) == 1


def test_counters_are_per_node_type():
    model, tools = FakeModel(), Tools()
    index = ResumeIndex("r")
    run_agent(index, model, tools)
    assert index.counters["model"] == {"hits": 0, "misses": 3}
    assert index.counters["tool"] == {"hits": 0, "misses": 5}
    index.reset_run()
    run_agent(index, model, tools)
    assert index.counters["model"] == {"hits": 3, "misses": 0}
    assert index.counters["tool"] == {"hits": 5, "misses": 0}


def test_keys_are_independent_of_dict_order():
    index = ResumeIndex("r")
    calls = itertools.count()
    m = ResumableModelClient(lambda req: next(calls), index)
    m.create({"a": 1, "b": [1, 2]})
    index.reset_run()
    assert m.create({"b": [1, 2], "a": 1}) == 0 and index.model_hits == 1
