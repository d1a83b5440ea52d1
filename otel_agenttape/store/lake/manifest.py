"""The lake's catalog: which Parquet files are live, so a reader never scans the data folders.

Two kinds of small JSON objects under ``_manifest/``:

- ``_manifest/<receiver>/<seq:010d>.json``: one *entry* per published batch of one receiver, listing
  the files it wrote (table, key, rows, bytes, sha256, time range). Written once, after its files;
  a receiver is the only writer of its folder, so receivers never collide.
- ``_manifest/_snapshots/<generation:010d>.json``: written by ``lake compact`` and ``lake retain``:
  the whole live file list at that point, the entries it ``covers`` (already folded in), the files it
  removed (deleted only after a grace period) and every retention record so far.

The live set is the newest snapshot's files plus the files of every entry it does not cover. Writing
one snapshot is the single step that replaces files (compaction) or drops them (retention); entries
that receivers publish meanwhile are not covered and so stay live.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_agenttape.store.lake.fs import LakeError, LakeFS

FORMAT = "agenttape.lake/1"
MANIFEST = "_manifest"
SNAPSHOTS = f"{MANIFEST}/_snapshots"
_ENTRY = re.compile(r"^_manifest/([^/_][^/]*)/(\d{10})\.json$")
_SNAPSHOT = re.compile(r"^_manifest/_snapshots/(\d{10})\.json$")
_RECEIVER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_receiver_id(receiver: str) -> str:
    """Receiver ids name folders and files in the lake: letters, digits, ``.``, ``_``, ``-``."""
    if not _RECEIVER_ID.match(receiver or ""):
        raise ValueError(f"receiver id {receiver!r}: use 1-100 letters, digits, '.', '_' or '-' (not first)")
    return receiver


def entry_key(receiver: str, seq: int) -> str:
    return f"{MANIFEST}/{receiver}/{seq:010d}.json"


def snapshot_key(generation: int) -> str:
    return f"{SNAPSHOTS}/{generation:010d}.json"


def file_sha256(lake: LakeFS, key: str) -> str:
    h = hashlib.sha256()
    with lake.open_input(key) as fh:
        while chunk := fh.read(8 * 1024 * 1024):
            h.update(chunk)
    return h.hexdigest()


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass
class Catalog:
    """What a reader needs: live files per table, and what retention removed."""

    lake: LakeFS
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> file record
    generation: int = 0
    covers: set[str] = field(default_factory=set)
    entries: list[str] = field(default_factory=list)  # entry keys read (not covered by the snapshot)
    snapshot: dict[str, Any] | None = None
    listed: dict[str, int] = field(default_factory=dict)  # every key under _manifest/

    def table_files(self, table: str) -> list[dict[str, Any]]:
        return sorted((f for f in self.files.values() if f["table"] == table), key=lambda f: f["key"])

    @property
    def retention(self) -> list[dict[str, Any]]:
        return list((self.snapshot or {}).get("retention", []))

    def retained_ranges(self) -> dict[tuple[str, int], list[tuple[int, int, str]]]:
        """Per (chain id, epoch): the seq ranges retention removed, each with the hash of its last entry."""
        out: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
        for rec in self.retention:
            for cid, epoch, lo, hi, head in rec.get("chains", []):
                out.setdefault((cid, int(epoch)), []).append((int(lo), int(hi), head))
        return out

    def receivers(self) -> dict[str, int]:
        """Receiver id -> highest published seq seen (entries and snapshot coverage)."""
        out: dict[str, int] = {}
        for key in [*self.covers, *self.entries]:
            m = _ENTRY.match(key)
            if m:
                out[m.group(1)] = max(out.get(m.group(1), -1), int(m.group(2)))
        return out

    def is_recorded(self, receiver: str, seq: int) -> bool:
        key = entry_key(receiver, seq)
        return key in self.listed or key in self.covers


def load_catalog(lake: LakeFS) -> Catalog:
    """List ``_manifest/`` once, read the newest snapshot and the entries it does not cover."""
    listed = lake.list(MANIFEST)
    cat = Catalog(lake, listed=listed)
    gens = sorted(int(m.group(1)) for k in listed if (m := _SNAPSHOT.match(k)))
    if gens:
        cat.generation = gens[-1]
        try:
            cat.snapshot = json.loads(lake.read(snapshot_key(gens[-1])))
        except (ValueError, FileNotFoundError) as exc:
            raise LakeError(f"unreadable lake snapshot {snapshot_key(gens[-1])} in {lake.uri}: {exc}") from exc
        cat.covers = set(cat.snapshot.get("covers", []))
        for rec in cat.snapshot.get("files", []):
            cat.files[rec["key"]] = rec
    for key in sorted(k for k in listed if _ENTRY.match(k) and k not in cat.covers):
        try:
            entry = json.loads(lake.read(key))
        except FileNotFoundError:
            continue  # removed by maintenance after a newer snapshot covered it
        except ValueError as exc:
            raise LakeError(f"unreadable lake manifest entry {key} in {lake.uri}: {exc}") from exc
        cat.entries.append(key)
        for rec in entry.get("files", []):
            cat.files[rec["key"]] = rec
    return cat


def entries_of(cat: Catalog, keys: Iterable[str]) -> list[dict[str, Any]]:
    return [json.loads(cat.lake.read(k)) for k in keys]
