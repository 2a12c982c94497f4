"""The two ways a Redis namespace stores runs, as strategy objects the backend delegates to.

:class:`RedisBackend <anarchon_core.backends.redis.RedisBackend>` holds one of them,
chosen by its strategy: :class:`LeaseStore` for ``lease`` (leases, backups, takeover) and
:class:`ClaimOnlyStore` for ``stream-id``, ``idmp`` and ``script`` (one winner per run).
The backend keeps what both share (connection, server checks, format record, read-only
mode, the jobs registry); a store only knows its keys and scripts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from ...backend import Retention
from ...decision import HANDED_OVER
from ...models import ClaimRequest, ClaimResult, ExpiredRun, Run, RunRef
from .claims import IdmpState, claim_only, claim_only_finish, claim_only_history
from .clients import Commands
from .lease import (
    lease_add_meta,
    lease_claim,
    lease_claim_many,
    lease_expired,
    lease_history,
    lease_update,
    run_score,
)
from .strategies import Strategy

__all__ = ["ClaimOnlyStore", "LeaseStore", "RedisStore", "store_for"]


class RedisStore:
    """What a strategy does with the store: claims, lease upkeep, ends and history."""

    #: Whether this way of storing holds leases (the backend's ``supports_leases``).
    leases: bool = False

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy

    async def claim(self, conn: Commands, prefix: str, request: ClaimRequest,
                    retention: Retention) -> ClaimResult:
        """Claim ``request``; trimming keeps ``retention``."""
        raise NotImplementedError

    async def claim_many(self, conn: Commands, prefix: str, requests: Sequence[ClaimRequest],
                         retention: Retention) -> list[ClaimResult | BaseException]:
        """Claim each request (sent concurrently); an error in place of a failed one's result."""
        return list(await asyncio.gather(*(self.claim(conn, prefix, r, retention)
                                           for r in requests), return_exceptions=True))

    async def heartbeat(self, conn: Commands, prefix: str, ref: RunRef, lease_ms: int) -> bool:
        """Extend the lease of ``ref`` (claim-only: nothing to extend)."""
        return True

    async def finish(self, conn: Commands, prefix: str, ref: RunRef, *, status: str,
                     error: str | None, meta: str | None, retention: Retention) -> bool:
        """Record the end of ``ref`` with its meta (JSON text or None)."""
        raise NotImplementedError

    async def release(self, conn: Commands, prefix: str, ref: RunRef) -> bool:
        """End the lease of ``ref`` now (claim-only: nothing to hand over)."""
        return False

    async def history(self, conn: Commands, prefix: str, job: str, limit: int, *,
                      read_only: bool) -> list[Run]:
        """Attempts of ``job``, newest first."""
        raise NotImplementedError

    async def expired_runs(self, conn: Commands, prefix: str, job: str,
                           limit: int) -> list[ExpiredRun]:
        """Running attempts whose lease expired (claim-only: none)."""
        return []


class LeaseStore(RedisStore):
    """The ``lease`` strategy: the decision table in Lua over the job's five tagged keys."""

    leases = True

    # The single calls hand back the script's coroutine itself (no coroutine of their
    # own): thousands of runs at one instant each make them.

    def claim(self, conn: Commands, prefix: str, request: ClaimRequest,
              retention: Retention) -> Coroutine[Any, Any, ClaimResult]:
        """Apply the lease decision table in one script (``lua/lease_claim.lua``)."""
        return lease_claim(conn, prefix, request, retention)

    async def claim_many(self, conn: Commands, prefix: str, requests: Sequence[ClaimRequest],
                         retention: Retention) -> list[ClaimResult | BaseException]:
        """Every claim script sent at once (pipelined on a client that can)."""
        return await lease_claim_many(conn, prefix, requests, retention)

    def heartbeat(self, conn: Commands, prefix: str, ref: RunRef,
                  lease_ms: int) -> Coroutine[Any, Any, bool]:
        """Extend the lease to server-now + ``lease_ms`` if ``ref`` is the current attempt."""
        return lease_update(conn, prefix, "heartbeat", ref, lease_ms)

    def finish(self, conn: Commands, prefix: str, ref: RunRef, *, status: str,
               error: str | None, meta: str | None,
               retention: Retention) -> Coroutine[Any, Any, bool]:
        """Record the attempt's end if ``ref`` is the current, running attempt."""
        return lease_update(conn, prefix, "finish", ref, run_score(ref.slot, ref.manual),
                            status, error or "", meta or "")

    def release(self, conn: Commands, prefix: str, ref: RunRef) -> Coroutine[Any, Any, bool]:
        """End the lease now so a backup takes the next attempt at once."""
        return lease_update(conn, prefix, "release", ref, HANDED_OVER)

    async def history(self, conn: Commands, prefix: str, job: str, limit: int, *,
                      read_only: bool) -> list[Run]:
        """Attempts of the newest runs; an expired running attempt reads interrupted."""
        return await lease_history(conn, prefix, job, limit, read_only=read_only)

    async def expired_runs(self, conn: Commands, prefix: str, job: str,
                           limit: int) -> list[ExpiredRun]:
        """Runs of ``job`` still running whose lease expired (one script, one hash slot)."""
        return await lease_expired(conn, prefix, job, limit)

    async def add_meta(self, conn: Commands, prefix: str, ref: RunRef,
                       meta: Mapping[str, str]) -> bool:
        """Merge ``meta`` into an ended attempt's meta (``lua/lease_add_meta.lua``)."""
        return await lease_add_meta(conn, prefix, ref, meta)


class ClaimOnlyStore(RedisStore):
    """``stream-id``, ``idmp`` and ``script``: the first claim of a run wins, no leases."""

    leases = False

    def __init__(self, strategy: Strategy) -> None:
        super().__init__(strategy)
        self._idmp = IdmpState()

    async def claim(self, conn: Commands, prefix: str, request: ClaimRequest,
                    retention: Retention) -> ClaimResult:
        """``won`` for the first claim of a run, ``taken`` for every other."""
        return await claim_only(conn, prefix, self.strategy, request, idmp=self._idmp,
                                history_size=retention.history_size)

    async def finish(self, conn: Commands, prefix: str, ref: RunRef, *, status: str,
                     error: str | None, meta: str | None, retention: Retention) -> bool:
        """Record the run's one result; False if it already has one."""
        return await claim_only_finish(conn, prefix, ref, status=status, error=error,
                                       history_size=retention.history_size, meta=meta)

    async def history(self, conn: Commands, prefix: str, job: str, limit: int, *,
                      read_only: bool) -> list[Run]:
        """Claimed runs of ``job`` with their results, newest first (one attempt each)."""
        return await claim_only_history(conn, prefix, job, limit, read_only=read_only)


def store_for(strategy: Strategy) -> RedisStore:
    """The store object of ``strategy``."""
    return LeaseStore(strategy) if strategy.leases else ClaimOnlyStore(strategy)
