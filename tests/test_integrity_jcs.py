"""The fast RFC 8785 encoder is byte-identical to the ``rfc8785`` package on the leaf's domain."""

from __future__ import annotations

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_agenttape.integrity.jcs import CanonicalError, dumps, sorted_keys, utf16_key

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
KEYS = st.text(st.one_of(st.sampled_from(["\ue000", "\uffff", "\U0001f600", "\U00010000", "a", "\x7f", "\u2028"]),
                        st.characters(exclude_categories=("Cs",))), max_size=5)
json_values = st.recursive(
    st.one_of(TEXT, st.booleans(), st.none(), st.integers(-(2**53) + 1, 2**53 - 1)),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(KEYS, inner, max_size=5)),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_differential_against_rfc8785(value) -> None:
    assert dumps(value) == rfc8785.dumps(value)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**60), 2**60)))
def test_values_outside_the_fast_domain_defer_to_rfc8785(x) -> None:
    try:
        want = rfc8785.dumps({"x": [x]})
    except rfc8785.CanonicalizationError:
        with pytest.raises(CanonicalError):
            dumps({"x": [x]})
        return
    assert dumps({"x": [x]}) == want


def test_every_control_and_escape_character() -> None:
    s = "".join(chr(i) for i in range(0x80)) + "\u2028\u2029\ufeff\U0001f600/\\\""
    assert dumps(s) == rfc8785.dumps(s)


def test_key_order_is_utf16_not_code_point() -> None:
    keys = ["\ue000", "\U0001f600", "a", "\uffff"]
    assert sorted_keys(keys) == ["a", "\U0001f600", "\ue000", "\uffff"]
    assert sorted(keys, key=utf16_key) == sorted_keys(keys)
    assert dumps(dict.fromkeys(keys, 1)) == rfc8785.dumps(dict.fromkeys(keys, 1))


@pytest.mark.parametrize("bad", ["a\ud800", {"\udc00": 1}, {1: "x"}, float("nan"), 2**53 + 10**10 * 0 + 2**60])
def test_values_without_a_canonical_form_fail_closed(bad) -> None:
    with pytest.raises(CanonicalError):
        dumps(bad)


def _random_value(rng, depth: int = 0):
    pick = rng.random()
    if depth < 3 and pick < 0.15:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if depth < 3 and pick < 0.3:
        return {_random_text(rng, 4): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if pick < 0.7:
        return _random_text(rng, 12)
    if pick < 0.85:
        return rng.randrange(-(2**53) + 1, 2**53)
    return rng.choice([True, False, None])


_POOLS = [(0x20, 0x7F), (0, 0x20), (0x80, 0x800), (0xE000, 0x10000), (0x10000, 0x110000), (0x800, 0xD800)]


def _random_text(rng, n: int) -> str:
    lo, hi = rng.choice(_POOLS)
    return "".join(chr(rng.randrange(lo, hi)) for _ in range(rng.randrange(n + 1)))


def test_differential_bulk_seeded() -> None:
    import random

    rng = random.Random(8785)
    for _ in range(20_000):
        v = {_random_text(rng, 3): _random_value(rng) for _ in range(rng.randrange(6))}
        assert dumps(v) == rfc8785.dumps(v), v
