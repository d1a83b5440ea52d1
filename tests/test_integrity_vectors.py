"""Leaf test vectors (tests/vectors/leaf, written by tests/vectors/make_leaf_vectors.py): row, OTLP JSON and
chain fields give the recorded bytes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import rfc8785

from otel_agenttape.codec.otlp_decode import JSON, decode_traces
from otel_agenttape.integrity import genesis, leaf_from_proto, leaf_from_row, link_hash

VECTORS = sorted((Path(__file__).parent / "vectors" / "leaf").glob("*.json"))


def test_vectors_exist() -> None:
    assert len(VECTORS) >= 6


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_leaf_vector(path: Path) -> None:
    v = json.loads(path.read_text(encoding="utf-8"))
    leaf = v["leaf"].encode("utf-8")
    assert rfc8785.dumps(orjson.loads(leaf)) == leaf  # the leaf is RFC 8785 canonical
    assert hashlib.sha256(leaf).hexdigest() == v["leaf_sha256"]
    assert hashlib.sha256(b"\x00" + leaf).hexdigest() == v["merkle_leaf_hash"]
    row = v["row"]
    assert leaf_from_row(row, row["events"], row["links"]) == leaf
    req = decode_traces(json.dumps(v["otlp_json"]).encode(), JSON)
    (span,) = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert leaf_from_proto(span) == leaf
    c = v["chain"]
    assert genesis(c["chain_id"], c["epoch"]) == c["genesis"] == c["prev"]
    # chain format v2: the link hashes the hex of the Merkle leaf hash, not the leaf bytes
    assert hashlib.sha256(f"{c['prev']}|{v['merkle_leaf_hash']}".encode()).hexdigest() == c["hash"]
    assert link_hash(c["prev"], leaf) == c["hash"]


def _generator(name: str) -> Any:
    path = Path(__file__).parent / "vectors" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_vectors_are_what_the_generator_writes() -> None:
    assert _generator("make_leaf_vectors").main(["--check"]) == 0


def test_v1_and_v2_vectors_are_both_kept() -> None:
    versions = {p.stem: orjson.loads(json.loads(p.read_text(encoding="utf-8"))["leaf"])["v"] for p in VECTORS}
    assert {n for n, v in versions.items() if v == 2} == {"v2_content", "v2_tool"}
    assert sum(1 for v in versions.values() if v == 1) >= 6


@pytest.mark.parametrize("path", [p for p in VECTORS if p.stem.startswith("v2_")], ids=lambda p: p.stem)
def test_v2_vector_commitments_are_salted_hashes_of_the_values(path: Path) -> None:
    v = json.loads(path.read_text(encoding="utf-8"))
    leaf = orjson.loads(v["leaf"])
    row = v["row"]
    attrs = json.loads(row["attributes"])
    salts = json.loads(attrs["agenttape.chain.salts"]["s"])
    events = [json.loads(e["attributes"]) for e in sorted(row["events"], key=lambda e: e["event_index"])]
    assert salts and len(salts) >= 2
    for label, salt in salts.items():
        if label.startswith("event:"):
            _, idx, key = label.split(":", 2)
            typed, committed = events[int(idx)][key], leaf["events"][int(idx)]["attributes"][key]
        else:
            typed, committed = attrs[label], leaf["attributes"][label]
        expect = hashlib.sha256(bytes.fromhex(salt) + rfc8785.dumps(typed)).hexdigest()
        assert committed == {"c": expect}
        assert orjson.dumps(typed).decode() not in v["leaf"]  # the value itself is not in the leaf


LOG_VECTORS = sorted((Path(__file__).parent / "vectors" / "log_leaf").glob("*.json"))


@pytest.mark.parametrize("path", LOG_VECTORS, ids=lambda p: p.stem)
def test_log_leaf_vector(path: Path) -> None:
    """A sealed log record: the leaf the sealer named in its span at capture is the one the stored row
    and the OTLP record give, over an RFC 8785 projection whose content values are salted commitments."""
    from otel_agenttape.codec.otlp_decode import decode_logs
    from otel_agenttape.integrity import log_leaf

    v = json.loads(path.read_text(encoding="utf-8"))
    proj = v["projection"].encode("utf-8")
    assert rfc8785.dumps(orjson.loads(proj)) == proj
    assert hashlib.sha256(proj).hexdigest() == v["leaf"] == v["span_logs_event"]["agenttape.logs.leaves"][0]
    row = v["row"]
    assert log_leaf.leaf_from_row(row) == v["leaf"]
    req = decode_logs(json.dumps(v["otlp_json"]).encode(), JSON)
    (rec,) = [r for rl in req.resource_logs for sl in rl.scope_logs for r in sl.log_records]
    attrs = json.loads(row["attributes"])
    salts = {k: bytes.fromhex(h) for k, h in json.loads(attrs.get("agenttape.chain.salts", {"s": "{}"})["s"]).items()}
    assert log_leaf.leaf_from_proto(rec, salts) == v["leaf"]
    p = orjson.loads(proj)
    for label, salt in salts.items():
        typed = json.loads(row["body"]) if label == log_leaf.BODY_LABEL else attrs[label]
        committed = p["body"] if label == log_leaf.BODY_LABEL else p["attributes"][label]
        assert committed == {"c": hashlib.sha256(salt + rfc8785.dumps(typed)).hexdigest()}
        assert orjson.dumps(typed).decode() not in v["projection"]


def test_log_leaf_vectors_are_what_their_generator_writes() -> None:
    assert len(LOG_VECTORS) >= 3
    assert _generator("make_log_leaf_vectors").main(["--check"]) == 0
