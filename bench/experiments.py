"""Experiment costs: what ``run_experiment`` adds per node over the candidate's own latency, and the time
of comparing 1,000 experiment runs with their originals.

Setup: ``--runs`` weather runs (two model calls each: a tool call, then the answer) recorded through the
capture API into a real receiver (``TapeServer``) on 127.0.0.1 in a process of its own (as ``agenttape
serve`` runs beside an experiment; ``--receiver thread`` runs it in this process, sharing the experiment's
interpreter lock), and an OpenAI-compatible chat server in its own process that answers after a fixed
``--latency-ms``.

(a) overhead: ``--nodes`` recorded model calls sent twice at the same concurrency, once by a bare OpenAI
    client (the same requests, a thread pool, nothing recorded) and once as an experiment (selected from
    the store, journalled, each answer recorded as a sealed run and exported), its client timing every
    request. The experiment's own cost per node, in the same run = (time from the first request to the
    last answer * concurrency - the time spent in requests) / nodes: what a worker does per node beyond
    waiting for the server. Printed beside it: the fixed cost (opening the store, selecting, the journal,
    the last flush), the bare client's wall time and the ideal (nodes * latency / concurrency).
(b) compare: an experiment over every recorded model call (``--runs`` * 2 experiment runs, the server at
    no latency), then ``Tapes.compare`` of it timed: the first call on a fresh reader, and the median of
    ``--repeat``.
Last line: ``experiments overhead_ms_per_node=X compare_ms=Y`` (Y: the cold compare). Targets: X <= 2 ms,
Y <= 2000 ms at 1,000 runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import otel_agenttape
from otel_agenttape.receiver.server import TapeServer
from otel_agenttape.tape.experiment import Candidate, apply_overrides, run_experiment, select_items, wait_for_runs

SYSTEM = "You are a terse travel assistant."
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CITIES = ["Paris", "Oslo", "Lima", "Rome", "Kyoto", "Quito", "Accra", "Perth"]


def _serve(port_out: multiprocessing.Queue, latency: multiprocessing.Value) -> None:  # type: ignore[type-arg]
    """An OpenAI-compatible chat server answering after ``latency`` seconds (a tool call, then text)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            return None

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            wait = latency.value
            if wait:
                time.sleep(wait)
            last = body["messages"][-1]
            if last.get("role") == "tool":
                message = {"role": "assistant", "content": f"It is {json.loads(last['content'])['temp']}F there."}
                finish = "stop"
            else:
                city = str(last.get("content") or "Paris").rsplit(" ", 1)[-1].strip("?")
                message = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                           "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}
                finish = "tool_calls"
            data = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000,
                               "model": body["model"], "choices": [{"index": 0, "message": message,
                                                                    "finish_reason": finish, "logprobs": None}],
                               "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port_out.put(server.server_address[1])
    server.serve_forever()


def _receive(db: str, conn: Any) -> None:
    """The receiver in a process of its own, as ``agenttape serve`` runs beside an experiment: answers
    ``idle`` (drained?) and ``stop`` over ``conn``."""
    server = TapeServer(db, host="127.0.0.1", http_port=0, grpc_port=0, grpc_enabled=False)
    server.start()
    conn.send(server.url)
    while True:
        what = conn.recv()
        if what == "stop":
            server.stop()
            conn.send(True)
            return
        conn.send(server.wait_idle(float(what[1])))


class ReceiverProcess:
    """``TapeServer``'s ``url`` / ``wait_idle`` / ``stop``, with the server in another process (its
    decoding and DuckDB writes then do not share the experiment's interpreter lock)."""

    def __init__(self, db: str) -> None:
        self._conn, child = multiprocessing.Pipe()
        self._proc = multiprocessing.Process(target=_receive, args=(db, child), daemon=True)
        self._proc.start()
        self.url = self._conn.recv()

    def wait_idle(self, timeout: float) -> bool:
        self._conn.send(("idle", timeout))
        return bool(self._conn.recv())

    def stop(self) -> None:
        self._conn.send("stop")
        self._conn.recv()
        self._proc.join(30)


