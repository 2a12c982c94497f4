"""What the SQL lease backends share: the schema, the named queries and the claim steps.

SQLite and PostgreSQL store runs identically (one row per attempt) and run the same
claim: the steps below are written once, free of I/O, as a generator that yields
:class:`Step` objects (a named query and its parameters) and receives each result. A
backend only drives the generator inside one transaction of its own store. The decision
itself comes from :func:`anarchon_core.decision.decide`.

A generator may also yield a list of steps that do not depend on each other's results; it
receives the list of their results. PostgreSQL sends such a list in one round trip (one
message), SQLite runs it in order. A :class:`Last` list is the transaction's final one:
nothing is yielded after it, so its statements and the ``COMMIT`` share a round trip.

Claims, heartbeats, finishes and releases due at one instant are batched: one transaction
serves many calls (:func:`claim_batch_steps`, :func:`update_batch_steps`,
:func:`run_rounds`). Every job's lock is taken first, in one fixed order, and the decision
table is still applied to each claim on its own; a transaction holds at most one claim per
job, so no decision depends on another of the same transaction.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Generator, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, Union

from ..backend import Retention
from ..batching import CallBatcher, rounds
from ..decision import (
    CANCELLED,
    CORRUPT_LEASE,
    FINAL_NOTES,
    MAX_LEASE_AHEAD_MS,
    WAITING,
    WAITING_HANDED_OVER,
    Action,
    Decision,
    RunState,
    decide,
    needs_overlap_check,
)
from ..errors import StoreError, StoreUnavailable
from ..models import (
    FINISHED_STATUSES,
    RUN_STATUSES,
    ClaimOutcome,
    ClaimRequest,
    ClaimResult,
    ExpiredRun,
    HistoryQuery,
    Run,
    RunPage,
    RunRef,
)
from ..readmodel import (
    STATUS_SQL,
    dump_meta,
    finish_page,
    load_meta,
    read_status,
    validate_query,
)
from ..records import MAX_COUNT, record_int, record_ms, record_text
from ..schedules import ms_to_datetime
from .common import check_format_value, trim_drawn
from .storeerrors import CorruptRecords

__all__ = ["Batched", "Last", "SqlQueries", "Step", "Steps", "Update", "check_format",
           "claim_batch_steps", "claim_steps", "control_read_steps", "control_write_steps",
           "expired_steps", "job_names_steps", "newest_slots_steps", "report_corrupt_lease",
           "rows_to_runs", "run_rounds", "runs_steps", "slot_states_steps", "update_batch_steps"]

log = logging.getLogger("anarchon.sql")
#: Rows anarchon cannot read are reported once each, then skipped quietly.
corrupt_records = CorruptRecords(log)

#: No transaction yields more often than this (a bound for the drivers' loops).
MAX_YIELDS = 10_000

# Templates: {runs} and {meta} are the quoted table names, {now} the dialect's expression
# for the store clock in ms, {lock_job} a statement that serialises claims of one job until
# the transaction ends (``:lock_key`` names the job), {lock_jobs} the same for every job of
# ``:lock_keys`` (a list), taken in one fixed order, {meta_col} the meta column (NULL for a
# table without it) and {set_meta} its assignment in ``finish``. Parameters are :named.
# The tables themselves are created by :func:`anarchon_core.schema.sql_schema`.
#: An attempt whose lease was not released (see :func:`~anarchon_core.decision.update_applies`).
_NOT_RELEASED = "(error IS NULL OR error NOT IN ({}))".format(
    ", ".join(f"'{note}'" for note in FINAL_NOTES))
#: The note a release leaves (decision.released_error).
_RELEASED_ERROR = (f"CASE WHEN error = '{CANCELLED}' THEN error "
                   f"WHEN error IN ('{WAITING}', '{WAITING_HANDED_OVER}') "
                   f"THEN '{WAITING_HANDED_OVER}' ELSE :handed_over END")
_COLUMNS = ("job, slot, attempt, status, runner, started_at, finished_at, error, manual, "
            "lease_until, {meta_col}")
_TEMPLATES: dict[str, str] = {
    "read_format": "SELECT value FROM {meta} WHERE name = 'format'",
    "control_put": """
        INSERT INTO {meta} (name, value) VALUES (:name, :value)
        ON CONFLICT (name) DO UPDATE SET value = excluded.value""",
    "control_delete": "DELETE FROM {meta} WHERE name = :name",
    "control_read": """
        SELECT name, value FROM {meta} WHERE substr(name, 1, :length) = :prefix""",
    "now": "SELECT {now}",
    # The attempts of the scheduled slots of ``:keys`` (a JSON list of [job, slot] pairs,
    # turned into rows k(job, slot) by the dialect's {slot_keys}).
    "slot_states": """
        SELECT r.job, r.slot, r.attempt, r.status FROM {runs} r
        JOIN {slot_keys} ON r.job = k.job AND r.slot = k.slot
        WHERE r.manual = 0""",
    "lock_job": "{lock_job}",
    "lock_jobs": "{lock_jobs}",
    "current": """
        SELECT attempt, token, status, lease_until, error FROM {runs}
        WHERE job = :job AND slot = :slot AND manual = :manual
        ORDER BY attempt DESC LIMIT 1""",
    # The clock, whether another run of the job holds a live lease by that same reading
    # (decision.lease_is_live), the slot of one whose lease is corrupt (further ahead than
    # anarchon writes; reported), and whether a live one is a waiting attempt: one
    # statement, so it needs no earlier result (it can share a round trip).
    "other_live": """
        SELECT c.clock, EXISTS (
            SELECT 1 FROM {runs}
            WHERE job = :job AND status = 'running' AND lease_until > c.clock
              AND lease_until <= c.clock + """ + str(MAX_LEASE_AHEAD_MS) + """
              AND NOT (slot = :slot AND manual = :manual)), (
            SELECT slot FROM {runs}
            WHERE job = :job AND status = 'running'
              AND lease_until > c.clock + """ + str(MAX_LEASE_AHEAD_MS) + """
              AND NOT (slot = :slot AND manual = :manual) LIMIT 1), EXISTS (
            SELECT 1 FROM {runs}
            WHERE job = :job AND status = 'running' AND lease_until > c.clock
              AND lease_until <= c.clock + """ + str(MAX_LEASE_AHEAD_MS) + """
              AND error = '""" + WAITING + """'
              AND NOT (slot = :slot AND manual = :manual))
        FROM (SELECT {now} AS clock) c""",
    # overlap cancel_other: every other live run of the job is noted cancelled.
    "cancel_others": """
        UPDATE {runs} SET error = '""" + CANCELLED + """'
        WHERE job = :job AND status = 'running' AND lease_until > :now
          AND NOT (slot = :slot AND manual = :manual)""",
    # A waiting attempt starts: its note cleared, a fresh lease.
    "resume_attempt": """
        UPDATE {runs} SET error = NULL, lease_until = :lease_until
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND token = :token AND status = 'running'""",
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
    # decision.update_applies: a heartbeat or finish never acts on a released attempt.
    "heartbeat": """
        UPDATE {runs} SET lease_until = {now} + :lease_ms
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND token = :token AND status = 'running' AND """ + _NOT_RELEASED,
    "finish": """
        UPDATE {runs} SET status = :status, error = :error, finished_at = {now},
                          lease_until = NULL{set_meta}
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND token = :token AND status = 'running' AND """ + _NOT_RELEASED,
    "release": """
        UPDATE {runs} SET lease_until = {now}, error = """ + _RELEASED_ERROR + """
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND token = :token AND status = 'running'""",
    "attempt_status": """
        SELECT status, error FROM {runs}
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND token = :token""",
    # add_meta: the stored meta of an ended attempt, and its replacement. The read is a
    # no-op update so that it locks the row: a concurrent add_meta waits and then reads
    # the meta this one wrote (a plain SELECT would let it overwrite that).
    "ended_meta": """
        UPDATE {runs} SET {meta_col} = {meta_col}
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND status <> 'running'
        RETURNING {meta_col}""",
    "set_ended_meta": """
        UPDATE {runs} SET {meta_col} = :meta
        WHERE job = :job AND slot = :slot AND manual = :manual AND attempt = :attempt
          AND status <> 'running'""",
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
    "newest_slot": """
        SELECT max(slot) FROM {runs} WHERE job = :job AND manual = 0""",
    "expired": """
        SELECT slot, attempt, manual, lease_until FROM {runs}
        WHERE job = :job AND status = 'running' AND lease_until <= :now
        ORDER BY lease_until LIMIT :limit""",
    "trim_cutoff": """
        SELECT slot FROM {runs} WHERE job = :job AND attempt = 1
        ORDER BY slot DESC LIMIT 1 OFFSET :keep_runs""",
}
# Trimming in one statement: drop finished runs at or before the ``history_size``-th newest
# first attempt (no such run: nothing) and, with a TTL, at or before the TTL cutoff too
# (``slot <= max(a, b)`` as an OR, so a missing cutoff, NULL, bounds nothing in both
# dialects); never at or after ``keep_after``.
_TEMPLATES["trim"] = f"""
        DELETE FROM {{runs}}
        WHERE job = :job AND slot <= ({_TEMPLATES["trim_cutoff"]})
          AND slot < :keep_after AND status <> 'running'"""
_TEMPLATES["trim_ttl"] = f"""
        DELETE FROM {{runs}}
        WHERE job = :job AND (slot <= ({_TEMPLATES["trim_cutoff"]}) OR slot <= :ttl_cutoff)
          AND slot < :keep_after AND status <> 'running'"""


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
        lock_jobs: str, slot_keys: str, has_meta: bool = True,
    ) -> SqlQueries:
        """Fill the templates; ``placeholder`` is a format like ``"%({})s"`` or ``":{}"``.

        ``slot_keys``: a table expression ``k(job, slot)`` of the pairs in the JSON list
        ``:keys``.

        ``has_meta``: the table has the ``meta`` column (a table of an earlier release
        that could not be upgraded reads meta as empty and does not store it).
        """
        names = {"runs": runs, "meta": meta, "now": now, "lock_job": lock_job,
                 "lock_jobs": lock_jobs, "slot_keys": slot_keys,
                 "meta_col": "meta" if has_meta else "NULL",
                 "set_meta": ", meta = :meta" if has_meta else ""}
        out = {}
        for key, template in _TEMPLATES.items():
            sql = template.replace("{meta_col}", names["meta_col"]).format(**names)
            sql = " ".join(sql.split())  # no template has a literal with a run of spaces
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


class Last(list[Step]):
    """The transaction's last steps: the generator yields nothing after them.

    A driver may send the ``COMMIT`` with them, in the same round trip; their results
    still come back, once the commit has succeeded.
    """


T = TypeVar("T")
Item = TypeVar("Item")
R = TypeVar("R")
#: A transaction written as steps: yields a :class:`Step` (gets its result back) or a list
#: of steps that need no result of each other (gets the list of their results).
Steps = Generator[Union[Step, list[Step]], Any, T]  # noqa: UP007 - a runtime alias
ClaimSteps = Steps[ClaimResult]
#: The answers to a batch, in its order: each call's result, or the error of its own call.
Answers = list[Union[R, BaseException]]  # noqa: UP007 - a runtime alias


def ref_params(ref: RunRef) -> dict[str, Any]:
    """The parameters that identify an attempt in the queries."""
    return {"job": ref.job, "slot": ref.slot, "manual": int(ref.manual),
            "attempt": ref.attempt, "token": ref.token}


def _lock_step(jobs: list[str]) -> Step:
    """The locks of ``jobs`` (sorted, distinct), taken in one statement in a fixed order.

    Every transaction takes all its locks first, each in that same order, so two batches
    (of any instances) can wait for each other but never deadlock.
    """
    if len(jobs) == 1:
        return Step("lock_job", {"lock_key": jobs[0]}, rows=False)
    return Step("lock_jobs", {"lock_keys": jobs}, rows=False)


def claim_steps(req: ClaimRequest, retention: Retention) -> ClaimSteps:
    """The claim, as steps to run inside one transaction that serialises claims per job."""
    [result] = yield from claim_batch_steps([req], retention)
    return result


def claim_batch_steps(reqs: Sequence[ClaimRequest],
                      retention: Retention) -> Steps[list[ClaimResult]]:
    """Claims of distinct jobs in one transaction: two lists of steps, whatever their number.

    First the lock of every job, in a statement of its own, so that every read after it sees
    what earlier holders committed; then, for each claim, the store clock (with the overlap
    check when the job forbids overlap) and the run's current state. Then
    :func:`~anarchon_core.decision.decide` for each claim on its own, and the writes of all
    of them as the :class:`Last` steps.
    """
    jobs = sorted({req.job for req in reqs})
    if len(jobs) != len(reqs):
        raise ValueError("a claim batch holds at most one claim per job")
    if not reqs:
        return []
    reads = [_lock_step(jobs)]
    for req in reqs:
        key = _claim_key(req)
        # The overlap check is read with the state, before it is known to be needed; its
        # result is used only when the decision table asks for it, as before.
        reads.append(Step("now", {}) if req.policy == "allow" else Step("other_live", key))
        reads.append(Step("current", key))
    replies = yield reads
    writes = Last()
    results = []
    for i, req in enumerate(reqs):
        clock, rows = replies[1 + 2 * i][0], replies[2 + 2 * i]
        now = int(clock[0])
        state = _run_state(req, rows[0]) if rows else None
        checked = needs_overlap_check(req, state)
        if checked and clock[2] is not None:
            report_corrupt_lease(req.job, clock[2])
        live = checked and len(clock) > 1
        decision = decide(req, state, now, live and bool(clock[1]), live and bool(clock[3]))
        writes.extend(_claim_writes(req, decision, now, retention))
        token = req.token if decision.outcome is ClaimOutcome.WON else None
        results.append(ClaimResult(decision.outcome, decision.attempt, token,
                                   decision.lease_until_ms))
    if writes:
        yield writes
    return results


def report_corrupt_lease(job: str, slot: object) -> None:
    """Report (once) a running run of ``job`` whose lease the overlap check ignores."""
    corrupt_records.report("table row", job, f"slot {slot!r} (running)", CORRUPT_LEASE)


def _claim_key(req: ClaimRequest) -> dict[str, Any]:
    return {"job": req.job, "slot": req.slot, "manual": int(req.manual)}


def _claim_writes(req: ClaimRequest, decision: Decision, now: int,
                  retention: Retention) -> list[Step]:
    """The statements that apply ``decision`` (none when it writes nothing)."""
    key = _claim_key(req)
    writes = []
    if decision.cancel_others:
        writes.append(Step("cancel_others", {**key, "now": now}, rows=False))
    if decision.action in (Action.START, Action.WAIT):
        waits = decision.action is Action.WAIT
        if decision.attempt > 1:
            writes.append(Step("end_attempt", {
                **key, "now": now, "attempt": decision.attempt - 1, "status": "interrupted",
                "error": None if waits else decision.error}, rows=False))
        writes.append(Step("insert_attempt", {
            **key, "now": now, "attempt": decision.attempt, "token": req.token,
            "status": "running", "runner": req.runner,
            "lease_until": decision.lease_until_ms, "finished_at": None,
            "error": WAITING if waits else None,
        }, rows=False))
        if trim_drawn():
            writes.append(trim_step(req.job, retention, now))
    elif decision.action is Action.RESUME:
        writes.append(Step("resume_attempt", {
            **key, "attempt": decision.attempt, "token": req.token,
            "lease_until": decision.lease_until_ms}, rows=False))
    elif decision.action is Action.SKIP:
        writes.append(Step("insert_attempt", {
            **key, "now": now, "attempt": 1, "token": req.token, "status": decision.status,
            "runner": req.runner, "lease_until": None, "finished_at": now,
            "error": decision.error,
        }, rows=False))
    elif decision.action is Action.GIVE_UP:
        writes.append(Step("end_attempt", {
            **key, "now": now, "attempt": decision.attempt, "status": "interrupted",
            "error": decision.error}, rows=False))
    return writes


@dataclass(frozen=True)
class Update:
    """One heartbeat, finish or release of a batch; ``query`` names its statement.

    ``recheck``: an earlier try of this finish may have committed before its answer was
    lost, so the attempt's stored end is read first; if it is this one, the call succeeded.
    """

    query: str
    ref: RunRef
    params: dict[str, Any]
    recheck: bool = False

    @property
    def attempt_key(self) -> tuple[str, int, bool, int]:
        """The attempt it acts on: a batch holds at most one call per attempt."""
        return (self.ref.job, self.ref.slot, self.ref.manual, self.ref.attempt)


def update_batch_steps(updates: Sequence[Update], *, lock: bool = True) -> Steps[list[bool]]:
    """Heartbeats, finishes and releases of distinct attempts in one transaction.

    With ``lock``, under the locks of their jobs, as claims (PostgreSQL passes False: its
    claims read the run ``FOR UPDATE``, so the row lock each statement takes serialises
    it with them); each acts only while its token holds the running attempt (its
    statement checks it). The statements go with the ``COMMIT``, in the order of their
    attempts (every transaction locks rows in that one order); a finish to recheck needs
    one list of reads before them.
    """
    if len({u.attempt_key for u in updates}) != len(updates):
        raise ValueError("an update batch holds at most one call per attempt")
    if not updates:
        return []
    head = [_lock_step(sorted({u.ref.job for u in updates}))] if lock else []
    done = [False] * len(updates)
    rechecks = [i for i, u in enumerate(updates) if u.recheck]
    if rechecks:
        replies = yield [*head, *(Step("attempt_status", ref_params(updates[i].ref))
                                  for i in rechecks)]
        for i, rows in zip(rechecks, replies[len(head):], strict=True):
            params = updates[i].params
            done[i] = bool(rows) and (rows[0][0], rows[0][1]) == (params["status"],
                                                                  params["error"])
        head = []
    todo = sorted((i for i in range(len(updates)) if not done[i]),
                  key=lambda i: updates[i].attempt_key)
    replies = yield Last([*head, *(Step(updates[i].query, updates[i].params, rows=False)
                                   for i in todo)])
    for i, count in zip(todo, replies[len(head):], strict=True):
        done[i] = count == 1
    return done


async def run_rounds(items: Sequence[Item], key: Callable[[Item], Hashable],
                     run: Callable[[list[Item]], Awaitable[list[R]]]) -> Answers[R]:
    """Answer ``items`` with as few transactions as possible: ``run`` makes one of a list.

    Each transaction holds at most one item per ``key`` (:func:`rounds`); the rounds run
    one after another. A transaction that fails with
    :class:`~anarchon_core.errors.StoreUnavailable` gives that error to each item not yet
    answered (each caller retries by its own policy). One that fails with another
    :class:`~anarchon_core.errors.StoreError` is run again one item at a time, so only the
    item the store refuses fails.
    """
    if len(items) == 1:  # a lone call: one transaction, no rounds to plan
        try:
            [answer] = await run([items[0]])
        except StoreError as exc:
            return [exc]
        return [answer]
    answers: dict[int, R | BaseException] = {}
    unavailable: StoreUnavailable | None = None
    for group in rounds(items, key):
        try:
            answers.update(zip(group, await run([items[i] for i in group]), strict=True))
        except StoreUnavailable as exc:
            unavailable = exc
        except StoreError as exc:
            if len(group) == 1:
                answers[group[0]] = exc
                continue
            for i in group:
                try:
                    [answers[i]] = await run([items[i]])
                except StoreUnavailable as alone:
                    unavailable = alone
                    break
                except StoreError as alone:
                    answers[i] = alone
        if unavailable is not None:
            break
    return [answers[i] if i in answers else _unanswered(unavailable)
            for i in range(len(items))]


def _unanswered(error: StoreUnavailable | None) -> BaseException:
    assert error is not None, "every item of a batch is answered unless the store failed"
    return error


class Batched(Generic[Item, R]):
    """Calls of one kind into ``send_many``: alone when nothing else is going on, else batched.

    A call made while no other call of this kind is queued or in flight goes out at once,
    as a batch of one; calls made meanwhile go through a
    :class:`~anarchon_core.batching.CallBatcher` (:attr:`batcher`), which gathers them
    into batches. The batcher waits a turn of the event loop for a batch to form and sends
    it from a task of its own, turns a lone call has no use for.
    """

    def __init__(self, send_many: Callable[[list[Item]], Awaitable[Answers[R]]], *,
                 max_batch: int, max_in_flight: int) -> None:
        self._send_many = send_many
        self.batcher: CallBatcher[Item, R] = CallBatcher(
            send_many, max_batch=max_batch, max_in_flight=max_in_flight)
        self._busy = 0
        #: Calls sent alone, at once (the batcher counts the others), for tests and benchmarks.
        self.alone = 0

    async def call(self, item: Item) -> R:
        """``item``'s answer, or the exception of its own call."""
        alone = self._busy == 0
        self._busy += 1
        try:
            if not alone:
                return await self.batcher.call(item)
            self.alone += 1
            [answer] = await self._send_many([item])
        finally:
            self._busy -= 1
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _run_state(req: ClaimRequest, row: Any) -> RunState:
    """The current attempt's row as a state; a corrupt row is reported and never taken over.

    A row with an unknown status or unreadable numbers reads as status ``"corrupt"``,
    which the decision table answers ``done`` without writing: the run is not started
    (again), and the other runs of the job go on.
    """
    attempt, token, status, lease, error = row
    try:
        state = RunState(int(attempt), str(token), str(status),
                         int(lease) if lease is not None else None,
                         error if isinstance(error, str) else None)
    except (TypeError, ValueError, OverflowError):
        state = RunState(0, "", "corrupt", None)
    if state.status not in FINISHED_STATUSES and state.status != "running":
        corrupt_records.report("table row", req.job, f"slot {req.slot} attempt {attempt}",
                               f"unknown status {status!r} or unreadable values; the run is "
                               "left alone")
        return RunState(state.attempt, state.token, "corrupt", None)
    return state


