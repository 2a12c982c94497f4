"""PostgreSQL's claims and lease updates in one round trip: session functions.

:mod:`~anarchon_core.backends.sqlstore` runs a claim as two messages: the job's lock with
the reads, then (after :func:`~anarchon_core.decision.decide` ran in Python) the writes
with the ``COMMIT``. Here the whole claim runs on the server: a PL/pgSQL function applies
the decision table line for line, as the Redis ``lease_claim`` Lua script does, and a
batch of claims is one call of it, one statement, one round trip. A lone claim (the
common case when nothing else is due) calls a second function made of the same decision
text, which takes its fields as parameters and answers with one text: it spares the
server the JSON and the row set, and the batch's lock statement for one job.

The function is made from the very statements the two-message claim sends (the job
locks, the current state read ``FOR UPDATE``, the clock with the overlap check, the
inserts, the end of an attempt, the notes of a ``cancel_other`` claim, the start of a
waiting attempt and the trim), rendered with PL/pgSQL variables where the
other path binds parameters: only the decision itself is written twice. It lives in
``pg_temp``: each session creates its own copy before its first claim (so an instance
always runs its own version's function, and nothing is left in the database), and it
vanishes with the session. The conformance suite holds it to the same table as the
Python decision.

Heartbeats, finishes and releases made together go the same way: one call of a second
function runs each one's statement (the very ``heartbeat``, ``finish`` and ``release``
statements of :mod:`sqlstore`), in the order of their attempts, and tells which took
effect.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..backend import Retention
from ..decision import (
    ALREADY_BUFFERED,
    CANCELLED,
    EARLY_TOLERANCE_MS,
    GAVE_UP,
    HANDED_OVER,
    LEASE_EXPIRED,
    OVERLAP_SKIP,
    WAITING,
    WAITING_HANDED_OVER,
)
from ..models import FINISHED_STATUSES, ClaimOutcome, ClaimRequest, ClaimResult
from .common import trim_drawn
from .sqlstore import Last, Step, Steps, Update, corrupt_records, report_corrupt_lease

__all__ = ["FUNCTION_VERSION", "claim_call", "claim_call_steps", "claim_function",
           "claim_one_call", "claim_one_function", "function_name", "update_call",
           "update_call_steps", "update_function"]

#: Part of the function's name: a release that changes the function changes it.
FUNCTION_VERSION = 6
#: The statements of :mod:`sqlstore` the function is made of (rendered with ``v_`` names).
USED_QUERIES = ("lock_job", "lock_jobs", "current", "current_locked", "other_live",
                "cancel_others", "resume_attempt", "insert_attempt", "end_attempt", "trim",
                "trim_ttl")


def function_name(runs: str, kind: str = "claim") -> str:
    """The name of the session function ``kind`` (``claim``, ``update``) for ``runs``."""
    digest = hashlib.sha1(f"{runs}:{FUNCTION_VERSION}".encode()).hexdigest()[:16]
    return f"anarchon_{kind}_{digest}"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def claim_function(name: str, q: Mapping[str, str], now: str) -> str:
    """``CREATE FUNCTION pg_temp.<name>`` from the statements ``q`` and the clock ``now``.

    It takes a batch of claims as JSON and answers each with a row. ``q`` holds
    :data:`USED_QUERIES` rendered with ``v_<name>`` for each ``:name`` parameter;
    ``q["current_locked"]`` is ``q["current"]`` read ``FOR UPDATE``. A run whose lease may
    have expired is read again that way before it is taken over, so a heartbeat or finish
    in flight ends first (and one that comes after finds itself fenced); a claim that only
    answers ``running`` or ``done`` locks no row.
    """
    return f"""CREATE OR REPLACE FUNCTION pg_temp.{name}(
    p_claims JSON, v_keep_runs BIGINT, v_keep_ms BIGINT, v_ttl_ms BIGINT)
