"""The integrity commands: ``agenttape keygen``, ``verify``, ``prove`` and ``verify-proof``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from otel_agenttape.cli import CliError
from otel_agenttape.commands.sources import open_args
from otel_agenttape.integrity import Verifier
from otel_agenttape.tape.verification import ProveError, prove_span, verify_store

# --- command line ---------------------------------------------------------------------------------------


def _looks_like_path(text: str) -> bool:
    return os.sep in text or "/" in text or text.endswith((".pub", ".key"))


def _parse_key(arg: str) -> Verifier:
    """``--key``: a file holding a verifier key, or the key text itself (``name+hash+base64``)."""
    from otel_agenttape.integrity.note import NoteError

    if os.path.exists(arg):
        try:
            with open(arg, encoding="utf-8") as fh:
                text = fh.read().strip()
        except UnicodeDecodeError:
            raise CliError(f"bad --key {arg}: not a text key file") from None
        except OSError as exc:
            raise CliError(f"bad --key {arg}: {exc.strerror or exc}") from None
    else:
        text = arg
    try:
        return Verifier.parse(text)
    except NoteError as exc:
        if text is arg and _looks_like_path(arg):  # key names and base64 hold "/" too: parse first
            raise CliError(f"bad --key {arg}: no such file") from None
        raise CliError(f"bad --key {arg}: {exc}") from None


def _verifiers(keys: Sequence[str] | None) -> list[Verifier]:
    return [_parse_key(k) for k in keys or ()]


def _open(args: Any) -> Any:
    return open_args(args)


def _keys(args: Any) -> list[Verifier]:
    return _verifiers(args.key)


def _run_exists(reader: Any, run: str) -> bool:
    """Whether any span belongs to ``run`` (as its run id or its tape's chain id)."""
    found = reader.query("SELECT 1 AS x FROM spans WHERE run_id = ? OR chain_id = ? LIMIT 1", [run, run])
    return found.num_rows > 0


def cmd_verify(args: Any) -> int:
    """``agenttape verify``: exit 0 when every tape verifies, 1 otherwise (2 for an unknown ``--run``)."""
    verifiers = _keys(args)
    for path in args.checkpoints or ():
        if not os.path.exists(path):
            raise CliError(f"no checkpoint file {path}")
    reader = _open(args)
    try:
        reports = verify_store(reader, run=args.run, verifiers=verifiers, checkpoint_files=args.checkpoints or ())
        if not reports and args.run is not None and not _run_exists(reader, args.run):
            raise CliError(f"run not found: {args.run}")
        lakes = getattr(reader, "lakes", None)  # a lake: every listed file there, as published
        files = lakes.check_files() if lakes is not None else []
    finally:
        reader.close()
    ok = bool(reports) and all(r.valid for r in reports) and not files
    if args.json:
        doc = {"valid": ok, "chains": [r.to_json() for r in reports]}
        if lakes is not None:
            doc["lake_files"] = {"checked": lakes.files(), "problems": files}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0 if ok else 1
    if not reports:
        print("no sealed tapes found" + (f" for run {args.run}" if args.run else ""))
        return 1
    for r in reports:
        epoch = f" epoch {r.epoch}" if r.epoch else ""
        if r.trace_id:  # the same tape id and epoch opened in several traces (integrity.md section 2)
            epoch += f" (trace {r.trace_id})"
        signed = f", signed up to {r.signed_size}" if r.key_pinned else ""
        if r.valid:
            print(f"ok    {r.chain_id}{epoch}: {r.length} entries{signed}")
        else:
            print(f"FAIL  {r.chain_id}{epoch}: {r.length} entries, first broken index {r.first_broken_index}: {r.reason}")
            for issue in r.issues[1:6]:
                print(f"        also at {issue.index}: {issue.reason}")
        if r.restored_from:
            print(f"        restored epoch; previous checkpoint: {r.restored_from}")
        if r.removed_by_retention:
            print(f"        {r.removed_by_retention} earlier entries removed by retention (recorded in the lake)")
    for f in files:
        print(f"FAIL  lake file {f['file']}: {f['problem']}")
    if not verifiers:
        print("note: no --key given: checkpoint signatures were not checked against a trusted key")
    return 0 if ok else 1


def cmd_prove(args: Any) -> int:
    """``agenttape prove SPAN_ID --out FILE``."""

    verifiers = _keys(args)
    reader = _open(args)
    try:
        proof = prove_span(reader, args.span_id, verifiers=verifiers, checkpoint_files=args.checkpoints or ())
    except ProveError as exc:
        print(f"agenttape: cannot prove: {exc}", file=sys.stderr)
        return 1
    finally:
        reader.close()
    try:
        with open(args.out, "wb") as fh:
            fh.write(orjson.dumps(proof, option=orjson.OPT_INDENT_2) + b"\n")
    except OSError as exc:
        raise CliError(str(exc)) from None
    print(f"wrote proof of span {proof['span_id']} (seq {proof['index']} of {proof['tree_size']} "
          f"in tape {proof['chain_id']}) to {args.out}")
    return 0


def cmd_verify_proof(args: Any) -> int:
    """``agenttape verify-proof FILE --key PUB``: checks offline, exit 0 or 1."""
    from otel_agenttape.integrity.proof import ProofInvalid, verify_proof

    verifiers = _keys(args)
    if not verifiers:
        raise CliError("verify-proof needs --key (the signer's public key)")
    try:
        with open(args.file, "rb") as fh:
            doc = orjson.loads(fh.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise CliError(f"cannot read proof {args.file}: {exc}") from None
    try:
        res = verify_proof(doc, verifiers)
    except ProofInvalid as exc:
        if args.json:
            print(orjson.dumps({"valid": False, "reason": str(exc)}).decode())
        else:
            print(f"INVALID proof: {exc}")
        return 1
    if args.json:
        print(orjson.dumps({"valid": True, "chain_id": res.chain_id, "epoch": res.epoch, "index": res.index,
                            "tree_size": res.tree_size, "span_id": res.span_id,
                            "signed_by": list(res.signed_by)}).decode())
    else:
        print(f"ok: span {res.span_id} is entry {res.index} of {res.tree_size} in tape {res.chain_id}, "
              f"signed by {', '.join(res.signed_by)}")
    return 0


def cmd_keygen(args: Any) -> int:
    """``agenttape keygen``: an Ed25519 signing key for checkpoints (PREFIX.key, PREFIX.pub)."""
    import socket

    from otel_agenttape.integrity.note import NoteError, Signer

    name = args.name or "agenttape." + "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.") or "agenttape"
    try:
        signer = Signer.generate(name)
    except NoteError as exc:
        raise CliError(str(exc)) from None
    key_path, pub_path = args.out + ".key", args.out + ".pub"
    for p in (key_path, pub_path):
        if os.path.exists(p) and not args.force:
            raise CliError(f"{p} exists (use --force to replace it)")
    try:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(signer.skey() + "\n")
        os.chmod(key_path, 0o600)
        with open(pub_path, "w", encoding="utf-8") as fh:
            fh.write(signer.verifier().vkey() + "\n")
    except OSError as exc:
        raise CliError(str(exc)) from None
    print(f"signing key: {key_path} (keep it secret; AGENTTAPE_SIGNING_KEY={key_path})")
    print(f"public key:  {pub_path}")
    print(signer.verifier().vkey())
    return 0
