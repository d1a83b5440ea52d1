"""What one model call cost, in US dollars, from its tokens and the price at the call's time.

Prices come from ``genai-prices`` (a maintained price database shipped inside the package: it is read from
the installed snapshot only, never fetched from the network, whatever ``genai_prices.UpdatePrices`` another
part of the process may have started) and from the user's overrides (``--prices FILE`` or
``AGENTTAPE_PRICES``: per-model prices per million tokens, for self-hosted or negotiated rates), which win.
A call whose model has no price, or that recorded no tokens, has an unknown cost (``None``), never 0: sums
count such calls instead ("3 calls without a price").

Token counts follow the GenAI conventions: ``input_tokens`` holds every input token, the cache-read and
cache-write tokens among them (capture adds Anthropic's cache tokens to its ``input_tokens``).

Lookups are cached per (provider, model); a price that is linear in tokens (most are) is turned once into
four per-token rates, so pricing a call is a few multiplications (the receiver prices every call it ingests).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

PRICES_ENV = "AGENTTAPE_PRICES"
OVERRIDE_KEYS = ("input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok")
_MTOK = 1_000_000
_NO_PRICE = object()


class PricesFileError(ValueError):
    """A ``--prices`` / ``AGENTTAPE_PRICES`` file that cannot be read as per-model prices."""


@dataclass(frozen=True)
class Rates:
    """Dollars per token: uncached input, output, cache read and cache write."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    source: str = "genai-prices"  # or "override"

    def cost(self, input_tokens: int, output_tokens: int, cache_read: int, cache_write: int) -> float:
        uncached = max(input_tokens - cache_read - cache_write, 0)
        return (uncached * self.input + output_tokens * self.output + cache_read * self.cache_read
                + cache_write * self.cache_write)


@dataclass
class Cost:
    """The cost of some model calls: ``usd`` sums the priced ones (``None`` when there were calls and none
    had a price); ``unpriced_calls`` counts those without a price, and ``unpriced_models`` names them."""

    usd: float | None = None
    priced_calls: int = 0
    unpriced_calls: int = 0
    unpriced_models: list[str] = field(default_factory=list)

    def add_call(self, usd: float | None, model: str | None) -> None:
        if usd is None:
            self.unpriced_calls += 1
            name = model or "(no model)"
            if name not in self.unpriced_models:
                self.unpriced_models.append(name)
            return
        self.priced_calls += 1
        self.usd = (self.usd or 0.0) + usd

    def add(self, other: Cost) -> None:
        if other.usd is not None:
            self.usd = (self.usd or 0.0) + other.usd
        self.priced_calls += other.priced_calls
        self.unpriced_calls += other.unpriced_calls
        for m in other.unpriced_models:
            if m not in self.unpriced_models:
                self.unpriced_models.append(m)

    @property
    def known(self) -> bool:
        """Every call had a price (a run without model calls costs a known 0)."""
        return self.unpriced_calls == 0

    def to_json(self) -> dict[str, Any]:
        usd = self.usd if self.usd is not None or self.unpriced_calls else 0.0
        return {"usd": None if usd is None else round(usd, 10), "priced_calls": self.priced_calls,
                "unpriced_calls": self.unpriced_calls, "unpriced_models": list(self.unpriced_models)}

    def text(self) -> str:
        """``$0.0123``, ``$0.0123 + 2 calls without a price`` or ``unknown (3 calls without a price)``."""
        n = self.unpriced_calls
        without = f"{n} call{'s' if n != 1 else ''} without a price"
        if self.usd is None:
            return f"unknown ({without})" if n else "$0"
        return format_usd(self.usd) + (f" + {without}" if n else "")


def format_usd(usd: float | None) -> str:
    """Dollars with enough digits for a cent fraction (model calls cost fractions of a cent)."""
    if usd is None:
        return "unknown"
    if usd == 0:
        return "$0"
    if abs(usd) >= 1:
        return f"${usd:,.2f}"
    return f"${usd:.4f}" if abs(usd) >= 0.0001 else f"${usd:.6f}"


def _snapshot() -> Any:
    """genai-prices' bundled snapshot, our own instance: a custom snapshot (auto-update) is never used."""
    from genai_prices import data
    from genai_prices.data_snapshot import DataSnapshot

    return DataSnapshot(providers=data.providers, from_auto_update=False)


