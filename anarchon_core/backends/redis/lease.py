"""The ``lease`` strategy's store operations: Lua scripts over the job's five tagged keys.

The claim script (``lua/lease_claim.lua``) applies the decision table of
:mod:`anarchon_core.decision` line for line, with the time read by ``TIME`` inside the
script, and trims old runs; heartbeat, finish and release share ``lua/lease_update.lua``.
State of a run (one field of ``{<prefix><job>}:state``, keyed ``<slot>`` or ``m<slot>``
for a manual run) is a small JSON object; so is each result.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from ...backend import Retention
from ...batching import rounds
from ...errors import StoreError
from ...models import (
    RUN_STATUSES,
    ClaimOutcome,
    ClaimRequest,
    ClaimResult,
    ExpiredRun,
    Run,
    RunRef,
)
from ...readmodel import dump_meta, load_meta, read_status
from ...records import MAX_COUNT, record_int, record_ms
from ...schedules import ms_to_datetime
from ..common import trim_drawn
from ..storeerrors import CorruptRecords
from .clients import Commands, LuaScript
from .keys import LEASE_PARTS, Part, redis_key

__all__ = ["claim_call", "lease_add_meta", "lease_claim", "lease_claim_many", "lease_expired",
           "lease_history", "lease_update", "run_id", "run_score"]

log = logging.getLogger("anarchon.redis")
#: Corrupt states and history entries are reported once each (then skipped quietly).
corrupt_records = CorruptRecords(log)
#: How many members of a job's active set one expired-runs scan looks at, at most.
EXPIRED_SCAN_BUDGET = 1_000
#: How often :func:`lease_add_meta` reads again when the meta changed under it.
ADD_META_TRIES = 5


def run_id(slot: int, manual: bool) -> str:
    """The field of a run in the state hash: ``<slot>``, or ``m<slot>`` for a manual run."""
    return f"m{slot}" if manual else str(slot)


def run_score(slot: int, manual: bool) -> int:
    """The score of a run's results: one score per run (``slot * 2 + manual``)."""
    return slot * 2 + int(manual)


@lru_cache(maxsize=1 << 16)
def _keys(prefix: str, job: str, *parts: Part) -> tuple[str, ...]:
    return tuple(redis_key(prefix, p, job, tagged=True) for p in parts)


#: A request's overlap policy as the claim script takes it (its ``overlap`` number).
OVERLAP_CODES = {"skip": "0", "allow": "1", "buffer_one": "2", "cancel_other": "3"}


def claim_call(prefix: str, req: ClaimRequest,
               retention: Retention) -> tuple[tuple[str, ...], list[str]]:
    """The keys and arguments of the claim script (``lua/lease_claim.lua``) for ``req``."""
    ttl = retention.history_ttl_ms
    late = req.max_late_ms
    numbers = (f"{req.slot} {req.manual:d} {req.lease_ms} {OVERLAP_CODES[req.policy]} "
               f"{req.max_attempts} {-1 if late is None else late} {retention.keep_ms} "
               f"{retention.history_size} {-1 if ttl is None else ttl} {trim_drawn():d}")
    args = [req.token, req.runner, numbers]
    if req.missed is not None:
        args.append(req.missed)
    return _keys(prefix, req.job, *LEASE_PARTS), args


_OUTCOMES = {outcome.value: outcome for outcome in ClaimOutcome}


def _claim_result(conn: Commands, prefix: str, req: ClaimRequest, reply: Any) -> ClaimResult:
    try:
        outcome, attempt, lease = _OUTCOMES[reply[0]], int(reply[1]), reply[2]
    except (TypeError, ValueError, IndexError, KeyError):
        raise StoreError(f"unexpected answer to the lease claim: {reply!r}") from None
    if len(reply) > 3 and reply[3]:
        _report_states(conn, prefix, req.job, reply[3])
    return ClaimResult(outcome, attempt, req.token if outcome is ClaimOutcome.WON else None,
                       int(lease) if lease not in ("", None) else None)


