"""Shared machinery of the SDK adapters: intercept one ``create`` method, pass the rest through."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..index import ResumeIndex
from ..model import ResumableModelClient

# Per-request transport options that do not change what the model is asked.
TRANSPORT_KEYS = frozenset({"extra_headers", "extra_query", "timeout"})


def _given(value: Any) -> bool:
    return type(value).__name__ not in ("NotGiven", "Omit")


def request_of(api: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The hashed request: which API, and every argument that reaches the model."""
    req = {k: v for k, v in kwargs.items() if k not in TRANSPORT_KEYS and _given(v)}
    req["$api"] = api
    return req


def dump(obj: Any) -> Any:
    d = getattr(obj, "model_dump", None)
    return d(mode="json", exclude_unset=True) if callable(d) else obj


class Endpoint:
    """Stands in for one SDK resource (``client.chat.completions``, ``client.messages``, ...)."""

    def __init__(
        self,
        resource: Any,
        index: ResumeIndex,
        api: str,
        *,
        decode: Callable[[Any], Any],
        decode_event: Callable[[Any], Any],
        accumulate: Callable[[list[Any]], Any],
        delta_text: Callable[[Any], str] = lambda d: "",
        run: Any = None,
    ) -> None:
        self._resource = resource
        self._index = index
        self._api = api
        self._plain = ResumableModelClient(None, index, encode=dump, decode=decode, run=run)
        self._streamed = ResumableModelClient(
            None, index, encode=dump, decode=lambda v: v, encode_delta=dump,
            decode_delta=decode_event, accumulate=accumulate, delta_text=delta_text, run=run,
        )
        self._async = inspect.iscoroutinefunction(resource.create) or type(resource).__name__.startswith(
            "Async"
        )

    def create(self, **kwargs: Any) -> Any:
        request = request_of(self._api, kwargs)
        live = lambda: self._resource.create(**kwargs)  # noqa: E731
        if kwargs.get("stream") is True:
            if self._async:
                return _ready(self._streamed.astream(request, call=live))
            return self._streamed.stream(request, call=live)
        if self._async:
            return self._plain.acreate(request, call=live)
        return self._plain.create(request, call=live)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resource, name)


async def _ready(value: Any) -> Any:
    """Async SDK ``create(stream=True)`` is awaited before it is iterated; keep that shape."""
    return value


class Namespace:
    """Passes attribute access through to the wrapped SDK object except for the given children."""

    def __init__(self, target: Any, **children: Any) -> None:
        self._target = target
        self.__dict__.update(children)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)
