"""The dollars of the model calls in one stored batch of spans, for the receiver's cost series.

Prices are ``otel_agenttape.pricing.Prices`` (genai-prices' bundled snapshot and the overrides of
``AGENTTAPE_PRICES``), the same rule ``agenttape runs`` uses, so a dashboard's dollars and the CLI's agree.
A batch is priced by its distinct (provider, model) pairs: each pair's per-token rates are looked up once
and multiplied over its rows as arrays; only a tiered price (rare) is priced call by call. Cache tokens
live in the attributes: they are read only from the rows whose attributes name a cache count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from otel_agenttape import semconv as sc
from otel_agenttape.pricing import Prices, Rates
from otel_agenttape.receiver.span_labels import flat, rows_containing

CACHE_READ_KEYS = (sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS_LEGACY,
                   sc.OI_TOKEN_CACHE_READ)
CACHE_WRITE_KEYS = (sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS, sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
                    sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS_LEGACY, sc.OI_TOKEN_CACHE_WRITE)


def _int_of(value: Any) -> int | None:
    """A typed attribute value (``{"i": 5}``, ``{"s": "5"}``) as an int."""
    if isinstance(value, dict):
        value = value.get("i", value.get("s", value.get("d")))
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _cache_tokens(attrs: pa.Array, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cache-read and cache-write tokens of ``rows`` of ``attrs`` (0 where none is recorded). The
    column is scanned in place for the word first: only the rows that name it are parsed."""
    read = np.zeros(len(rows), dtype=np.float64)
    write = np.zeros(len(rows), dtype=np.float64)
    where = np.full(len(attrs), -1, dtype=np.int64)
    where[rows] = np.arange(len(rows), dtype=np.int64)
    for row in rows_containing(attrs, b"cache"):
        i = where[row]
        if i < 0:
            continue
        text = attrs[int(row)].as_py()
        try:
            doc = orjson.loads(text) if text else {}
        except orjson.JSONDecodeError:
            continue
        for out, keys in ((read, CACHE_READ_KEYS), (write, CACHE_WRITE_KEYS)):
            for k in keys:
                n = _int_of(doc.get(k))
                if n is not None:
                    out[i] = n
                    break
    return read, write


def batch_usd(spans: pa.Table, rows: np.ndarray, prices: Prices) -> tuple[np.ndarray, np.ndarray]:
    """(dollars of each of ``rows``, which of them had a price) for model-call rows of a batch. A call
    without a price, or with no token counts, is not priced (its dollars are 0 and it is counted apart)."""
    n = len(rows)
    usd = np.zeros(n, dtype=np.float64)
    priced = np.zeros(n, dtype=bool)
    if not n:
        return usd, priced
    take = pa.array(rows)
    model = pc.coalesce(flat(spans.column("response_model")), flat(spans.column("request_model"))).take(take)
    provider = flat(spans.column("provider_name")).take(take)
    inp = flat(spans.column("input_tokens")).take(take)
    out = flat(spans.column("output_tokens")).take(take)
    has_tokens = (inp.is_valid() if inp.null_count else pa.array(np.ones(n, dtype=bool)))
    has_tokens = pc.or_(has_tokens, out.is_valid()).to_numpy(zero_copy_only=False)
    i_tok = pc.fill_null(inp, 0).to_numpy(zero_copy_only=False).astype(np.float64)
    o_tok = pc.fill_null(out, 0).to_numpy(zero_copy_only=False).astype(np.float64)
    start = flat(spans.column("start_time_unix_nano")).take(take).to_numpy(zero_copy_only=False)
    cache_r, cache_w = _cache_tokens(flat(spans.column("attributes")), rows)
    pairs = pc.binary_join_element_wise(pc.fill_null(provider, ""), pc.fill_null(model, ""), "\x00")
    pairs = pairs.dictionary_encode()
    codes = pairs.indices.to_numpy(zero_copy_only=False)
    for code, key in enumerate(pairs.dictionary.to_pylist()):
        at = np.flatnonzero((codes == code) & has_tokens)
        if not len(at):
            continue
        p_name, m_name = key.split("\x00", 1)
        pair = {"p": p_name or None, "m": m_name or None}
        rates = prices.rates(pair["p"], pair["m"], int(start[at[0]]))
        if rates is None:
            continue
        if isinstance(rates, Rates):
            uncached = np.maximum(i_tok[at] - cache_r[at] - cache_w[at], 0)
            usd[at] = (uncached * rates.input + o_tok[at] * rates.output + cache_r[at] * rates.cache_read
                       + cache_w[at] * rates.cache_write)
        else:  # tiered: genai-prices per call
            for j in at:
                usd[j] = prices.call_usd(pair["p"], pair["m"], int(i_tok[j]), int(o_tok[j]), int(cache_r[j]),
                                         int(cache_w[j]), int(start[j])) or 0.0
        priced[at] = True
    return usd, priced
