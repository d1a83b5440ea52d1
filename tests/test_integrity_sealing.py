"""The sealing processor: chain per tape, checkpoints, node consumer, threads, restore epochs."""

from __future__ import annotations

import threading

from integrity_support import encode, sealed_provider
from opentelemetry.sdk.trace import SpanProcessor

from otel_agenttape import semconv
from otel_agenttape.capture.sealing import SealingSpanProcessor
from otel_agenttape.integrity import (
    Signer,
    genesis,
    leaf_from_sdk,
    link_hash,
    open_note,
)
from otel_agenttape.integrity.checkpoint import (
    Checkpoint,
    origin_for,
    read_checkpoint_file,
)
from otel_agenttape.integrity.note import split_note
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.verification import verify_store


def _chained(spans):
    return [s for s in spans if semconv.CHAIN_SEQ in s.attributes]


def test_one_chain_per_root_run_named_by_its_run_id() -> None:
    provider, _, exporter = sealed_provider()
    tracer = provider.get_tracer("otel_agenttape")
    other = provider.get_tracer("some.http.lib")
    for run in ("r1", "r2"):
        with tracer.start_as_current_span("invoke_agent", attributes={semconv.RUN_ID: run}):
            with other.start_as_current_span("GET /"):
                pass
            with tracer.start_as_current_span("chat", attributes={semconv.NODE_TYPE: "model"}):
                pass
    provider.shutdown()
    spans = _chained(exporter.get_finished_spans())
    by_chain: dict[str, list] = {}
    for s in spans:
        by_chain.setdefault(s.attributes[semconv.CHAIN_ID], []).append(s)
    assert set(by_chain) == {"r1", "r2"}
    for cid, chain in by_chain.items():
        assert [s.attributes[semconv.CHAIN_SEQ] for s in chain] == [0, 1, 2]
        assert chain[0].attributes[semconv.CHAIN_PREV] == genesis(cid)
        assert chain[-1].name == "invoke_agent"
        for s in chain:
            assert link_hash(s.attributes[semconv.CHAIN_PREV], leaf_from_sdk(s)) == s.attributes[semconv.CHAIN_HASH]


def test_foreign_spans_can_be_left_unsealed() -> None:
    provider, _, exporter = sealed_provider(seal_foreign=False)
    with provider.get_tracer("otel_agenttape").start_as_current_span("run", attributes={semconv.RUN_ID: "r"}):
        with provider.get_tracer("other").start_as_current_span("db"):
            pass
    provider.shutdown()
    names = {s.name: semconv.CHAIN_SEQ in s.attributes for s in exporter.get_finished_spans()}
    assert names["run"] is True and names["db"] is False


def test_checkpoints_at_nodes_every_n_and_run_end_signed_and_filed(tmp_path) -> None:
    key = Signer.generate("k.example/agent")
    cp_file = tmp_path / "cp.jsonl"
    records = []
    provider, _, exporter = sealed_provider(signing_key=key, checkpoint_file=cp_file, checkpoint_every=4,
                                                 checkpoint_on_nodes=False, on_checkpoint=records.append)
    tracer = provider.get_tracer("otel_agenttape")
    with tracer.start_as_current_span("run", attributes={semconv.RUN_ID: "r"}):
        for i in range(9):
            with tracer.start_as_current_span(f"s{i}"):
                pass
    provider.shutdown()
    sizes = [r["size"] for r in records]
    assert sizes == [0, 4, 8, 10]  # the opening checkpoint is filed at once, then every 4, then run end
    assert [r["size"] for r in read_checkpoint_file(cp_file)] == sizes
    cp_spans = [s for s in exporter.get_finished_spans() if s.name == semconv.EVENT_CHECKPOINT]
    assert [s.attributes[semconv.CHECKPOINT_SIZE] for s in cp_spans] == sizes
    note = cp_spans[-1].attributes[semconv.CHECKPOINT_NOTE]
    cp = Checkpoint.parse(open_note(note, [key.verifier()]).text)
    assert cp.origin == origin_for("r") and cp.size == 10
    assert cp.chain_head == [s for s in exporter.get_finished_spans() if s.name == "run"][0].attributes[semconv.CHAIN_HASH]


