"""``Tapes.erase``: which spans a session, run, trace or time names, erased in the DuckDB store.

The selection is a condition on ``spans``: ``session`` (every run that carries the session id, with all
its spans), ``run`` (a ref: the run's spans in its trace), ``trace`` (a trace id), ``before`` (spans
that started before a time). ``store/erasure.py`` does the erasing; ``integrity/erasure.py`` holds the
rule and the record.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Sequence
from typing import Any

from ..integrity.note import Signer
from ..store.erasure import EraseResult, erase_duckdb
from ..store.erasure_copies import copies_for
from ..store.readers import StoreError
from .load import Reader
from .read.filters import as_ns
from .refs import resolve


def selection(reader: Reader, *, session: str | None = None, run: str | None = None, trace: str | None = None,
              before: Any = None, where: str | None = None) -> tuple[str, list[Any], dict[str, Any]]:
    """``(spans condition, params, selector for the record)``; exactly one selector must be given."""
    given = {k: v for k, v in (("session", session), ("run", run), ("trace", trace), ("before", before),
                               ("where", where)) if v not in (None, "")}
    if len(given) != 1:
        raise ValueError("name exactly one of session, run, trace, before or where")
    (what, value), = given.items()
    if what == "where":
        return f"({check_predicate(reader, str(value))})", [], {"where": str(value)}
    if what == "session":
        return ("(session_id = ? OR run_id IN (SELECT DISTINCT run_id FROM spans WHERE session_id = ? "
                "AND run_id IS NOT NULL))", [value, value], {"session": value})
    if what == "run":
        target = resolve(reader, str(value))
        if target.key is None:
            return "trace_id = ?", [target.trace_id], {"run": target.ref}
        return "run_id = ? AND trace_id = ?", [target.key, target.trace_id], {"run": target.ref}
    if what == "trace":
        return "trace_id = ?", [str(value).lower()], {"trace": str(value).lower()}
    ns = as_ns(value, "before")
    return "start_time_unix_nano < ?", [ns], {"before_unix_nano": str(ns)}


def check_predicate(reader: Reader, predicate: str) -> str:
    """A user's ``--where``: one SQL expression over the columns of ``spans`` (a subquery over ``spans``
    may be part of it), run once through the read-only SQL guard (``store/sql.py``: reads only, no
    files, no table function that could reach outside the store). ``ValueError`` says what is wrong."""
    import duckdb

    from ..store.reader import QueryError
    from ..store.sql import run_readonly_sql

    if not predicate.strip():
        raise ValueError("--where: empty predicate")
    try:
        duckdb.SQLExpression(predicate)
    except duckdb.Error as exc:
        raise ValueError(f"--where {predicate!r} is not one SQL expression: {str(exc).splitlines()[0]}") from None
    try:
        run_readonly_sql(reader, f"SELECT count(*) FROM spans WHERE ({predicate})")
    except QueryError as exc:
        raise ValueError(f"--where {predicate!r}: {str(exc).splitlines()[0]}") from None
    return predicate


def default_by() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def signer_from(key: Signer | str | os.PathLike[str] | None) -> Signer:
    """The key that signs the record: a ``Signer``, a ``PRIVATE+KEY+...`` text or a file holding one,
    else ``$AGENTTAPE_SIGNING_KEY``, else a new ephemeral key (the record then proves structure, not
    authority, as a checkpoint signed by an ephemeral key)."""
    if key is None:
        key = os.environ.get("AGENTTAPE_SIGNING_KEY") or None
    if key is None:
        return Signer.generate("agenttape.ephemeral")
    if isinstance(key, Signer):
        return key
    text = str(key)
    if not text.startswith("PRIVATE+KEY+"):
        with open(text, encoding="utf-8") as fh:
            text = fh.read().strip()
    return Signer.parse(text)


def held_by_server(reader: Reader) -> bool:
    """Whether the reader reads a store file through the running receiver that holds it."""
    return getattr(reader, "kind", None) == "server" and " via " in str(getattr(reader, "description", "") or "")


def erase_via_server(reader: Any, where: str, params: list[Any], selector: dict[str, Any], *, reason: str,
                     signing_key: Any = None, by: str | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Ask the receiver that holds the store to erase (``POST /api/erase``): it keeps ingesting, its
    writes wait only while the file and its own copies are rewritten. The record is signed with
    ``signing_key`` when one is given (sent to the receiver over its authenticated endpoint), else with
    the receiver's own key."""
    key = signer_from(signing_key).skey() if signing_key is not None else None
    return _post(reader, "/api/erase", "erasure", {"where": where, "params": params, "selector": selector,
                                                    "reason": reason, "by": by or default_by(),
                                                    "signing_key": key, "dry_run": dry_run})


