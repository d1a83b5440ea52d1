"""What ``runs()`` selects (``Filters``) and the times it takes, as SQL over the runs' keys or the view."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from ...store.run_keys import ours_has


def parse_since(text: str) -> int:
    """An ISO date or time (UTC when no zone is given), or nanoseconds since the epoch (17 digits or
    more: fewer digits would be seconds or milliseconds read as nanoseconds, matching everything)."""
    text = text.strip()
    if text.isdigit() and len(text) != 8:  # 8 digits: an ISO basic date, 20261130
        if len(text) < 17:
            raise ValueError(f"{text!r}: give an ISO date or time (2026-11-30, 2026-11-30T12:00Z) "
                             "or nanoseconds since the epoch")
        return int(text)
    when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return int(when.timestamp() * 1_000_000_000)


def as_ns(value: Any, name: str) -> int | None:
    """Nanoseconds since the epoch from an int, a datetime/date or an ISO string."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"{name}: not a time: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        when = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return int(when.timestamp() * 1_000_000_000)
    if isinstance(value, dt.date):
        return as_ns(dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc), name)
    try:
        return parse_since(str(value))
    except ValueError:
        raise ValueError(f"{name}: not an ISO date/time or nanoseconds since the epoch: {value!r}") from None


@dataclass
class Filters:
    """What ``runs()`` selects; every field None selects every run."""

    agent: str | None = None
    status: str | None = None
    source: str | None = None
    session: str | None = None
    service: str | None = None
    model: str | None = None
    tool: str | None = None
    since: int | None = None
    until: int | None = None
    text: str | None = None
    parent: str | None = None
    # ``NAME>=V`` / ``NAME=LABEL`` texts (scores.py), each of which the run's latest scores must pass
    score: tuple[str, ...] | None = None
    label: tuple[str, ...] | None = None

    def where(self) -> tuple[str, list[Any]]:
        """The filter over the ``runs`` view."""
        return self._where(keys=False)

    def narrow(self) -> tuple[str, list[Any]]:
        """A condition some span of every matching agenttape run meets (``run_keys_select``'s ``narrow``):
        its session and agent are those of its spans. Not the service, which most runs share: narrowing
        by a name nearly every run has costs more than it saves (about 250 ms against 420-530 ms for
        1,000,000 spans whose runs all have one agent; 160-250 ms against 240-285 ms for a tenth)."""
        clauses, params = [], []
        for column, value in (("session_id", self.session), ("agent_name", self.agent)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        return " AND ".join(clauses[:1]), params[:1]

    def keys_where(self) -> tuple[str, list[str], list[Any]]:
        """The filter over ``run_keys_select`` rows (``c``), with the key columns it reads; its
        parameters start with ``narrow()``'s."""
        narrow_params = self.narrow()[1]
        where, params = self._where(keys=True)
        params = [*narrow_params, *params]
        columns = ["start_time_unix_nano", "span_lo", "span_hi"]
        wanted = [("agent", self.agent), ("status", self.status), ("source", self.source),
                  ("session_id", self.session), ("service_name", self.service), ("models", self.model),
                  ("tools", self.tool)]
        columns += [c for c, v in wanted if v is not None]
        if self.text:
            columns += ["agent", "session_id", "status_message", "service_name"]
        return where, list(dict.fromkeys(columns)), params

    def _where(self, keys: bool) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("agent", self.agent), ("status", self.status), ("source", self.source),
                              ("session_id", self.session), ("service_name", self.service)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        for column, role, listed, value in (("model", "model", "models", self.model),
                                             ("tool", "tool", "tools", self.tool)):
            if value is None:
                continue
            if keys:  # an agenttape run's spans are asked; another source's run lists them
                clauses.append(f"CASE WHEN c.ours THEN {ours_has(column, role)} "
                               f"ELSE list_contains(c.{listed}, ?) END")
                params += [value, value]
            else:
                clauses.append(f"list_contains({listed}, ?)")
                params.append(value)
        if self.since is not None:
            clauses.append("start_time_unix_nano >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("start_time_unix_nano < ?")
            params.append(self.until)
        if self.parent is not None:
            clauses.append("(parent_ref = ? OR parent_run_id = ?)")
            params += [self.parent, self.parent]
        if self.text:
            # in the run's names, or anywhere in its trace's attributes (prompts, outputs, tool arguments)
            clauses.append(
                "(contains(lower(concat_ws(' ', ref, agent, session_id, status_message, service_name)), lower(?)) "
                "OR trace_id IN (SELECT trace_id FROM spans "
                "WHERE contains(lower(CAST(attributes AS VARCHAR)), lower(?))))")
            params += [self.text, self.text]
        from .scores import parsed  # scores.py reads the kept store version, whose module reads Filters

        for f in parsed(self.score, self.label):
            clause, more = f.sql()
            clauses.append(clause)
            params += more
        return (" AND ".join(clauses) or "true"), params
