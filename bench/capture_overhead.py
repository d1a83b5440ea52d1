"""CPU cost per span of capture vs the plain OpenTelemetry SDK, side by side in one run.

(a) plain: TracerProvider + BatchSpanProcessor + OTLP/HTTP exporter, writing by hand the same span a
    capture model call produces (same name, kind, attributes, ~2.7 KB).
(b) agenttape: ``otel_agenttape.setup(endpoint=...)`` (default pipeline: sealed, exported by the
    official OTLP/HTTP exporter whose request encoding is ``codec/otlp_encode.py``, byte-identical to
    the SDK encoder's) with ``run.model_call(...)`` + ``call.finish(...)`` per span.

Both export over OTLP/HTTP to a sink server in a separate process (its CPU is not counted). CPU is this
process's user+system time (all threads: span creation, processors, encoding, HTTP) per agent span;
``producer`` is the part spent in the calling thread (span building), the rest is the export thread.
Rounds interleave a and b, alternating which goes first, so load changes on the machine hit both
alike; each side's median round is reported. ``--split`` adds capture without sealing, sealing with a
checkpoint at every node, and the default pipeline with the SDK's stock exporter (its own encoder),
to show where the cost goes. Last line:
``capture ratio=R plain_us=A agenttape_us=B`` for the default pipeline (what ``setup()`` does).

``--zero-code`` measures the zero-code path instead: one OpenAI SDK app (chat completions with a tool,
against a fake OpenAI-compatible server in another process) run three ways, interleaved round by
round: ``bare`` (no telemetry), ``stock`` (what the stock OpenTelemetry distro sets up: the SDK's
``_OTelSDKConfigurator`` with OTLP/HTTP traces and logs, metrics off, plus the same GenAI OpenAI
instrumentation with content on spans) and ``zero_code`` (``opentelemetry-instrument`` with our
distro: sealed, the outbox on, logs through it). Each app reports its own CPU (all threads, flush
included) per call, after a warm-up. Last line:
``zero_code ratio=R stock_us=A zero_code_us=B bare_us=C telemetry_ratio=T`` where ``ratio`` is the
app's CPU per call under ours over the stock distro's and ``telemetry_ratio`` the same for what
telemetry adds over ``bare``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

SINK = textwrap.dedent("""
    import sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
        def log_message(self, *a): pass
    s = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(s.server_address[1], flush=True)
    s.serve_forever()
""")

MESSAGES = [
    {"role": "system", "content": "You are a careful planning agent. Use tools when they help. " * 4},
    {"role": "user", "content": "Plan a three-day trip to Lisbon in May with a budget of 1500 EUR, "
                                "including museums, food and one day trip. " * 3},
    {"role": "assistant", "content": "I will look up flights and hotels first."},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"flights": [{"price": 220}, {"price": 260}]}'},
]
TEXT = ("Day 1: Alfama walk, Castelo de Sao Jorge, dinner in Bairro Alto. "
        "Day 2: Belem tower, Jeronimos, pasteis. Day 3: Sintra day trip. ") * 2
RAW = {"id": "chatcmpl-123", "model": "gpt-4o-2024-08-06", "object": "chat.completion",
       "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": TEXT}}],
       "usage": {"prompt_tokens": 412, "completion_tokens": 96, "total_tokens": 508}}


def start_sink() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}"


def capture_once(tape, run) -> None:
    with run.model_call(model="gpt-4o", provider="openai", messages=MESSAGES, temperature=0.2) as call:
        call.finish(raw=RAW)


def template_span():
    """The span (b) produces, captured once in memory, to be written by hand in (a)."""
    import otel_agenttape
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, seal=False)
    with tape.run(agent="bench") as run:
        capture_once(tape, run)
    tape.force_flush()
    span = next(s for s in exporter.get_finished_spans() if s.name.startswith("chat"))
    tape.shutdown()
    return span.name, span.kind, dict(span.attributes)


def bench_plain(endpoint: str, n: int, template) -> tuple[float, float]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name, kind, attrs = template
    provider = TracerProvider()
    # Queue sized for the round so the plain SDK does not drop (a drop would skip its encoding cost).
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint + "/v1/traces"),
                                                   max_queue_size=max(n + 1, 2048)))
    tracer = provider.get_tracer("bench")
    t0, p0 = time.process_time(), time.thread_time()
    with tracer.start_as_current_span("invoke_agent bench"):
        for _ in range(n):
            with tracer.start_as_current_span(name, kind=kind) as span:
                span.set_attributes(attrs)
    p1 = time.thread_time()
    provider.force_flush()
    cpu = time.process_time() - t0
    provider.shutdown()
    return cpu * 1e6 / (n + 1), (p1 - p0) * 1e6 / (n + 1)


def bench_capture(endpoint: str, n: int, seal: bool = True, seal_options: dict | None = None,
                  stock_exporter: bool = False) -> tuple[float, float, dict]:
    import otel_agenttape

    exporter = None
    if stock_exporter:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint + "/v1/traces")
    tape = otel_agenttape.setup(endpoint=endpoint, seal=seal, seal_options=seal_options, exporter=exporter)
    t0, p0 = time.process_time(), time.thread_time()
    with tape.run(agent="bench") as run:
        for _ in range(n):
            capture_once(tape, run)
    p1 = time.thread_time()
    tape.force_flush()
    cpu = time.process_time() - t0
    tape.shutdown()
    stats = tape.stats()
    # With sealing active, signed checkpoint spans are exported on top of the n + 1 agent spans.
    if stats["spans_exported"] < n + 1 or stats["spans_dropped_queue_full"] or stats["spans_export_failed"]:
        raise SystemExit(f"capture exported {stats['spans_exported']} of {n + 1} spans: {stats}")
    return cpu * 1e6 / (n + 1), (p1 - p0) * 1e6 / (n + 1), stats


FAKE_OPENAI = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from tape_fakeopenai import FakeOpenAI
    fake = FakeOpenAI().__enter__()
    print(fake.base_url, flush=True)
    while True:
        time.sleep(3600)
""")