def test_node_consumer_gets_sealed_model_and_tool_spans() -> None:
    got = []
    provider, _, _ = sealed_provider(on_node=got.append)
    tracer = provider.get_tracer("otel_agenttape")
    with tracer.start_as_current_span("run", attributes={semconv.RUN_ID: "r"}):
        for kind in ("model", "tool", None):
            attrs = {semconv.NODE_TYPE: kind} if kind else {}
            with tracer.start_as_current_span(f"n-{kind}", attributes=attrs):
                pass
    provider.shutdown()
    assert [s.name for s in got] == ["n-model", "n-tool"]
    assert all(semconv.CHAIN_HASH in s.attributes for s in got)


class _Exploding(SpanProcessor):
    def on_start(self, span, parent_context=None):
        raise RuntimeError("boom")

    def on_end(self, span):
        raise RuntimeError("boom")


def test_never_raises_into_the_agent() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    def bad_consumer(span):
        raise ValueError("consumer bug")

    sealer = SealingSpanProcessor(_Exploding(), on_node=bad_consumer)
    provider = TracerProvider()
    provider.add_span_processor(sealer)
    with provider.get_tracer("x").start_as_current_span("run", attributes={semconv.NODE_TYPE: "tool"}):
        pass
    assert sealer.errors >= 2


def test_threads_share_one_contiguous_chain() -> None:
    provider, sealer, exporter = sealed_provider(checkpoint_every=32)
    tracer = provider.get_tracer("otel_agenttape")
    with tracer.start_as_current_span("run", attributes={semconv.RUN_ID: "threads"}) as root:
        from opentelemetry import trace

        ctx = trace.set_span_in_context(root)

        def work(k: int) -> None:
            for i in range(200):
                with tracer.start_as_current_span(f"t{k}-{i}", context=ctx):
                    pass

        threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    provider.shutdown()
    spans = _chained(exporter.get_finished_spans())
    assert sorted(s.attributes[semconv.CHAIN_SEQ] for s in spans) == list(range(1201))
    store = Store(None)
    store.write_traces([encode(exporter.get_finished_spans())])
    (report,) = verify_store(store.reader())
    assert report.valid and report.length == 1201 and sealer.errors == 0
    store.close()


def test_restored_tape_starts_a_new_signed_epoch(tmp_path) -> None:
    key = Signer.generate("k.example/agent")
    cp_file = tmp_path / "cp.jsonl"
    all_spans = []
    for _ in range(2):  # the same tape id sealed twice (a restore / resumed process)
        provider, _, exporter = sealed_provider(signing_key=key, checkpoint_file=cp_file)
        tracer = provider.get_tracer("otel_agenttape")
        with tracer.start_as_current_span("run", attributes={semconv.RUN_ID: "again"}):
            with tracer.start_as_current_span("chat", attributes={semconv.NODE_TYPE: "model"}):
                pass
        provider.shutdown()
        all_spans += exporter.get_finished_spans()
    epochs = sorted({s.attributes[semconv.CHAIN_EPOCH] for s in _chained(all_spans)})
    assert epochs == [0, 1]
    second = [s for s in _chained(all_spans) if s.attributes[semconv.CHAIN_EPOCH] == 1]
    assert second[0].attributes[semconv.CHAIN_PREV] == genesis("again", 1) != genesis("again", 0)
    opening = [r for r in read_checkpoint_file(cp_file) if r["epoch"] == 1][0]
    cp = Checkpoint.parse(split_note(opening["note"])[0])
    assert cp.size == 0 and cp.extension("restore").startswith(origin_for("again") + " 2 ")
    store = Store(None)
    store.write_traces([encode(all_spans)])
    reports = verify_store(store.reader(), verifiers=[key.verifier()], checkpoint_files=[cp_file])
    assert [(r.epoch, r.valid) for r in reports] == [(0, True), (1, True)]
    assert reports[1].restored_from.startswith(origin_for("again"))
    store.close()


