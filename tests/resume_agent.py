"""A scripted 20-step agent for the kill test, run in forked children of a zygote process.

The zygote imports the SDKs once (they take seconds to import) and forks one child per run; a child
kills itself with SIGKILL at the named point (``<step>.<call>:<point>``), which is how the test puts a
crash exactly before a side effect, after it but before its commit, or after the commit.

Protocol: one JSON object per stdin line (the run's settings), one JSON line back on stdout per run:
``{"id": ..., "exit": code, "signal": n}``. Exit codes: 0 done, 3 a call is in doubt.
"""

from __future__ import annotations

import contextvars
import json
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import openai
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import otel_agenttape
from otel_agenttape.capture.sealing import SealingSpanProcessor
from otel_agenttape.resume import InDoubtError, Recorded, ResumableToolExecutor, ResumeIndex
from otel_agenttape.resume.adapters import resumable_openai

EXIT_IN_DOUBT = 3
_CLIENT: openai.OpenAI | None = None  # created and warmed once in the zygote, shared by its children


def plan(step: int) -> list[tuple[str, dict]]:
    """The tool calls of each step: idempotent ``pay`` and plain ``email``, with identical repeats."""
    if step in (6, 7):
        return [("pay", {"amount": 10, "memo": "rent"})]  # identical repeated side effect
    if step in (9, 10):
        return [("email", {"to": "ops", "body": "status"})]  # identical, non-idempotent
    if step == 15:
        return [("pay", {"amount": 1, "memo": "par-a"}), ("email", {"to": "par", "body": "b"})]
    if step % 2:
        return [("email", {"to": f"user{step}", "body": f"hello {step}"})]
    return [("pay", {"amount": step, "memo": f"invoice {step}"})]


class FramedFileExporter(SpanExporter):
    """Appends each export as a length-prefixed OTLP protobuf request; written before on_end returns,
    so a SIGKILL loses only spans that never ended."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans) -> SpanExportResult:
        data = encode_spans(spans).SerializeToString()
        with open(self.path, "ab") as f:
            f.write(len(data).to_bytes(4, "big") + data)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def read_framed(path: str) -> list:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + 4 <= len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        if pos + 4 + n > len(data):
            break  # a frame cut by the kill
        out.append(ExportTraceServiceRequest.FromString(data[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return out


def make_tape(cfg: dict):
    """Capture with the sealing processor exporting synchronously to the scenario's span file."""
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=1024, max_events=65536))
    provider.add_span_processor(SealingSpanProcessor(
        SimpleSpanProcessor(FramedFileExporter(cfg["spans"])), checkpoint_file=cfg["checkpoints"]))
    return otel_agenttape.instrument(provider, exporter=False)


def calls() -> list[str]:
    return [f"{s}.{i}" for s in range(20) for i in range(len(plan(s)))]


def run(cfg: dict) -> int:
    kill_at = cfg.get("kill_at")

    def point(name: str) -> None:
        if name == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    ledger_lock = threading.Lock()

    def append(record: dict) -> None:
        with ledger_lock, open(cfg["ledger"], "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def ledger_keys() -> set[str]:
        try:
            with open(cfg["ledger"]) as f:
                return {json.loads(line).get("key") for line in f if line.strip()}
        except FileNotFoundError:
            return set()

    tape = make_tape(cfg)
    try:
        with tape.run(agent="kill-test", run_id=cfg["tape"]) as agent_run:
            return _steps(cfg, agent_run, point, append, ledger_keys)
    finally:
        tape.shutdown()


def _steps(cfg: dict, agent_run, point, append, ledger_keys) -> int:
    where = threading.local()

    def pay(amount: int, memo: str, idempotency_key: str) -> str:
        point(f"{where.call}:before_effect")
        if idempotency_key not in ledger_keys():  # the payee deduplicates on the key
            append({"tool": "pay", "amount": amount, "memo": memo, "key": idempotency_key})
        point(f"{where.call}:after_effect")
        return f"paid {amount} for {memo}"

    def email(to: str, body: str) -> str:
        point(f"{where.call}:before_effect")
        append({"tool": "email", "to": to, "body": body})
        point(f"{where.call}:after_effect")
        return f"mailed {to}"

    index = ResumeIndex(cfg["tape"], journal=cfg["journal"])
    reports = []

    def report(r) -> None:
        reports.append(r)
        with open(cfg["reports"], "a") as f:
            f.write(json.dumps({"key": r.key, "tool": r.tool, "policy": r.policy,
                                "idempotency_key": r.idempotency_key}) + "\n")

    tools = ResumableToolExecutor({"pay": pay, "email": email}, index, run=agent_run,
                                  policies={"pay": "reexecute_with_key"}, on_in_doubt=report)
    base = _CLIENT or openai.OpenAI(api_key="test", base_url=cfg["base_url"], max_retries=0)
    client = resumable_openai(base.with_options(base_url=cfg["base_url"]), index, run=agent_run)
    rec = Recorded(index)

    def call_tool(step: int, i: int, name: str, args: dict) -> str:
        where.call = f"{step}.{i}"
        out = tools.execute(name, args, call_id=f"s{step}c{i}")
        point(f"{step}.{i}:after_commit")
        return out

    last = "start"
    results = []
    try:
        for step in range(20):
            reply = client.chat.completions.create(model="agent", messages=[
                {"role": "system", "content": f"It is {rec.now()}; run {rec.uuid()}."},
                {"role": "user", "content": f"step {step}: last was {last}"}])
            last = reply.choices[0].message.content
            todo = plan(step)
            if len(todo) == 1:
                outs = [call_tool(step, 0, *todo[0])]
            else:
                with ThreadPoolExecutor(len(todo)) as pool:  # each thread keeps the run's OTel context
                    futures = [pool.submit(contextvars.copy_context().run, call_tool, step, i, *c)
                               for i, c in enumerate(todo)]
                    outs = [f.result() for f in futures]
            results.append({"step": step, "model": last, "tools": outs})
    except InDoubtError:
        return EXIT_IN_DOUBT
    with open(cfg["out"], "w") as f:
        json.dump({"results": results, "counters": index.counters}, f)
    return 0


def warm_up() -> None:
    """One full run in the zygote, so each forked child starts with the SDK's lazy setup done."""
    global _CLIENT
    import tempfile

    from resume_fakellm import FakeLLM

    _CLIENT = openai.OpenAI(api_key="test", base_url="http://127.0.0.1:9/v1", max_retries=0)
    with tempfile.TemporaryDirectory() as d, FakeLLM() as server:
        run({"tape": "warm", "journal": f"{d}/j", "ledger": f"{d}/l", "reports": f"{d}/r",
             "out": f"{d}/o", "spans": f"{d}/s", "checkpoints": f"{d}/c",
             "base_url": server.url + "/v1"})
    _CLIENT.close()
    _CLIENT = openai.OpenAI(api_key="test", base_url="http://127.0.0.1:9/v1", max_retries=0)


def zygote() -> None:
    warm_up()
    lock = threading.Lock()

    def reply(msg: dict) -> None:
        with lock:
            sys.stdout.write(json.dumps(msg) + "\n")
            sys.stdout.flush()

    def wait(run_id: str, pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        reply({"id": run_id, "exit": os.waitstatus_to_exitcode(status)})

    for line in sys.stdin:
        cfg = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run(cfg)
            except BaseException as exc:  # noqa: BLE001
                sys.stderr.write(f"agent failed: {exc!r}\n")
            finally:
                sys.stderr.flush()
                os._exit(code)
        threading.Thread(target=wait, args=(cfg["id"], pid), daemon=True).start()


if __name__ == "__main__":
    zygote()
