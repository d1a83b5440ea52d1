"""A tiny OpenAI-compatible chat completions server on 127.0.0.1 (free port) for the tape tests.

The first user turn gets a ``get_weather`` tool call (a ``transfer_to_*`` call instead when the request
offers such a tool: a triage agent handing over); a conversation ending in a weather tool result gets a
text answer built from it, one ending in a handoff's result starts over from the last user turn.
``stream=true`` answers as server-sent events. Every request body is kept in ``requests`` so a test can
see exactly what a client sent.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _weather(content: Any) -> dict[str, Any] | None:
    try:
        data = json.loads(content)
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) and "temp" in data else None


def _answer(body: dict[str, Any], n: int) -> dict[str, Any]:
    last = body["messages"][-1]
    data = _weather(last.get("content")) if last.get("role") == "tool" else None
    if data is not None:
        message = {"role": "assistant", "content": f"It is {data['temp']}F in {data['city']}."}
        finish = "stop"
    else:
        user = next((m for m in reversed(body["messages"]) if m.get("role") == "user"), last)
        text = user.get("content") if isinstance(user.get("content"), str) else ""
        city = text.rsplit(" ", 1)[-1].strip("?") or "Paris"
        names = [(t.get("function") or {}).get("name") or "" for t in body.get("tools") or []]
        handoff = next((name for name in names if name.startswith("transfer_to_")), None)
        name, arguments = (handoff, {}) if handoff and last.get("role") != "tool" else ("get_weather", {"city": city})
        message = {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{n}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}]}
        finish = "tool_calls"
    return {
        "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1700000000 + n, "model": body["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 10 + n, "completion_tokens": 5, "total_tokens": 15 + n},
    }


class FakeOpenAI:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                owner.requests.append(body)
                if not self.path.endswith("/chat/completions"):
                    self.send_response(404)
                    self.end_headers()
                    return
                resp = _answer(body, len(owner.requests))
                if body.get("stream"):
                    self._stream(resp, bool((body.get("stream_options") or {}).get("include_usage")))
                    return
                data = json.dumps(resp).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, resp: dict[str, Any], usage: bool) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                msg = resp["choices"][0]["message"]
                base = {"id": resp["id"], "object": "chat.completion.chunk", "created": resp["created"],
                        "model": resp["model"]}
                chunks = []
                if msg.get("content"):
                    words = msg["content"].split(" ")
                    for i, w in enumerate(words):
                        piece = w + (" " if i < len(words) - 1 else "")
                        delta = {"content": piece} if i else {"role": "assistant", "content": piece}
                        chunks.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                for i, tc in enumerate(msg.get("tool_calls") or []):
                    delta = {"role": "assistant", "tool_calls": [{"index": i, "id": tc["id"], "type": "function",
                                                                  "function": tc["function"]}]}
                    chunks.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                chunks.append({**base, "choices": [{"index": 0, "delta": {},
                                                    "finish_reason": resp["choices"][0]["finish_reason"]}]})
                if usage:
                    chunks.append({**base, "choices": [], "usage": resp["usage"]})
                for c in chunks:
                    self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
