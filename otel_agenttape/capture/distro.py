"""Zero-code capture: the ``agenttape`` OpenTelemetry distro and configurator, and ``register()``.

``opentelemetry-instrument python app.py`` with otel-agenttape installed (``OTEL_PYTHON_DISTRO=agenttape``
when other distros are installed too) runs, before the app: ``AgentTapeDistro.configure`` (chooses one
GenAI instrumentation a library and turns their content capture on), ``AgentTapeConfigurator.configure``
(``setup()`` from the environment as the global tracer provider, sealed, with the outbox and
redaction, plus a logger provider to the same receiver), the instrumentations, then ``announce`` (one
line on stderr saying what is on). ``register()`` does the same from code and returns the ``Tape``.
At exit everything is flushed within ``AGENTTAPE_SHUTDOWN_TIMEOUT``; what could not be sent goes to
the outbox or is counted and said, and the app never waits longer. Log records go through the outbox
too (``log_export``); a provider SDK instrumentation beside a framework's records each model call once
(``model_calls``).

Every option and its variable: ``otel_agenttape.capture.settings`` (``agenttape doctor`` prints the
same resolution).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from opentelemetry.instrumentation.distro import BaseDistro

from otel_agenttape.capture import instrumentations as inst
from otel_agenttape.capture import model_calls
from otel_agenttape.capture.log_export import LOST as _LOGS_LOST
from otel_agenttape.capture.log_export import TapeLogExporter
from otel_agenttape.capture.settings import Settings, SettingsError, resolve

_log = logging.getLogger("otel_agenttape.distro")
NAME = "agenttape"
_LOST = ("spans_dropped_shutdown", "spans_dropped_queue_full", "spans_export_failed", "spans_dropped_too_large",
         "spans_refused", "outbox_dropped_full", "outbox_write_errors")


@dataclass
class _Process:
    """What this process configured (one configuration a process)."""

    tape: Any = None
    logger_provider: Any = None
    log_exporter: TapeLogExporter | None = None
    settings: Settings | None = None
    origin: str = ""
    distro: bool = False
    chosen: list[inst.Instrumentation] = field(default_factory=list)
    skipped: list[tuple[inst.Instrumentation, str]] = field(default_factory=list)
    loaded: list[inst.Instrumentation] = field(default_factory=list)
    failed: list[tuple[inst.Instrumentation, str]] = field(default_factory=list)
    applied: dict[str, str] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    dedup: bool = False  # SDK spans skipped inside a framework's model calls (model_calls)
    prepared: bool = False
    announced: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


_PROCESS = _Process()


def _say(text: str, settings: Settings | None = None, *, warn: bool = False) -> None:
    """One line on stderr (through logging when the app configured it), unless AGENTTAPE_QUIET."""
    if settings is not None and settings.values.get("quiet") and not warn:
        return
    if not _log.handlers and not [h for h in logging.getLogger().handlers if not isinstance(h, _BridgeFilter.kinds())]:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        _log.addHandler(handler)
        _log.setLevel(logging.INFO)
        _log.propagate = False
    (_log.warning if warn else _log.info)(text)


class _BridgeFilter(logging.Filter):
    """Python logging bridged into log records, except our own and the SDK's (no export feedback)."""

    @staticmethod
    def kinds() -> tuple[type, ...]:
        try:
            from opentelemetry.sdk._logs import LoggingHandler
        except Exception:
            return ()
        return (LoggingHandler,)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(("otel_agenttape", "opentelemetry"))


BRIDGE_ENV = "OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED"


def _bridges_logging() -> bool:
    return os.environ.get(BRIDGE_ENV, "").strip().lower() == "true"


