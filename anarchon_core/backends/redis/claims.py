"""The claim-only strategies' store operations: ``stream-id``, ``idmp`` and ``script``.

Keys (no hash tag: every script touches one key): ``<prefix><job>:runs`` (stream, one
entry per claimed run, fields ``slot token runner [at]``), ``<prefix><job>:manual``
(stream, one entry per ``run_now``), ``<prefix><job>:results`` (sorted set scored
``slot * 2 + manual``, one JSON result per run).
"""

from __future__ import annotations

import json
from typing import Any

from ...decision import late_error, not_run
from ...errors import StoreError
from ...models import FINISHED_STATUSES, ClaimOutcome, ClaimRequest, ClaimResult, Run, RunRef
from ...readmodel import load_meta
from ...records import record_map, record_ms, record_text
from ...schedules import ms_to_datetime
from .clients import Commands, LuaScript
from .keys import redis_key
from .lease import corrupt_records, run_score
from .strategies import Idmp, Script, Strategy, StreamId

__all__ = ["IdmpState", "claim_only", "claim_only_finish", "claim_only_history"]


class IdmpState:
    """Which job streams this backend has configured for IDMP (once per job and process)."""

    def __init__(self) -> None:
        self.configured: set[str] = set()


#: How far before a slot's time the search for its claim entry starts (clock skew margin).
_CLAIM_SEARCH_MS = 300_000
_CLAIM_SEARCH_COUNT = 5_000


def _answer(req: ClaimRequest, code: int) -> ClaimResult:
    if code == 1:
        return ClaimResult(ClaimOutcome.WON, 1, req.token)
    if code == 2:
        return ClaimResult(ClaimOutcome.LATE, 1)
    return ClaimResult(ClaimOutcome.TAKEN, 1)


async def claim_only(conn: Commands, prefix: str, strategy: Strategy, req: ClaimRequest, *,
                     idmp: IdmpState, history_size: int) -> ClaimResult:
    """Claim ``req`` with ``strategy``: won for the first claim of a run, taken after.

    A first claim later than ``max_late_ms`` after the slot (by the server's clock) is
    recorded, so later claims lose too, and answered ``late`` with a ``skipped`` result.
    Streams and results keep about ``history_size`` runs.
    """
    # A missed request is "late" at once: it wins only a run nobody claimed, and records it.
    max_late = 0 if req.missed is not None else -1 if req.max_late_ms is None \
        else req.max_late_ms
    if req.manual:
        key = redis_key(prefix, "manual", req.job)
        reply = await LuaScript.load("manual_claim").run(
            conn, [key], [req.slot, req.token, req.runner, history_size])
        return _answer(req, int(reply))
    key = redis_key(prefix, "runs", req.job)
    if isinstance(strategy, StreamId):
        code, now = await LuaScript.load("stream_id_claim").run(
            conn, [key], [req.slot, req.token, req.runner, history_size, max_late])
    elif isinstance(strategy, Script):
        code, now = await LuaScript.load("script_claim").run(
            conn, [key], [req.slot, req.token, req.runner, strategy.window_ms,
                          history_size, max_late])
    elif isinstance(strategy, Idmp):
        code, now = await _idmp_claim(conn, key, strategy, req, idmp=idmp,
                                      history_size=history_size)
    else:
        raise StoreError(f"strategy {strategy.name!r} does not claim without leases")
    if int(code) == 2:
        status, error = not_run(req, int(now)) or ("skipped", late_error(req, int(now)))
        await claim_only_finish(conn, prefix, RunRef(req.job, req.slot, req.token),
                                status=status, error=error,
                                history_size=history_size, check_owner=False)
    return _answer(req, int(code))


async def _idmp_claim(conn: Commands, key: str, strategy: Idmp, req: ClaimRequest, *,
                      idmp: IdmpState, history_size: int) -> tuple[int, int]:
    if key not in idmp.configured:
        await LuaScript.load("idmp_config").run(
            conn, [key], [strategy.duration_sec, strategy.max_size])
        idmp.configured.add(key)
    # Redis 8.6: the first XADD for (producer, idempotent id) stores its entry; repeats
    # answer that entry's id without adding. Producer = the job, idempotent id = the slot.
    entry_id = await conn.call("XADD", key, "IDMP", req.job, str(req.slot), "*",
                               "slot", str(req.slot), "token", req.token,
                               "runner", req.runner)
    if not isinstance(entry_id, str):
        raise StoreError(f"unexpected answer to XADD ... IDMP: {entry_id!r}")
    token, now = await LuaScript.load("idmp_read").run(
        conn, [key], [entry_id, history_size])
    if token != req.token:
        return 0, int(now)
    return (2 if not_run(req, int(now)) else 1), int(now)