_BUNDLED: Any = None


def _bundled() -> Any:
    global _BUNDLED
    if _BUNDLED is None:
        _BUNDLED = _snapshot()
    return _BUNDLED


def _rates_of(model_price: Any) -> Rates | None:
    """Per-token rates of a genai-prices ``ModelPrice`` that is linear in tokens; None when tiered.

    The rates are read by pricing a million tokens of each kind with genai-prices itself, so its rules
    (a cache write without its own price is billed as input, for one) hold."""
    from genai_prices.types import TieredPrices, Usage

    if any(isinstance(v, TieredPrices) for v in model_price.__dict__.values()):
        return None

    def total(**kw: int) -> float:
        return float(model_price.calc_price(Usage(**kw))["total_price"])

    inp = total(input_tokens=_MTOK) / _MTOK
    return Rates(input=inp, output=total(output_tokens=_MTOK) / _MTOK,
                 cache_read=total(input_tokens=_MTOK, cache_read_tokens=_MTOK) / _MTOK,
                 cache_write=total(input_tokens=_MTOK, cache_write_tokens=_MTOK) / _MTOK)


def _provider_id(provider: str | None) -> str | None:
    """A GenAI ``gen_ai.provider.name`` (or ``gen_ai.system``) as genai-prices names providers."""
    if not provider:
        return None
    p = provider.strip().lower()
    return {"gcp.gemini": "google", "gcp.vertex_ai": "google", "gcp.gen_ai": "google", "vertexai": "google",
            "aws.bedrock": "aws", "az.ai.openai": "azure", "azure.ai.openai": "azure", "azure.ai.inference": "azure",
            "mistral_ai": "mistral", "mistralai": "mistral", "x_ai": "x-ai", "xai": "x-ai"}.get(p, p)


class Prices:
    """Prices for model calls: overrides first, then genai-prices' bundled database."""

    def __init__(self, overrides: Mapping[tuple[str | None, str], Rates] | None = None,
                 path: str | None = None) -> None:
        self.overrides = dict(overrides or {})
        self.path = path
        self._models: dict[tuple[str | None, str], Any] = {}
        self._rates: dict[int, Rates | None] = {}

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> Prices:
        """Prices with the overrides of ``path`` (or of ``$AGENTTAPE_PRICES``; neither: none)."""
        path = path if path is not None else (os.environ.get(PRICES_ENV) or None)
        if path is None:
            return cls()
        return cls(read_overrides(path), path=str(path))

    def lookup(self, provider: str | None, model: str | None) -> Any:
        """The override ``Rates`` or genai-prices' ``(provider, ModelInfo)`` of a model; None if unknown."""
        if not model:
            return None
        key = (provider, model)
        found = self._models.get(key)
        if found is None:
            found = self._find(provider, model)
            self._models[key] = found
        return None if found is _NO_PRICE else found

    def _find(self, provider: str | None, model: str) -> Any:
        m = model.lower()
        pid = _provider_id(provider)
        for k in ((pid, m), (None, m)):
            if k in self.overrides:
                return self.overrides[k]
        snap = _bundled()
        for p in ((pid, None) if pid else (None,)):
            try:
                return snap.find_provider_model(m, None, p, None)
            except LookupError:
                pass
        if pid:  # a provider genai-prices does not know (a gateway, a self-hosted server): by model alone
            try:
                return snap.find_provider_model(m, None, None, None)
            except LookupError:
                pass
        return _NO_PRICE

    def call_usd(self, provider: str | None, model: str | None, input_tokens: int | None,
                 output_tokens: int | None, cache_read: int | None = None, cache_write: int | None = None,
                 at_ns: int | None = None) -> float | None:
        """The dollars of one call, or None: no price for the model, or no token counts recorded."""
        if input_tokens is None and output_tokens is None:
            return None
        found = self.lookup(provider, model)
        if found is None:
            return None
        i, o = int(input_tokens or 0), int(output_tokens or 0)
        cr, cw = int(cache_read or 0), int(cache_write or 0)
        if isinstance(found, Rates):
            return found.cost(i, o, cr, cw)
        prov, info = found
        when = datetime.fromtimestamp(at_ns / 1e9, UTC) if at_ns else datetime.now(UTC)
        model_price = info.get_prices(when)
        key = id(model_price)
        if key not in self._rates:
            self._rates[key] = _rates_of(model_price)
            self._keep = getattr(self, "_keep", [])
            self._keep.append(model_price)  # the id stays this object's
        rates = self._rates[key]
        if rates is not None:
            return rates.cost(i, o, cr, cw)
        from genai_prices.types import Usage

        usage = Usage(input_tokens=i, output_tokens=o, cache_read_tokens=cr or None,
                      cache_write_tokens=cw or None)
        return float(info.calc_price(usage, prov, genai_request_timestamp=when).total_price)

    def price_source(self, provider: str | None, model: str | None) -> str | None:
        """Where a model's price comes from: ``override``, ``genai-prices``, or None (no price)."""
        found = self.lookup(provider, model)
        return None if found is None else ("override" if isinstance(found, Rates) else "genai-prices")

    def cost_of(self, calls: Iterable[Mapping[str, Any]]) -> Cost:
        """The ``Cost`` of call rows (provider, model, input_tokens, output_tokens, cache_read_tokens,
        cache_write_tokens, start_ns)."""
        cost = Cost()
        for c in calls:
            cost.add_call(self.call_usd(c.get("provider"), c.get("model"), c.get("input_tokens"),
                                        c.get("output_tokens"), c.get("cache_read_tokens"),
                                        c.get("cache_write_tokens"), c.get("start_ns")), c.get("model"))
        return cost


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise PricesFileError(f"{where}: a number of dollars per million tokens, not {value!r}")
    try:
        number = float(Decimal(str(value)))
    except ArithmeticError:
        raise PricesFileError(f"{where}: a number of dollars per million tokens, not {value!r}") from None
    if number < 0 or number != number:
        raise PricesFileError(f"{where}: a price cannot be negative")
    return number


