"""The installed OpenTelemetry instrumentations: which GenAI ones to enable, and their content capture.

Three families write GenAI spans: OpenTelemetry's own (``opentelemetry-instrumentation-genai-*``,
``*-v2``, on ``opentelemetry-util-genai``), OpenInference (``openinference-instrumentation-*``) and
OpenLLMetry (Traceloop's ``opentelemetry-instrumentation-*``). Stock auto-instrumentation enables every
installed one, so with two of them for the same library each model call is recorded twice (two model
nodes a call). Here one a library is enabled: the package or family named first in
``AGENTTAPE_INSTRUMENTATIONS``, else OpenTelemetry's, then OpenInference, then OpenLLMetry.

Each family keeps prompts and answers off by default or behind its own variable; ``content_defaults``
names the variables that turn capture on (onto spans, where sealing covers them), and only variables
the user has not set are set.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, MutableMapping, Sequence

_log = logging.getLogger(__name__)

GROUP = "opentelemetry_instrumentor"
FAMILIES = ("otel-genai", "openinference", "openllmetry")
# Entry point names of GenAI libraries that register() enables by default (others: instrument="all").
GENAI_LIBRARIES = frozenset({
    "openai", "anthropic", "langchain", "langgraph", "openai_agents", "openai-agents", "agents", "mcp",
    "google_genai", "google-genai", "vertexai", "bedrock", "boto3", "litellm", "groq", "mistralai", "cohere",
    "llama_index", "crewai", "dspy", "haystack", "smolagents", "autogen", "pydantic_ai", "claude_agent_sdk",
})
GENAI_CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
OPENINFERENCE_SHOW = ("OPENINFERENCE_HIDE_INPUTS", "OPENINFERENCE_HIDE_OUTPUTS", "OPENINFERENCE_HIDE_INPUT_MESSAGES",
                      "OPENINFERENCE_HIDE_OUTPUT_MESSAGES")
TRACELOOP_CONTENT = "TRACELOOP_TRACE_CONTENT"
DISABLED_ENV = "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"


@dataclass(frozen=True)
class Instrumentation:
    """One ``opentelemetry_instrumentor`` entry point and the package that provides it."""

    library: str  # the entry point's name: the library it instruments
    value: str  # module:Instrumentor
    package: str
    family: str | None  # one of FAMILIES, or None for a non-GenAI instrumentation
    util_genai: bool  # built on opentelemetry-util-genai (takes span_only / event_only content modes)
    entry_point: Any = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.library, self.value)

    def label(self) -> str:
        return f"{self.library} ({self.package})"


def _family(package: str, requires: Sequence[str]) -> tuple[str | None, bool]:
    reqs = [r.split(";")[0].strip().lower() for r in requires]
    util_genai = any(r.startswith("opentelemetry-util-genai") for r in reqs)
    name = package.lower()
    if util_genai or name.startswith("opentelemetry-instrumentation-genai-") or (
            name.startswith("opentelemetry-instrumentation-") and name.endswith("-v2")):
        return "otel-genai", util_genai
    if name.startswith("openinference-instrumentation-"):
        return "openinference", False
    if any(r.startswith("opentelemetry-semantic-conventions-ai") for r in reqs):
        return "openllmetry", False
    return None, False


def installed() -> list[Instrumentation]:
    """Every installed instrumentation, in entry point order."""
    from importlib.metadata import entry_points

    out = []
    for ep in entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        package = dist.name if dist is not None else ep.value.split(":")[0].split(".")[0]
        requires = (dist.requires or []) if dist is not None else []
        family, util_genai = _family(package, requires)
        out.append(Instrumentation(ep.name, ep.value, package, family, util_genai, ep))
    return out


def _conflicts(item: Instrumentation) -> bool:
    """Whether the instrumented library is missing or at a version the package does not support."""
    dist = getattr(item.entry_point, "dist", None)
    if dist is None:
        return False
    try:
        from opentelemetry.instrumentation.dependencies import get_dist_dependency_conflicts

        return get_dist_dependency_conflicts(dist) is not None
    except Exception:
        return False


def disabled_names(environ: Mapping[str, str] | None = None) -> set[str]:
    env = os.environ if environ is None else environ
    return {n.strip() for n in env.get(DISABLED_ENV, "").split(",") if n.strip()}


def choose(found: Iterable[Instrumentation], prefer: Sequence[str] = (), *,
           disabled: Iterable[str] = (), libraries: Iterable[str] | None = None,
           check_conflicts: bool = True) -> tuple[list[Instrumentation], list[tuple[Instrumentation, str]]]:
    """(enabled, [(skipped, why)]): one GenAI instrumentation a library (see the module doc),
    instrumentations of other libraries as found. ``libraries`` limits the choice to those entry point
    names; ``disabled`` (``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``) are skipped, ``*`` skips all."""
    found = list(found)
    disabled = set(disabled)
    wanted = set(libraries) if libraries is not None else None
    everything = "all" in prefer
    order = [p.lower() for p in prefer if p != "all"]

    def rank(item: Instrumentation) -> tuple[int, int, int]:
        named = next((i for i, p in enumerate(order) if p in (item.package.lower(), item.family)), len(order))
        family = FAMILIES.index(item.family) if item.family in FAMILIES else len(FAMILIES)
        return (named, int(check_conflicts and _conflicts(item)), family)

    enabled: list[Instrumentation] = []
    skipped: list[tuple[Instrumentation, str]] = []
    groups: dict[str, list[Instrumentation]] = {}
    for item in found:
        if "*" in disabled or item.library in disabled:
            skipped.append((item, f"disabled by {DISABLED_ENV}"))
        elif wanted is not None and item.library not in wanted:
            skipped.append((item, "not asked for"))
        elif item.family is None or everything:
            enabled.append(item)
        else:
            groups.setdefault(item.library, []).append(item)
    for library, items in groups.items():
        best = min(items, key=rank)
        enabled.append(best)
        skipped.extend((i, f"{best.package} instruments {library}") for i in items if i is not best)
    position = {item.key: n for n, item in enumerate(found)}
    enabled.sort(key=lambda i: position[i.key])
    return enabled, skipped


def content_defaults(enabled: Iterable[Instrumentation]) -> dict[str, str]:
    """The variables that turn content capture on for these instrumentations, onto spans."""
    enabled = list(enabled)
    out: dict[str, str] = {}
    genai = [i for i in enabled if i.family == "otel-genai"]
    if genai:
        # util-genai based packages take modes (span_only puts content on the sealed span); the older
        # openai-v2 reads only "true"
        out[GENAI_CAPTURE] = "span_only" if all(i.util_genai for i in genai) else "true"
    if any(i.family == "openinference" for i in enabled):
        out.update({name: "false" for name in OPENINFERENCE_SHOW})
    if any(i.family == "openllmetry" for i in enabled):
        out[TRACELOOP_CONTENT] = "true"
    return out


def apply_content_defaults(enabled: Iterable[Instrumentation],
                           environ: MutableMapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Set the content variables the user did not set: returns (set now, kept as the user set them)."""
    env = os.environ if environ is None else environ
    applied, kept = {}, {}
    for name, value in content_defaults(enabled).items():
        if env.get(name, "").strip():
            kept[name] = env[name]
        else:
            env[name] = value
            applied[name] = value
    return applied, kept


def enable(items: Iterable[Instrumentation], **kwargs: Any) -> tuple[list[Instrumentation], list[tuple[Instrumentation, str]]]:
    """Instrument each (``instrument(**kwargs)``, e.g. ``tracer_provider=``): (enabled, [(failed, why)]).
    A missing library or an instrumentor that raises is skipped and reported, never raised."""
    done, failed = [], []
    for item in items:
        try:
            cls = item.entry_point.load()
            instrumentor = cls()
            if getattr(instrumentor, "is_instrumented_by_opentelemetry", False):
                done.append(item)
                continue
            instrumentor.instrument(**kwargs)
            if getattr(instrumentor, "is_instrumented_by_opentelemetry", True):
                done.append(item)
            else:  # the instrumentor found its library missing or at a version it does not support
                failed.append((item, "library missing or at an unsupported version"))
        except ModuleNotFoundError as exc:
            failed.append((item, f"not installed: {exc.name}"))
        except Exception as exc:  # an instrumentor's bug must not stop the app
            _log.debug("instrumenting %s failed", item.label(), exc_info=True)
            failed.append((item, f"{type(exc).__name__}: {exc}"))
    return done, failed
