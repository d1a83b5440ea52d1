"""The SQLite journal: durable intents and commits, in-doubt detection and its policies."""

from __future__ import annotations

import sqlite3

import pytest

from otel_agenttape.resume import (
    InDoubtError,
    InDoubtPolicy,
    Journal,
    ResumableModelClient,
    ResumableToolExecutor,
    ResumeIndex,
)


class Crash(BaseException):
    """Stands in for kill -9 between a side effect and its commit."""


def make_tools(ledger: list, crash_after: set[str] | None = None):
    crash_after = crash_after if crash_after is not None else set()

    def pay(amount: int, idempotency_key: str) -> str:
        if idempotency_key not in [k for k, _ in ledger]:  # the callee deduplicates
            ledger.append((idempotency_key, ("pay", amount)))
        if "pay" in crash_after:
            crash_after.discard("pay")
            raise Crash()
        return f"paid {amount}"

    def email(to: str) -> str:
        ledger.append((None, ("email", to)))
        if "email" in crash_after:
            crash_after.discard("email")
            raise Crash()
        return f"mailed {to}"

    return {"pay": pay, "email": email}


def test_journal_is_wal_and_survives_a_new_process(tmp_path):
    path = tmp_path / "journal.sqlite"
    index = ResumeIndex("run", journal=path)
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    calls = []
    m = ResumableModelClient(lambda r: calls.append(r) or {"ok": len(calls)}, index)
    m.create({"q": 1})
    m.create({"q": 2})
    # no close(): a killed process never closes; the journal must already hold both commits
    again = ResumeIndex("run", journal=path)
    m2 = ResumableModelClient(lambda r: calls.append(r) or {"ok": len(calls)}, again)
    assert m2.create({"q": 1}) == {"ok": 1} and m2.create({"q": 2}) == {"ok": 2}
    assert len(calls) == 2 and again.model_hits == 2


def test_intent_without_commit_raises_in_doubt_by_default(tmp_path):
    path = tmp_path / "j.sqlite"
    ledger: list = []
    index = ResumeIndex("run", journal=path)
    t = ResumableToolExecutor(make_tools(ledger, {"email"}), index)
    with pytest.raises(Crash):
        t.execute("email", {"to": "bob"})
    assert [e.state for e in index.in_doubt()] == ["intent"]

    resumed = ResumeIndex("run", journal=path)
    reports = []
    t2 = ResumableToolExecutor(make_tools(ledger), resumed, on_in_doubt=reports.append)
    with pytest.raises(InDoubtError) as err:
        t2.execute("email", {"to": "bob"})
    assert err.value.report.tool == "email" and len(reports) == 1
    assert len(ledger) == 1  # never silently re-run


def test_resolve_in_doubt_after_reconciling(tmp_path):
    path = tmp_path / "j.sqlite"
    ledger: list = []
    index = ResumeIndex("run", journal=path)
    with pytest.raises(Crash):
        ResumableToolExecutor(make_tools(ledger, {"email"}), index).execute("email", {"to": "bob"})
    # an operator finds the effect in the outside world and records it as done
    (pending,) = ResumeIndex("run", journal=path).in_doubt()
    fixer = ResumeIndex("run", journal=path)
    fixer.resolve_in_doubt(pending.key, result="mailed bob")
    final = ResumeIndex("run", journal=path)
    assert ResumableToolExecutor(make_tools(ledger), final).execute("email", {"to": "bob"}) == "mailed bob"
    assert len(ledger) == 1 and final.tool_hits == 1

    # or finds it missing and forgets the intent so the call runs again
    ledger2: list = []
    p2 = tmp_path / "j2.sqlite"
    with pytest.raises(Crash):
        ResumableToolExecutor(make_tools(ledger2, {"email"}), ResumeIndex("r", journal=p2)).execute(
            "email", {"to": "x"})
    ledger2.clear()  # the effect did not survive
    i2 = ResumeIndex("r", journal=p2)
    i2.resolve_in_doubt(i2.in_doubt()[0].key, done=False)
    i3 = ResumeIndex("r", journal=p2)
    assert ResumableToolExecutor(make_tools(ledger2), i3).execute("email", {"to": "x"}) == "mailed x"
    assert len(ledger2) == 1


def test_reexecute_with_key_gives_exactly_once_for_idempotent_tools(tmp_path):
    path = tmp_path / "j.sqlite"
    ledger: list = []
    index = ResumeIndex("run", journal=path)
    with pytest.raises(Crash):
        ResumableToolExecutor(make_tools(ledger, {"pay"}), index).execute("pay", {"amount": 7})
    first_key = ledger[0][0]
    resumed = ResumeIndex("run", journal=path)
    t = ResumableToolExecutor(make_tools(ledger), resumed, in_doubt=InDoubtPolicy.REEXECUTE_WITH_KEY)
    assert t.execute("pay", {"amount": 7}) == "paid 7"
    assert len(ledger) == 1 and t.in_doubt_reports[0].idempotency_key == first_key
    # the same key again on the next resume: committed now, a plain hit
    last = ResumeIndex("run", journal=path)
    assert ResumableToolExecutor(make_tools(ledger), last).execute("pay", {"amount": 7}) == "paid 7"
    assert last.tool_hits == 1


