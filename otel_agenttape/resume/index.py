"""The resume index: recorded calls of a tape, looked up by (tape, request hash, occurrence).

Lookup is by content plus the occurrence ordinal among identical requests, so N identical calls
replay N recorded results in order and parallel calls that finish in another order still match.
Position (the ordinal of the call among calls of its kind) is only used to explain a miss: a
different request where the recorded run had an unconsumed call raises ``DivergenceError``.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from otel_agenttape.atomicfile import write_atomic

from .entry import COMMITTED, FAILED, INTENT, MATCH_POSITION, Entry
from .errors import DivergenceError, UnrecordedCallError
from .journal import Journal
from .keys import MODEL, TOOL, VALUE, ResumeKey, position_conflict, request_diff, request_hash

JSON_VERSION = 1


@dataclass
class Call:
    """One call in progress: its key, position and the recorded entry if any."""

    key: ResumeKey
    position: int
    request: Any
    name: str | None
    call_id: str | None
    entry: Entry | None

    @property
    def hit(self) -> bool:
        return self.entry is not None and self.entry.state != INTENT

    @property
    def in_doubt(self) -> bool:
        return self.entry is not None and self.entry.state == INTENT


class ResumeIndex:
    """Recorded calls of one tape, with hit/miss counters per node type.

    ``journal`` (a path or a ``Journal``) writes every record through as it is made and loads what a
    previous process recorded; ``durability`` (for a path) is the journal's fsync policy.
    ``replay_only`` turns every miss into ``UnrecordedCallError``.
    """

    def __init__(
        self,
        tape: str = "default",
        *,
        journal: Journal | str | os.PathLike[str] | None = None,
        durability: str = "full",
        replay_only: bool = False,
        entries: Iterable[Entry] = (),
    ) -> None:
        self.tape = tape
        self.replay_only = replay_only
        self._lock = threading.RLock()
        self._entries: dict[ResumeKey, Entry] = {}
        self._by_position: dict[tuple[str, int], Entry] = {}
        self._by_call_id: dict[str, Entry] = {}
        self._consumed: set[ResumeKey] = set()
        self._occurrence: dict[tuple[str, str], int] = defaultdict(int)
        self._position: dict[str, int] = defaultdict(int)
        self._inflight: dict[str, int] = defaultdict(int)
        self._seq = 0
        self.counters: dict[str, dict[str, int]] = {
            k: {"hits": 0, "misses": 0} for k in (MODEL, TOOL, VALUE)
        }
        if journal is not None and not isinstance(journal, Journal):
            journal = Journal(journal, durability=durability)
        self.journal: Journal | None = journal
        for e in entries:
            self.add(e, durable=False)
        if journal is not None:
            for e in journal.load(tape):
                self.add(e, durable=False)

    # --- contents ----------------------------------------------------------------------------
    def add(self, entry: Entry, *, durable: bool = True, sync: bool = False) -> None:
        """Insert or replace a recorded entry (also how the sealing processor or a rebuild feeds it).

        ``durable`` writes it to the journal; ``sync`` asks the journal to fsync it before returning.
        """
        with self._lock:
            if entry.seq <= 0:
                self._seq += 1
                entry.seq = self._seq
            else:
                self._seq = max(self._seq, entry.seq)
            self._entries[entry.key] = entry
            if entry.tape == self.tape:
                self._by_position[(entry.kind, entry.position)] = entry
                if entry.call_id:
                    self._by_call_id[entry.call_id] = entry
            if durable and self.journal is not None:
                self.journal.put(entry, sync=sync)

    def discard(self, key: ResumeKey) -> Entry | None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            if self._by_position.get((entry.kind, entry.position)) is entry:
                del self._by_position[(entry.kind, entry.position)]
            if entry.call_id and self._by_call_id.get(entry.call_id) is entry:
                del self._by_call_id[entry.call_id]
            if self.journal is not None:
                self.journal.delete(key)
            return entry

    def entries(self, kind: str | None = None) -> list[Entry]:
        with self._lock:
            out = [e for e in self._entries.values() if kind is None or e.kind == kind]
        return sorted(out, key=lambda e: e.seq)

    def get(self, key: ResumeKey | str) -> Entry | None:
        if isinstance(key, str):
            key = ResumeKey.parse(key)
        return self._entries.get(key)

    def __len__(self) -> int:
        return len(self._entries)

    def remove_last_model_entry(self) -> Entry | None:
        """Drop the most recent model record: simulates a crash just before the last model step."""
        models = self.entries(MODEL)
        return self.discard(models[-1].key) if models else None

    def in_doubt(self) -> list[Entry]:
        """Intents without a commit: the side effect may or may not have happened."""
        return [e for e in self.entries() if e.state == INTENT]

    def resolve_in_doubt(self, key: ResumeKey | str, *, result: Any = None, done: bool = True) -> None:
        """Settle an in-doubt call after reconciling with the outside world.

        ``done=True`` records ``result`` as the call's result (the effect happened); ``done=False``
        forgets the intent so the next run executes the call again.
        """
        entry = self.get(key)
        if entry is None or entry.state != INTENT:
            raise KeyError(f"no in-doubt entry {key}")
        if done:
            entry.state = COMMITTED
            entry.result = result
            entry.extra = {**entry.extra, "resolved": "done"}  # an operator's word, not a recorded call
            self.add(entry, sync=True)
        else:
            self.discard(entry.key)

    # --- counters ----------------------------------------------------------------------------
    @property
    def model_hits(self) -> int:
        return self.counters[MODEL]["hits"]

    @property
    def model_misses(self) -> int:
        return self.counters[MODEL]["misses"]

    @property
    def tool_hits(self) -> int:
        return self.counters[TOOL]["hits"]

    @property
    def tool_misses(self) -> int:
        return self.counters[TOOL]["misses"]

    def reset_run(self) -> None:
        """Start counting occurrences and positions from zero, as a new process would."""
        with self._lock:
            self._consumed.clear()
            self._occurrence.clear()
            self._position.clear()
            for c in self.counters.values():
                c["hits"] = c["misses"] = 0

    # --- the call protocol -------------------------------------------------------------------
    def begin(self, kind: str, request: Any, *, name: str | None = None, call_id: str | None = None) -> Call:
        """Assign the call its key and position and find what was recorded for it.

        Raises ``DivergenceError`` when the run asks something else where the recording has a call
        still to be replayed, and ``UnrecordedCallError`` on a miss in replay-only mode.
        """
        digest = request_hash(request)
        with self._lock:
            occ = self._occurrence[(kind, digest)]
            self._occurrence[(kind, digest)] = occ + 1
            pos = self._position[kind]
            self._position[kind] = pos + 1
            key = ResumeKey(self.tape, kind, digest, occ)
            entry = self._entries.get(key)
            if entry is None:
                entry = self._positional_match(kind, pos)
                if entry is not None:
                    why = position_conflict(entry.request, request)
                    if why is not None:  # matched by position only: refuse what is plainly another call
                        raise DivergenceError(kind, pos, entry.request, request, why)
            if entry is None:
                self._check_divergence(kind, pos, digest, request, call_id)
            if entry is not None:
                self._consumed.add(entry.key)
                if entry.state != INTENT:
                    self.counters.setdefault(kind, {"hits": 0, "misses": 0})["hits"] += 1
            else:
                if self.replay_only:
                    raise UnrecordedCallError(kind, pos, request)
                self.counters.setdefault(kind, {"hits": 0, "misses": 0})["misses"] += 1
            self._inflight[kind] += 1
        return Call(key, pos, request, name, call_id, entry)

    def end(self, call: Call) -> None:
        with self._lock:
            self._inflight[call.key.kind] -= 1

    def _positional_match(self, kind: str, pos: int) -> Entry | None:
        rec = self._by_position.get((kind, pos))
        if rec is not None and rec.match == MATCH_POSITION and rec.key not in self._consumed:
            return rec
        return None

    def _check_divergence(self, kind: str, pos: int, digest: str, request: Any, call_id: str | None) -> None:
        if kind == VALUE:
            return
        rec: Entry | None = None
        if call_id and call_id in self._by_call_id:
            rec = self._by_call_id[call_id]
        elif kind == MODEL or self._inflight[kind] == 0:
            # Model calls are sequential; tool calls are compared by position only when none run
            # concurrently (parallel calls may start in another order).
            rec = self._by_position.get((kind, pos))
        if rec is None or rec.key in self._consumed or rec.request_hash == digest:
            return
        raise DivergenceError(kind, pos, rec.request, request, request_diff(rec.request, request))

    def record_intent(self, call: Call, *, idempotency_key: str | None = None) -> Entry:
        """Durably note that a side effect is about to start."""
        entry = Entry(
            tape=call.key.tape, kind=call.key.kind, request_hash=call.key.request_hash,
            occurrence=call.key.occurrence, position=call.position, request=call.request,
            state=INTENT, name=call.name, call_id=call.call_id, idempotency_key=idempotency_key,
            seq=call.entry.seq if call.entry is not None else 0,
        )
        with self._lock:
            self.add(entry, sync=True)  # on disk before the side effect starts
            self._consumed.add(entry.key)
        return entry

    def record_result(
        self,
        call: Call,
        result: Any,
        *,
        deltas: list[Any] | None = None,
        error: dict[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> Entry:
        """Record the call's outcome (a commit)."""
        prior = self._entries.get(call.key)
        entry = Entry(
            tape=call.key.tape, kind=call.key.kind, request_hash=call.key.request_hash,
            occurrence=call.key.occurrence, position=call.position, request=call.request,
            result=result, state=FAILED if error else COMMITTED, deltas=deltas, name=call.name,
            call_id=call.call_id, error=error,
            idempotency_key=idempotency_key or (prior.idempotency_key if prior else None),
            seq=prior.seq if prior is not None else 0,
        )
        with self._lock:
            self.add(entry)
            self._consumed.add(entry.key)
        return entry

    # --- recorded nondeterminism ---------------------------------------------------------------
    def recorded_value(self, name: str, produce: Any) -> Any:
        """The value ``produce()`` gave at this occurrence of ``name`` in the recorded run, else a new one."""
        call = self.begin(VALUE, {"value": name}, name=name)
        try:
            if call.hit:
                return call.entry.result  # type: ignore[union-attr]
            value = produce()
            self.record_result(call, value)
            return value
        finally:
            self.end(call)

    # --- JSON file -----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"version": JSON_VERSION, "tape": self.tape, "entries": [e.to_dict() for e in self.entries()]}

    def save_json(self, path: str | os.PathLike[str]) -> None:
        """Write every entry to one JSON file (atomically: a temp file renamed into place)."""
        write_atomic(path, orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2))

    @classmethod
    def load_json(
        cls, path: str | os.PathLike[str], *, tape: str | None = None, **kwargs: Any
    ) -> ResumeIndex:
        """Load a saved index; a missing file gives an empty index, not an error."""
        path = Path(path)
        if not path.exists():
            return cls(tape or "default", **kwargs)
        data = orjson.loads(path.read_bytes())
        entries = [Entry.from_dict(d) for d in data.get("entries", [])]
        return cls(tape or data.get("tape") or "default", entries=entries, **kwargs)

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
