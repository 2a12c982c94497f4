"""The ``lease`` strategy's store operations: Lua scripts over the job's five tagged keys.

The claim script (``lua/lease_claim.lua``) applies the decision table of
:mod:`anarchon_core.decision` line for line, with the time read by ``TIME`` inside the
script, and trims old runs; heartbeat, finish and release share ``lua/lease_update.lua``.
State of a run (one field of ``{<prefix><job>}:state``, keyed ``<slot>`` or ``m<slot>``
for a manual run) is a small JSON object; so is each result.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from ...errors import StoreError
from ...models import ClaimOutcome, ClaimRequest, ClaimResult, Run, RunRef
from ...schedules import ms_to_datetime
from .clients import Commands, LuaScript
from .keys import LEASE_PARTS, Part, redis_key

__all__ = ["lease_claim", "lease_history", "lease_update", "run_id", "run_score"]

EXPIRED_READ = "lease expired: the runner is gone"


def run_id(slot: int, manual: bool) -> str:
    """The field of a run in the state hash: ``<slot>``, or ``m<slot>`` for a manual run."""
    return f"m{slot}" if manual else str(slot)


def run_score(slot: int, manual: bool) -> int:
    """The score of a run's results: one score per run (``slot * 2 + manual``)."""
    return slot * 2 + int(manual)


@lru_cache(maxsize=4096)
def _keys(prefix: str, job: str, *parts: Part) -> tuple[str, ...]:
    return tuple(redis_key(prefix, p, job, tagged=True) for p in parts)


async def lease_claim(conn: Commands, prefix: str, req: ClaimRequest) -> ClaimResult:
    """Run the claim script for ``req``."""
    numbers = (req.slot, int(req.manual), req.lease_ms, int(req.overlap), req.max_attempts,
               -1 if req.max_late_ms is None else req.max_late_ms, req.keep_ms,
               req.history_size, -1 if req.history_ttl_ms is None else req.history_ttl_ms)
    reply = await LuaScript.load("lease_claim").run(
        conn, _keys(prefix, req.job, *LEASE_PARTS),
        [req.token, req.runner, " ".join(map(str, numbers))],
    )
    try:
        outcome, attempt, lease = ClaimOutcome(reply[0]), int(reply[1]), reply[2]
    except (TypeError, ValueError, IndexError):
        raise StoreError(f"unexpected answer to the lease claim: {reply!r}") from None
    return ClaimResult(outcome, attempt, req.token if outcome is ClaimOutcome.WON else None,
                       int(lease) if lease not in ("", None) else None)


async def lease_update(conn: Commands, prefix: str, op: str, ref: RunRef,
                       *extra: str | int) -> bool:
    """Heartbeat, finish or release ``ref``; False when the caller is fenced."""
    reply = await LuaScript.load("lease_update").run(
        conn, _keys(prefix, ref.job, "state", "active", "results"),
        [op, run_id(ref.slot, ref.manual), str(ref.attempt), ref.token, *extra],
    )
    return int(reply) == 1


def _ms(value: Any) -> int | None:
    return int(value) if value not in (None, "") else None


def _run(job: str, slot: int, manual: bool, rec: dict[str, Any], *, status: str,
         error: str | None) -> Run:
    started, finished = _ms(rec.get("b")), _ms(rec.get("f"))
    return Run(
        job=job, slot=slot, attempt=int(rec["a"]), status=status, runner=str(rec.get("r", "")),
        started_at=ms_to_datetime(started) if started is not None else None,
        finished_at=ms_to_datetime(finished) if finished is not None else None,
        error=error, manual=manual,
    )


async def lease_history(conn: Commands, prefix: str, job: str, limit: int) -> list[Run]:
    """Attempts of the newest ``limit`` runs, newest first, cut to ``limit`` attempts."""
    reply = await LuaScript.load("lease_history").run(
        conn, _keys(prefix, job, "state", "slots", "results"), [limit])
    try:
        now = int(reply[0])
        runs: list[Run] = []
        for rid, slot_text, raw, results in reply[1:]:
            slot, manual = int(float(slot_text)), str(rid).startswith("m")
            attempts: dict[int, Run] = {}
            for text in results:
                rec = json.loads(text)
                attempts[int(rec["a"])] = _run(job, slot, manual, rec, status=rec["s"],
                                               error=rec.get("e"))
            if raw:
                st = json.loads(raw)
                if st["s"] == "running":
                    lease = _ms(st.get("l"))
                    expired = lease is not None and lease <= now
                    status = "interrupted" if expired else "running"
                    error = st.get("e") or (EXPIRED_READ if expired else None)
                    attempts[int(st["a"])] = _run(job, slot, manual, st, status=status, error=error)
                elif int(st["a"]) not in attempts:
                    attempts[int(st["a"])] = _run(job, slot, manual, st, status=st["s"],
                                                   error=st.get("e"))
            runs.extend(attempts.values())
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise StoreError(f"unreadable lease history for job {job!r}: {exc!r}") from None
    runs.sort(key=lambda r: (r.slot, r.manual, r.attempt), reverse=True)
    return runs[:limit]