def record_originals(server: Any, runs: int) -> list[str]:
    """``runs`` weather runs through the capture API: a tool call, the tool, the answer."""
    tape = otel_agenttape.setup(endpoint=server.url, protocol="http/protobuf", service_name="bench-weather")
    refs = []
    try:
        for i in range(runs):
            city = CITIES[i % len(CITIES)]
            question = f"Weather in {city}?"
            with tape.run("weather", input=question, run_id=f"w{i:05d}") as run:
                messages = [{"role": "user", "content": question}]
                call_id = f"call_{i}"
                asked = [{"id": call_id, "type": "function",
                          "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]
                with run.model_call(model="fake-1", messages=list(messages), system=SYSTEM, tools=TOOLS,
                                    provider="fake") as call:
                    call.finish(raw={"id": f"r{i}a", "model": "fake-1", "choices": [{"index": 0, "finish_reason":
                                "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": asked}}],
                                "usage": {"prompt_tokens": 12, "completion_tokens": 3}}, tool_calls=asked)
                result = {"city": city, "temp": 50 + i % 30}
                with run.tool_call("get_weather", {"city": city}, call_id=call_id) as tool:
                    tool.result(result)
                messages += [{"role": "assistant", "content": None, "tool_calls": asked},
                             {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)}]
                text = f"In {city} it is {result['temp']}F."
                with run.model_call(model="fake-1", messages=list(messages), system=SYSTEM, tools=TOOLS,
                                    provider="fake") as call:
                    call.delta(text)
                    call.finish(raw={"id": f"r{i}b", "model": "fake-1", "choices": [{"index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": text}}],
                                "usage": {"prompt_tokens": 30, "completion_tokens": 8}})
                run.set_output(text)
                refs.append(f"w{i:05d}")
        tape.force_flush()
    finally:
        tape.shutdown()
    assert server.wait_idle(120), "the receiver did not drain"
    return refs


