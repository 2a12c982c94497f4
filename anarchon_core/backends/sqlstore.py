"""What the SQL lease backends share: the schema, the named queries and the claim steps.

SQLite and PostgreSQL store runs identically (one row per attempt) and run the same
claim: the steps below are written once, free of I/O, as a generator that yields
:class:`Step` objects (a named query and its parameters) and receives each result. A
backend only drives the generator inside one transaction of its own store. The decision
itself comes from :func:`anarchon_core.decision.decide`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..backend import FORMAT_VERSION
from ..decision import Action, RunState, decide, needs_overlap_check
from ..errors import StoreFormatError
from ..models import ClaimOutcome, ClaimRequest, ClaimResult, Run, RunRef
from ..schedules import ms_to_datetime

__all__ = ["SqlQueries", "Step", "check_format", "claim_steps", "rows_to_runs"]

#: A claim trims old history about once in this many won claims.
TRIM_EVERY = 20

# Templates: {runs} and {meta} are the quoted table names, {now} the dialect's expression
# for the store clock in ms, {bigint} its 64-bit integer type, {lock_job} a statement that
# serialises claims of one job until the transaction ends (``:lock_key`` names the job).
# Parameters are :named.
_TEMPLATES: dict[str, str] = {
    "create_runs": """
        CREATE TABLE IF NOT EXISTS {runs} (
            job TEXT NOT NULL,
            slot {bigint} NOT NULL,
            manual INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            token TEXT NOT NULL,
            status TEXT NOT NULL,
            runner TEXT NOT NULL,
            lease_until {bigint},
            started_at {bigint},
            finished_at {bigint},
            error TEXT,
            PRIMARY KEY (job, slot, manual, attempt)
        )""",
    "create_live_index": """
        CREATE INDEX IF NOT EXISTS {live_index} ON {runs} (job, lease_until)
        WHERE status = 'running'""",
    "create_meta": """
        CREATE TABLE IF NOT EXISTS {meta} (name TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    "insert_format": """
        INSERT INTO {meta} (name, value) VALUES ('format', :format) ON CONFLICT DO NOTHING""",
    "read_format": "SELECT value FROM {meta} WHERE name = 'format'",
    "now": "SELECT {now}",
    "lock_job": "{lock_job}",
    "current": """
        SELECT attempt, token, status, lease_until FROM {runs}
        WHERE job = :job AND slot = :slot AND manual = :manual
        ORDER BY attempt DESC LIMIT 1""",
    "other_live": """
        SELECT 1 FROM {runs}
        WHERE job = :job AND status = 'running' AND lease_until > :now
          AND NOT (slot = :slot AND manual = :manual)
        LIMIT 1""",
    "insert_attempt": """
        INSERT INTO {runs} (job, slot, manual, attempt, token, status, runner,
                            lease_until, started_at, finished_at, error)
        VALUES (:job, :slot, :manual, :attempt, :token, :status, :runner,
                :lease_until, :now, :finished_at, :error)""",
    "end_attempt": """
        UPDATE {runs} SET status = :status, error = COALESCE(error, :error),
                          finished_at = :now, lease_until = NULL
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND status = 'running'""",
    "heartbeat": """
        UPDATE {runs} SET lease_until = {now} + :lease_ms
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND token = :token AND status = 'running'""",
    "finish": """
        UPDATE {runs} SET status = :status, error = :error, finished_at = {now},
                          lease_until = NULL
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND token = :token AND status = 'running'""",
    "release": """
        UPDATE {runs} SET lease_until = {now}, error = :handed_over
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND token = :token AND status = 'running'""",
    "history": """
        SELECT job, slot, attempt, status, runner, started_at, finished_at, error, manual,
               lease_until, {now}
        FROM {runs} WHERE job = :job
        ORDER BY slot DESC, manual DESC, attempt DESC LIMIT :limit""",
    "trim_cutoff": """
        SELECT slot FROM {runs} WHERE job = :job AND attempt = 1
        ORDER BY slot DESC LIMIT 1 OFFSET :keep_runs""",
    "trim_before": """
        DELETE FROM {runs}
        WHERE job = :job AND slot <= :cutoff AND slot < :keep_after AND status <> 'running'""",
}


@dataclass(frozen=True)
class SqlQueries:
    """The named queries rendered for one dialect and one table."""

    text: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def render(
        cls, *, runs: str, meta: str, live_index: str, now: str, bigint: str,
        placeholder: str, lock_job: str,
    ) -> SqlQueries:
        """Fill the templates; ``placeholder`` is a format like ``"%({})s"`` or ``":{}"``."""
        names = {"runs": runs, "meta": meta, "live_index": live_index, "now": now,
                 "bigint": bigint, "lock_job": lock_job}
        out = {}
        for key, template in _TEMPLATES.items():
            sql = template.format(**names)
            out[key] = re.sub(r"(?<!:):([a-z_]+)", lambda m: placeholder.format(m.group(1)), sql)
        return cls(out)

    def __getitem__(self, name: str) -> str:
        return self.text[name]