async def claim_only_finish(conn: Commands, prefix: str, ref: RunRef, *, status: str,
                            error: str | None, history_size: int, meta: str | None = None,
                            check_owner: bool = True) -> bool:
    """Record the run's one result; False if it has one already or ``ref`` lost the claim."""
    if check_owner:
        stream = redis_key(prefix, "manual" if ref.manual else "runs", ref.job)
        start = max(0, ref.slot - _CLAIM_SEARCH_MS)
        owner = await LuaScript.load("claim_token").run(
            conn, [stream], [ref.slot, start, _CLAIM_SEARCH_COUNT])
        if owner != ref.token:
            return False
    reply = await LuaScript.load("claim_result").run(
        conn, [redis_key(prefix, "results", ref.job)],
        [run_score(ref.slot, ref.manual), ref.token, status, error or "", history_size,
         meta or ""])
    return int(reply) == 1


_UNREADABLE = (TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError)
_RESULT_STATUSES = FINISHED_STATUSES
#: The longest runner or error text a record may hold.
_MAX_TEXT = 1_000_000


def _entries(job: str, key: str, reply: Any, manual: bool) -> list[dict[str, Any]]:
    """Claim entries of a stream; an entry anarchon cannot read is reported and skipped."""
    out = []
    for entry in reply:
        try:
            entry_id, flat = entry
            fields = dict(zip(flat[::2], flat[1::2], strict=False))
            at = fields.get("at") or str(entry_id).split("-", 1)[0]
            claim = {"slot": record_ms(fields["slot"], "slot"), "manual": manual,
                     "runner": record_text(fields.get("runner", ""), "runner",
                                           limit=_MAX_TEXT),
                     "at": record_ms(at, "at", lo=0)}
        except _UNREADABLE as exc:
            corrupt_records.report(key, job, repr(entry), f"unreadable claim entry: {exc!r}")
            continue
        out.append(claim)
    return out


def _result(job: str, key: str, text: Any) -> dict[str, Any]:
    """A run's result record, or {} (still running) if there is none or it is unreadable."""
    if not text:
        return {}
    try:
        result = record_map(json.loads(text), "result")
        if result.get("s") not in _RESULT_STATUSES:
            raise ValueError(f"unknown status {str(result.get('s'))[:40]!r}")
        return {
            "s": result["s"],
            "f": None if result.get("f") in (None, "") else record_ms(result["f"], "f", lo=0),
            "e": None if result.get("e") is None else record_text(result["e"], "e",
                                                                   limit=_MAX_TEXT),
            "m": result.get("m"),
        }
    except _UNREADABLE as exc:
        corrupt_records.report(key, job, str(text), f"unreadable result: {exc!r}")
        return {}


async def claim_only_history(conn: Commands, prefix: str, job: str, limit: int, *,
                             read_only: bool = False) -> list[Run]:
    """Claimed runs of ``job`` (scheduled and manual), newest slot first, with results."""
    read = LuaScript.load("read_stream")
    runs_key, manual_key = redis_key(prefix, "runs", job), redis_key(prefix, "manual", job)
    claims = _entries(job, runs_key, await read.run(conn, [runs_key], [limit],
                                                    read_only=read_only), False)
    claims += _entries(job, manual_key, await read.run(conn, [manual_key], [limit],
                                                       read_only=read_only), True)
    claims.sort(key=lambda c: (c["slot"], c["manual"]), reverse=True)
    claims = claims[:limit]
    if not claims:
        return []
    results = await LuaScript.load("read_results").run(
        conn, [redis_key(prefix, "results", job)],
        [run_score(c["slot"], c["manual"]) for c in claims], read_only=read_only)
    runs = []
    results_key = redis_key(prefix, "results", job)
    for claim, text in zip(claims, results, strict=True):
        result = _result(job, results_key, text)
        finished = result.get("f")
        runs.append(Run(
            job=job, slot=claim["slot"], attempt=1, status=result.get("s", "running"),
            runner=claim["runner"], started_at=ms_to_datetime(claim["at"]),
            finished_at=ms_to_datetime(finished) if finished is not None else None,
            error=result.get("e"), manual=claim["manual"], meta=load_meta(result.get("m")),
        ))
    return runs
