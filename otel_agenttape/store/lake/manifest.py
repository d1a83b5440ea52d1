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
    covers: dict[str, int] = field(default_factory=dict)  # receiver -> highest seq the snapshot folded in
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
        from otel_agenttape.store.retention import retained_ranges

        return retained_ranges(self.retention)

    def receivers(self) -> dict[str, int]:
        """Receiver id -> highest published seq seen (entries and snapshot coverage)."""
        out = dict(self.covers)
        for key in [*self.listed]:
            m = _ENTRY.match(key)
            if m:
                out[m.group(1)] = max(out.get(m.group(1), -1), int(m.group(2)))
        return out

    def covered(self, key: str) -> bool:
        m = _ENTRY.match(key)
        return bool(m) and int(m.group(2)) <= self.covers.get(m.group(1), 0)


def load_catalog(lake: LakeFS) -> Catalog:
    """List ``_manifest/`` once, read the newest snapshot and the entries it does not cover.

    Maintenance may remove an old snapshot or covered entries (after its grace period) while this
    runs: then the listing is taken again, and the newer snapshot covers what went away."""
    for attempt in range(5):
        try:
            return _load(lake)
        except _Raced:
            if attempt == 4:
                raise LakeError(f"the manifest of {lake.uri} kept changing while being read: try again") from None
    raise AssertionError("unreachable")


class _Raced(Exception):
    pass


def _load(lake: LakeFS) -> Catalog:
    listed = lake.list(MANIFEST)
    cat = Catalog(lake, listed=listed)
    gens = sorted(int(m.group(1)) for k in listed if (m := _SNAPSHOT.match(k)))
    if gens:
        cat.generation = gens[-1]
        try:
            cat.snapshot = json.loads(lake.read(snapshot_key(gens[-1])))
        except FileNotFoundError:
            raise _Raced from None
        except ValueError as exc:
            raise LakeError(f"unreadable lake snapshot {snapshot_key(gens[-1])} in {lake.uri}: {exc}") from exc
        cat.covers = {str(k): int(v) for k, v in cat.snapshot.get("covers", {}).items()}
        for rec in cat.snapshot.get("files", []):
            cat.files[rec["key"]] = rec
    for key in sorted(k for k in listed if _ENTRY.match(k) and not cat.covered(k)):
        try:
            entry = json.loads(lake.read(key))
        except FileNotFoundError:
            raise _Raced from None  # removed by maintenance: a newer snapshot covers it
        except ValueError as exc:
            raise LakeError(f"unreadable lake manifest entry {key} in {lake.uri}: {exc}") from exc
        cat.entries.append(key)
        for rec in entry.get("files", []):
            cat.files[rec["key"]] = rec
    return cat


def entry_receiver_seq(key: str) -> tuple[str, int] | None:
    m = _ENTRY.match(key)
    return (m.group(1), int(m.group(2))) if m else None


def snapshot_generations(listed: Iterable[str]) -> list[int]:
    return sorted(int(m.group(1)) for k in listed if (m := _SNAPSHOT.match(k)))


def latest_covers(lake: LakeFS) -> dict[str, int]:
    """The newest snapshot's coverage (receiver -> highest seq folded in), reading only that snapshot."""
    gens = snapshot_generations(f"{SNAPSHOTS}/{k}" for k in _names(lake.list(SNAPSHOTS), SNAPSHOTS))
    if not gens:
        return {}
    try:
        snap = json.loads(lake.read(snapshot_key(gens[-1])))
    except FileNotFoundError:
        return latest_covers(lake)
    return {str(k): int(v) for k, v in snap.get("covers", {}).items()}


def _names(listed: dict[str, int], prefix: str) -> list[str]:
    return [k[len(prefix) + 1:] for k in listed if k.startswith(prefix + "/")]