APP = textwrap.dedent("""
    import json, sys, time
    mode, base_url, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "stock":  # what opentelemetry-distro's configurator runs, and the one instrumentation
        from opentelemetry.sdk._configuration import _OTelSDKConfigurator
        _OTelSDKConfigurator().configure()
        from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor
        OpenAIInstrumentor().instrument()
    import openai
    from opentelemetry import _logs, trace
    client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0)
    TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    MESSAGES = [{"role": "system", "content": "You are a careful planning agent. " * 8},
                {"role": "user", "content": "Weather in Paris?"}]
    def flush():
        for provider in (trace.get_tracer_provider(), _logs.get_logger_provider()):
            getattr(provider, "force_flush", lambda: None)()
    def run(n):
        for _ in range(n):
            client.chat.completions.create(model="gpt-test", messages=MESSAGES, tools=TOOLS)
    run(max(20, calls // 10))
    flush()
    t0, p0 = time.process_time(), time.thread_time()
    run(calls)
    p1 = time.thread_time()
    flush()
    cpu = time.process_time() - t0
    out = {"cpu_us": cpu * 1e6 / calls, "app_thread_us": (p1 - p0) * 1e6 / calls}
    if mode == "zero_code":
        from otel_agenttape.capture.distro import configured_tape
        out["stats"] = configured_tape().stats()
    print(json.dumps(out), flush=True)
""")