def test_a_run_end_checkpoint_is_signed_off_the_app_thread_and_flush_signs_what_waits() -> None:
    import time

    threads = []
    provider, sealer, exporter = sealed_provider(on_checkpoint=lambda r: threads.append(threading.current_thread()))
    tracer = provider.get_tracer("otel_agenttape")
    with tracer.start_as_current_span("run", attributes={semconv.RUN_ID: "quick"}):
        pass
    deadline = time.monotonic() + 5
    while not threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threads and threads[0] is not threading.current_thread()  # signed by the checkpoint thread
    provider.shutdown()

    # a delay longer than the test: force_flush and shutdown sign what waits before they return
    provider, sealer, exporter = sealed_provider(checkpoint_delay_s=3600)
    tracer = provider.get_tracer("otel_agenttape")
    for run in ("a", "b"):
        with tracer.start_as_current_span("run", attributes={semconv.RUN_ID: run}):
            pass
    assert not [s for s in exporter.get_finished_spans() if s.name == semconv.EVENT_CHECKPOINT]
    provider.force_flush()
    cps = [s for s in exporter.get_finished_spans() if s.name == semconv.EVENT_CHECKPOINT]
    assert [s.attributes[semconv.CHECKPOINT_ORIGIN] for s in cps] == [origin_for("a"), origin_for("b")]
    with tracer.start_as_current_span("run", attributes={semconv.RUN_ID: "c"}):
        pass
    provider.shutdown()
    cps = [s for s in exporter.get_finished_spans() if s.name == semconv.EVENT_CHECKPOINT]
    assert len(cps) == 3 and cps[-1].attributes[semconv.CHECKPOINT_ORIGIN] == origin_for("c")


def test_an_app_of_one_call_traces_keeps_a_bounded_memory_of_closed_tapes(monkeypatch) -> None:
    """Every closed tape is remembered (so the same tape id sealed again opens its next epoch), but
    only the newest ``MAX_REMEMBERED_TAPES``: an app whose every model call is a trace of its own does
    not hold one entry per call for as long as it runs. A late span of a recent trace still opens the
    next epoch and names the closed one."""
    from opentelemetry import trace as trace_api

    from otel_agenttape.capture import sealing

    monkeypatch.setattr(sealing, "MAX_REMEMBERED_TAPES", 50)
    key = Signer.generate("k.example/agent")
    provider, sealer, exporter = sealed_provider(signing_key=key, seal_foreign=True)
    tracer = provider.get_tracer("openai.instrumentation")
    roots = []
    for _ in range(400):  # 400 one-call traces, each its own tape, closed at its root's end
        span = tracer.start_span("chat", attributes={"gen_ai.operation.name": "chat"})
        span.end()
        roots.append(span)
    assert len(sealer._last_epochs) == 50
    # a child span of the last trace ends after its root (an async tool finishing late)
    late = tracer.start_span("tool", context=trace_api.set_span_in_context(roots[-1]))
    late.end()
    provider.shutdown()
    spans = exporter.get_finished_spans()
    mine = [s for s in _chained(spans) if s.context.trace_id == roots[-1].context.trace_id]
    assert sorted(s.attributes[semconv.CHAIN_EPOCH] for s in mine) == [0, 1]
    cps = [s for s in spans if s.name == semconv.EVENT_CHECKPOINT and s.context.trace_id == roots[-1].context.trace_id]
    opening = [Checkpoint.parse(split_note(s.attributes[semconv.CHECKPOINT_NOTE])[0]) for s in cps]
    restore = [cp.extension("restore") for cp in opening if cp.extension("restore")]
    assert restore and restore[0].startswith(origin_for(f"{roots[-1].context.trace_id:032x}") + " 1 ")
    store = Store(None)
    store.write_traces([encode(spans)])
    reports = verify_store(store.reader(), verifiers=[key.verifier()])
    assert len(reports) == 401 and all(r.valid for r in reports), [r.reason for r in reports if not r.valid][:3]
    store.close()