def add_meta_steps(ref: RunRef, meta: Mapping[str, str]) -> Steps[bool]:
    """Merge ``meta`` into an ended attempt's stored meta (False: no such ended attempt)."""
    key = {k: v for k, v in ref_params(ref).items() if k != "token"}
    rows = yield Step("ended_meta", key)
    if not rows:
        return False
    merged = {**load_meta(rows[0][0]), **meta}
    [count] = yield Last([Step("set_ended_meta", {**key, "meta": dump_meta(merged)},
                               rows=False)])
    return bool(count == 1)


def finish_params(ref: RunRef, status: str, error: str | None,
                  meta: Mapping[str, str] | None) -> dict[str, Any]:
    """The parameters of the ``finish`` query."""
    return {**ref_params(ref), "status": status, "error": error, "meta": dump_meta(meta)}


def expired_steps(job: str, limit: int) -> Generator[Step, Any, list[ExpiredRun]]:
    """Runs of ``job`` still running whose lease expired by the store's clock (bounded)."""
    now = int((yield Step("now", {}))[0][0])
    rows = yield Step("expired", {"job": job, "now": now, "limit": max(0, limit)})
    out = []
    for slot, attempt, manual, lease_until in rows:
        try:
            out.append(ExpiredRun(job, record_ms(slot, "slot"),
                                  record_int(attempt, "attempt", 1, MAX_COUNT), bool(manual),
                                  None if lease_until is None
                                  else record_ms(lease_until, "lease_until")))
        except ValueError as exc:
            corrupt_records.report("table row", job, f"slot {slot!r} attempt {attempt!r}",
                                   f"unreadable expired run: {exc}")
    return out


