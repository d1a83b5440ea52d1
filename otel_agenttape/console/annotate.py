"""Scores a person gives in the console (a label, a value, a comment on a run or one of its nodes).

The console reads; an annotation is the one thing it writes, and it writes the way every process does:
``Tape.score`` seals it in a score tape of its own and the OTLP exporter sends it to a receiver (with
an outbox when one is configured), so it is durable and verifiable like any span and never edits the
run it scores. Annotating needs its own token (``--annotate-token``), sent as the
``X-Agenttape-Annotate-Token`` header, never a cookie, on top of the read token.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

ANNOTATE_HEADER = "x-agenttape-annotate-token"
DELIVER_TIMEOUT = 10.0  # seconds to wait for the receiver to acknowledge the score tape
VISIBLE_TIMEOUT = 5.0  # then seconds to wait until the read model lists it
MAX_TEXT = 4000  # characters of a comment


class AnnotationRefused(PermissionError):
    """Annotating is off, or the request lacks the annotate token."""


class Annotations:
    """Records console annotations as ``source="human"`` scores through a receiver.

    ``endpoint``: the receiver's OTLP/HTTP URL, or a function returning it (``agenttape serve`` knows
    its own URL only once started); ``headers``: what the receiver needs (its bearer token)."""

    def __init__(self, token: str, endpoint: str | Callable[[], str], *, headers: Mapping[str, str] | None = None,
                 outbox: str | None = None, service_name: str = "agenttape-console") -> None:
        if not token:
            raise ValueError("an annotate token is required")
        self._token = token.encode()
        self._endpoint = endpoint
        self._headers = dict(headers or {})
        self._outbox = outbox
        self._service = service_name
        self._tape: Any = None
        self._lock = threading.Lock()

    def allowed(self, given: str | None) -> bool:
        """Whether ``given`` (the header's value) is the annotate token (compared in constant time)."""
        return bool(given) and hmac.compare_digest(given.encode(), self._token)

    def _recorder(self) -> Any:
        with self._lock:
            if self._tape is None:
                from otel_agenttape.capture.setup import setup

                endpoint = self._endpoint() if callable(self._endpoint) else self._endpoint
                self._tape = setup(endpoint=endpoint, protocol="http/protobuf", service_name=self._service,
                                   headers=self._headers or None, outbox=self._outbox)
            return self._tape

    def record(self, tapes: Any, ref: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Score run ``ref`` (or its node ``span_id``) with the request body's ``name`` and ``value``,
        ``label`` and/or ``comment``; returns the score as the read model lists it once it does.
        ``ValueError`` for a body that cannot be a score."""
        from otel_agenttape.capture.scores import ScoreError

        if not isinstance(body, Mapping):
            raise ValueError("the body is a JSON object: name, value and/or label, comment, span_id")
        name = str(body.get("name") or "").strip()
        value = body.get("value")
        if value in ("", None):
            value = None
        elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError("value: a number")
        else:
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"value: a number, not {value!r}") from None
        label = str(body.get("label") or "").strip() or None
        comment = str(body.get("comment") or "").strip() or None
        if comment is not None and len(comment) > MAX_TEXT:
            raise ValueError(f"comment: at most {MAX_TEXT} characters")
        span_id = str(body.get("span_id") or "").strip() or None
        full = tapes.locate(ref)
        try:
            span = self._recorder().score(full, name, value, label, comment, source="human", span_id=span_id)
        except ScoreError as exc:
            raise ValueError(str(exc)) from None
        delivered = self._recorder().wait_delivered(DELIVER_TIMEOUT)
        score_id = _score_id(span)
        deadline = time.monotonic() + VISIBLE_TIMEOUT
        while True:
            found = [s for s in tapes.scores(full, errors=True) if s.get("score_id") == score_id]
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return {"score_id": score_id, "delivered": delivered, "visible": bool(found),
                "score": found[0] if found else None}

    def close(self) -> None:
        with self._lock:
            if self._tape is not None:
                self._tape.shutdown()
                self._tape = None


def _score_id(span: Any) -> str | None:
    """The ``agenttape.score.id`` of the score event on a score tape's span."""
    from otel_agenttape import semconv as sc

    for event in getattr(span, "events", ()) or ():
        attrs = event.attributes or {}
        if sc.SCORE_ID in attrs:
            return str(attrs[sc.SCORE_ID])
    attrs = getattr(span, "attributes", None) or {}
    return str(attrs[sc.SCORE_ID]) if sc.SCORE_ID in attrs else None