def test_reexecute_with_key_refuses_tools_without_a_key(tmp_path):
    path = tmp_path / "j.sqlite"
    ledger: list = []
    with pytest.raises(Crash):
        ResumableToolExecutor(make_tools(ledger, {"email"}), ResumeIndex("r", journal=path)).execute(
            "email", {"to": "a"})
    t = ResumableToolExecutor(make_tools(ledger), ResumeIndex("r", journal=path),
                              in_doubt="reexecute_with_key")
    with pytest.raises(InDoubtError):
        t.execute("email", {"to": "a"})
    t = ResumableToolExecutor(make_tools(ledger), ResumeIndex("r", journal=path),
                              policies={"email": "reexecute"})
    assert t.execute("email", {"to": "a"}) == "mailed a" and len(ledger) == 2  # explicit at-least-once


def test_idempotency_keys_differ_between_identical_calls_and_repeat_across_attempts(tmp_path):
    ledger: list = []
    index = ResumeIndex("r", journal=tmp_path / "j.sqlite")
    t = ResumableToolExecutor(make_tools(ledger), index)
    t.execute("pay", {"amount": 1})
    t.execute("pay", {"amount": 1})
    assert len(ledger) == 2 and ledger[0][0] != ledger[1][0]
    other_tape = ResumeIndex("r2", journal=tmp_path / "j.sqlite")
    ResumableToolExecutor(make_tools(ledger), other_tape).execute("pay", {"amount": 1})
    assert len({k for k, _ in ledger}) == 3


def test_remove_last_model_entry_also_leaves_the_journal(tmp_path):
    path = tmp_path / "j.sqlite"
    index = ResumeIndex("r", journal=path)
    m = ResumableModelClient(lambda r: r["q"], index)
    m.create({"q": 1})
    m.create({"q": 2})
    assert index.remove_last_model_entry().request == {"q": 2}
    assert [e.request for e in Journal(path).load("r")] == [{"q": 1}]


def test_json_round_trip_keeps_in_doubt_state(tmp_path):
    ledger: list = []
    index = ResumeIndex("r")
    with pytest.raises(Crash):
        ResumableToolExecutor(make_tools(ledger, {"email"}), index).execute("email", {"to": "z"})
    index.save_json(tmp_path / "x.json")
    loaded = ResumeIndex.load_json(tmp_path / "x.json")
    assert len(loaded.in_doubt()) == 1
    with pytest.raises(InDoubtError):
        ResumableToolExecutor(make_tools(ledger), loaded).execute("email", {"to": "z"})


def test_durability_modes_fsync_what_they_promise(tmp_path):
    from otel_agenttape.resume.entry import Entry

    def synchronous(j: Journal) -> int:
        return j._db.execute("PRAGMA synchronous").fetchone()[0]  # 1 NORMAL, 2 FULL

    e = Entry(tape="t", kind="tool", request_hash="h", occurrence=0, position=0)
    assert Journal.__init__.__kwdefaults__["durability"] == "full"  # the default
    j = Journal(tmp_path / "a.sqlite", durability="intent")
    j.put(e, sync=True)
    assert synchronous(j) == 2
    j.put(e, sync=False)
    assert synchronous(j) == 1
    full = Journal(tmp_path / "b.sqlite", durability="full")
    full.put(e, sync=False)
    assert synchronous(full) == 2
    proc = Journal(tmp_path / "c.sqlite", durability="process")
    proc.put(e, sync=True)
    assert synchronous(proc) == 1
    with pytest.raises(ValueError):
        Journal(tmp_path / "d.sqlite", durability="sometimes")
    for x in (j, full, proc):
        x.close()
    assert Journal(tmp_path / "a.sqlite").load("t")[0].key == e.key


def test_intent_is_written_before_the_side_effect_starts(tmp_path):
    path = tmp_path / "j.sqlite"
    seen = []

    def effect(x: int) -> int:
        # what a fresh process would find if this one died right now
        seen.append([(e.state, e.request) for e in Journal(path).load("r")])
        return x

    ResumableToolExecutor({"effect": effect}, ResumeIndex("r", journal=path)).execute("effect", {"x": 1})
    assert seen == [[("intent", {"name": "effect", "arguments": {"x": 1}})]]
    assert [e.state for e in Journal(path).load("r")] == ["committed"]


async def test_async_executor_in_doubt_and_reexecute_with_key(tmp_path):
    path = tmp_path / "j.sqlite"
    ledger: dict[str, int] = {}

    async def transfer(amount: int, idempotency_key: str) -> str:
        ledger.setdefault(idempotency_key, amount)
        if len(ledger) == 1 and not getattr(transfer, "resumed", False):
            raise Crash()
        return f"sent {amount}"

    with pytest.raises(Crash):
        await ResumableToolExecutor({"transfer": transfer}, ResumeIndex("r", journal=path)).aexecute(
            "transfer", {"amount": 3})
    with pytest.raises(InDoubtError):
        await ResumableToolExecutor({"transfer": transfer}, ResumeIndex("r", journal=path)).aexecute(
            "transfer", {"amount": 3})
    transfer.resumed = True
    t = ResumableToolExecutor({"transfer": transfer}, ResumeIndex("r", journal=path),
                              in_doubt=InDoubtPolicy.REEXECUTE_WITH_KEY)
    assert await t.aexecute("transfer", {"amount": 3}) == "sent 3"
    assert list(ledger.values()) == [3] and len(t.in_doubt_reports) == 1