@dataclass(frozen=True)
class Step:
    """One query to run: ``rows`` wants the fetched rows back, ``count`` the rowcount."""

    query: str
    params: dict[str, Any]
    rows: bool = True


ClaimSteps = Generator[Step, Any, ClaimResult]


def ref_params(ref: RunRef) -> dict[str, Any]:
    """The parameters that identify an attempt in the queries."""
    return {"job": ref.job, "slot": ref.slot, "manual": int(ref.manual),
            "attempt": ref.attempt, "token": ref.token}


def claim_steps(req: ClaimRequest) -> ClaimSteps:
    """The claim, as steps to run inside one transaction that serialises claims per job."""
    key = {"job": req.job, "slot": req.slot, "manual": int(req.manual)}
    yield Step("lock_job", {"lock_key": req.job})
    now = int((yield Step("now", {}))[0][0])
    rows = yield Step("current", key)
    state = RunState(*rows[0]) if rows else None
    other_live = False
    if needs_overlap_check(req, state):
        other_live = bool((yield Step("other_live", {**key, "now": now})))
    decision = decide(req, state, now, other_live)
    if decision.action is Action.START:
        if decision.attempt > 1:
            yield Step("end_attempt", {**key, "now": now, "attempt": decision.attempt - 1,
                                       "status": "interrupted", "error": decision.error},
                       rows=False)
        yield Step("insert_attempt", {
            **key, "now": now, "attempt": decision.attempt, "token": req.token,
            "status": "running", "runner": req.runner,
            "lease_until": decision.lease_until_ms, "finished_at": None, "error": None,
        }, rows=False)
        if random.random() < 1 / TRIM_EVERY:
            yield from trim_steps(req, now)
    elif decision.action is Action.SKIP:
        yield Step("insert_attempt", {
            **key, "now": now, "attempt": 1, "token": req.token, "status": "skipped",
            "runner": req.runner, "lease_until": None, "finished_at": now,
            "error": decision.error,
        }, rows=False)
    elif decision.action is Action.GIVE_UP:
        yield Step("end_attempt", {**key, "now": now, "attempt": decision.attempt,
                                   "status": "interrupted", "error": decision.error},
                   rows=False)
    token = req.token if decision.outcome is ClaimOutcome.WON else None
    return ClaimResult(decision.outcome, decision.attempt, token, decision.lease_until_ms)


def trim_steps(req: ClaimRequest, now: int) -> Generator[Step, Any, None]:
    """Drop finished runs beyond ``history_size`` and ``history_ttl_ms``.

    Nothing newer than ``keep_ms`` (a late claim could still ask for it) and nothing
    running is ever dropped.
    """
    keep_after = now - req.keep_ms
    rows = yield Step("trim_cutoff", {"job": req.job, "keep_runs": req.history_size})
    cutoffs = [int(rows[0][0])] if rows else []
    if req.history_ttl_ms is not None:
        cutoffs.append(now - req.history_ttl_ms)
    if cutoffs:
        yield Step("trim_before", {"job": req.job, "cutoff": max(cutoffs),
                                   "keep_after": keep_after}, rows=False)


def check_format(rows: list[Any]) -> None:
    """Raise StoreFormatError if the format record is newer than this version reads."""
    if not rows:
        return
    value = rows[0][0]
    try:
        found = int(value)
    except (TypeError, ValueError):
        raise StoreFormatError(value, FORMAT_VERSION) from None
    if found > FORMAT_VERSION:
        raise StoreFormatError(found, FORMAT_VERSION)


def rows_to_runs(rows: list[Any]) -> list[Run]:
    """Turn ``history`` rows into runs; an expired running attempt reads ``interrupted``."""
    runs = []
    for job, slot, attempt, stored_status, runner, started, finished, stored_error, manual, \
            lease, now in rows:
        status, error = stored_status, stored_error
        if status == "running" and lease is not None and int(lease) <= int(now):
            status, error = "interrupted", error or "lease expired: the runner is gone"
        runs.append(Run(
            job=job, slot=int(slot), attempt=int(attempt), status=status, runner=runner,
            started_at=ms_to_datetime(int(started)) if started is not None else None,
            finished_at=ms_to_datetime(int(finished)) if finished is not None else None,
            error=error, manual=bool(manual),
        ))
    return runs