def _bridge_logging(provider: Any) -> None:
    """``OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED=true``: the SDK's LoggingHandler on the root
    logger, as the stock configurator sets it up (the records then go through our log exporter)."""
    import warnings

    from opentelemetry.sdk._logs import LoggingHandler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        handler = LoggingHandler(level=logging.NOTSET, logger_provider=provider)
    handler.addFilter(_BridgeFilter())
    logging.getLogger().addHandler(handler)
    try:  # so the app's own logging.basicConfig() still configures the console (the SDK does the same)
        from opentelemetry.sdk._configuration import _overwrite_logging_config_fns

        _overwrite_logging_config_fns(handler)
    except Exception:
        pass


# ---- the description both the startup line and doctor print -----------------------------------------

def describe(settings: Settings, *, enabled: Sequence[inst.Instrumentation] = (),
             skipped: Sequence[tuple[inst.Instrumentation, str]] = (), applied: dict[str, str] | None = None,
             kept: dict[str, str] | None = None, failed: Sequence[tuple[inst.Instrumentation, str]] = ()) -> str:
    """What a process with these settings records, in one line."""
    v = settings.values
    parts = [f"{'sealed tapes' if v['seal'] else 'unsealed spans'} to {settings.traces_endpoint()} "
             f"({v['protocol']}) as service {settings.service_name()!r}"]
    if v["seal"]:
        parts.append("checkpoints signed by " + (f"the key in {v['signing_key']}" if v["signing_key"] else
                                                 "a key made for this process"))
    parts.append(f"outbox {v['outbox']}" if v["outbox"] else "no outbox (AGENTTAPE_OUTBOX)")
    redact = v["redact"]
    parts.append("redaction " + ("of the built-in patterns" if redact is True else
                                 f"of {', '.join(redact)}" if redact else "off"))
    if v["logs"]:
        parts.append(f"{'sealed ' if v['seal'] else ''}logs to {settings.logs_endpoint()}" + (f" (through the outbox {v['outbox']}/logs)" if v["outbox"] else "")
                     + (f", Python logging bridged ({BRIDGE_ENV})" if _bridges_logging() else ""))
    else:
        parts.append("logs off")
    parts.append(f"requests at most {v['max_request_bytes']} bytes, exit flush at most {v['shutdown_timeout']:g} s")
    if applied or kept:
        content = [f"{k}={val}" for k, val in (applied or {}).items()]
        content += [f"{k}={val} (as set)" for k, val in (kept or {}).items()]
        parts.append("content capture " + ", ".join(content))
    elif not v["capture_content"]:
        parts.append("content capture left as the instrumentations default (AGENTTAPE_CAPTURE_CONTENT=false)")
    if enabled:
        parts.append("instrumentations " + ", ".join(i.label() for i in enabled))
    else:
        parts.append("no GenAI instrumentation enabled")
    dupes = [i.package for i, why in skipped if " instruments " in why]
    if dupes:
        parts.append("left out " + ", ".join(dupes) + " (another package instruments the same library)")
    if failed:
        parts.append("failed " + ", ".join(f"{i.label()}: {why}" for i, why in failed))
    libraries = [i.library for i in enabled]
    if model_calls.overlapping(libraries):
        frameworks = model_calls.frameworks(libraries)
        sdks = sorted(set(libraries) & model_calls.PROVIDER_LIBRARIES)
        parts.append(f"model calls made through {', '.join(frameworks)} recorded once, by its instrumentation "
                     f"({', '.join(sdks)} spans skipped inside them)")
    return "; ".join(parts)


def planned(settings: Settings, *, libraries: Iterable[str] | None = None,
            environ: dict[str, str] | None = None) -> tuple[list[inst.Instrumentation], list[tuple[inst.Instrumentation, str]]]:
    """The instrumentations a process with these settings enables: (enabled, skipped)."""
    return inst.choose(inst.installed(), settings.values["instrumentations"],
                       disabled=inst.disabled_names(environ), libraries=libraries)


# ---- building the providers ----------------------------------------------------------------------------