def parse_overrides(data: Any, origin: str = "prices") -> dict[tuple[str | None, str], Rates]:
    """``{model: {input_mtok, output_mtok, cache_read_mtok?, cache_write_mtok?, provider?}}`` (or the same
    under a ``models`` key) as rates keyed by (provider or None, model in lower case). A missing cache
    price is the input price (what a provider without a cache bills)."""
    if isinstance(data, Mapping) and "models" in data and isinstance(data["models"], Mapping):
        data = data["models"]
    if not isinstance(data, Mapping):
        raise PricesFileError(f"{origin}: a mapping of model name to prices per million tokens")
    out: dict[tuple[str | None, str], Rates] = {}
    for model, entry in data.items():
        where = f"{origin}: {model}"
        if not isinstance(entry, Mapping):
            raise PricesFileError(f"{where}: a mapping with input_mtok and output_mtok")
        unknown = set(entry) - set(OVERRIDE_KEYS) - {"provider"}
        if unknown:
            raise PricesFileError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: "
                                  f"{', '.join(OVERRIDE_KEYS)}, provider)")
        missing = [k for k in ("input_mtok", "output_mtok") if k not in entry]
        if missing:
            raise PricesFileError(f"{where}: {missing[0]} is missing")
        inp = _number(entry["input_mtok"], f"{where}.input_mtok")
        rates = Rates(input=inp / _MTOK, output=_number(entry["output_mtok"], f"{where}.output_mtok") / _MTOK,
                      cache_read=_number(entry.get("cache_read_mtok", inp), f"{where}.cache_read_mtok") / _MTOK,
                      cache_write=_number(entry.get("cache_write_mtok", inp), f"{where}.cache_write_mtok") / _MTOK,
                      source="override")
        provider = entry.get("provider")
        out[(_provider_id(str(provider)) if provider else None, str(model).lower())] = rates
    return out


def read_overrides(path: str | os.PathLike[str]) -> dict[tuple[str | None, str], Rates]:
    """The overrides of a JSON or YAML file (by its suffix; JSON when it has none)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PricesFileError(f"prices file {str(p)!r}: {exc.strerror or exc}") from None
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise PricesFileError(f"prices file {str(p)!r}: YAML needs PyYAML (pip install pyyaml), "
                                  "or write the file as JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PricesFileError(f"prices file {str(p)!r}: not YAML ({exc})") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise PricesFileError(f"prices file {str(p)!r}: not JSON ({exc})") from None
    return parse_overrides(data, f"prices file {str(p)!r}")
