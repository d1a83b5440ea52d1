"""OpenAI and Anthropic SDK clients made resumable, against a fake server on 127.0.0.1."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

from resume_fakellm import FakeLLM  # noqa: E402

from otel_agenttape.resume import ResumeIndex  # noqa: E402
from otel_agenttape.resume.adapters import resumable_anthropic, resumable_openai  # noqa: E402


@pytest.fixture
def server():
    with FakeLLM() as s:
        yield s


def _openai(server, asynchronous=False):
    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return cls(api_key="test", base_url=server.url + "/v1", max_retries=0)


def _anthropic(server, asynchronous=False):
    cls = anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic
    return cls(api_key="test", base_url=server.url, max_retries=0)


MSGS = [{"role": "user", "content": "hi there"}]


def test_openai_chat_completions_replayed_without_a_request(server, tmp_path):
    index = ResumeIndex("t", journal=tmp_path / "j.sqlite")
    client = resumable_openai(_openai(server), index)
    first = client.chat.completions.create(model="gpt-x", messages=MSGS, temperature=0)
    again = client.chat.completions.create(model="gpt-x", messages=MSGS, temperature=0)  # 2nd occurrence
    assert len(server.requests) == 2 and first.choices[0].message.content != again.choices[0].message.content

    resumed = resumable_openai(_openai(server), ResumeIndex("t", journal=tmp_path / "j.sqlite"))
    r1 = resumed.chat.completions.create(model="gpt-x", messages=MSGS, temperature=0,
                                         extra_headers={"x-trace": "other"})
    r2 = resumed.chat.completions.create(model="gpt-x", messages=MSGS, temperature=0)
    assert isinstance(r1, openai.types.chat.ChatCompletion)
    assert r1.choices[0].message.content == first.choices[0].message.content
    assert r2.choices[0].message.content == again.choices[0].message.content
    assert len(server.requests) == 2
    assert resumed.models is client.models or resumed.models is not None  # pass-through attributes


def test_openai_chat_stream_replays_chunks(server):
    index = ResumeIndex("t")
    client = resumable_openai(_openai(server), index)
    live = client.chat.completions.create(model="m", messages=MSGS, stream=True)
    live_text = "".join(c.choices[0].delta.content or "" for c in live)
    assert live_text.startswith("reply 1:") and live.result["text"] == live_text
    index.reset_run()
    with client.chat.completions.create(model="m", messages=MSGS, stream=True) as replay:
        chunks = list(replay)
    assert all(isinstance(c, openai.types.chat.ChatCompletionChunk) for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == live_text
    assert len(chunks) > 2 and replay.replayed and len(server.requests) == 1


def test_openai_responses_create_and_stream(server):
    index = ResumeIndex("t")
    client = resumable_openai(_openai(server), index)
    resp = client.responses.create(model="m", input="question")
    events = list(client.responses.create(model="m", input="streamed", stream=True))
    assert resp.output_text.startswith("reply 1") and events[-1].type == "response.completed"
    index.reset_run()
    resp2 = client.responses.create(model="m", input="question")
    events2 = list(client.responses.create(model="m", input="streamed", stream=True))
    assert isinstance(resp2, openai.types.responses.Response) and resp2.output_text == resp.output_text
    assert [e.type for e in events2] == [e.type for e in events]
    assert [getattr(e, "delta", None) for e in events2] == [getattr(e, "delta", None) for e in events]
    assert len(server.requests) == 2


def test_anthropic_messages_create_and_stream(server):
    index = ResumeIndex("t")
    client = resumable_anthropic(_anthropic(server), index)
    msg = client.messages.create(model="claude-x", max_tokens=50, messages=MSGS)
    stream = client.messages.create(model="claude-x", max_tokens=50, messages=MSGS, stream=True)
    events = list(stream)
    assert msg.content[0].text.startswith("reply 1") and stream.result["text"].startswith("reply 2")
    index.reset_run()
    msg2 = client.messages.create(model="claude-x", max_tokens=50, messages=MSGS)
    stream2 = client.messages.create(model="claude-x", max_tokens=50, messages=MSGS, stream=True)
    events2 = list(stream2)
    assert isinstance(msg2, anthropic.types.Message) and msg2.content[0].text == msg.content[0].text
    assert [e.type for e in events2] == [e.type for e in events] and stream2.result == stream.result
    assert len(server.requests) == 2 and index.model_hits == 2


async def test_async_clients(server):
    index = ResumeIndex("t")
    oa = resumable_openai(_openai(server, asynchronous=True), index)
    an = resumable_anthropic(_anthropic(server, asynchronous=True), index)
    c = await oa.chat.completions.create(model="m", messages=MSGS)
    s = await oa.chat.completions.create(model="m", messages=MSGS, stream=True)
    text = "".join([ch.choices[0].delta.content or "" async for ch in s])
    m = await an.messages.create(model="c", max_tokens=5, messages=MSGS, stream=True)
    atext = "".join([e.delta.text async for e in m if e.type == "content_block_delta"])
    assert len(server.requests) == 3
    index.reset_run()
    c2 = await oa.chat.completions.create(model="m", messages=MSGS)
    s2 = await oa.chat.completions.create(model="m", messages=MSGS, stream=True)
    text2 = "".join([ch.choices[0].delta.content or "" async for ch in s2])
    m2 = await an.messages.create(model="c", max_tokens=5, messages=MSGS, stream=True)
    atext2 = "".join([e.delta.text async for e in m2 if e.type == "content_block_delta"])
    assert (c2.choices[0].message.content, text2, atext2) == (c.choices[0].message.content, text, atext)
    assert len(server.requests) == 3 and index.model_hits == 3


def test_changed_parameters_are_a_divergence(server):
    from otel_agenttape.resume import DivergenceError

    index = ResumeIndex("t")
    client = resumable_openai(_openai(server), index)
    client.chat.completions.create(model="m", messages=MSGS, temperature=0)
    index.reset_run()
    with pytest.raises(DivergenceError) as err:
        client.chat.completions.create(model="m", messages=MSGS, temperature=1)
    assert '"temperature": 0' in err.value.diff and len(server.requests) == 1


def test_sdk_calls_recorded_by_capture_resume_from_the_store(server):
    """OpenAI calls (plain and streamed) recorded through capture, rebuilt from the store, replayed."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otel_agenttape
    from otel_agenttape.store.writer import Store
    from otel_agenttape.tape.resume_index import build_resume_index

    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, seal=False)
    with tape.run(agent="sdk", run_id="sdk-run") as run:
        client = resumable_openai(_openai(server), ResumeIndex("sdk-run"), run=run)
        plain = client.chat.completions.create(model="m", messages=MSGS)
        chunks = list(client.chat.completions.create(model="m", messages=MSGS, stream=True))
    tape.shutdown()
    spans = exporter.get_finished_spans()
    texts = [e.attributes["agenttape.segment"] for s in spans for e in s.events if e.name == "agenttape.text"]
    assert "".join(texts) == "".join(c.choices[0].delta.content or "" for c in chunks)

    store = Store(None)
    store.write_traces([encode_spans(spans)])
    index = build_resume_index(store.reader(), "sdk-run")
    replay = resumable_openai(_openai(server), index)
    again = replay.chat.completions.create(model="m", messages=MSGS)
    chunks2 = list(replay.chat.completions.create(model="m", messages=MSGS, stream=True))
    assert again.choices[0].message.content == plain.choices[0].message.content
    assert [type(c) for c in chunks2] == [type(c) for c in chunks]
    assert [(c.id, c.choices[0].delta.content, c.choices[0].finish_reason) for c in chunks2] == [
        (c.id, c.choices[0].delta.content, c.choices[0].finish_reason) for c in chunks]
    assert len(server.requests) == 2 and index.model_hits == 2
