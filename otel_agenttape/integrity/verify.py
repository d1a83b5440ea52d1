"""Verification of one tape's chain, Merkle tree and checkpoints from recomputed leaves.

Pure logic: the caller recomputes each entry's leaf from its source (stored rows, OTLP) and hands
over the stored chain fields. Gaps in the sequence (export loss) are reported as ``missing seq a..b``
and kept apart from tampering; ``first_broken_index`` is the lowest seq with any problem.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from otel_agenttape.integrity.chain import genesis, genesis_v1, link_from_leaf_hash
from otel_agenttape.integrity.checkpoint import Checkpoint, CheckpointError, origin_for
from otel_agenttape.integrity.merkle import CompactRange, leaf_hash
from otel_agenttape.integrity.note import NoteError, Verifier, open_note, split_note

GAP = "gap"
TAMPER = "tamper"


@dataclass(slots=True)
class Entry:
    """One stored chain entry: its chain fields and the leaf recomputed from its content (slots: a
    tape of a million entries holds a million of these)."""

    seq: int
    prev: str | None
    hash: str | None
    leaf: bytes | None
    span_id: str = ""
    trace_id: str = ""
    problem: str | None = None  # set by the reader, e.g. chain columns that disagree with attributes
    computed_hash: str | None = None  # link_hash(prev, leaf), when the reader computed it and dropped the leaf
    merkle_leaf: bytes | None = None  # leaf_hash(leaf), likewise
    erased: dict[str, str] | None = None  # leaf v2: the span's erased values (label -> commitment)

    def compact(self) -> Entry:
        """Precompute both hashes and drop the leaf bytes (keeps a million entries small)."""
        if self.leaf is not None:
            lh = leaf_hash(self.leaf)
            if self.prev is not None:
                self.computed_hash = link_from_leaf_hash(self.prev, lh)
            self.merkle_leaf = lh
            self.leaf = None
        return self


@dataclass(frozen=True)
class SignedCheckpoint:
    checkpoint: Checkpoint
    note: str
    trusted: bool | None  # True: a pinned key verified it; False: it did not; None: no key given
    source: str = ""


@dataclass
class Issue:
    index: int
    kind: str  # GAP or TAMPER
    reason: str


@dataclass
class ChainReport:
    chain_id: str
    epoch: int
    length: int
    valid: bool
    first_broken_index: int | None
    reason: str | None
    issues: list[Issue] = field(default_factory=list)
    head: str | None = None
    root: str | None = None
    checkpoints_checked: int = 0
    signed_size: int = 0  # entries covered by a checkpoint a pinned key signed
    key_pinned: bool = False
    restored_from: str | None = None
    untrusted_checkpoints: int = 0
    trace_id: str | None = None  # set when processes sealed the same tape id and epoch in several traces
    removed_by_retention: int = 0  # entries a recorded retention removed (not a finding)
    erased_spans: int = 0  # spans with values erased by an erasure record that accounts for them
    erased_values: int = 0
    erasures: list[dict[str, str]] = field(default_factory=list)  # [{"id", "date"}]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["gaps"] = [i.reason for i in self.issues if i.kind == GAP]
        return out


def parse_notes(notes: Iterable[tuple[str, str]], verifiers: Sequence[Verifier]) -> list[SignedCheckpoint]:
    """Parse ``(note, source)`` pairs into checkpoints; with keys given, mark which ones they signed."""
    out: list[SignedCheckpoint] = []
    seen: set[str] = set()
    for note, source in notes:
        if note in seen:
            continue
        seen.add(note)
        try:
            text, _ = split_note(note)
            cp = Checkpoint.parse(text)
        except (NoteError, CheckpointError):
            continue
        trusted: bool | None = None
        if verifiers:
            try:
                open_note(note, verifiers)
                trusted = True
            except NoteError:
                trusted = False
        out.append(SignedCheckpoint(cp, note, trusted, source))
    return out


def assign_checkpoints(
    chain_id: str,
    epoch: int,
    parts: Mapping[str, Sequence[Entry]],
    checkpoints: Sequence[SignedCheckpoint],
) -> dict[str, list[SignedCheckpoint]]:
    """Share the checkpoints of one origin among chains that carry it in different traces.

    Two processes that seal the same run id without a common checkpoint file both open epoch 0 of
    the same tape: two chains, one per trace. A checkpoint goes to the chain holding the entry its
    chain head names (at ``size - 1``); one whose head is in no chain (a re-seal, a truncated tail)
    and the size-0 ones go to every chain, so nothing a signer vouched for is left unchecked.
    """
    origin = origin_for(chain_id, epoch)
    owner: dict[tuple[int, str], str] = {}
    for key, entries in parts.items():
        for e in entries:
            if e.hash:
                owner[(e.seq, e.hash)] = key
    out: dict[str, list[SignedCheckpoint]] = {key: [] for key in parts}
    for c in checkpoints:
        cp = c.checkpoint
        if cp.origin != origin:
            continue
        key = owner.get((cp.size - 1, cp.chain_head or "")) if cp.size > 0 else None
        for k in ([key] if key is not None else parts):
            out[k].append(c)
    return out


def verify_chain(
    chain_id: str,
    epoch: int,
    entries: Sequence[Entry],
    checkpoints: Sequence[SignedCheckpoint] = (),
    key_pinned: bool = False,
    retained: Sequence[tuple[int, int, str]] = (),
) -> ChainReport:
    """Check every link, every recomputed leaf, the gaps, and the checkpoints of this tape's origin.

    ``retained``: seq ranges ``(lo, hi, hash of hi)`` that a recorded retention removed. A missing
    range that matches one exactly, and whose next entry links to its recorded last hash, is counted
    as removed by retention instead of a gap; anything else there is still reported."""
    kept = {lo: (hi, head) for lo, hi, head in retained}
    removed = 0
    issues: list[Issue] = []
    by_seq: dict[int, Entry] = {}
    for e in entries:
        other = by_seq.get(e.seq)
        if other is None:
            by_seq[e.seq] = e
        elif other.hash != e.hash or other.leaf != e.leaf or other.merkle_leaf != e.merkle_leaf:
            issues.append(Issue(e.seq, TAMPER, f"duplicate seq {e.seq} with different content"))
    seqs = sorted(by_seq)
    hash_to_seq = {e.hash: s for s, e in by_seq.items() if e.hash}
    expected_prev = genesis(chain_id, epoch)
    last = -1
    leaves: list[bytes | None] = []  # Merkle leaf hashes by seq
    for s in seqs:
        e = by_seq[s]
        cut = kept.get(last + 1)
        if s != last + 1 and cut is not None and cut[0] == s - 1:
            removed += s - 1 - last  # removed by retention: the chain resumes from the recorded hash
            expected_prev, last = cut[1], s - 1
        if s != last + 1:
            issues.append(Issue(last + 1, GAP, f"missing seq {last + 1}..{s - 1}"))
        elif e.prev != expected_prev:
            k = hash_to_seq.get(e.prev or "")
            if k is not None and k != s - 1:
                issues.append(Issue(s, TAMPER, f"seq {s} links to seq {k}: entries reordered"))
            elif s == 0 and e.prev == genesis_v1(chain_id, epoch):
                issues.append(Issue(0, TAMPER, "seq 0 starts from a chain format v1 genesis: sealed by an older "
                                               "version (links over leaf bytes), not verifiable here"))
            elif s == 0:
                issues.append(Issue(0, TAMPER, "seq 0 does not start from this tape's genesis: spliced or foreign tape"))
            else:
                issues.append(Issue(s, TAMPER, f"seq {s} does not link to seq {s - 1}: entry removed, replaced or spliced"))
        lh = e.merkle_leaf or (leaf_hash(e.leaf) if e.leaf is not None else None)
        if e.problem:
            issues.append(Issue(s, TAMPER, f"seq {s}: {e.problem}"))
        elif lh is None or e.prev is None or e.hash is None:
            issues.append(Issue(s, TAMPER, f"seq {s}: chain fields or content missing"))
        elif (e.computed_hash or link_from_leaf_hash(e.prev, lh)) != e.hash:
            issues.append(Issue(s, TAMPER, f"leaf hash mismatch at seq {s}: span content edited"))
        expected_prev = e.hash
        last = s
        leaves.extend([None] * (s - len(leaves)))
        leaves.append(lh)
    length = last + 1

    # Merkle roots at each checkpoint size of this origin (computable up to the first gap).
    origin = origin_for(chain_id, epoch)
    mine = sorted((c for c in checkpoints if c.checkpoint.origin == origin), key=lambda c: c.checkpoint.size)
    roots: dict[int, bytes] = {}
    wanted = {c.checkpoint.size for c in mine}
    cr = CompactRange()
    if 0 in wanted:
        roots[0] = cr.root()
    usable = leaves.index(None) if None in leaves else len(leaves)  # the tree stops at the first gap
    done = 0
    for size in sorted(s for s in wanted if 0 < s <= usable):
        cr.extend(leaves[done:size])
        roots[size] = cr.root()
        done = size
    cr.extend(leaves[done:usable])
    report = ChainReport(chain_id, epoch, length, True, None, None, key_pinned=key_pinned,
                         removed_by_retention=removed)
    report.root = cr.root().hex() if len(leaves) == cr.size else None
    report.head = by_seq[last].hash if last >= 0 else None
    good_size = 0
    untrusted = 0
    coarse: list[Issue] = []  # checkpoint mismatches: they bound a range, not an entry
    covered = 0  # the largest checkpoint size beyond the stored entries
    for c in mine:
        cp = c.checkpoint
        if c.trusted is False:
            untrusted += 1  # anyone can write a note: only a pinned key's checkpoints count
            continue
        report.checkpoints_checked += 1
        if cp.size == 0:
            restore = cp.extension("restore")
            if restore:
                report.restored_from = restore
        if cp.size > length:
            covered = max(covered, cp.size)
            continue
        got = roots.get(cp.size)
        if got is None:
            continue  # beyond a gap: already reported
        if got != cp.root:
            issue = Issue(good_size, TAMPER, f"checkpoint at size {cp.size} does not match the stored entries: edited or re-sealed (entries {good_size}..{cp.size - 1})")
            issues.append(issue)
            coarse.append(issue)
            continue
        head = cp.chain_head
        want_head = by_seq[cp.size - 1].hash if cp.size > 0 and (cp.size - 1) in by_seq else genesis(chain_id, epoch)
        if head is not None and head != want_head:
            issues.append(Issue(max(cp.size - 1, 0), TAMPER, f"checkpoint at size {cp.size} names another chain head"))
            continue
        good_size = max(good_size, cp.size)
        if c.trusted:
            report.signed_size = max(report.signed_size, cp.size)
    if covered:
        issues.append(Issue(length, TAMPER, f"truncated: signed checkpoint covers {covered} entries, found {length}"))
    if key_pinned and length > 0 and report.checkpoints_checked == 0:
        issues.append(Issue(0, TAMPER, f"no checkpoint signed by the trusted key ({untrusted} signed by other keys): re-sealed, or sealed with another key"))
    report.untrusted_checkpoints = untrusted
    issues.sort(key=lambda i: (i.index, i.kind != TAMPER))
    report.issues = issues
    if issues:
        report.valid = False
        # A checkpoint mismatch says "somewhere in a..b"; an entry-level finding inside that range
        # names the entry, so it is the one reported first.
        precise = [i for i in issues if not any(i is c for c in coarse)]
        first = precise[0] if precise else issues[0]
        report.first_broken_index = first.index
        report.reason = first.reason
    return report


def add_issues(report: ChainReport, extra: Sequence[Issue]) -> ChainReport:
    """Add entry-level findings made outside ``verify_chain`` (erasures) and re-derive the verdict.

    An entry-level finding comes before a checkpoint mismatch at the same or a later index, as in
    ``verify_chain``."""
    if not extra:
        return report
    issues = sorted([*report.issues, *extra], key=lambda i: (i.index, i.kind != TAMPER))
    report.issues = issues
    report.valid = False
    coarse = [i for i in issues if i.reason.startswith("checkpoint at size ")]
    precise = [i for i in issues if i not in coarse]
    first = precise[0] if precise else issues[0]
    report.first_broken_index = first.index
    report.reason = first.reason
    return report
