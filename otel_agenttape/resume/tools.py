"""``ResumableToolExecutor``: side effects run at most once per recorded call, in-doubt ones surfaced.

Before a tool runs, an intent is committed to the journal; after it returns, the result. On resume an
intent without a result is *in doubt*: the effect may or may not have happened, and the policy decides
(raise by default, never a silent re-run).
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from .errors import InDoubtError, InDoubtReport, RecordedToolError
from .index import Call, ResumeIndex
from .keys import TOOL, to_jsonable, tool_request
from .recording import mark_result, tool_node

IDEMPOTENCY_PARAM = "idempotency_key"


class InDoubtPolicy(str, enum.Enum):
    RAISE = "raise"  # stop and surface it (default)
    REEXECUTE = "reexecute"  # run again (the idempotency key is still passed if the tool takes one)
    REEXECUTE_WITH_KEY = "reexecute_with_key"  # run again only if the tool accepts the idempotency key


def accepts_idempotency_key(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return IDEMPOTENCY_PARAM in params


class ResumableToolExecutor:
    """Wraps a tool executor so completed tool calls return their recorded result.

    ``executor`` is a mapping ``name -> function(**arguments)``, an object with
    ``execute(name, arguments)``, or a callable ``(name, arguments)``. A tool function that has an
    ``idempotency_key`` parameter receives a key that is the same on every attempt of this call and
    different for every other call, so the callee can deduplicate. ``policies`` sets the in-doubt
    policy per tool name; ``on_in_doubt`` is called with every in-doubt report. ``run`` (a capture
    ``Run``) records each real execution as a tool node carrying its resume key.
    """

    def __init__(
        self,
        executor: Any,
        index: ResumeIndex,
        *,
        in_doubt: InDoubtPolicy | str = InDoubtPolicy.RAISE,
        policies: Mapping[str, InDoubtPolicy | str] | None = None,
        on_in_doubt: Callable[[InDoubtReport], None] | None = None,
        encode: Callable[[Any], Any] = lambda v: v,
        decode: Callable[[Any], Any] = lambda v: v,
        run: Any = None,
    ) -> None:
        self.run = run
        self.executor = executor
        self.index = index
        self.in_doubt = InDoubtPolicy(in_doubt)
        self.policies = {k: InDoubtPolicy(v) for k, v in (policies or {}).items()}
        self.on_in_doubt = on_in_doubt
        self.encode = encode
        self.decode = decode
        self.in_doubt_reports: list[InDoubtReport] = []

    def _target(self, name: str, arguments: Any) -> tuple[Callable[..., Any], bool]:
        """The function to call and whether it takes the idempotency key."""
        ex = self.executor
        if isinstance(ex, Mapping):
            fn = ex[name]
            return (lambda **kw: fn(**(arguments or {}), **kw)), accepts_idempotency_key(fn)
        execute = getattr(ex, "execute", None)
        if execute is not None:
            return (lambda **kw: execute(name, arguments, **kw)), accepts_idempotency_key(execute)
        if callable(ex):
            return (lambda **kw: ex(name, arguments, **kw)), accepts_idempotency_key(ex)
        raise TypeError("executor must be a mapping of tools, have execute(), or be callable")

    def _prepare(self, c: Call, name: str, arguments: Any) -> tuple[Callable[..., Any], str | None]:
        """Decide what to run; raises for a recorded failure or an in-doubt call the policy refuses."""
        fn, takes_key = self._target(name, arguments)
        key = c.key.idempotency_key()
        if c.in_doubt:
            policy = self.policies.get(name, self.in_doubt)
            report = InDoubtReport(str(c.key), name, arguments, key if takes_key else None, policy.value)
            self.in_doubt_reports.append(report)
            if self.on_in_doubt is not None:
                self.on_in_doubt(report)
            if policy is InDoubtPolicy.RAISE or (policy is InDoubtPolicy.REEXECUTE_WITH_KEY and not takes_key):
                raise InDoubtError(report)
            self.index.counters[TOOL]["misses"] += 1
        return fn, (key if takes_key else None)

    def _replay(self, c: Call) -> Any:
        entry = c.entry
        if entry.error:  # type: ignore[union-attr]
            raise RecordedToolError(entry.error.get("type", "Error"), entry.error.get("message", ""))  # type: ignore[union-attr]
        return self.decode(entry.result)  # type: ignore[union-attr]

    def _record_failure(self, c: Call, exc: Exception) -> None:
        self.index.record_result(c, None, error={"type": type(exc).__name__, "message": str(exc)})

    def _record_success(self, c: Call, node: Any, result: Any) -> None:
        """Commit the result to the journal, then put it on the tool span."""
        encoded = to_jsonable(self.encode(result))
        self.index.record_result(c, encoded)
        node.result(encoded)
        mark_result(node, encoded)

    def execute(self, name: str, arguments: Any = None, *, call_id: str | None = None) -> Any:
        """The recorded result on a hit; otherwise journal the intent, run the tool, journal the result."""
        c = self.index.begin(TOOL, tool_request(name, arguments), name=name, call_id=call_id)
        try:
            if c.hit:
                return self._replay(c)
            fn, key = self._prepare(c, name, arguments)
            self.index.record_intent(c, idempotency_key=key)
            with tool_node(self.run, c, name, arguments) as node:
                try:
                    result = fn(**({"idempotency_key": key} if key else {}))
                except Exception as exc:
                    self._record_failure(c, exc)
                    raise
                self._record_success(c, node, result)
            return result
        finally:
            self.index.end(c)

    async def aexecute(self, name: str, arguments: Any = None, *, call_id: str | None = None) -> Any:
        """``execute`` for a tool that may be a coroutine function."""
        # The twin of execute, step for step, with the tool's result awaited: one body cannot serve both
        # (execute must run without an event loop), and the shared steps are the _prepare/_replay/_record_*.
        c = self.index.begin(TOOL, tool_request(name, arguments), name=name, call_id=call_id)
        try:
            if c.hit:
                return self._replay(c)
            fn, key = self._prepare(c, name, arguments)
            self.index.record_intent(c, idempotency_key=key)
            with tool_node(self.run, c, name, arguments) as node:
                try:
                    result = fn(**({"idempotency_key": key} if key else {}))
                    if inspect.isawaitable(result):
                        result = await result
                except Exception as exc:
                    self._record_failure(c, exc)
                    raise
                self._record_success(c, node, result)
            return result
        finally:
            self.index.end(c)