async def lease_claim(conn: Commands, prefix: str, req: ClaimRequest,
                      retention: Retention) -> ClaimResult:
    """Run the claim script for ``req``; trimming keeps the namespace's ``retention``."""
    reply = await LuaScript.load("lease_claim").run(conn, *claim_call(prefix, req, retention))
    return _claim_result(conn, prefix, req, reply)


async def lease_claim_many(conn: Commands, prefix: str, requests: Sequence[ClaimRequest],
                           retention: Retention) -> list[ClaimResult | BaseException]:
    """:func:`lease_claim` for each request, all sent at once; an error in place of a result.

    Requests of the same job are answered in their order (a later one goes in a later
    round): a client that cannot pipeline sends each round's calls concurrently.
    """
    script = LuaScript.load("lease_claim")
    calls = [claim_call(prefix, req, retention) for req in requests]
    replies: list[Any] = [None] * len(requests)
    for group in rounds(requests, key=lambda req: req.job):
        answers = await script.run_many(conn, [calls[i] for i in group])
        for i, reply in zip(group, answers, strict=True):
            replies[i] = reply
    out: list[ClaimResult | BaseException] = []
    for req, reply in zip(requests, replies, strict=True):
        if isinstance(reply, BaseException):
            out.append(reply)
            continue
        try:
            out.append(_claim_result(conn, prefix, req, reply))
        except StoreError as exc:
            out.append(exc)
    return out


async def lease_update(conn: Commands, prefix: str, op: str, ref: RunRef,
                       *extra: str | int) -> bool:
    """Heartbeat, finish or release ``ref``; False when the caller is fenced."""
    reply = await LuaScript.load("lease_update").run(
        conn, _keys(prefix, ref.job, "state", "active", "results"),
        [op, run_id(ref.slot, ref.manual), str(ref.attempt), ref.token, *extra],
    )
    return int(reply) == 1


async def lease_add_meta(conn: Commands, prefix: str, ref: RunRef,
                         meta: Mapping[str, str]) -> bool:
    """Merge ``meta`` into an ended attempt's stored meta; False when no ended attempt matches.

    ``lua/lease_add_meta.lua`` reads the attempt's meta, the merge is checked here as every
    meta is (:func:`~anarchon_core.readmodel.dump_meta`), and the script writes it only if
    the meta is still the one read (its results entry, and its state while current).
    """
    script = LuaScript.load("lease_add_meta")
    keys = _keys(prefix, ref.job, "state", "results")
    run = [run_id(ref.slot, ref.manual), str(ref.attempt), str(run_score(ref.slot, ref.manual))]
    for _ in range(ADD_META_TRIES):
        stored = await script.run(conn, keys, ["read", *run])
        if stored is None:
            return False
        merged = dump_meta({**load_meta(stored), **meta}) or ""
        if merged == stored:
            return True
        reply = await script.run(conn, keys, ["write", *run, stored, merged])
        if int(reply) >= 0:
            return int(reply) == 1
    raise StoreError(f"the meta of job {ref.job!r} slot {ref.slot} attempt {ref.attempt} "
                     f"changed {ADD_META_TRIES} times while adding to it")


def _report_states(conn: Commands, prefix: str, job: str, run_ids: list[str]) -> None:
    key = redis_key(prefix, "state", job, tagged=True)
    for rid in run_ids:
        corrupt_records.report(key, job, f"field {rid}",
                               "not a run state anarchon wrote; the run is left alone")


