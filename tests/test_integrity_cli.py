"""agenttape keygen / verify / prove / verify-proof, end to end on a real store file."""

from __future__ import annotations

import json

import duckdb
import orjson
from integrity_support import encode, sealed_provider

from otel_agenttape import semconv
from otel_agenttape.cli import main
from otel_agenttape.integrity import Signer
from otel_agenttape.store.writer import Store


def _setup(tmp_path, capsys):
    assert main(["keygen", "--out", str(tmp_path / "k"), "--name", "test.agenttape/cli"]) == 0
    capsys.readouterr()
    key = Signer.parse((tmp_path / "k.key").read_text())
    cp = tmp_path / "cp.jsonl"
    provider, _, exporter = sealed_provider(signing_key=str(tmp_path / "k.key"), checkpoint_file=cp)
    tracer = provider.get_tracer("otel_agenttape")
    with tracer.start_as_current_span("invoke_agent", attributes={semconv.RUN_ID: "cli-run"}):
        for i in range(5):
            with tracer.start_as_current_span(f"chat {i}", attributes={semconv.NODE_TYPE: "model", "i": i}):
                pass
    provider.shutdown()
    spans = exporter.get_finished_spans()
    db = str(tmp_path / "t.duckdb")
    store = Store(db)
    store.write_traces([encode(spans)])
    store.close()
    otlp = tmp_path / "spans.json"
    from integrity_support import otlp_json

    otlp.write_bytes(otlp_json(encode(spans)))
    target = [s for s in spans if s.name == "chat 2"][0]
    return key, db, str(cp), str(otlp), f"{target.context.span_id:016x}"