def zero_code(calls: int, rounds: int, split: bool = False) -> None:
    """The ``--zero-code`` mode (see the module doc)."""
    here = Path(__file__).resolve().parents[1]
    instrument = shutil.which("opentelemetry-instrument", path=os.path.dirname(sys.executable)) or shutil.which(
        "opentelemetry-instrument")
    if instrument is None:
        raise SystemExit("opentelemetry-instrument is not installed (pip install opentelemetry-instrumentation)")
    sink, endpoint = start_sink()
    fake = subprocess.Popen([sys.executable, "-c", FAKE_OPENAI, str(here / "tests")], stdout=subprocess.PIPE, text=True)
    work = Path(tempfile.mkdtemp(prefix="agenttape-zero-code-"))
    try:
        base_url = fake.stdout.readline().strip()
        app = work / "app.py"
        app.write_text(APP)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTTAPE_", "OTEL_"))}
        env["PYTHONPATH"] = os.pathsep.join([str(here), env.get("PYTHONPATH", "")])
        common = dict(env, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                      OTEL_SERVICE_NAME="bench", OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="span_only")
        ways = {
            "bare": ([sys.executable], env),
            "stock": ([sys.executable], dict(common, OTEL_TRACES_EXPORTER="otlp", OTEL_LOGS_EXPORTER="otlp",
                                             OTEL_METRICS_EXPORTER="none")),
            "zero_code": ([sys.executable, instrument, sys.executable],
                          dict(common, OTEL_PYTHON_DISTRO="agenttape", AGENTTAPE_QUIET="true",
                               AGENTTAPE_OUTBOX=str(work / "outbox"))),
        }
        if split:  # where our cost goes: without sealing (no checkpoint per trace), and without logs either
            ways["zero_code_unsealed"] = (ways["zero_code"][0], dict(ways["zero_code"][1], AGENTTAPE_SEAL="false"))
            ways["zero_code_no_logs"] = (ways["zero_code"][0], dict(ways["zero_code"][1], AGENTTAPE_LOGS="false"))
        results: dict[str, list[float]] = {k: [] for k in ways}
        in_app: dict[str, list[float]] = {k: [] for k in ways}
        stats: dict = {}
        order = list(ways)
        for i in range(rounds):
            for key in (order if i % 2 == 0 else order[::-1]):
                prefix, way_env = ways[key]
                done = subprocess.run([*prefix, str(app), key, base_url, str(calls)], capture_output=True, text=True,
                                      env=way_env, timeout=600)
                if done.returncode != 0:
                    raise SystemExit(f"{key} app failed: {done.stderr[-2000:]}")
                out = json.loads(done.stdout.strip().splitlines()[-1])
                results[key].append(out["cpu_us"])
                in_app[key].append(out["app_thread_us"])
                if key == "zero_code":
                    stats = out["stats"]
            print(f"round {i + 1}: " + " ".join(f"{k}_us={v[-1]:.1f}" for k, v in results.items()), flush=True)
        exported = stats.get("spans_exported", 0)
        if exported < calls or stats.get("spans_dropped_queue_full") or stats.get("spans_export_failed"):
            raise SystemExit(f"the zero-code app exported {exported} spans of {calls}+: {stats}")
        print(f"zero_code sealing_active={stats.get('sealing_active')} exported_per_round={exported} "
              f"(calls {calls} + warm-up) outbox_spans_written={stats.get('outbox_spans_written')}")
        med = {k: statistics.median(v) for k, v in results.items()}
        for key in ways:
            app_thread = statistics.median(in_app[key])
            print(f"{key}: cpu_us_per_call={med[key]:.1f} telemetry_us={med[key] - med['bare']:.1f} "
                  f"app_thread_us={app_thread:.1f} other_threads_us={med[key] - app_thread:.1f}")
        telemetry = (med["zero_code"] - med["bare"]) / max(1e-9, med["stock"] - med["bare"])
        print(f"zero_code ratio={med['zero_code'] / med['stock']:.3f} stock_us={med['stock']:.1f} "
              f"zero_code_us={med['zero_code']:.1f} bare_us={med['bare']:.1f} telemetry_ratio={telemetry:.3f}")
    finally:
        for proc in (sink, fake):
            proc.terminate()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=2000, help="spans per round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--no-seal", action="store_true", help="measure capture without the sealing processor")
    parser.add_argument("--split", action="store_true",
                        help="also measure capture without sealing and with a checkpoint at every node")
    parser.add_argument("--zero-code", action="store_true",
                        help="an OpenAI app under opentelemetry-instrument with our distro vs the stock distro's setup")
    parser.add_argument("--calls", type=int, default=300, help="--zero-code: chat calls per app run")
    args = parser.parse_args()
    if args.zero_code:
        zero_code(args.calls, args.rounds if args.rounds != parser.get_default("rounds") else 5, args.split)
        return
    seal = not args.no_seal
    variants: dict[str, tuple[bool, dict | None, bool]] = {"agenttape": (seal, None, False)}
    if args.split:
        variants["unsealed"] = (False, None, False)
        variants["node_checkpoints"] = (True, {"checkpoint_on_nodes": True}, False)
        variants["sdk_encoder"] = (seal, None, True)
    sink, endpoint = start_sink()
    try:
        template = template_span()
        size = sum(len(k) + len(str(v)) for k, v in template[2].items())
        print(f"span: {template[0]!r}, {len(template[2])} attributes, ~{size} bytes of attribute data")
        bench_plain(endpoint, 300, template)  # warm up every path
        for on, options, stock in variants.values():
            bench_capture(endpoint, 300, on, options, stock)
        results: dict[str, list[tuple[float, float]]] = {"plain": [], **{k: [] for k in variants}}
        stats: dict = {}
        order = ["plain", *variants]
        for i in range(args.rounds):
            for key in (order if i % 2 == 0 else order[::-1]):
                if key == "plain":
                    results[key].append(bench_plain(endpoint, args.spans, template))
                else:
                    on, options, stock = variants[key]
                    total, producer, round_stats = bench_capture(endpoint, args.spans, on, options, stock)
                    results[key].append((total, producer))
                    if key == "agenttape":
                        stats = round_stats
            print(f"round {i + 1}: " + " ".join(f"{k}_us={v[-1][0]:.1f}" for k, v in results.items()))
        print(f"sealing_active={stats.get('sealing_active')} drops={stats.get('spans_dropped_queue_full')} "
              f"exported_per_round={stats.get('spans_exported')} (agent spans {args.spans + 1})")
        medians = {k: (statistics.median(t for t, _ in v), statistics.median(p for _, p in v))
                   for k, v in results.items()}
        for key, (total, producer) in medians.items():
            print(f"{key}: total_us={total:.1f} producer_us={producer:.1f} export_us={total - producer:.1f}")
        a, b = medians["plain"][0], medians["agenttape"][0]
        print(f"capture ratio={b / a:.3f} plain_us={a:.1f} agenttape_us={b:.1f}")
    finally:
        sink.terminate()
        sink.wait()


if __name__ == "__main__":
    main()