RETURNS TABLE (o_i INTEGER, o_outcome TEXT, o_attempt INTEGER, o_lease BIGINT,
               o_corrupt BIGINT, o_stored TEXT)
LANGUAGE plpgsql VOLATILE AS $anarchon$
DECLARE
    r RECORD;
    v_lock_keys TEXT[];
    v_job TEXT; v_slot BIGINT; v_manual INTEGER; v_token TEXT; v_runner TEXT;
    {_DECLARED}
BEGIN
    -- Every job's lock first, in one fixed order (the order of the two-message claim).
    SELECT array_agg(c.job) INTO v_lock_keys FROM json_to_recordset(p_claims) AS c(job TEXT);
    PERFORM * FROM ({q['lock_jobs']}) AS locks;
    FOR r IN SELECT * FROM json_to_recordset(p_claims) AS c({_CLAIM_FIELDS}) LOOP
        v_job := r.job; v_slot := r.slot; v_manual := r.manual;
        v_token := r.token; v_runner := r.runner;
        o_i := r.i;
        {_decision(q, now, "r.")}
        RETURN NEXT;
    END LOOP;
END
$anarchon$"""


def claim_one_function(name: str, q: Mapping[str, str], now: str) -> str:
    """``CREATE FUNCTION pg_temp.<name>``: :func:`claim_function` for one claim.

    The claim comes as parameters and its answer as one text (``outcome attempt lease
    corrupt stored``, NULLs empty), which the server makes and the client reads cheaper than JSON
    and a row set; the decision is the same text as the batch function's. The job's lock is
    taken alone, as the two-message claim takes the lock of a lone job.
    """
    params = ", ".join(f"p_{field}" for field in _CLAIM_FIELDS.split(", ")
                       if field.split()[0] not in _IN_VARIABLES)
    return f"""CREATE OR REPLACE FUNCTION pg_temp.{name}(
    v_job TEXT, v_slot BIGINT, v_manual INTEGER, v_token TEXT, v_runner TEXT, {params},
    v_keep_runs BIGINT, v_keep_ms BIGINT, v_ttl_ms BIGINT)
RETURNS TEXT
LANGUAGE plpgsql VOLATILE AS $anarchon$
DECLARE
    v_lock_key TEXT := v_job;
    o_outcome TEXT; o_attempt INTEGER; o_lease BIGINT; o_corrupt BIGINT; o_stored TEXT;
    {_DECLARED}
BEGIN
    PERFORM * FROM ({q['lock_job']}) AS locks;
    {_decision(q, now, "p_")}
    RETURN format('%s %s %s %s %s', o_outcome, o_attempt, o_lease, o_corrupt, o_stored);