def test_keygen_verify_prove_round_trip(tmp_path, capsys) -> None:
    _key, db, cp, otlp, span_id = _setup(tmp_path, capsys)
    pub = str(tmp_path / "k.pub")
    assert (tmp_path / "k.key").stat().st_mode & 0o777 == 0o600
    assert main(["verify", "--db", db, "--key", pub, "--checkpoints", cp, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (chain,) = doc["chains"]
    assert doc["valid"] and chain["chain_id"] == "cli-run" and chain["length"] == 6
    assert chain["first_broken_index"] is None and chain["reason"] is None
    assert main(["verify", "--otlp", otlp, "--key", pub, "--run", "cli-run"]) == 0
    assert "ok    cli-run: 6 entries, signed up to 6" in capsys.readouterr().out

    proof = tmp_path / "proof.json"
    assert main(["prove", span_id, "--db", db, "--key", pub, "--out", str(proof)]) == 0
    capsys.readouterr()
    assert main(["verify-proof", str(proof), "--key", pub, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["valid"] and res["span_id"] == span_id and res["index"] == 2

    doc = orjson.loads(proof.read_bytes())
    other = Signer.generate("test.agenttape/cli").verifier().vkey()
    assert main(["verify-proof", str(proof), "--key", other]) == 1
    for mutate in (
        lambda d: d.update(leaf=d["leaf"].replace('"i":{"i":"2"}', '"i":{"i":"3"}')),
        lambda d: d.update(index=d["index"] + 1),
        lambda d: d.update(checkpoint=d["checkpoint"].replace(f"\n{d['tree_size']}\n", f"\n{d['tree_size'] + 1}\n", 1),
                           tree_size=d["tree_size"] + 1),
        lambda d: d.update(inclusion=d["inclusion"][1:]),
        lambda d: d.update(chain_id="another-run"),
    ):
        bad = dict(doc)
        mutate(bad)
        assert bad != doc
        p = tmp_path / "bad.json"
        p.write_bytes(orjson.dumps(bad))
        assert main(["verify-proof", str(p), "--key", pub]) == 1, bad
        assert "INVALID" in capsys.readouterr().out


def test_verify_exit_1_and_json_reason_on_tampering(tmp_path, capsys) -> None:
    _key, db, _cp, _, span_id = _setup(tmp_path, capsys)
    con = duckdb.connect(db)
    attrs = orjson.loads(con.execute("SELECT attributes FROM spans WHERE span_id = ?", [span_id]).fetchone()[0])
    attrs["i"] = {"i": "20"}
    con.execute("UPDATE spans SET attributes = ? WHERE span_id = ?", [orjson.dumps(attrs).decode(), span_id])
    con.close()
    assert main(["verify", "--db", db, "--json"]) == 1
    (chain,) = json.loads(capsys.readouterr().out)["chains"]
    assert (chain["valid"], chain["first_broken_index"]) == (False, 2)
    assert chain["reason"] == "leaf hash mismatch at seq 2: span content edited"
    assert main(["verify", "--db", db]) == 1
    assert "FAIL  cli-run" in capsys.readouterr().out
    assert main(["prove", span_id, "--db", db, "--key", str(tmp_path / "k.pub"), "--out", str(tmp_path / "p.json")]) == 1


def test_verify_usage_errors(tmp_path, capsys) -> None:
    assert main(["verify", "--db", str(tmp_path / "missing.duckdb")]) == 2
    assert main(["verify-proof", str(tmp_path / "none.json"), "--key", "x+1+2"]) == 2


def test_integrity_commands_report_bad_input_in_one_line(tmp_path, capsys) -> None:
    _key, db, _cp, _, span_id = _setup(tmp_path, capsys)
    pub = str(tmp_path / "k.pub")
    proof = tmp_path / "proof.json"
    assert main(["prove", span_id, "--db", db, "--key", pub, "--out", str(proof)]) == 0
    capsys.readouterr()
    # valid JSON that is not a proof object: INVALID (exit 1), no traceback
    for text in ("[1, 2]", "3", '"x"', "null"):
        (tmp_path / "notproof.json").write_text(text)
        assert main(["verify-proof", str(tmp_path / "notproof.json"), "--key", pub]) == 1, text
        assert "INVALID proof: not an agenttape proof" in capsys.readouterr().out
    doc = orjson.loads(proof.read_bytes())
    for bad in ({**doc, "leaf": 7}, {**doc, "leaf": "[1]"}, {**doc, "inclusion": 5}):
        (tmp_path / "bad.json").write_bytes(orjson.dumps(bad))
        assert main(["verify-proof", str(tmp_path / "bad.json"), "--key", pub]) == 1
        assert "INVALID proof" in capsys.readouterr().out
    # a binary --key file, a key path that does not exist, and key text that is not a key
    (tmp_path / "bin.pub").write_bytes(b"\xff\xfe\x00\x81binary")
    for cmd in (["verify-proof", str(proof)], ["verify", "--db", db], ["prove", span_id, "--db", db, "--out", "o"]):
        assert main([*cmd, "--key", str(tmp_path / "bin.pub")]) == 2
        assert capsys.readouterr().err.strip() == f"agenttape: error: bad --key {tmp_path / 'bin.pub'}: not a text key file"
        for missing in (str(tmp_path / "nokey.pub"), "nokey.pub", "keys/signer"):
            assert main([*cmd, "--key", missing]) == 2
            assert capsys.readouterr().err.strip() == f"agenttape: error: bad --key {missing}: no such file"
        assert main([*cmd, "--key", "notakey"]) == 2
        assert "bad --key notakey: malformed verifier key" in capsys.readouterr().err


def test_verify_unknown_run_is_exit_2_and_prove_errors_go_to_stderr(tmp_path, capsys) -> None:
    _key, db, _cp, _, _span_id = _setup(tmp_path, capsys)
    assert main(["verify", "--db", db, "--run", "nope"]) == 2
    assert capsys.readouterr().err.strip() == "agenttape: error: run not found: nope"
    assert main(["verify", "--db", db, "--run", "nope", "--json"]) == 2
    assert capsys.readouterr().out == ""
    assert main(["verify", "--db", db, "--run", "cli-run"]) == 0
    capsys.readouterr()
    # a run that exists but holds no sealed span: found, not verified (exit 1)
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider, exporter = TracerProvider(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("invoke_agent", attributes={semconv.RUN_ID: "plain-run"}):
        pass
    provider.shutdown()
    store = Store(db)
    store.write_traces([encode(exporter.get_finished_spans())])
    store.close()
    assert main(["verify", "--db", db, "--run", "plain-run"]) == 1
    assert "no sealed tapes found for run plain-run" in capsys.readouterr().out
    assert main(["prove", "00000000000000aa", "--db", db, "--out", str(tmp_path / "p.json")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("agenttape: cannot prove:")
