"""Capture settings from the environment: the one resolution that the zero-code distro, ``register()``
and ``agenttape doctor`` share, so what doctor prints is what an instrumented process sets up.

Every option has an ``AGENTTAPE_*`` variable; where OpenTelemetry has a standard variable for the same
thing (``OTEL_EXPORTER_OTLP_*``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``) that one is read
when ours is unset, and the OTLP exporters and the SDK's resource read theirs themselves as usual.
A value that cannot be parsed is an error naming the variable (``SettingsError``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping
from urllib.parse import urlparse

from otel_agenttape.capture.delivery import DEFAULT_MAX_REQUEST_BYTES
from otel_agenttape.capture.export_queue import DEFAULT_SHUTDOWN_TIMEOUT_MILLIS

PROTOCOLS = ("http/protobuf", "grpc")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    """An environment variable holds a value the option cannot take."""


@dataclass(frozen=True)
class Option:
    name: str
    env: str
    default: Any
    parse: Callable[[str, str], Any]
    standard: tuple[str, ...] = ()  # OTel variables read when ours is unset
    doc: str = ""


def _bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise SettingsError(f"{name} must be true or false, got {text!r}")


def _text(name: str, text: str) -> str:
    return text.strip()


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"{name} must be a number of seconds, got {text!r}") from None
    if value < 0:
        raise SettingsError(f"{name} must not be negative, got {text!r}")
    return value


def _count(name: str, text: str) -> int:
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        raise SettingsError(f"{name} must be a whole number, got {text!r}") from None
    if value <= 0:
        raise SettingsError(f"{name} must be positive, got {text!r}")
    return value


def _protocol(name: str, text: str) -> str:
    value = text.strip().lower()
    if value not in PROTOCOLS:
        raise SettingsError(f"{name} must be one of {', '.join(PROTOCOLS)}, got {text!r}")
    return value


def _compression(name: str, text: str) -> str:
    value = text.strip().lower()
    if value not in ("gzip", "deflate", "none"):
        raise SettingsError(f"{name} must be gzip, deflate or none, got {text!r}")
    return value


def _redact(name: str, text: str) -> Any:
    """true/builtin: the built-in patterns; false: off; else a comma-separated list of pattern names
    (``openai_key``, ``email``...) or regular expressions, checked now."""
    import re

    from otel_agenttape.capture.redact import BUILTIN_PATTERNS

    low = text.strip().lower()
    if low in _FALSE:
        return None
    if low in _TRUE or low == "builtin":
        return True
    items = [t.strip() for t in text.split(",") if t.strip()]
    for item in items:
        if item not in BUILTIN_PATTERNS and item != "builtin":
            try:
                re.compile(item)
            except re.error as exc:
                raise SettingsError(f"{name}: {item!r} is neither a built-in pattern name "
                                    f"({', '.join(BUILTIN_PATTERNS)}) nor a regular expression: {exc}") from None
    return items


def _pairs(name: str, text: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise SettingsError(f"{name} must be key=value pairs separated by commas, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def _names(name: str, text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


OPTIONS: tuple[Option, ...] = (
    Option("endpoint", "AGENTTAPE_ENDPOINT", None, _text,
           ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
           "the receiver: http://host:4318 (a path of /v1/traces is added) or host:4317 for gRPC"),
    Option("protocol", "AGENTTAPE_PROTOCOL", "http/protobuf", _protocol,
           ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf or grpc"),
    Option("headers", "AGENTTAPE_HEADERS", None, _text,
           ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"),
           "request headers, key=value,... (e.g. authorization=Bearer%20TOKEN)"),
    Option("timeout", "AGENTTAPE_TIMEOUT", None, _seconds,
           ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"), "seconds an export request may take"),
    Option("compression", "AGENTTAPE_COMPRESSION", None, _compression,
           ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"), "gzip, deflate or none"),
    Option("insecure", "AGENTTAPE_INSECURE", None, _bool, ("OTEL_EXPORTER_OTLP_TRACES_INSECURE",
                                                            "OTEL_EXPORTER_OTLP_INSECURE"),
           "gRPC without TLS"),
    Option("service_name", "AGENTTAPE_SERVICE_NAME", None, _text, ("OTEL_SERVICE_NAME",),
           "service.name of the resource (it names a run that has no agent span)"),
    Option("resource_attributes", "AGENTTAPE_RESOURCE_ATTRIBUTES", None, _pairs, ("OTEL_RESOURCE_ATTRIBUTES",),
           "more resource attributes, key=value,... (ours win over OTEL_RESOURCE_ATTRIBUTES)"),
    Option("seal", "AGENTTAPE_SEAL", True, _bool, (), "seal every span into its trace's tape"),
    Option("signing_key", "AGENTTAPE_SIGNING_KEY", None, _text, (),
           "key file of `agenttape keygen` that signs checkpoints (default: a key made for the process)"),
    Option("checkpoints", "AGENTTAPE_CHECKPOINTS", None, _text, (), "local file the signed checkpoints are appended to"),
    Option("outbox", "AGENTTAPE_OUTBOX", None, _text, (),
           "folder where spans that cannot be delivered are kept and re-sent from"),
    Option("outbox_max_bytes", "AGENTTAPE_OUTBOX_MAX_BYTES", None, _count, (), "bound of the outbox (256 MiB)"),
    Option("redact", "AGENTTAPE_REDACT", None, _redact, (),
           "true for the built-in patterns, or pattern names / regular expressions, comma-separated"),
    Option("max_request_bytes", "AGENTTAPE_MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES, _count, (),
           "bound of one export request in bytes"),
    Option("max_payload_chars", "AGENTTAPE_MAX_PAYLOAD_CHARS", None, _count, (),
           "longer payloads of our capture spans are cut and marked (length + sha256)"),
    Option("shutdown_timeout", "AGENTTAPE_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT_MILLIS / 1000, _seconds, (),
           "seconds the exit flush may take in all; what is left goes to the outbox or is counted"),
    Option("logs", "AGENTTAPE_LOGS", True, _bool, (),
           "also set up the logger provider (GenAI log events to the same receiver)"),
    Option("capture_content", "AGENTTAPE_CAPTURE_CONTENT", True, _bool, (),
           "turn on message content capture of the GenAI instrumentations found (unless set)"),
    Option("instrumentations", "AGENTTAPE_INSTRUMENTATIONS", (), _names, (),
           "preferred instrumentation packages or families (otel-genai, openinference, openllmetry) "
           "where several instrument one library; `all` loads every one"),
    Option("quiet", "AGENTTAPE_QUIET", False, _bool, (), "no startup line on stderr"),
)
OPTION_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass
class Settings:
    """Resolved options: ``values[name]`` and where each came from (``sources[name]``: a variable name,
    ``argument`` or ``default``)."""

    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    # ---- what the exporters will do ------------------------------------------------------------
    def traces_endpoint(self) -> str:
        """The URL (or gRPC target) spans go to, as the exporter will compute it."""
        src = self.sources.get("endpoint", "default")
        ep = self.values["endpoint"]
        if self.protocol == "grpc":
            return ep or "http://localhost:4317"
        if ep is None:
            return "http://localhost:4318/v1/traces"
        if src in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",):
            return ep
        return with_path(ep, "/v1/traces")

    def logs_endpoint(self) -> str | None:
        """Where log records go: the same receiver (``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`` wins)."""
        explicit = os.environ.get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
        if explicit:
            return explicit
        ep = self.values["endpoint"]
        if self.sources.get("endpoint") == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
            ep = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or base_of(ep)
        if self.protocol == "grpc":
            return ep or "http://localhost:4317"
        return with_path(ep or "http://localhost:4318", "/v1/logs")

    def setup_kwargs(self) -> dict[str, Any]:
        """Keywords for ``otel_agenttape.setup()``: options read from a standard variable stay None, so
        the exporter and the resource read that variable themselves, the same way they always do."""
        v, s = self.values, self.sources

        def own(name: str) -> Any:
            return v[name] if s.get(name) in (OPTION_BY_NAME[name].env, "argument") else None

        attrs = dict(v["resource_attributes"] or {}) if s.get("resource_attributes") in (
            "AGENTTAPE_RESOURCE_ATTRIBUTES", "argument") else {}
        # the sealing processor reads AGENTTAPE_SIGNING_KEY / AGENTTAPE_CHECKPOINTS itself
        seal_options = {"signing_key": v["signing_key"]} if s.get("signing_key") == "argument" else {}
        if s.get("checkpoints") == "argument":
            seal_options["checkpoint_file"] = v["checkpoints"]
        return {
            "endpoint": own("endpoint"), "protocol": v["protocol"], "headers": own("headers"),
            "timeout": own("timeout"), "compression": own("compression"), "insecure": own("insecure"),
            "service_name": own("service_name"), "resource_attributes": attrs or None, "seal": v["seal"],
            "seal_options": seal_options or None, "outbox": v["outbox"],
            "outbox_options": {"max_bytes": v["outbox_max_bytes"]} if v["outbox_max_bytes"] else None,
            "redact": v["redact"], "max_request_bytes": v["max_request_bytes"],
            "max_payload_chars": v["max_payload_chars"],
            "queue_options": {"shutdown_timeout_millis": v["shutdown_timeout"] * 1000},
        }

    def service_name(self) -> str:
        """service.name as the resource will carry it."""
        if self.values["service_name"]:
            return self.values["service_name"]
        attrs = _pairs("OTEL_RESOURCE_ATTRIBUTES", os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")) if os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES") else {}
        return (self.values["resource_attributes"] or {}).get("service.name") or attrs.get(
            "service.name") or "unknown_service"

    def as_dict(self) -> dict[str, Any]:
        """Every option as JSON-able text, headers hidden."""
        out = {}
        for o in OPTIONS:
            value = self.values[o.name]
            if o.name == "headers" and value:
                value = "<set>"
            out[o.name] = {"value": list(value) if isinstance(value, tuple) else value,
                           "from": self.sources.get(o.name, "default")}
        return out


def with_path(endpoint: str, path: str) -> str:
    parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parsed.path in ("", "/"):
        return parsed._replace(path=path).geturl()
    return parsed.geturl()


def base_of(endpoint: str | None) -> str | None:
    if not endpoint:
        return None
    parsed = urlparse(endpoint)
    return parsed._replace(path="", query="", fragment="").geturl()


def resolve(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """The settings for a process with this environment (default ``os.environ``); keyword arguments
    (``register()``'s) win over variables. Raises ``SettingsError`` naming the bad variable."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for o in OPTIONS:
        if o.name in overrides and overrides[o.name] is not None:
            values[o.name], sources[o.name] = overrides[o.name], "argument"
            continue
        for var in (o.env, *o.standard):
            text = env.get(var)
            if text is not None and text.strip():
                values[o.name], sources[o.name] = o.parse(var, text), var
                break
        else:
            values[o.name], sources[o.name] = o.default, "default"
    unknown = set(overrides) - set(OPTION_BY_NAME)
    if unknown:
        raise TypeError(f"unknown setting(s): {sorted(unknown)}")
    return Settings(values, sources)
