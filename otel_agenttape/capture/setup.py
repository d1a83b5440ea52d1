"""One-call setup: a TracerProvider with raised limits, our processor chain and the official OTLP
exporter (or our chain on an application's existing provider), returned as a Tape."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Mapping, Sequence
from urllib.parse import urlparse

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from otel_agenttape import semconv
from otel_agenttape.capture.api import Run, current_run
from otel_agenttape.capture.listener import CaptureListener
from otel_agenttape.capture.log_sealing import LogLeaves
from otel_agenttape.capture.delivery import DEFAULT_MAX_REQUEST_BYTES
from otel_agenttape.capture.pipeline import QueueingSpanProcessor, build_processor_chain
from otel_agenttape.capture.propagation import inject_context
from otel_agenttape.capture.redact import RedactSpec, build_redactor
from otel_agenttape.capture.sinks import InMemorySink, JsonlSink, NodeSink
from otel_agenttape.capture.stats import CaptureStats

PROTOCOLS = ("http/protobuf", "grpc")
OUTBOX_ENV = "AGENTTAPE_OUTBOX"
# gRPC's reconnect backoff grows to 120 s: a receiver back after a minute would wait that long
GRPC_CHANNEL_OPTIONS = (("grpc.max_reconnect_backoff_ms", 5000), ("grpc.initial_reconnect_backoff_ms", 500))

# Raised limits for our provider: node payloads are large and streams produce many events.
RAISED_LIMITS = dict(max_span_attributes=1024, max_events=65536, max_links=1024, max_event_attributes=256,
                     max_link_attributes=128)


def raised_span_limits() -> SpanLimits:
    """SDK defaults are 128 attributes / events; an explicit OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT is kept
    (capture then cuts and marks payloads itself before the SDK would cut them silently)."""
    return SpanLimits(**RAISED_LIMITS)


class Tape:
    """What setup()/instrument() return: start runs, feed events, read counters, flush, shut down."""

    def __init__(self, tracer_provider: TracerProvider, listener: CaptureListener, stats: CaptureStats,
                 processor: SpanProcessor | None, queue: QueueingSpanProcessor | None, *,
                 owns_provider: bool, sinks: Sequence[NodeSink] = (), resume_index: Any = None,
                 log_leaves: LogLeaves | None = None, redactor: Any = None) -> None:
        self.tracer_provider = tracer_provider
        self.log_leaves = log_leaves
        self._redactor = redactor
        self._log_processor: Any = None
        self.listener = listener
        self._stats = stats
        self.processor = processor
        self.queue = queue
        self.owns_provider = owns_provider
        self.sinks = list(sinks)
        self._closed = False
        self._recorded: Any = None
        self.resume_index = resume_index

    # ---- recorded nondeterminism -----------------------------------------------------------
    @property
    def resume_index(self) -> Any:
        """The ``otel_agenttape.resume.ResumeIndex`` that records ``now()``/``uuid()``..., or None."""
        return self._resume_index

    @resume_index.setter
    def resume_index(self, index: Any) -> None:
        self._resume_index = index
        if index is None:
            self._recorded = None
        else:
            from otel_agenttape.resume.nondeterminism import Recorded

            self._recorded = Recorded(index)

    def now(self) -> float:
        """``time.time()``; with a resume index, recorded on the first run and replayed on resume, so a
        prompt that embeds the time hashes the same and hits the recorded call."""
        return self._recorded.now() if self._recorded is not None else time.time()

    def time_ns(self) -> int:
        """``time.time_ns()``, recorded like ``now()``."""
        return self._recorded.time_ns() if self._recorded is not None else time.time_ns()

    def uuid(self) -> str:
        """A random uuid as text, recorded like ``now()``."""
        return self._recorded.uuid() if self._recorded is not None else str(uuid.uuid4())

    def random(self) -> float:
        """``random.random()``, recorded like ``now()``."""
        if self._recorded is not None:
            return self._recorded.random()
        import random

        return random.random()

    @property
    def outbox(self) -> Any:
        """The ``capture.outbox.Outbox`` when one is configured, else None."""
        return self.queue.outbox if self.queue is not None else None

    @property
    def memory(self) -> InMemorySink | None:
        """The in-memory node sink, if one was configured."""
        return next((s for s in self.sinks if isinstance(s, InMemorySink)), None)

    def run(self, agent: str | None = None, **kwargs: Any) -> Run:
        """``with tape.run(agent="planner", session_id=...) as run:`` (see Run for the keywords)."""
        return Run(self.listener, agent, **kwargs)

    def score(self, ref_or_response_id: str, name: str, value: float | None = None, label: str | None = None,
              explanation: str | None = None, *, source: str = "human", version: str | None = None,
              span_id: str | None = None, error_type: str | None = None) -> Any:
        """Score a run recorded earlier, from any process: ``RUN_ID@TRACE_ID`` (or a bare run id) names
        the run, anything else is taken as a model response's ``gen_ai.response.id``. The score is sealed
        in a tape of its own (an ``agenttape.score`` span) that names what it scores, and leaves through
        the same exporter and outbox as every span; ``span_id`` (16 hex digits, with a full ref) scores
        one node of the run. Returns the ended span. Bad arguments raise ``ScoreError`` (a ValueError)."""
        from otel_agenttape.capture.scores import ScoreError, check_ids, emit_score_span, score_attributes

        ref = str(ref_or_response_id or "").strip()
        if not ref:
            raise ScoreError("score: name the run (RUN_ID@TRACE_ID, a run id) or a response id")
        trace_id = ref.rpartition("@")[2] if "@" in ref else None
        if span_id is not None and trace_id is None:
            raise ScoreError("span_id: give the run as RUN_ID@TRACE_ID to score one of its nodes")
        check_ids(trace_id, span_id)
        # a bare id is a run id or a response id: the read model takes the run it names, else the
        # model call that answered with it
        attrs = score_attributes(name, value, label, explanation, source=source, version=version,
                                 response_id=None if "@" in ref else ref, error_type=error_type)
        tracer = self.tracer_provider.get_tracer(semconv.SCOPE_NAME, _version())
        return emit_score_span(tracer, attrs, of=ref, trace_id=trace_id, span_id=span_id)

    def inject(self, carrier: dict[str, str] | None = None) -> dict[str, str]:
        """Trace context of the current run for an outgoing call to a child agent process."""
        run = current_run()
        return inject_context(carrier, run=run) if run is not None else inject_context(carrier)

    def wait_delivered(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every span ended so far has left the export queue (sent,
        or written to the outbox) and the outbox holds nothing: True when it got there. An outbox alone
        cannot tell, since spans still queued or in an export being retried have not reached it yet."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            settled = (s.get("spans_exported", 0) + s.get("spans_to_outbox", 0) + s.get("spans_export_failed", 0)
                       + s.get("spans_dropped_too_large", 0) + s.get("spans_refused", 0)
                       + s.get("spans_dropped_queue_full", 0))
            box = self.outbox
            if s.get("queue_length", 0) == 0 and settled >= s.get("spans_queued", 0) and (
                    box is None or not box.backlog()):
                return True
            if time.monotonic() >= deadline:
                return False
            if box is not None:
                box.wait_drained(min(0.2, max(0.0, deadline - time.monotonic())))
            else:
                time.sleep(0.05)

    def log_processor(self) -> Any:
        """The log record processor that seals each record emitted in a live span into that span
        (``log_sealing``) after redacting it like spans; add it to a logger provider before the
        processor that exports: ``provider.add_log_record_processor(tape.log_processor())``. The same
        one on every call; None when this tape does not seal."""
        if self.log_leaves is None:
            return None
        if self._log_processor is None:
            from otel_agenttape.capture.log_sealing import SealingLogRecordProcessor

            self._log_processor = SealingLogRecordProcessor(self.log_leaves, redactor=self._redactor)
            self._stats.add_source(lambda: {"log_sealing_errors": self._log_processor.errors})
        return self._log_processor

    def stats(self) -> dict[str, int]:
        """Every capture counter: drops, cuts, failures, swallowed errors, queue state."""
        snapshot = self._stats.snapshot()
        pending = self.listener.pending()
        snapshot["open_runs"] = pending["runs"]
        snapshot["open_nodes"] = pending["model_nodes"] + pending["tool_nodes"]
        return snapshot

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait up to ``timeout_millis`` for queued spans to be exported. True only if every span queued
        before the call was accepted by the exporter; False on a failed export or the timeout."""
        try:
            if self.owns_provider:
                return bool(self.tracer_provider.force_flush(timeout_millis))
            return bool(self.processor.force_flush(timeout_millis)) if self.processor is not None else True
        except Exception:
            self._stats.incr("processor_errors")
            return False

    def shutdown(self) -> None:
        """Export what is queued and stop, within the queue's ``shutdown_timeout_millis`` (10 s) in
        total, final checkpoints included; spans not exported go to the outbox if there is one, else
        are counted in ``spans_dropped_shutdown``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.queue is not None:
                self.queue.begin_shutdown()
            if self.owns_provider:
                self.tracer_provider.shutdown()
            elif self.processor is not None:
                self.processor.shutdown()
        except Exception:
            self._stats.incr("processor_errors")

    def __enter__(self) -> "Tape":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value.strip()
    return None


def _parse_headers(headers: Mapping[str, str] | str | None) -> dict[str, str] | None:
    if headers is None:
        return None
    if isinstance(headers, str):
        out = {}
        for item in headers.split(","):
            if "=" in item:
                key, value = item.split("=", 1)
                out[key.strip().lower()] = value.strip()
        return out
    return {str(k).lower(): str(v) for k, v in headers.items()}


def make_exporter(endpoint: str | None = None, protocol: str | None = None, *,
                  headers: Mapping[str, str] | str | None = None, timeout: float | None = None,
                  compression: str | None = None, insecure: bool | None = None,
                  max_request_bytes: int | None = None) -> SpanExporter:
    """The official OTLP span exporter, with our faster request encoding (see ``otlp_exporters``). Unset arguments fall back to the OTEL_EXPORTER_OTLP_* variables,
    which the exporters read themselves (endpoint, headers, timeout, compression, certificates)."""
    protocol = protocol or _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    parsed_headers = _parse_headers(headers)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.exporter import Compression as GrpcCompression

        from otel_agenttape.capture.otlp_exporters import TapeOtlpGrpcSpanExporter as GrpcExporter

        kwargs: dict[str, Any] = {"endpoint": endpoint, "headers": parsed_headers, "timeout": timeout,
                                  "insecure": insecure, "max_request_bytes": max_request_bytes,
                                  "channel_options": GRPC_CHANNEL_OPTIONS}
        if compression:
            kwargs["compression"] = {"gzip": GrpcCompression.Gzip, "deflate": GrpcCompression.Deflate,
                                     "none": GrpcCompression.NoCompression}[compression.lower()]
        return GrpcExporter(**{k: v for k, v in kwargs.items() if v is not None})
    from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression

    from otel_agenttape.capture.otlp_exporters import TapeOtlpHttpSpanExporter as HttpExporter

    if endpoint is not None:
        parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
        if parsed.path in ("", "/"):
            endpoint = parsed._replace(path="/v1/traces").geturl()
        else:
            endpoint = parsed.geturl()
    kwargs = {"endpoint": endpoint, "headers": parsed_headers, "timeout": timeout,
              "max_request_bytes": max_request_bytes}
    if compression:
        kwargs["compression"] = HttpCompression(compression)
    return HttpExporter(**{k: v for k, v in kwargs.items() if v is not None})


def _sinks(sinks: Sequence[NodeSink], jsonl_path: str | os.PathLike[str] | None, memory: bool) -> list[NodeSink]:
    out = list(sinks)
    if jsonl_path is not None:
        out.append(JsonlSink(jsonl_path))
    if memory:
        out.append(InMemorySink())
    return out


def _attribute_length_limit(provider: Any) -> int | None:
    limits = getattr(provider, "_span_limits", None)
    if limits is None:
        return None
    return getattr(limits, "max_span_attribute_length", None) or getattr(limits, "max_attribute_length", None)


def _effective_cut(max_payload_chars: int | None, provider: Any) -> int | None:
    sdk_limit = _attribute_length_limit(provider)
    limits = [x for x in (max_payload_chars, sdk_limit) if x is not None]
    return min(limits) if limits else None


def _wire(provider: TracerProvider, *, exporter: SpanExporter | None | bool, endpoint: str | None,
          protocol: str | None, headers: Any, timeout: float | None, compression: str | None,
          insecure: bool | None, redact: RedactSpec, seal: bool, seal_options: Mapping[str, Any] | None,
          queue_options: Mapping[str, Any] | None, sinks: list[NodeSink], max_payload_chars: int | None,
          owns_provider: bool, resume_index: Any = None, outbox: str | os.PathLike[str] | None = None,
          outbox_options: Mapping[str, Any] | None = None, max_request_bytes: int | None = None) -> Tape:
    stats = CaptureStats()
    redactor = build_redactor(redact, stats)
    processor = queue = None
    log_leaves = LogLeaves() if seal else None
    if exporter is not False:
        if exporter is None or exporter is True:
            span_exporter = make_exporter(endpoint, protocol, headers=headers, timeout=timeout,
                                          compression=compression, insecure=insecure,
                                          max_request_bytes=max_request_bytes)
        else:
            span_exporter = exporter
        box = _make_outbox(outbox, outbox_options, span_exporter, max_request_bytes)
        processor, queue = build_processor_chain(span_exporter, stats=stats, seal=seal, seal_options=seal_options,
                                                 redactor=redactor, queue_options=queue_options, outbox=box,
                                                 log_leaves=log_leaves)
        provider.add_span_processor(processor)
    if log_leaves is not None:
        stats.add_source(log_leaves.counts)
    tracer = provider.get_tracer(semconv.SCOPE_NAME, _version())
    listener = CaptureListener(tracer, stats=stats, redactor=redactor, sinks=sinks,
                               max_payload_chars=_effective_cut(max_payload_chars, provider))
    return Tape(provider, listener, stats, processor, queue, owns_provider=owns_provider, sinks=sinks,
                resume_index=resume_index, log_leaves=log_leaves, redactor=redactor)


def _make_outbox(path: str | os.PathLike[str] | None, options: Mapping[str, Any] | None, exporter: SpanExporter,
                 max_request_bytes: int | None) -> Any:
    """The outbox at ``path`` (else ``$AGENTTAPE_OUTBOX``), re-sending through the exporter; None when off."""
    path = path if path is not None else _env(OUTBOX_ENV)
    if not path:
        return None
    from otel_agenttape.capture.outbox import outbox_from_options

    send = getattr(exporter, "deliver_requests", None)
    deliver = (lambda requests: send(requests, retry=False)) if send is not None else None
    limit = getattr(exporter, "max_request_bytes", None) or max_request_bytes or DEFAULT_MAX_REQUEST_BYTES
    return outbox_from_options(path, dict(options or {}), deliver, limit)


def _version() -> str:
    from otel_agenttape import __version__

    return __version__


def setup(
    endpoint: str | None = None,
    protocol: str | None = None,
    *,
    service_name: str | None = None,
    headers: Mapping[str, str] | str | None = None,
    redact: RedactSpec = None,
    seal: bool = True,
    seal_options: Mapping[str, Any] | None = None,
    exporter: SpanExporter | bool | None = None,
    timeout: float | None = None,
    compression: str | None = None,
    insecure: bool | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    span_limits: SpanLimits | None = None,
    queue_options: Mapping[str, Any] | None = None,
    sinks: Sequence[NodeSink] = (),
    jsonl_path: str | os.PathLike[str] | None = None,
    memory: bool = False,
    max_payload_chars: int | None = None,
    set_global: bool = False,
    resume_index: Any = None,
    outbox: str | os.PathLike[str] | None = None,
    outbox_options: Mapping[str, Any] | None = None,
    max_request_bytes: int | None = None,
) -> Tape:
    """Configure capture in one call and return a Tape.

    ``endpoint``/``protocol``/``headers``/``timeout``/``compression`` default to the standard
    OTEL_EXPORTER_OTLP_* variables (protocol ``http/protobuf`` or ``grpc``). ``exporter`` replaces the
    OTLP exporter (False: local sinks only). ``redact``: True for the built-in patterns, a callable, a
    regex, or a list of them; applied to content before sealing and export. ``seal`` wraps export in the
    sealing processor when available. ``jsonl_path``/``memory`` add local node-record sinks.
    ``max_payload_chars`` cuts larger payloads, recording their length and sha256. ``resume_index``
    (an ``otel_agenttape.resume.ResumeIndex``) makes ``tape.now()``, ``tape.uuid()``... recorded values
    that come back the same when the run is resumed. ``outbox`` (else ``$AGENTTAPE_OUTBOX``): a
    folder where spans that cannot be delivered are kept and re-sent from (``outbox_options``:
    ``max_bytes``, ``fsync``, ``segment_bytes``). ``max_request_bytes`` bounds each export request
    (default 4 MiB).
    """
    attrs = dict(resource_attributes or {})
    if service_name:
        attrs["service.name"] = service_name
    provider = TracerProvider(resource=Resource.create(attrs), span_limits=span_limits or raised_span_limits())
    tape = _wire(provider, exporter=exporter, endpoint=endpoint, protocol=protocol, headers=headers, timeout=timeout,
                 compression=compression, insecure=insecure, redact=redact, seal=seal, seal_options=seal_options,
                 queue_options=queue_options, sinks=_sinks(sinks, jsonl_path, memory),
                 max_payload_chars=max_payload_chars, owns_provider=True, resume_index=resume_index,
                 outbox=outbox, outbox_options=outbox_options, max_request_bytes=max_request_bytes)
    if set_global:
        trace.set_tracer_provider(provider)
    return tape


# setup() and instrument() repeat their keyword lists on purpose: each is a public signature (docs/api.md)
# that editors and help() show in full; both hand everything to _wire, which holds the logic.
def instrument(
    provider: TracerProvider | None = None,
    *,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | str | None = None,
    redact: RedactSpec = None,
    seal: bool = True,
    seal_options: Mapping[str, Any] | None = None,
    exporter: SpanExporter | bool | None = None,
    timeout: float | None = None,
    compression: str | None = None,
    insecure: bool | None = None,
    queue_options: Mapping[str, Any] | None = None,
    sinks: Sequence[NodeSink] = (),
    jsonl_path: str | os.PathLike[str] | None = None,
    memory: bool = False,
    max_payload_chars: int | None = None,
    resume_index: Any = None,
    outbox: str | os.PathLike[str] | None = None,
    outbox_options: Mapping[str, Any] | None = None,
    max_request_bytes: int | None = None,
) -> Tape:
    """Add capture to an application's existing SDK TracerProvider (default: the global one).

    Its span limits stay the application's; payloads longer than its attribute length limit are cut by
    capture and marked (length + sha256) instead of being cut silently by the SDK.
    """
    provider = provider if provider is not None else trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        raise TypeError("instrument() needs an opentelemetry.sdk.trace.TracerProvider")
    return _wire(provider, exporter=exporter, endpoint=endpoint, protocol=protocol, headers=headers, timeout=timeout,
                 compression=compression, insecure=insecure, redact=redact, seal=seal, seal_options=seal_options,
                 queue_options=queue_options, sinks=_sinks(sinks, jsonl_path, memory),
                 max_payload_chars=max_payload_chars, owns_provider=False, resume_index=resume_index,
                 outbox=outbox, outbox_options=outbox_options, max_request_bytes=max_request_bytes)