END
$anarchon$"""


#: The variables of the decision (beyond the claim's own fields and the answer).
_DECLARED = """v_attempt INTEGER; v_status TEXT; v_error TEXT; v_lease_until BIGINT;
    v_finished_at BIGINT; v_now BIGINT; v_live BOOLEAN; v_corrupt BIGINT;
    v_waiting BOOLEAN; v_keep_after BIGINT; v_ttl_cutoff BIGINT;
    c_attempt INTEGER; c_token TEXT; c_status TEXT; c_lease BIGINT; c_error TEXT;"""


def _decision(q: Mapping[str, str], now: str, field: str) -> str:
    """The decision table for one claim, in PL/pgSQL: sets ``o_outcome`` and the rest.

    The claim's job, slot, manual flag, token and runner are in ``v_`` variables; its other
    fields are ``<field><name>`` (``r.lease_ms`` in the batch function's loop, ``p_lease_ms``
    for a lone claim's parameters). ``<field>overlap`` is the policy's name.
    """
    missing = [key for key in USED_QUERIES if key not in q]
    if missing:
        raise ValueError(f"claim function: missing statements {missing}")
    r = field

    def write(status: str, error: str, finished: str, lease: str, attempt: str) -> str:
        return (f"v_attempt := {attempt}; v_status := {status}; v_error := {error}; "
                f"v_finished_at := {finished}; v_lease_until := {lease}; "
                f"{q['insert_attempt']};")

    def end(error: str) -> str:
        return (f"v_attempt := c_attempt; v_status := 'interrupted'; v_error := {error}; "
                f"{q['end_attempt']};")

    trim = (f"IF {r}trim_history THEN v_keep_after := v_now - v_keep_ms; "
            f"IF v_ttl_ms IS NULL THEN {q['trim']}; ELSE v_ttl_cutoff := v_now - v_ttl_ms; "
            f"{q['trim_ttl']}; END IF; END IF;")
    skip = "'skipped'"
    lease = f"v_now + {r}lease_ms"
    waits = f"c_error IN ({_literal(WAITING)}, {_literal(WAITING_HANDED_OVER)})"
    cancelled = f"c_error = {_literal(CANCELLED)}"
    # other_live's columns; the waiting one is read only where the table asks for it (a
    # column of the derived table left unread is not computed).
    live = f"({q['other_live']}) AS live (clock, other, corrupt, waiting)"
    return f"""o_outcome := NULL; o_attempt := 0; o_lease := NULL; o_stored := NULL;
        o_corrupt := NULL;
        -- The run's state, the clock and the overlap check in one statement: a won claim
        -- (the common case) needs all three, and the check costs a lookup when it does not.
        -- v_corrupt: the slot of a run whose lease the check ignores (reported by Python).
        SELECT live.clock, live.other, live.corrupt, cur.*
            INTO v_now, v_live, v_corrupt, c_attempt, c_token, c_status, c_lease, c_error
            FROM {live} LEFT JOIN ({q['current']}) AS cur ON TRUE;
        IF c_attempt IS NULL THEN
            IF {r}overlap = 'allow' THEN v_live := FALSE; ELSE o_corrupt := v_corrupt; END IF;
            IF v_slot > v_now + {EARLY_TOLERANCE_MS} AND v_manual = 0 THEN
                o_outcome := 'early';
            ELSIF {r}missed IS NOT NULL THEN
                {write("'missed'", f"{r}missed", "v_now", "NULL", "1")}
                o_outcome := 'late'; o_attempt := 1;
            ELSIF {r}max_late_ms IS NOT NULL AND v_now > v_slot + {r}max_late_ms THEN
                {write(skip, "format('late: first claimed %s ms after its time "
                       f"(max_late_ms=%s)', v_now - v_slot, {r}max_late_ms)",
                       "v_now", "NULL", "1")}
                o_outcome := 'late'; o_attempt := 1;
            ELSE
                IF v_live AND {r}overlap = 'buffer_one' THEN
                    -- Whether a live run waits already: the check again, with that column.
                    SELECT live.* INTO v_now, v_live, v_corrupt, v_waiting FROM {live};
                END IF;
                IF v_live AND {r}overlap = 'skip' THEN
                    {write(skip, _literal(OVERLAP_SKIP), "v_now", "NULL", "1")}
                    o_outcome := 'overlap'; o_attempt := 1;
                ELSIF v_live AND {r}overlap = 'buffer_one' AND v_waiting THEN
                    {write(skip, _literal(ALREADY_BUFFERED), "v_now", "NULL", "1")}
                    o_outcome := 'overlap'; o_attempt := 1;
                ELSIF v_live AND {r}overlap IN ('buffer_one', 'cancel_other') THEN
                    IF {r}overlap = 'cancel_other' THEN {q['cancel_others']}; END IF;
                    {write("'running'", _literal(WAITING), "NULL", lease, "1")}
                    {trim}
                    o_outcome := 'buffered'; o_attempt := 1; o_lease := v_lease_until;
                ELSE
                    {write("'running'", "NULL", "NULL", lease, "1")}
                    {trim}
                    o_outcome := 'won'; o_attempt := 1; o_lease := v_lease_until;
                END IF;
            END IF;
        ELSE
            IF c_status = 'running' AND {r}missed IS NULL AND c_token <> v_token
                    AND (c_lease IS NULL OR c_lease <= v_now) THEN
                SELECT * INTO c_attempt, c_token, c_status, c_lease, c_error
                    FROM ({q['current_locked']}) AS cur;
                IF c_status = 'running' AND ({r}overlap <> 'allow' OR {waits}) THEN
                    -- The overlap check by the clock read after the row's lock.
                    SELECT live.clock, live.other, live.corrupt INTO v_now, v_live, v_corrupt
                        FROM {live};
                ELSE
                    v_now := {now};
                END IF;
            END IF;
            IF c_status = 'running' AND {r}missed IS NULL AND (({waits}) IS TRUE
                    OR (c_token <> v_token AND {r}overlap <> 'allow')) THEN
                o_corrupt := v_corrupt;
            END IF;
            o_attempt := c_attempt; o_stored := c_status;
            IF c_status IS DISTINCT FROM 'running' THEN
                o_outcome := 'done';
            ELSIF {r}missed IS NOT NULL THEN
                o_outcome := 'running'; o_lease := c_lease;
            ELSIF c_token = v_token THEN
                IF ({cancelled}) IS TRUE THEN
                    {end(_literal(CANCELLED))}
                    o_outcome := 'done';
                ELSIF ({waits}) IS TRUE AND v_live THEN
                    o_outcome := 'buffered'; o_lease := c_lease;
                ELSIF ({waits}) IS TRUE THEN
                    v_attempt := c_attempt; v_lease_until := {lease};
                    {q['resume_attempt']};
                    o_outcome := 'won'; o_lease := v_lease_until;
                ELSE
                    o_outcome := 'won'; o_lease := c_lease;
                END IF;
            ELSIF c_lease IS NOT NULL AND c_lease > v_now THEN
                o_outcome := 'running'; o_lease := c_lease;
            ELSIF ({cancelled}) IS TRUE THEN
                {end(_literal(CANCELLED))}
                o_outcome := 'done';
            ELSIF ({waits}) IS TRUE AND c_attempt < {r}max_attempts AND v_live THEN
                {end("NULL")}
                {write("'running'", _literal(WAITING), "NULL", lease, "c_attempt + 1")}
                {trim}
                o_outcome := 'buffered'; o_attempt := v_attempt; o_lease := v_lease_until;
            ELSIF v_live AND {r}overlap <> 'allow' AND ({waits}) IS NOT TRUE THEN
                o_outcome := 'running'; o_lease := c_lease;
            ELSIF c_attempt < {r}max_attempts THEN
                {end(_literal(LEASE_EXPIRED))}
                {write("'running'", "NULL", "NULL", lease, "c_attempt + 1")}
                {trim}
                o_outcome := 'won'; o_attempt := v_attempt; o_lease := v_lease_until;
            ELSE
                {end(_literal(GAVE_UP))}
                o_outcome := 'done';
            END IF;
        END IF;"""


#: The fields of each claim in the function's JSON argument, with their SQL types.
_CLAIM_FIELDS = ("i INTEGER, job TEXT, slot BIGINT, manual INTEGER, token TEXT, runner TEXT, "
                 "lease_ms BIGINT, overlap TEXT, max_attempts INTEGER, max_late_ms BIGINT, "
                 "missed TEXT, trim_history BOOLEAN")
#: The fields the decision reads from ``v_`` variables (the lone function's own parameters),
#: and the batch's index of each claim; the others are ``r.<name>`` or ``p_<name>``.
_IN_VARIABLES = ("i", "job", "slot", "manual", "token", "runner")


def claim_call(name: str) -> str:
    """The statement that calls the claim function (``%(name)s`` parameters).

    The claims go as one JSON array: encoding it costs the client a fraction of binding
    one array per field.
    """
    return (f"SELECT * FROM pg_temp.{name}(CAST(%(claims)s AS JSON), CAST(%(keep_runs)s AS "
            "BIGINT), CAST(%(keep_ms)s AS BIGINT), CAST(%(ttl_ms)s AS BIGINT))")


def claim_one_call(name: str) -> str:
    """The statement that calls the lone claim's function (``%(name)s`` parameters).

    Each value is cast to its parameter's type, so one the type cannot hold fails as such
    instead of finding no function to call.
    """
    fields = [field.split() for field in _CLAIM_FIELDS.split(", ")[1:]]
    fields += [["keep_runs", "BIGINT"], ["keep_ms", "BIGINT"], ["ttl_ms", "BIGINT"]]
    args = ", ".join(f"CAST(%({field})s AS {kind})" for field, kind in fields)
    return f"SELECT pg_temp.{name}({args})"


def claim_call_steps(reqs: Sequence[ClaimRequest],
                     retention: Retention) -> Steps[list[ClaimResult]]:
    """Claims of distinct jobs as one call of a function: one statement.

    A lone claim calls :func:`claim_one_function`; a batch calls :func:`claim_function`,
    its claims in the order of their jobs (the order every transaction takes row locks
    in), and the answers come back in ``reqs``' order.
    """
    if len(reqs) == 1:
        [req] = reqs
        [[(answer,)]] = yield Last([Step("claim_one_call", {
            **_claim_fields(req), **_retention_params(retention)})])
        outcome, attempt, lease, corrupt, stored = answer.split(" ", 4)
        return [_result(req, (outcome, attempt, lease or None, corrupt or None,
                              stored or None))]
    if len({req.job for req in reqs}) != len(reqs):
        raise ValueError("a claim batch holds at most one claim per job")
    if not reqs:
        return []
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].job)
    claims = [{"i": i, **_claim_fields(reqs[i])} for i in order]
    params = {"claims": json.dumps(claims), **_retention_params(retention)}
    [rows] = yield Last([Step("claim_call", params)])
    results = {int(row[0]): _result(reqs[int(row[0])], row[1:]) for row in rows}
    if len(results) != len(reqs) or set(results) != set(range(len(reqs))):
        raise RuntimeError(f"the claim function answered {len(rows)} of {len(reqs)} claims")
    return [results[i] for i in range(len(reqs))]


def _claim_fields(req: ClaimRequest) -> dict[str, Any]:
    """A claim's fields as the functions take them (:data:`_CLAIM_FIELDS` but ``i``)."""
    return {"job": req.job, "slot": req.slot, "manual": int(req.manual), "token": req.token,
            "runner": req.runner, "lease_ms": req.lease_ms, "overlap": req.policy,
            "max_attempts": req.max_attempts, "max_late_ms": req.max_late_ms,
            "missed": req.missed, "trim_history": trim_drawn()}


def _retention_params(retention: Retention) -> dict[str, Any]:
    """The history bounds both claim functions take after the claims."""
    return {"keep_runs": retention.history_size, "keep_ms": retention.keep_ms,
            "ttl_ms": retention.history_ttl_ms}


def _result(req: ClaimRequest, row: Sequence[Any]) -> ClaimResult:
    """The answer to ``req`` from its row of the function's result."""
    outcome, attempt, lease, corrupt, stored = row
    if corrupt is not None:
        report_corrupt_lease(req.job, int(corrupt))
    if stored is not None and stored not in FINISHED_STATUSES and stored != "running":
        corrupt_records.report("table row", req.job, f"slot {req.slot} attempt {attempt}",
                               f"unknown status {stored!r}; the run is left alone")
    result = ClaimOutcome(outcome)
    return ClaimResult(result, int(attempt), req.token if result is ClaimOutcome.WON else None,
                       None if lease is None else int(lease))


#: The statements of :mod:`sqlstore` the update function is made of.
UPDATE_QUERIES = ("heartbeat", "finish", "release")
#: The fields of each call in the update function's JSON argument, with their SQL types.
_UPDATE_FIELDS = ("i INTEGER, kind TEXT, job TEXT, slot BIGINT, manual INTEGER, "
                  "attempt INTEGER, token TEXT, lease_ms BIGINT, status TEXT, error TEXT, "
                  "meta TEXT")


def update_function(name: str, q: Mapping[str, str]) -> str:
    """``CREATE FUNCTION pg_temp.<name>``: heartbeats, finishes and releases in a batch.

    Each item runs its own statement of ``q`` (rendered with ``v_`` names, as for
    :func:`claim_function`), in the order given; the function returns, per item, whether
    it took effect.
    """
    missing = [key for key in UPDATE_QUERIES if key not in q]
    if missing:
        raise ValueError(f"update function: missing statements {missing}")
    return f"""CREATE OR REPLACE FUNCTION pg_temp.{name}(p_updates JSON, v_handed_over TEXT)
RETURNS TABLE (o_i INTEGER, o_done BOOLEAN)
LANGUAGE plpgsql VOLATILE AS $anarchon$
DECLARE
    r RECORD;
    v_job TEXT; v_slot BIGINT; v_manual INTEGER; v_attempt INTEGER; v_token TEXT;
    v_lease_ms BIGINT; v_status TEXT; v_error TEXT; v_meta TEXT;
BEGIN
    FOR r IN SELECT * FROM json_to_recordset(p_updates) AS u({_UPDATE_FIELDS}) LOOP
        v_job := r.job; v_slot := r.slot; v_manual := r.manual;
        v_attempt := r.attempt; v_token := r.token;
        IF r.kind = 'heartbeat' THEN
            v_lease_ms := r.lease_ms;
            {q['heartbeat']};
        ELSIF r.kind = 'finish' THEN
            v_status := r.status; v_error := r.error; v_meta := r.meta;
            {q['finish']};
        ELSIF r.kind = 'release' THEN
            {q['release']};
        ELSE
            RAISE EXCEPTION 'unknown lease update %', r.kind;
        END IF;
        o_i := r.i; o_done := FOUND;
        RETURN NEXT;
    END LOOP;
END
$anarchon$"""


def update_call(name: str) -> str:
    """The statement that calls the update function (``%(name)s`` parameters)."""
    return (f"SELECT * FROM pg_temp.{name}(CAST(%(updates)s AS JSON), "
            "CAST(%(handed_over)s AS TEXT))")


def update_call_steps(updates: Sequence[Update]) -> Steps[list[bool]]:
    """Heartbeats, finishes and releases of distinct attempts as one call: one statement.

    In the order of their attempts (the order every transaction locks rows in); the
    answers come back in ``updates``' order. A finish to recheck is not for this path.
    """
    if len({u.attempt_key for u in updates}) != len(updates):
        raise ValueError("an update batch holds at most one call per attempt")
    if any(u.recheck for u in updates):
        raise ValueError("a finish to recheck reads its attempt first (update_batch_steps)")
    if not updates:
        return []
    order = sorted(range(len(updates)), key=lambda i: updates[i].attempt_key)
    calls = [{"i": i, "kind": u.query, "job": u.ref.job, "slot": u.ref.slot,
              "manual": int(u.ref.manual), "attempt": u.ref.attempt, "token": u.ref.token,
              "lease_ms": u.params.get("lease_ms"), "status": u.params.get("status"),
              "error": u.params.get("error"), "meta": u.params.get("meta")}
             for i, u in ((i, updates[i]) for i in order)]
    params = {"updates": json.dumps(calls), "handed_over": HANDED_OVER}
    [rows] = yield Last([Step("update_call", params)])
    done = {int(i): bool(ok) for i, ok in rows}
    if set(done) != set(range(len(updates))):
        raise RuntimeError(f"the update function answered {len(rows)} of {len(updates)} calls")
    return [done[i] for i in range(len(updates))]