def _logger_provider(settings: Settings, resource: Any, sealing: Any = None) -> Any:
    """A logger provider exporting to the receiver (the GenAI log events, bridged Python logging) through
    the outbox like spans (``log_export``), global, shut down by us; ``sealing``: the tape's log record
    processor (redacts, and seals each record emitted in a live span into that span), ahead of export."""
    from opentelemetry import _logs
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    v, s = settings.values, settings.sources
    own = {name: v[name] for name in ("headers", "timeout", "compression") if s.get(name) in (
        f"AGENTTAPE_{name.upper()}", "argument")}
    kwargs: dict[str, Any] = {}
    if s.get("endpoint") in ("AGENTTAPE_ENDPOINT", "argument"):
        kwargs["endpoint"] = settings.logs_endpoint()
    if "timeout" in own:
        kwargs["timeout"] = own["timeout"]
    if "headers" in own:
        from otel_agenttape.capture.setup import _parse_headers

        kwargs["headers"] = _parse_headers(own["headers"])
    if v["protocol"] == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter

        if v["insecure"] is not None and s.get("insecure") in ("AGENTTAPE_INSECURE", "argument"):
            kwargs["insecure"] = v["insecure"]
        exporter = GrpcLogExporter(**kwargs)
    else:
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

        if "compression" in own:
            kwargs["compression"] = Compression(own["compression"])
        exporter = OTLPLogExporter(**kwargs)
    wrapped = TapeLogExporter(exporter, outbox=v["outbox"], max_request_bytes=v["max_request_bytes"],
                              outbox_options={"max_bytes": v["outbox_max_bytes"]} if v["outbox_max_bytes"] else None)
    _PROCESS.log_exporter = wrapped
    provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    if sealing is not None:
        provider.add_log_record_processor(sealing)
    provider.add_log_record_processor(BatchLogRecordProcessor(
        wrapped, export_timeout_millis=max(1.0, v["shutdown_timeout"] * 1000)))
    _logs.set_logger_provider(provider)
    try:  # the older GenAI instrumentations write their events through the Events API
        from opentelemetry import _events
        from opentelemetry.sdk._events import EventLoggerProvider

        _events.set_event_logger_provider(EventLoggerProvider(provider))
    except Exception:
        pass
    return provider


def _prepare(settings: Settings, libraries: Iterable[str] | None = None) -> None:
    """Choose the instrumentations and turn their content capture on (before they are instrumented)."""
    p = _PROCESS
    if p.prepared:
        return
    p.prepared = True
    p.chosen, p.skipped = planned(settings, libraries=libraries)
    p.dedup = model_calls.overlapping([i.library for i in p.chosen])
    if settings.values["capture_content"]:
        p.applied, p.kept = inst.apply_content_defaults(p.chosen)


def _build(settings: Settings, origin: str) -> Any:
    from opentelemetry import trace

    from otel_agenttape.capture.setup import setup

    p = _PROCESS
    tape = setup(**settings.setup_kwargs())
    trace.set_tracer_provider(tape.tracer_provider)
    p.tape, p.settings, p.origin = tape, settings, origin
    if settings.values["logs"]:
        try:
            p.logger_provider = _logger_provider(settings, tape.tracer_provider.resource, tape.log_processor())
            if _bridges_logging():
                _bridge_logging(p.logger_provider)
        except Exception as exc:  # spans still record; say why logs do not
            _say(f"agenttape: log records are not exported: {type(exc).__name__}: {exc}", warn=True)
    atexit.register(_at_exit)
    return tape


def _sdk_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def _configure_process(origin: str) -> Any:
    """The configurator's work; never raises into the app (a bad variable is said, not raised)."""
    p = _PROCESS
    with p.lock:
        if p.tape is not None:
            return p.tape
        if _sdk_disabled():
            _say("agenttape: OTEL_SDK_DISABLED=true: not recording", warn=True)
            return None
        try:
            settings = resolve()
            _prepare(settings)
            return _build(settings, origin)
        except SettingsError as exc:
            _say(f"agenttape: not recording: {exc}", warn=True)
        except Exception as exc:
            _log.debug("configuration failed", exc_info=True)
            _say(f"agenttape: not recording: {type(exc).__name__}: {exc}", warn=True)
        return None


