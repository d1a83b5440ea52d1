"""``ResumableModelClient``: a recorded model result on a hit, a real (recorded) call on a miss."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from .index import Call, ResumeIndex
from .keys import MODEL, to_jsonable
from .recording import mark_result, model_node

Codec = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _default_delta_text(delta: Any) -> str:
    return delta if isinstance(delta, str) else ""


def _default_accumulate(deltas: list[Any]) -> Any:
    if all(isinstance(d, str) for d in deltas):
        return "".join(deltas)
    return None


def _keep(owner: ResumableModelClient, node: Any, recorded: list[Any], delta: Any) -> None:
    """Record one live stream delta (JSON form) and put it on the model node."""
    enc = to_jsonable(owner.encode_delta(delta))
    recorded.append(enc)
    node.delta(owner.delta_text(enc), raw=enc)


def _finish_live(owner: ResumableModelClient, call: Call, node: Any, recorded: list[Any]) -> Any:
    """A live stream ended: journal its deltas and terminal result, finish the node; the decoded result."""
    terminal = owner.accumulate(recorded)
    result = owner.decode(terminal) if terminal is not None else None
    owner.index.record_result(call, terminal, deltas=recorded)
    node.finish(raw=terminal)
    mark_result(node, terminal, recorded)
    return result


class ResumableStream:
    """Iterates a model stream's deltas; ``result`` holds the terminal result once exhausted.

    On a hit it replays the recorded deltas, then the recorded terminal result, without calling the
    model. On a miss it passes the live deltas through and commits them with the result at the end.
    """

    def __init__(self, owner: ResumableModelClient, call: Call, source: Callable[[], Any] | None) -> None:
        self._owner = owner
        self._call = call
        self._source = source
        self._iter: Iterator[Any] | None = None
        self.result: Any = None
        self.replayed = call.hit
        self.done = False

    def __iter__(self) -> Iterator[Any]:
        if self._iter is None:
            self._iter = self._run()
        return self._iter

    def _run(self) -> Iterator[Any]:
        owner, call = self._owner, self._call
        try:
            if call.hit:
                for d in call.entry.deltas or []:  # type: ignore[union-attr]
                    yield owner.decode_delta(d)
                self.result = owner.decode(call.entry.result)  # type: ignore[union-attr]
                self.done = True
                return
            with model_node(owner.run, call) as node:
                live = self._source() if self._source else iter(())
                recorded: list[Any] = []
                for delta in live:
                    _keep(owner, node, recorded, delta)
                    yield delta
                self.result = _finish_live(owner, call, node, recorded)
            self.done = True
        finally:
            owner.index.end(call)

    def close(self) -> None:
        """Release the call if the stream was never iterated (an iterated one releases itself)."""
        if self._iter is None and not self.done:
            self.done = True
            self._owner.index.end(self._call)

    def __enter__(self) -> ResumableStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncResumableStream:
    """Async twin of ``ResumableStream``."""

    def __init__(self, owner: ResumableModelClient, call: Call, source: Callable[[], Any] | None) -> None:
        self._owner = owner
        self._call = call
        self._source = source
        self.result: Any = None
        self.replayed = call.hit
        self.done = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._run()

    async def _run(self) -> AsyncIterator[Any]:
        # The twin of ResumableStream._run: a generator is either sync or async, so the replay and
        # record steps are written twice; what they share is in _keep and _finish_live.
        owner, call = self._owner, self._call
        try:
            if call.hit:
                for d in call.entry.deltas or []:  # type: ignore[union-attr]
                    yield owner.decode_delta(d)
                self.result = owner.decode(call.entry.result)  # type: ignore[union-attr]
                self.done = True
                return
            with model_node(owner.run, call) as node:
                live = self._source() if self._source else None
                if inspect.isawaitable(live):
                    live = await live
                recorded: list[Any] = []
                if live is not None:
                    if hasattr(live, "__aiter__"):
                        async for delta in live:
                            _keep(owner, node, recorded, delta)
                            yield delta
                    else:
                        for delta in live:
                            _keep(owner, node, recorded, delta)
                            yield delta
                self.result = _finish_live(owner, call, node, recorded)
            self.done = True
        finally:
            owner.index.end(call)

    async def __aenter__(self) -> AsyncResumableStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None



def plain_text(encoded: Any) -> str | None:
    """The answer's text when a client returns plain text or a dict with a ``text`` string, which
    provider payload parsing does not read (OpenAI and Anthropic shapes are read from ``raw``)."""
    if isinstance(encoded, str):
        return encoded
    if isinstance(encoded, dict) and isinstance(encoded.get("text"), str):
        return encoded["text"]
    return None

class ResumableModelClient:
    """Wraps a model client so completed calls are not paid for again on a resumed run.

    ``client`` is a callable ``client(request)`` or an object with ``create(request)`` (and
    optionally ``acreate``/``stream``/``astream``). ``request`` is the whole prompt and parameters;
    its canonical sha256 and occurrence ordinal key the call. ``encode``/``decode`` turn results into
    JSON values and back (SDK adapters use them); ``accumulate`` turns recorded stream deltas into
    the stream's terminal result. ``run`` (a capture ``Run``) records each real call as a model
    node carrying its resume key; ``delta_text`` gives the text of a recorded delta for that node.
    """

    def __init__(
        self,
        client: Any,
        index: ResumeIndex,
        *,
        encode: Codec = _identity,
        decode: Codec = _identity,
        encode_delta: Codec = _identity,
        decode_delta: Codec = _identity,
        accumulate: Callable[[list[Any]], Any] = _default_accumulate,
        delta_text: Callable[[Any], str] = _default_delta_text,
        run: Any = None,
    ) -> None:
        self.delta_text = delta_text
        self.run = run
        self.client = client
        self.index = index
        self.encode = encode
        self.decode = decode
        self.encode_delta = encode_delta
        self.decode_delta = decode_delta
        self.accumulate = accumulate

    def _fn(self, *names: str) -> Callable[..., Any]:
        for n in names:
            fn = getattr(self.client, n, None)
            if fn is not None:
                return fn
        if callable(self.client):
            return self.client
        raise TypeError(f"model client has none of {names}")

    def _record(self, c: Call, node: Any, result: Any) -> None:
        """Commit a live call's result to the journal, then put it on the model span."""
        encoded = to_jsonable(self.encode(result))
        self.index.record_result(c, encoded)
        node.finish(raw=encoded, text=plain_text(encoded))
        mark_result(node, encoded)

    def create(self, request: Any, *, call: Callable[[], Any] | None = None) -> Any:
        """The recorded result on a hit; otherwise call the model, record, and return its result."""
        c = self.index.begin(MODEL, request)
        try:
            if c.hit:
                return self.decode(c.entry.result)  # type: ignore[union-attr]
            with model_node(self.run, c) as node:
                result = call() if call is not None else self._fn("create")(request)
                self._record(c, node, result)
            return result
        finally:
            self.index.end(c)

    async def acreate(self, request: Any, *, call: Callable[[], Any] | None = None) -> Any:
        """``create`` for a client whose call may be a coroutine function."""
        # The twin of create with the result awaited: one body cannot serve both (create must run without an
        # event loop); the shared step is _record.
        c = self.index.begin(MODEL, request)
        try:
            if c.hit:
                return self.decode(c.entry.result)  # type: ignore[union-attr]
            with model_node(self.run, c) as node:
                result = call() if call is not None else self._fn("acreate", "create")(request)
                if inspect.isawaitable(result):
                    result = await result
                self._record(c, node, result)
            return result
        finally:
            self.index.end(c)

    def stream(self, request: Any, *, call: Callable[[], Any] | None = None) -> ResumableStream:
        """Stream deltas: recorded ones on a hit (then the terminal result), live ones on a miss."""
        c = self.index.begin(MODEL, request)
        source = call if call is not None else (lambda: self._fn("stream")(request))
        return ResumableStream(self, c, None if c.hit else source)

    def astream(self, request: Any, *, call: Callable[[], Any] | None = None) -> AsyncResumableStream:
        c = self.index.begin(MODEL, request)
        source = call if call is not None else (lambda: self._fn("astream", "stream")(request))
        return AsyncResumableStream(self, c, None if c.hit else source)