class TimedClient:
    """The candidate's OpenAI client, timing each request (``post``, which the experiment sends the recorded
    request through): what the experiment spends beyond them is its own."""

    def __new__(cls, base_url: str) -> Any:
        from openai import OpenAI

        class Timed(OpenAI):
            spans: list[tuple[float, float]]

            def post(self, *args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return super().post(*args, **kwargs)
                finally:
                    self.spans.append((t0, time.perf_counter()))

        client = Timed(base_url=base_url, api_key="bench", max_retries=0)
        client.spans = []
        return client


def bare(base_url: str, requests: list[dict], concurrency: int) -> float:
    """The same requests through a bare OpenAI client and a thread pool: the floor."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="bench", max_retries=0)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda r: client.chat.completions.create(**r), requests))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=500, help="recorded runs (2 model calls each; compare: 2x runs)")
    ap.add_argument("--nodes", type=int, default=200, help="model calls in the overhead measurement")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--receiver", choices=("process", "thread"), default="process",
                    help="the receiver in its own process (as agenttape serve is; default) or in this one")
    args = ap.parse_args()

    folder = Path(args.dir or tempfile.mkdtemp(prefix="bench-experiments-"))
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "tapes.duckdb"
    ports: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    latency = multiprocessing.Value("d", args.latency_ms / 1000)
    fake = multiprocessing.Process(target=_serve, args=(ports, latency), daemon=True)
    fake.start()
    base_url = f"http://127.0.0.1:{ports.get(timeout=30)}/v1"
    if args.receiver == "process":
        server: Any = ReceiverProcess(str(db))
    else:
        server = TapeServer(str(db), host="127.0.0.1", http_port=0, grpc_port=0, grpc_enabled=False)
        server.start()
    try:
        t0 = time.perf_counter()
        record_originals(server, args.runs)
        print(f"recorded {args.runs} runs in {time.perf_counter() - t0:.1f} s")

        some = max(1, min(args.nodes, 2 * args.runs) // 2)
        with otel_agenttape.open(str(db)) as tapes:  # the requests the experiment will send, for the bare client
            requests = [apply_overrides(dict(item.request), Candidate("cand-bench"))
                        for item in select_items(tapes, filters={"agent": "weather"}, limit=some)]
        bare(base_url, requests[:8], args.concurrency)  # warm the client and the server
        bare_s = bare(base_url, requests, args.concurrency)
        timed = TimedClient(base_url)
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        res = run_experiment(str(db), "bench-overhead", Candidate("cand-bench", base_url=base_url, client=timed),
                             filters={"agent": "weather"}, limit=some, endpoint=server.url,
                             journal=folder / "overhead.sqlite", concurrency=args.concurrency)
        exp_s = time.perf_counter() - t0
        exp_cpu = time.process_time() - cpu0
        assert server.wait_idle(120)  # stored before the next selection, which leaves experiment runs out
        n = len(requests)
        assert res.answered == n == len(timed.spans) and res.failed == 0, res.to_json()
        # from the first request sent to the last answer back, every worker is either waiting for the
        # server or doing the experiment's own work (recording, sealing, journalling) for a node
        first, last = min(a for a, _ in timed.spans), max(b for _, b in timed.spans)
        waiting = sum(b - a for a, b in timed.spans)
        overhead = ((last - first) * args.concurrency - waiting) / n * 1000
        fixed = exp_s - (last - first)
        ideal = n * args.latency_ms / args.concurrency / 1000
        print(f"overhead nodes={n} latency_ms={args.latency_ms} concurrency={args.concurrency} "
              f"ideal_s={ideal:.3f} bare_s={bare_s:.3f} experiment_s={exp_s:.3f} "
              f"experiment_over_bare={exp_s / bare_s:.3f} request_ms_mean={waiting / n * 1000:.1f} "
              f"fixed_ms={fixed * 1000:.0f} (open, select, journal, flush) "
              f"per_node_vs_bare_ms={(exp_s - bare_s) * args.concurrency / n * 1000:.2f} "
              f"cpu_ms_per_node={exp_cpu * 1000 / n:.2f}")

        latency.value = 0.0
        t0 = time.perf_counter()
        res = run_experiment(str(db), "bench-compare", Candidate("cand-bench", base_url=base_url),
                             filters={"agent": "weather"}, endpoint=server.url,
                             journal=folder / "compare.sqlite", concurrency=args.concurrency, limit=args.runs)
        assert server.wait_idle(120)
        want = res.selected
        assert want == 2 * args.runs, res.to_json()
        with otel_agenttape.open(str(db)) as tapes:
            assert wait_for_runs(tapes, "bench-compare", want, timeout=120) == want
        print(f"recorded {want} experiment runs in {time.perf_counter() - t0:.1f} s ({res.failed} failed)")
        times = []
        for i in range(args.repeat + 1):
            with otel_agenttape.open(str(db)) as tapes:
                t0 = time.perf_counter()
                cmp = tapes.compare("bench-compare")
                s = cmp.summary()
                times.append((time.perf_counter() - t0) * 1000)
            assert s["runs"] == want and s["errors"] == 0, s
        cold, warm = times[0], statistics.median(times[1:]) if args.repeat else times[0]
        print(f"compare runs={want} cold_ms={cold:.0f} median_ms={warm:.0f} "
              f"answer_changed={s['answer_changed']} tool_agreement={s['tool_agreement']}")
        print(f"experiments overhead_ms_per_node={overhead:.2f} compare_ms={cold:.0f}")
    finally:
        server.stop()
        fake.terminate()
        fake.join(10)


if __name__ == "__main__":
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")
    main()