class AgentTapeDistro(BaseDistro):
    """The ``agenttape`` distro: picks our configurator, one GenAI instrumentation a library, content on."""

    def _configure(self, **kwargs: Any) -> None:
        # our configurator even when another distro's is installed too (OTEL_PYTHON_DISTRO=agenttape alone)
        os.environ.setdefault("OTEL_PYTHON_CONFIGURATOR", NAME)
        _PROCESS.distro = True
        if _sdk_disabled():
            return
        try:
            _prepare(resolve())
        except SettingsError:
            pass  # the configurator says it

    def load_instrumentor(self, entry_point: Any, **kwargs: Any) -> None:
        key = (entry_point.name, entry_point.value)
        why = next((w for i, w in _PROCESS.skipped if i.key == key), None)
        if why is not None and _PROCESS.prepared:
            _log.debug("not instrumenting %s (%s): %s", entry_point.name, entry_point.value, why)
            return
        chosen = next((i for i in _PROCESS.chosen if i.key == key), None)
        if chosen is not None and chosen.family is not None:
            kwargs = dict(kwargs, **_instrument_kwargs(chosen))
        super().load_instrumentor(entry_point, **kwargs)
        if chosen is not None and chosen.family is not None:
            _after_instrumented(chosen)
            _PROCESS.loaded.append(chosen)


def _instrument_kwargs(item: inst.Instrumentation) -> dict[str, Any]:
    """Extra ``instrument()`` keywords: a provider SDK instrumentation beside a framework one records
    through the tracer provider that skips calls the framework records (``model_calls``)."""
    p = _PROCESS
    if not p.dedup or item.library not in model_calls.PROVIDER_LIBRARIES or p.tape is None:
        return {}
    return {"tracer_provider": model_calls.DedupTracerProvider(p.tape.tracer_provider)}


def _after_instrumented(item: inst.Instrumentation) -> None:
    if _PROCESS.dedup and item.library in ("langchain", "langgraph"):
        model_calls.hook_langchain()
    elif _PROCESS.dedup and item.library == "openai_agents":
        model_calls.hook_openai_agents()


class AgentTapeConfigurator:
    """The ``agenttape`` configurator: sealed capture from the environment as the global providers."""

    def configure(self, **kwargs: Any) -> None:
        _configure_process("opentelemetry-instrument")


def announce() -> None:
    """After the instrumentations loaded (``opentelemetry_post_instrument``): the startup line."""
    p = _PROCESS
    if p.tape is None or p.announced or p.settings is None:
        return
    p.announced = True
    enabled = p.loaded if p.distro else [i for i in p.chosen if i.family is not None]
    _say("agenttape: recording " + describe(p.settings, enabled=enabled, skipped=p.skipped, applied=p.applied,
                                           kept=p.kept, failed=p.failed), p.settings)


def configured_tape() -> Any:
    """The Tape this process's zero-code configuration or ``register()`` built, else None."""
    return _PROCESS.tape


# ---- register() ----------------------------------------------------------------------------------------

