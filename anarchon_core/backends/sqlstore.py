"""What the SQL lease backends share: the schema, the named queries and the claim steps.

SQLite and PostgreSQL store runs identically (one row per attempt) and run the same
claim: the steps below are written once, free of I/O, as a generator that yields
:class:`Step` objects (a named query and its parameters) and receives each result. A
backend only drives the generator inside one transaction of its own store. The decision
itself comes from :func:`anarchon_core.decision.decide`.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..backend import Retention
from ..decision import Action, RunState, decide, needs_overlap_check
from ..errors import StoreError
from ..models import (
    FINISHED_STATUSES,
    ClaimOutcome,
    ClaimRequest,
    ClaimResult,
    ExpiredRun,
    HistoryQuery,
    Run,
    RunPage,
    RunRef,
)
from ..readmodel import STATUS_SQL, finish_page, load_meta, read_status, validate_query
from ..schedules import ms_to_datetime
from .common import check_format_value
from .storeerrors import CorruptRecords

__all__ = ["SqlQueries", "Step", "check_format", "claim_steps", "expired_steps",
           "job_names_steps", "rows_to_runs", "runs_steps"]

log = logging.getLogger("anarchon.sql")
#: Rows anarchon cannot read are reported once each, then skipped quietly.
corrupt_records = CorruptRecords(log)

#: A claim trims old history about once in this many won claims.
TRIM_EVERY = 20

# Templates: {runs} and {meta} are the quoted table names, {now} the dialect's expression
# for the store clock in ms, {lock_job} a statement that serialises claims of one job until
# the transaction ends (``:lock_key`` names the job), {meta_col} the meta column (NULL for
# a table without it) and {set_meta} its assignment in ``finish``. Parameters are :named.
# The tables themselves are created by :func:`anarchon_core.schema.sql_schema`.
_COLUMNS = ("job, slot, attempt, status, runner, started_at, finished_at, error, manual, "
            "lease_until, {meta_col}")
_TEMPLATES: dict[str, str] = {
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
                          lease_until = NULL{set_meta}
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND token = :token AND status = 'running'""",
    "release": """
        UPDATE {runs} SET lease_until = {now}, error = :handed_over
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND token = :token AND status = 'running'""",
    "history": f"""
        SELECT {_COLUMNS}
        FROM {{runs}} WHERE job = :job
        ORDER BY slot DESC, manual DESC, attempt DESC LIMIT :limit""",
    "job_names": f"""
        SELECT {_COLUMNS} FROM (
            SELECT r.*, ROW_NUMBER() OVER (
                PARTITION BY job ORDER BY slot DESC, manual DESC, attempt DESC) AS newest
            FROM {{runs}} r) ranked
        WHERE newest = 1 ORDER BY job""",
    "expired": """
        SELECT slot, attempt, manual, lease_until FROM {runs}
        WHERE job = :job AND status = 'running' AND lease_until <= :now
        ORDER BY lease_until LIMIT :limit""",
    "trim_cutoff": """
        SELECT slot FROM {runs} WHERE job = :job AND attempt = 1
        ORDER BY slot DESC LIMIT 1 OFFSET :keep_runs""",
    "trim_before": """
        DELETE FROM {runs}
        WHERE job = :job AND slot <= :cutoff AND slot < :keep_after AND status <> 'running'""",
}


# ``runs``: one query per combination of filters (``runs_<flags>``, see runs_query_name).
_RUNS_FILTERS = (
    ("j", "job = :job"),
    ("s", STATUS_SQL.format(now=":now") + " = :status"),
    ("r", "runner = :runner"),
    ("c", "(slot, job, manual, attempt) < (:c_slot, :c_job, :c_manual, :c_attempt)"),
)
for _mask in range(1 << len(_RUNS_FILTERS)):
    _used = [f for i, f in enumerate(_RUNS_FILTERS) if _mask >> i & 1]
    _where = " AND ".join(cond for _, cond in _used) or "1 = 1"
    _TEMPLATES["runs_" + "".join(flag for flag, _ in _used)] = (
        f"SELECT {_COLUMNS} FROM {{runs}} WHERE {_where} "
        "ORDER BY slot DESC, job DESC, manual DESC, attempt DESC LIMIT :limit"
    )


def runs_query_name(query: HistoryQuery, cursor: bool) -> str:
    """The name of the ``runs`` query for these filters."""
    flags = [query.job is not None, query.status is not None, query.runner is not None, cursor]
    return "runs_" + "".join(f for (f, _), on in zip(_RUNS_FILTERS, flags, strict=True) if on)


@dataclass(frozen=True)
class SqlQueries:
    """The named queries rendered for one dialect and one table."""

    text: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def render(
        cls, *, runs: str, meta: str, now: str, placeholder: str, lock_job: str,
        has_meta: bool = True,
    ) -> SqlQueries:
        """Fill the templates; ``placeholder`` is a format like ``"%({})s"`` or ``":{}"``.

        ``has_meta``: the table has the ``meta`` column (a table of an earlier release
        that could not be upgraded reads meta as empty and does not store it).
        """
        names = {"runs": runs, "meta": meta, "now": now, "lock_job": lock_job,
                 "meta_col": "meta" if has_meta else "NULL",
                 "set_meta": ", meta = :meta" if has_meta else ""}
        out = {}
        for key, template in _TEMPLATES.items():
            sql = template.replace("{meta_col}", names["meta_col"]).format(**names)
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


