"""OpenAI-compatible chat servers on 127.0.0.1 for the experiment tests: each answers through its own
function, so two candidates can answer differently and one can fail chosen calls."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Respond = Callable[[dict[str, Any], int], "tuple[int, dict[str, Any]]"]


def completion(body: dict[str, Any], n: int, message: dict[str, Any], finish: str = "stop",
               prompt_tokens: int = 20, completion_tokens: int = 7) -> dict[str, Any]:
    return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1700000000 + n, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def weather_tool_call(city: str, n: int) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{n}", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}


def last_city(body: dict[str, Any]) -> str:
    for m in reversed(body["messages"]):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return m["content"].rsplit(" ", 1)[-1].strip("?") or "Paris"
    return "Paris"


class ChatServer:
    """``respond(body, n) -> (status, json)``; every request body kept in ``requests``."""

    def __init__(self, respond: Respond, delay: float = 0.0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.paths: list[tuple[str, str | None]] = []  # (path, the API key header) of each request
        self.respond = respond
        self.delay = delay
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with owner._lock:
                    owner.requests.append(body)
                    owner.paths.append((self.path, self.headers.get("x-api-key") or self.headers.get("authorization")))
                    n = len(owner.requests)
                if owner.delay:
                    time.sleep(owner.delay)
                status, payload = owner.respond(body, n)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def root_url(self) -> str:
        """The server's root: the Anthropic SDK adds ``/v1/messages`` itself."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ChatServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def claude_message(body: dict[str, Any], n: int, content: list[dict[str, Any]], stop: str = "end_turn",
                   input_tokens: int = 25, output_tokens: int = 6) -> dict[str, Any]:
    """An Anthropic Messages API answer."""
    return {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": body["model"], "content": content,
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}