def trim_step(job: str, retention: Retention, now: int) -> Step:
    """Drop finished runs beyond ``history_size`` and ``history_ttl_ms`` (the retention).

    Nothing newer than ``keep_ms`` (a late claim could still ask for it) and nothing
    running is ever dropped.
    """
    params = {"job": job, "keep_runs": retention.history_size,
              "keep_after": now - retention.keep_ms}
    if retention.history_ttl_ms is None:
        return Step("trim", params, rows=False)
    return Step("trim_ttl", {**params, "ttl_cutoff": now - retention.history_ttl_ms},
                rows=False)


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


#: Control records live in the meta table under this prefix, apart from ``format``.
CONTROL_PREFIX = "control:"


def control_write_steps(name: str, value: str | None) -> Steps[None]:
    """Set (or with ``None`` delete) the control record ``name`` in the meta table."""
    key = CONTROL_PREFIX + name
    step = (Step("control_delete", {"name": key}, rows=False) if value is None
            else Step("control_put", {"name": key, "value": value}, rows=False))
    yield Last([step])


def control_read_steps(prefix: str) -> Generator[Step, Any, dict[str, str]]:
    """Every control record whose name starts with ``prefix``."""
    key = CONTROL_PREFIX + prefix
    rows = yield Step("control_read", {"prefix": key, "length": len(key)})
    return {str(name)[len(CONTROL_PREFIX):]: str(value) for name, value in rows}


