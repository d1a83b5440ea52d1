"""Record resumable calls as capture nodes, without importing capture (layering: resume is below it).

``run`` is anything shaped like ``otel_agenttape.capture.Run``: ``model_call(model, messages, *,
system, tools, attributes, **params)`` and ``tool_call(name, arguments, *, call_id, attributes)``
context managers. Only misses are recorded: a hit was recorded by the run that made it, so the
resumed tape holds each call once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .. import semconv as sc
from .index import Call
from .keys import canonical_json
from .spans import call_attributes, result_encoding

_MODEL_FIELDS = ("model", "messages", "system", "tools")


class _NoNode:
    span = None

    def finish(self, *args: Any, **kwargs: Any) -> None:
        pass

    def delta(self, *args: Any, **kwargs: Any) -> None:
        pass

    def result(self, value: Any) -> Any:
        return value


@contextlib.contextmanager
def model_node(run: Any, call: Call) -> Iterator[Any]:
    if run is None:
        yield _NoNode()
        return
    req = call.request if isinstance(call.request, dict) else {"messages": call.request}
    params = {k: v for k, v in req.items() if k not in _MODEL_FIELDS and not str(k).startswith("$")}
    with run.model_call(req.get("model"), req.get("messages"), system=req.get("system"),
                        tools=req.get("tools"), attributes=call_attributes(call), **params) as node:
        yield node


@contextlib.contextmanager
def tool_node(run: Any, call: Call, name: str, arguments: Any) -> Iterator[Any]:
    if run is None:
        yield _NoNode()
        return
    with run.tool_call(name, arguments, call_id=call.call_id, attributes=call_attributes(call)) as node:
        yield node


def mark_result(node: Any, result: Any, deltas: list[Any] | None = None) -> None:
    """Say how capture encoded the result payload, so a rebuild decodes it exactly; a stream whose
    deltas are not plain text (SDK chunks) also gets them whole, since capture keeps only the text."""
    span = getattr(node, "span", None)
    if span is None:
        return
    try:
        span.set_attribute(sc.RESUME_RESULT_ENCODING, result_encoding(result))
        if deltas and not all(isinstance(d, str) for d in deltas):
            span.set_attribute(sc.RESUME_DELTAS, canonical_json(deltas).decode("utf-8"))
    except Exception:  # capture is best-effort; so is this
        pass
