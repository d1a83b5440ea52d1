"""The durable resume journal: SQLite in WAL mode, one synchronous commit per record.

It lives next to the agent and does not depend on export: an intent is on disk before a tool's side
effect starts and a commit after it ends, so a kill -9 anywhere leaves either nothing, an intent (the
call is in doubt) or a commit (the call is done).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import orjson

from .entry import Entry
from .keys import ResumeKey

_DDL = """
CREATE TABLE IF NOT EXISTS entries (
  tape TEXT NOT NULL,
  kind TEXT NOT NULL,
  request_hash TEXT NOT NULL,
  occurrence INTEGER NOT NULL,
  position INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  state TEXT NOT NULL,
  name TEXT,
  call_id TEXT,
  idempotency_key TEXT,
  match TEXT NOT NULL,
  request BLOB,
  result BLOB,
  deltas BLOB,
  error BLOB,
  extra BLOB,
  PRIMARY KEY (tape, kind, request_hash, occurrence)
)
"""

_COLS = (
    "tape, kind, request_hash, occurrence, position, seq, state, name, call_id, idempotency_key, "
    "match, request, result, deltas, error, extra"
)


def _dump(value: object) -> bytes | None:
    return None if value is None else orjson.dumps(value)


def _load(blob: bytes | None) -> object:
    return None if blob is None else orjson.loads(blob)


DURABILITY = ("intent", "full", "process")
CHECKPOINT_INTERVAL_S = 1.0


class Journal:
    """Append-mostly record of intents and commits in one SQLite WAL file.

    Every record is in the WAL (so it survives kill -9) before ``put`` returns. ``durability`` says
    which records are also fsync'd before returning:

    - ``"full"`` (default): every record (``synchronous=FULL`` throughout); a commit survives a power
      loss too, at the cost of an fsync per record.
    - ``"intent"``: intents, i.e. before any side effect starts. Commits ride on the next fsync: the
      WAL is sequential, so syncing an intent makes every earlier record durable too. After a power
      loss a commit can be missing, which turns the call into an in-doubt one (reported, never
      silently re-run) or, for a model call, into one paid for again.
    - ``"process"``: none; survives the process dying, not the machine.
    """

    def __init__(self, path: str | Path, *, durability: str = "full") -> None:
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {DURABILITY}")
        self.path = str(path)
        self.durability = durability
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_DDL)
        self._sync: str | None = None
        # Copying the WAL back into the database (a checkpoint) costs fsyncs; done on the calling
        # thread it shows up as latency spikes, so a background thread does it instead.
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._dirty = threading.Event()
        self._closed = threading.Event()
        self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="resume-journal-checkpoint",
                                              daemon=True)
        self._checkpointer.start()

    def _checkpoint_loop(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            while not self._closed.wait(CHECKPOINT_INTERVAL_S):
                if self._dirty.is_set():
                    self._dirty.clear()
                    try:
                        db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    except sqlite3.Error:
                        self._dirty.set()
        finally:
            db.close()

    def _synchronous(self, sync: bool) -> None:
        want = "FULL" if self.durability == "full" or (sync and self.durability == "intent") else "NORMAL"
        if want != self._sync:
            self._db.execute(f"PRAGMA synchronous={want}")
            self._sync = want

    def put(self, entry: Entry, *, sync: bool = True) -> None:
        """Write (or overwrite) one record; ``sync``: fsync it before returning (per ``durability``)."""
        row = (
            entry.tape, entry.kind, entry.request_hash, entry.occurrence, entry.position, entry.seq,
            entry.state, entry.name, entry.call_id, entry.idempotency_key, entry.match,
            _dump(entry.request), _dump(entry.result), _dump(entry.deltas), _dump(entry.error),
            _dump(entry.extra or None),
        )
        with self._lock:
            self._synchronous(sync)
            self._db.execute(f"INSERT OR REPLACE INTO entries ({_COLS}) VALUES ({','.join('?' * 16)})", row)
        self._dirty.set()

    def delete(self, key: ResumeKey) -> None:
        with self._lock:
            self._synchronous(True)
            self._db.execute(
                "DELETE FROM entries WHERE tape=? AND kind=? AND request_hash=? AND occurrence=?",
                (key.tape, key.kind, key.request_hash, key.occurrence),
            )

    def load(self, tape: str | None = None) -> list[Entry]:
        sql = f"SELECT {_COLS} FROM entries"
        params: tuple = ()
        if tape is not None:
            sql += " WHERE tape=?"
            params = (tape,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY seq", params).fetchall()
        out = []
        for r in rows:
            out.append(
                Entry(
                    tape=r[0], kind=r[1], request_hash=r[2], occurrence=r[3], position=r[4], seq=r[5],
                    state=r[6], name=r[7], call_id=r[8], idempotency_key=r[9], match=r[10],
                    request=_load(r[11]), result=_load(r[12]), deltas=_load(r[13]),  # type: ignore[arg-type]
                    error=_load(r[14]), extra=_load(r[15]) or {},  # type: ignore[arg-type]
                )
            )
        return out

    def close(self) -> None:
        """Checkpoint and close (a killed process never gets here; the WAL is recovered on open)."""
        self._closed.set()
        self._checkpointer.join(timeout=5)
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
            self._db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