async def lease_expired(conn: Commands, prefix: str, job: str, limit: int) -> list[ExpiredRun]:
    """Runs of ``job`` still running whose lease expired, by the server's clock.

    One script over the job's ``active`` set and ``state`` hash (one hash slot); it looks
    at no more than :data:`EXPIRED_SCAN_BUDGET` members.
    """
    if limit <= 0:
        return []
    expired, corrupt = await LuaScript.load("lease_expired").run(
        conn, _keys(prefix, job, "state", "active"), [limit, EXPIRED_SCAN_BUDGET])
    if corrupt:
        _report_states(conn, prefix, job, corrupt)
    out = []
    for rid, attempt, lease in zip(expired[::3], expired[1::3], expired[2::3], strict=True):
        text = str(rid)
        manual = text.startswith("m")
        try:
            until = record_int(lease, "lease", -1, 2**63)
            out.append(ExpiredRun(job, record_ms(text[1:] if manual else text, "slot"),
                                  record_int(attempt, "attempt", 1, MAX_COUNT), manual,
                                  until if until >= 0 else None))
        except ValueError:
            _report_states(conn, prefix, job, [text])
    return out[:limit]


_UNREADABLE = (TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError)
_STATUSES = frozenset(RUN_STATUSES)


def _record(text: Any) -> dict[str, Any]:
    """A state or result record; ValueError if it is not one anarchon wrote."""
    rec = json.loads(text)
    if not isinstance(rec, dict) or rec.get("s") not in _STATUSES:
        raise ValueError("not a run record (unknown status or not a JSON object)")
    return rec


def _ms(value: Any) -> int | None:
    return record_ms(value, "time") if value not in (None, "") else None


def _run(job: str, slot: int, manual: bool, rec: dict[str, Any], *, status: str,
         error: str | None) -> Run:
    started, finished = _ms(rec.get("b")), _ms(rec.get("f"))
    return Run(
        job=job, slot=slot, attempt=record_int(rec["a"], "attempt", 1, MAX_COUNT),
        status=status, runner=str(rec.get("r", "")),
        started_at=ms_to_datetime(started) if started is not None else None,
        finished_at=ms_to_datetime(finished) if finished is not None else None,
        error=error, manual=manual, meta=load_meta(rec.get("m")),
    )


async def lease_history(conn: Commands, prefix: str, job: str, limit: int, *,
                        read_only: bool = False) -> list[Run]:
    """Attempts of the newest ``limit`` runs, newest first, cut to ``limit`` attempts."""
    reply = await LuaScript.load("lease_history").run(
        conn, _keys(prefix, job, "state", "slots", "results"), [limit], read_only=read_only)
    try:
        now = int(reply[0])
    except (TypeError, ValueError, IndexError) as exc:
        raise StoreError(f"unreadable lease history for job {job!r}: {exc!r}") from None
    runs: list[Run] = []
    # A record anarchon cannot read is reported once and skipped: one corrupt entry never
    # hides the rest of the history.
    for entry in reply[1:]:
        try:
            rid, slot_text, raw, results = entry
            slot, manual = record_ms(float(slot_text), "slot"), str(rid).startswith("m")
        except _UNREADABLE as exc:
            corrupt_records.report(redis_key(prefix, "slots", job, tagged=True), job,
                                   repr(entry), f"unreadable run: {exc!r}")
            continue
        attempts: dict[int, Run] = {}
        for text in results:
            try:
                rec = _record(text)
                attempts[int(rec["a"])] = _run(job, slot, manual, rec, status=rec["s"],
                                               error=rec.get("e"))
            except _UNREADABLE as exc:
                corrupt_records.report(redis_key(prefix, "results", job, tagged=True), job,
                                       str(text), f"unreadable result: {exc!r}")
        if raw:
            try:
                st = _record(raw)
                if st["s"] == "running":
                    status, error = read_status("running", st.get("e"), _ms(st.get("l")), now)
                    attempts[int(st["a"])] = _run(job, slot, manual, st, status=status,
                                                   error=error)
                elif int(st["a"]) not in attempts:
                    attempts[int(st["a"])] = _run(job, slot, manual, st, status=st["s"],
                                                   error=st.get("e"))
            except _UNREADABLE as exc:
                corrupt_records.report(redis_key(prefix, "state", job, tagged=True), job,
                                       str(raw), f"unreadable state of run {rid}: {exc!r}")
        runs.extend(attempts.values())
    runs.sort(key=lambda r: (r.slot, r.manual, r.attempt), reverse=True)
    return runs[:limit]