def claim_steps(req: ClaimRequest, retention: Retention) -> ClaimSteps:
    """The claim, as steps to run inside one transaction that serialises claims per job."""
    key = {"job": req.job, "slot": req.slot, "manual": int(req.manual)}
    yield Step("lock_job", {"lock_key": req.job})
    now = int((yield Step("now", {}))[0][0])
    rows = yield Step("current", key)
    state = _run_state(req, rows[0]) if rows else None
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
            yield from trim_steps(req.job, retention, now)
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


def _run_state(req: ClaimRequest, row: Any) -> RunState:
    """The current attempt's row as a state; a corrupt row is reported and never taken over.

    A row with an unknown status or unreadable numbers reads as status ``"corrupt"``,
    which the decision table answers ``done`` without writing: the run is not started
    (again), and the other runs of the job go on.
    """
    attempt, token, status, lease = row
    try:
        state = RunState(int(attempt), str(token), str(status),
                         int(lease) if lease is not None else None)
    except (TypeError, ValueError, OverflowError):
        state = RunState(0, "", "corrupt", None)
    if state.status not in FINISHED_STATUSES and state.status != "running":
        corrupt_records.report("table row", req.job, f"slot {req.slot} attempt {attempt}",
                               f"unknown status {status!r} or unreadable values; the run is "
                               "left alone")
        return RunState(state.attempt, state.token, "corrupt", None)
    return state


def expired_steps(job: str, limit: int) -> Generator[Step, Any, list[ExpiredRun]]:
    """Runs of ``job`` still running whose lease expired by the store's clock (bounded)."""
    now = int((yield Step("now", {}))[0][0])
    rows = yield Step("expired", {"job": job, "now": now, "limit": max(0, limit)})
    out = []
    for slot, attempt, manual, lease_until in rows:
        try:
            out.append(ExpiredRun(job, int(slot), int(attempt), bool(manual),
                                  None if lease_until is None else int(lease_until)))
        except (TypeError, ValueError):
            corrupt_records.report("table row", job, f"slot {slot!r} attempt {attempt!r}",
                                   "unreadable slot or attempt")
    return out


def trim_steps(job: str, retention: Retention, now: int) -> Generator[Step, Any, None]:
    """Drop finished runs beyond ``history_size`` and ``history_ttl_ms`` (the retention).

    Nothing newer than ``keep_ms`` (a late claim could still ask for it) and nothing
    running is ever dropped.
    """
    keep_after = now - retention.keep_ms
    rows = yield Step("trim_cutoff", {"job": job, "keep_runs": retention.history_size})
    cutoffs = [int(rows[0][0])] if rows else []
    if retention.history_ttl_ms is not None:
        cutoffs.append(now - retention.history_ttl_ms)
    if cutoffs:
        yield Step("trim_before", {"job": job, "cutoff": max(cutoffs),
                                   "keep_after": keep_after}, rows=False)


def check_format(rows: list[Any]) -> None:
    """Raise StoreFormatError if the format record is newer than this version reads."""
    if rows:
        check_format_value(rows[0][0])


def history_steps(job: str, limit: int) -> Generator[Step, Any, list[Run]]:
    """Read the newest ``limit`` attempts of ``job``."""
    now = int((yield Step("now", {}))[0][0])
    rows = yield Step("history", {"job": job, "limit": limit})
    return rows_to_runs(rows, now)


def runs_steps(query: HistoryQuery) -> Generator[Step, Any, RunPage]:
    """Read one page of history (:meth:`Backend.runs`), filters and cursor in the query."""
    below = validate_query(query)
    now = int((yield Step("now", {}))[0][0])
    params: dict[str, Any] = {"now": now, "limit": query.limit + 1, "job": query.job,
                              "status": query.status, "runner": query.runner}
    if below is not None:
        params.update(c_slot=below[0], c_job=below[1], c_manual=below[2], c_attempt=below[3])
    rows = yield Step(runs_query_name(query, below is not None), params)
    return finish_page(rows_to_runs(rows, now), query.limit)


def job_names_steps() -> Generator[Step, Any, dict[str, Run | None]]:
    """Read every job of the table with its newest attempt."""
    now = int((yield Step("now", {}))[0][0])
    rows = yield Step("job_names", {})
    return {run.job: run for run in rows_to_runs(rows, now)}


def rows_to_runs(rows: list[Any], now: int) -> list[Run]:
    """Turn rows of the history columns into runs (read by the shared status rule)."""
    runs = []
    for row in rows:
        # A row anarchon cannot read (an unknown status, a value out of range) is reported
        # once and skipped: it never hides the rest of the history.
        try:
            job, slot, attempt, stored_status, runner, started, finished, stored_error, \
                manual, lease, meta = row
            if stored_status not in FINISHED_STATUSES and stored_status != "running":
                raise ValueError(f"unknown status {stored_status!r}")
            status, error = read_status(stored_status, stored_error,
                                        int(lease) if lease is not None else None, now)
            runs.append(Run(
                job=job, slot=int(slot), attempt=int(attempt), status=status, runner=runner,
                started_at=ms_to_datetime(int(started)) if started is not None else None,
                finished_at=ms_to_datetime(int(finished)) if finished is not None else None,
                error=error, manual=bool(manual), meta=load_meta(meta),
            ))
        except (TypeError, ValueError, OverflowError, StoreError) as exc:
            corrupt_records.report("table row", str(row[0]) if row else "?",
                                   f"slot {row[1]!r} attempt {row[2]!r}" if len(row) > 2
                                   else repr(row), f"unreadable history row: {exc}")
    return runs