def register(endpoint: str | None = None, protocol: str | None = None, *, service_name: str | None = None,
             instrument: bool | str | Sequence[str] = True, outbox: str | os.PathLike[str] | None = None,
             redact: Any = None, **options: Any) -> Any:
    """Sealed capture in one call: the zero-code configuration, from code. Returns the ``Tape``.

    Arguments win over the variables (``AGENTTAPE_*``, then ``OTEL_*``); ``options`` are the other
    settings by name (``headers``, ``timeout``, ``seal``, ``shutdown_timeout``, ``logs``,
    ``capture_content``, ``instrumentations``...: docs/api.md). ``instrument``: True enables the
    installed GenAI instrumentations (OpenAI, Anthropic, LangChain/LangGraph, OpenAI Agents SDK,
    MCP...; one a library), False none, a list of library names those, ``"all"`` every installed
    instrumentation. A second call returns the first call's Tape (so does a call in an app already
    run under ``opentelemetry-instrument``). A bad value raises ``ValueError`` naming it.
    """
    p = _PROCESS
    with p.lock:
        if p.tape is not None:
            return p.tape
        settings = resolve(endpoint=endpoint, protocol=protocol, service_name=service_name,
                           outbox=os.fspath(outbox) if outbox is not None else None, redact=redact, **options)
        if _sdk_disabled():
            from otel_agenttape.capture.setup import setup

            return setup(exporter=False)
        if instrument is False:
            libraries: Iterable[str] | None = ()
        elif instrument is True:
            libraries = inst.GENAI_LIBRARIES
        elif instrument == "all":
            libraries = None
        elif isinstance(instrument, str):
            libraries = [instrument]
        else:
            libraries = list(instrument)
        _prepare(settings, libraries)
        tape = _build(settings, "register()")
        kwargs: dict[str, Any] = {"tracer_provider": tape.tracer_provider}
        if p.logger_provider is not None:
            kwargs["logger_provider"] = p.logger_provider
        p.loaded, p.failed = [], []
        for item in p.chosen:
            done, failed = inst.enable([item], **dict(kwargs, **_instrument_kwargs(item)))
            for d in done:
                _after_instrumented(d)
            p.loaded += done
            p.failed += failed
        p.distro = True  # loaded is what we enabled
    announce()
    return tape


# ---- exit ------------------------------------------------------------------------------------------------

def _at_exit() -> None:
    """Flush within the shutdown timeout, then say what was not delivered (never raises, never hangs)."""
    p = _PROCESS
    tape, settings = p.tape, p.settings
    if tape is None or settings is None:
        return
    budget = float(settings.values["shutdown_timeout"])
    start = time.monotonic()
    logs = None
    if p.logger_provider is not None:  # log records flush beside the spans, within the same budget
        logs = threading.Thread(target=_quiet(p.logger_provider.shutdown), name="agenttape-logs-exit", daemon=True)
        logs.start()
    try:
        tape.shutdown()  # bounded by the queue's shutdown timeout; leftovers go to the outbox or are counted
    except Exception:
        pass
    if logs is not None:
        left = budget - (time.monotonic() - start)
        logs.join(max(0.2, left * 0.8))
        if logs.is_alive() and p.log_exporter is not None:  # out of time: what is left goes to the outbox
            p.log_exporter.stop_sending()
            logs.join(max(0.3, budget - (time.monotonic() - start)))
    try:
        stats = tape.stats()
    except Exception:
        return
    lost = {k: stats.get(k, 0) for k in _LOST if stats.get(k, 0)}
    kept = stats.get("outbox_spans_pending", 0)
    log_stats = p.log_exporter.stats() if p.log_exporter is not None else {}
    lost.update({k: log_stats[k] for k in _LOGS_LOST if log_stats.get(k)})
    kept_logs = log_stats.get("logs_outbox_pending", 0)
    if lost or kept or kept_logs:
        held = ", ".join(x for x in (f"{kept} spans" if kept else "", f"{kept_logs} log records" if kept_logs else "") if x)
        text = (f"agenttape: at exit {stats.get('spans_exported', 0)} spans"
                + (f" and {log_stats.get('logs_exported', 0)} log records" if log_stats else "") + " delivered"
                + (f", {held} kept in the outbox {settings.values['outbox']} (re-sent by the next process "
                   f"with this outbox or `agenttape ingest`)" if held else "")
                + (", not delivered: " + ", ".join(f"{k}={n}" for k, n in lost.items()) if lost else ""))
        _say(text, settings, warn=bool(lost))


def _quiet(fn: Any) -> Any:
    def run() -> None:
        try:
            fn()
        except Exception:
            pass
    return run