def retain_via_server(reader: Any, older_than_days: int, *, reason: str, content_only: bool = False,
                      signing_key: Any = None, by: str | None = None, dry_run: bool = False,
                      today: Any = None) -> dict[str, Any]:
    """Ask the receiver that holds the store to apply retention (``POST /api/retain``), as ``erase_via_server``."""
    key = signer_from(signing_key).skey() if signing_key is not None else None
    return _post(reader, "/api/retain", "retention", {
        "older_than_days": int(older_than_days), "reason": reason, "by": by or default_by(),
        "content_only": content_only, "signing_key": key, "dry_run": dry_run,
        "today": today.isoformat() if today is not None else None})


def _post(reader: Any, path: str, what: str, doc: dict[str, Any]) -> dict[str, Any]:
    import urllib.error
    import urllib.request

    import orjson

    headers = {"Content-Type": "application/json"}
    if getattr(reader, "token", None):
        headers["Authorization"] = f"Bearer {reader.token}"
    req = urllib.request.Request(f"{reader.url}{path}", data=orjson.dumps(doc), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:  # noqa: S310 - the receiver's own URL
            return orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            message = orjson.loads(exc.read()).get("error") or str(exc)
        except (ValueError, AttributeError):
            message = str(exc)
        raise StoreError(f"the receiver at {reader.url} refused the {what}: {message}") from None
    except OSError as exc:
        raise StoreError(f"cannot reach the receiver at {reader.url}: {exc}") from None


def store_path(reader: Reader) -> str:
    """The DuckDB file a reader reads; erasure works on nothing else."""
    path = str(getattr(reader, "description", "") or "")
    if held_by_server(reader):
        raise StoreError(f"{path.split(' via ')[0]} is held by a running receiver ({path.split(' via ')[1]}): "
                         "stop it for the moment this runs")
    if getattr(reader, "kind", None) != "duckdb" or not os.path.isfile(path):
        raise StoreError("erasure works on a DuckDB store file, and with it on its copies (name them: "
                         "--parquet DIR, --lake DIR|s3://..., --wal DIR, --outbox DIR)")
    return path


def erase_file(path: str, where: str, params: list[Any], selector: dict[str, Any], *, reason: str,
               signer: Signer, by: str | None = None, dry_run: bool = False, parquet: Sequence[str] = (),
               lakes: Sequence[str] = (), wal: Sequence[str] = (), outbox: Sequence[str] = ()) -> EraseResult:
    """Erase in the store file and in the copies named; the receiver's WAL beside the file (``DB.otlpwal``,
    segments a crash left for replay) is always included."""
    wal = list(wal)
    beside = path + ".otlpwal"
    if os.path.isdir(beside) and os.path.abspath(beside) not in {os.path.abspath(w) for w in wal}:
        wal.append(beside)
    copies = copies_for(parquet=parquet, lakes=lakes, wal=wal, outbox=outbox)
    return erase_duckdb(path, where, params, reason=reason, by=by or default_by(), selector=selector,
                        signer=signer, dry_run=dry_run, copies=copies)
