"""A fake OpenAI- and Anthropic-compatible HTTP server on 127.0.0.1 for the resume tests.

Every answer carries a server-wide counter, so a replayed answer is told apart from a fresh one, and
every request body is kept (and optionally appended to a log file) so tests can count real calls.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _last_text(body: dict) -> str:
    msgs = body.get("messages") or []
    if msgs:
        content = msgs[-1].get("content")
        if isinstance(content, list):
            return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return str(content)
    inp = body.get("input")
    return inp if isinstance(inp, str) else json.dumps(inp)


class FakeLLM:
    def __init__(self, log_file: str | Path | None = None) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.counter = 0
        self.log_file = Path(log_file) if log_file else None
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with owner._lock:
                    owner.counter += 1
                    n = owner.counter
                    owner.requests.append((self.path, body))
                    if owner.log_file:
                        with owner.log_file.open("a") as f:
                            f.write(json.dumps({"path": self.path, "body": body}) + "\n")
                text = f"reply {n}: {_last_text(body)}"
                model = body.get("model", "fake")
                if self.path.endswith("/chat/completions"):
                    self._chat(body, model, text, n)
                elif self.path.endswith("/responses"):
                    self._responses(body, model, text, n)
                elif self.path.endswith("/messages"):
                    self._messages(body, model, text, n)
                else:
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()

            def _json(self, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _sse(self, events: list[tuple[str | None, dict | str]]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                for name, data in events:
                    chunk = f"event: {name}\n" if name else ""
                    chunk += f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
                    self.wfile.write(chunk.encode())
                self.wfile.flush()
                self.close_connection = True

            def _chat(self, body: dict, model: str, text: str, n: int) -> None:
                base = {"id": f"chatcmpl-{n}", "created": 0, "model": model}
                if not body.get("stream"):
                    self._json({**base, "object": "chat.completion", "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})
                    return
                pieces = text.split(" ")
                events: list = []
                for i, p in enumerate(pieces):
                    events.append((None, {**base, "object": "chat.completion.chunk", "choices": [
                        {"index": 0, "delta": {"content": p if i == 0 else " " + p}, "finish_reason": None}]}))
                events.append((None, {**base, "object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {}, "finish_reason": "stop"}]}))
                events.append((None, "[DONE]"))
                self._sse(events)

            def _response_obj(self, model: str, text: str, n: int, status: str) -> dict:
                return {"id": f"resp_{n}", "object": "response", "created_at": 0, "model": model,
                        "status": status, "parallel_tool_calls": True, "tool_choice": "auto",
                        "tools": [], "output": [] if status != "completed" else [
                            {"type": "message", "id": f"msg_{n}", "role": "assistant",
                             "status": "completed",
                             "content": [{"type": "output_text", "text": text, "annotations": []}]}],
                        "usage": {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8,
                                  "input_tokens_details": {"cached_tokens": 0},
                                  "output_tokens_details": {"reasoning_tokens": 0}}}

            def _responses(self, body: dict, model: str, text: str, n: int) -> None:
                if not body.get("stream"):
                    self._json(self._response_obj(model, text, n, "completed"))
                    return
                events: list = [("response.created", {"type": "response.created", "sequence_number": 0,
                                 "response": self._response_obj(model, text, n, "in_progress")})]
                for i, p in enumerate(text.split(" ")):
                    events.append(("response.output_text.delta", {
                        "type": "response.output_text.delta", "sequence_number": i + 1,
                        "item_id": f"msg_{n}", "output_index": 0, "content_index": 0,
                        "delta": p if i == 0 else " " + p, "logprobs": []}))
                events.append(("response.completed", {"type": "response.completed",
                               "sequence_number": len(events),
                               "response": self._response_obj(model, text, n, "completed")}))
                self._sse(events)

            def _messages(self, body: dict, model: str, text: str, n: int) -> None:
                msg = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": model,
                       "stop_reason": "end_turn", "stop_sequence": None,
                       "usage": {"input_tokens": 3, "output_tokens": 5}}
                if not body.get("stream"):
                    self._json({**msg, "content": [{"type": "text", "text": text}]})
                    return
                events: list = [("message_start", {"type": "message_start", "message": {
                    **msg, "content": [], "stop_reason": None}})]
                events.append(("content_block_start", {"type": "content_block_start", "index": 0,
                               "content_block": {"type": "text", "text": ""}}))
                for i, p in enumerate(text.split(" ")):
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": p if i == 0 else " " + p}}))
                events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
                events.append(("message_delta", {"type": "message_delta", "delta": {
                    "stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 5}}))
                events.append(("message_stop", {"type": "message_stop"}))
                self._sse(events)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> FakeLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