def newest_slots_steps(jobs: Sequence[str]
                       ) -> Generator[list[Step], Any, dict[str, int | None]]:
    """The newest scheduled slot of each job, one statement each, all in one round trip.

    A job whose newest slot is not a readable slot (a corrupt row) is reported and answers
    None, like a job with no record; the other jobs are unaffected.
    """
    replies = yield [Step("newest_slot", {"job": job}) for job in jobs]
    out: dict[str, int | None] = {}
    for job, rows in zip(jobs, replies, strict=True):
        value = rows[0][0] if rows else None
        try:
            out[job] = None if value is None else record_ms(value, "slot")
        except ValueError as exc:
            corrupt_records.report("table row", job, f"slot {value!r}",
                                   f"unreadable newest slot: {exc}")
            out[job] = None
    return out


def slot_states_steps(slots: Sequence[tuple[str, int]]
                      ) -> Generator[Step, Any, dict[tuple[str, int], str]]:
    """The newest attempt's status of each scheduled slot on record, in one statement.

    A row anarchon cannot read leaves its slot out (the claim that follows reports it).
    """
    wanted = set(slots)
    rows = yield Step("slot_states", {"keys": json.dumps([[job, slot] for job, slot in wanted])})
    newest: dict[tuple[str, int], tuple[int, str]] = {}
    for job, slot, attempt, status in rows:
        try:
            key = (str(job), record_ms(slot, "slot"))
            number = record_int(attempt, "attempt", 1, MAX_COUNT)
        except (ValueError, TypeError):
            continue
        if key in wanted and (key not in newest or number > newest[key][0]):
            newest[key] = (number, str(status))
    return {key: status for key, (_, status) in newest.items() if status in RUN_STATUSES}


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
            status, error = read_status(
                stored_status,
                None if stored_error is None else record_text(stored_error, "error"),
                record_ms(lease, "lease_until") if lease is not None else None, now)
            runs.append(Run(
                job=record_text(job, "job"), slot=record_ms(slot, "slot"),
                attempt=record_int(attempt, "attempt", 1, MAX_COUNT), status=status,
                runner=record_text(runner, "runner"),
                started_at=ms_to_datetime(record_ms(started, "started_at"))
                if started is not None else None,
                finished_at=ms_to_datetime(record_ms(finished, "finished_at"))
                if finished is not None else None,
                error=error, manual=bool(manual), meta=load_meta(meta),
            ))
        except (TypeError, ValueError, OverflowError, StoreError) as exc:
            corrupt_records.report("table row", str(row[0]) if row else "?",
                                   f"slot {row[1]!r} attempt {row[2]!r}" if len(row) > 2
                                   else repr(row), f"unreadable history row: {exc}")
    return runs
