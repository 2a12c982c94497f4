"""The backend contract: how the core talks to a store.

A backend stores claims and, for lease backends, leases. The scheduler, the Celery beat
scheduler and the APScheduler executor all drive this same small interface, so it is
usable on its own, without the scheduler's timer loop::

    backend = SqliteBackend(path="cron.db")
    await backend.start()
    result = await backend.claim(ClaimRequest(job="sync", slot=slot, token=new_token(),
                                              runner="host:42", max_late_ms=60_000))
    if result.won:
        ...  # run it, heartbeat every lease_ms / 3, then:
        await backend.finish(RunRef("sync", slot, token, result.attempt), "success")

Rules every backend keeps:

* ``claim`` is atomic: for one ``(job, slot, manual)`` exactly one caller gets ``won``
  for each attempt. Lease backends apply the decision table of
  :mod:`anarchon_core.decision` exactly, with times from the store's own clock.
  Claim-only backends answer ``won`` to the first claim and ``taken`` to every other.
* ``heartbeat``, ``finish`` and ``release`` act only when ``ref.token`` is the current
  attempt's token and the run is still ``running``; they return ``False`` otherwise (the
  caller is fenced) and never raise for that.
* ``release`` ends the lease at once (hand-over): the attempt stays ``running`` with an
  expired lease, so the next claim of a backup takes over as attempt + 1.
* ``history`` returns one :class:`Run` per attempt, newest first (slot, then attempt,
  descending). An attempt still ``running`` whose lease has expired is reported
  ``interrupted``: its runner is gone even if no backup has taken over yet.
* A run's state is never trimmed while it is running, nor while a claim could still ask
  for it (``Backend.retention.keep_ms``); beyond that, history is kept to about
  ``retention.history_size`` runs per job and, when set, to ``retention.history_ttl_ms``.
* ``finish`` stores ``meta`` (checked by :func:`~anarchon_core.models.validate_meta`) with
  the attempt; ``history`` and ``runs`` return it as :attr:`Run.meta`.
* ``start`` creates what is missing (tables, streams), writes the format record if absent
  and raises :class:`StoreFormatError` when the store's format is newer than
  :data:`FORMAT_VERSION`. ``stop`` closes only what the backend opened itself.
* With ``read_only=True`` a backend creates nothing and writes nothing (no format record,
  no markers): ``start`` checks the store exists and its format, and ``claim``,
  ``heartbeat``, ``finish`` and ``release`` raise :class:`ReadOnlyError`. A namespace
  that was never set up is a :class:`StoreNotSetUp` naming the store (URL masked), the
  namespace looked for and the namespaces :meth:`Backend.namespaces` finds there.
"""

from __future__ import annotations

import abc
import asyncio
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .backends.common import refuse_write
from .errors import UnsupportedStrategyError
from .models import ClaimRequest, ClaimResult, ExpiredRun, HistoryQuery, Run, RunPage, RunRef

if TYPE_CHECKING:
    from .options import JobOptions
    from .transactional import SqlStatement

__all__ = ["FORMAT_VERSION", "MAX_NAMESPACES", "Backend", "ClaimOnlyBackend", "Retention",
           "new_token"]

#: Version of the data layout anarchon writes. A store with a larger number is refused.
FORMAT_VERSION = 1
#: Most namespaces :meth:`Backend.namespaces` returns.
MAX_NAMESPACES = 200


@dataclass(frozen=True)
class Retention:
    """How much history a namespace keeps: configuration of the store, not of each claim.

    ``history_size`` runs per job (about), runs older than ``history_ttl_ms`` when set, and
    never a run newer than ``keep_ms`` (a late claim or a catch-up could still ask for it).
    """

    history_size: int = 1000
    history_ttl_ms: int | None = None
    keep_ms: int = 0

    def merge(self, other: Retention) -> Retention:
        """The retention that satisfies both (several schedulers sharing one backend)."""
        ttl = (None if self.history_ttl_ms is None or other.history_ttl_ms is None
               else max(self.history_ttl_ms, other.history_ttl_ms))
        return Retention(max(self.history_size, other.history_size), ttl,
                         max(self.keep_ms, other.keep_ms))


def new_token() -> str:
    """Return a fresh random fencing token."""
    return secrets.token_hex(12)


class Backend(abc.ABC):
    """Base class of every store adapter (see the module docstring for the rules)."""

    #: Whether the store holds leases: backups, takeover, overlap, catch-up, hand-over.
    #: Read it on the instance (a Redis backend's strategy decides it).
    supports_leases: bool = True
    #: Opened with ``read_only=True``: reads history, writes nothing (every write raises
    #: :class:`~anarchon_core.errors.ReadOnlyError`).
    read_only: bool = False
    #: What the namespace keeps; set through :meth:`configure_retention`.
    retention: Retention = Retention()

    def configure_retention(self, retention: Retention) -> None:
        """Widen this namespace's retention to cover ``retention`` (schedulers call it)."""
        self.retention = self.retention.merge(retention) if "retention" in vars(self) \
            else retention

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Connect, create what is missing and check the store format."""

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Close the connections this backend opened (never a client the user passed)."""

    def tune_timeouts(self, lease_ms: int) -> None:  # noqa: B027 - optional hook
        """Fit the timeouts and keepalives of the connections this backend opens to a lease.

        Called by every scheduler that uses the backend, before :meth:`start`, with its
        ``lease_ms`` (the shortest wins). Socket, read and connect timeouts and keepalive
        probes of owned connections stay below it, so a dead connection is noticed while
        the lease could still be saved. A client the user passed in is left as it is.
        """

    def check_job(self, name: str, options: JobOptions) -> None:  # noqa: B027 - optional hook
        """Raise ConfigError if this backend cannot serve a job with these options."""

    @abc.abstractmethod
    async def clock_ms(self) -> int:
        """Return the store's clock in ms since the epoch (the clock leases use)."""

    @abc.abstractmethod
    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """Atomically claim ``(request.job, request.slot)``; see the module rules."""

    async def claim_many(self, requests: Sequence[ClaimRequest]
                         ) -> list[ClaimResult | BaseException]:
        """:meth:`claim` each request; in order, its result or the exception it raised.

        Exactly as many separate claims (each one atomic, the decision table per request);
        a store that can sends them together (the scheduler claims every slot due at one
        instant this way). Never raises for one request's failure.
        """
        return list(await asyncio.gather(*(self.claim(r) for r in requests),
                                          return_exceptions=True))

    @abc.abstractmethod
    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        """Extend the lease to store-now + ``lease_ms``; False if the caller is fenced."""

    @abc.abstractmethod
    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the attempt's end (``success``/``failed``/``interrupted``) and its meta."""

    @abc.abstractmethod
    async def release(self, ref: RunRef) -> bool:
        """End the lease now so a backup takes the next attempt (hand-over)."""

    @abc.abstractmethod
    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Return up to ``limit`` attempts of ``job``, newest first."""

    async def runs(self, query: HistoryQuery) -> RunPage:
        """One page of history across the namespace (or one job), newest first.

        Ordered by ``(slot, job, attempt)`` descending; ``query.before`` is the cursor of
        the previous page. Filters apply before the limit.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot page history yet")

    async def job_names(self) -> dict[str, Run | None]:
        """Every job the store holds runs of, by name, with its newest attempt."""
        raise NotImplementedError(f"{type(self).__name__} cannot list jobs yet")

    def finish_statement(self, ref: RunRef, status: str, error: str | None = None,
                         meta: Mapping[str, str] | None = None) -> SqlStatement:
        """:meth:`finish` as a statement for a transaction of the caller's own connection.

        Only for stores that keep runs in a database the caller can reach (PostgreSQL,
        SQLite): the statement records the end exactly as :meth:`finish` would, under the
        same conditions (``ref.token`` holds the running attempt), and changes one row when
        it does, none when the caller is fenced. The caller commits only on one row (see
        :mod:`anarchon_core.transactional`). Other stores raise
        :class:`UnsupportedStrategyError`.
        """
        raise UnsupportedStrategyError(
            f"{self.describe()} cannot record a run's end in another transaction: that "
            "needs a PostgreSQL or SQLite store in the database the caller writes to")

    async def add_meta(self, ref: RunRef, meta: Mapping[str, str]) -> bool:
        """Merge ``meta`` into the stored meta of an ended attempt (``ref.token`` unused).

        For facts that arrive after the run ended (the outcome of a task it enqueued).
        False when no ended attempt matches. The merged meta is checked as any run's meta
        is (:func:`~anarchon_core.models.validate_meta`). Every lease store can (PostgreSQL,
        SQLite, Redis and Valkey with the ``lease`` strategy, :class:`MemoryBackend
        <anarchon_core.testing.MemoryBackend>`); claim-only stores, which keep each run's
        result as first written, raise :class:`UnsupportedStrategyError`.
        """
        raise UnsupportedStrategyError(
            f"{self.describe()} cannot add meta to an ended run: it keeps each run's result "
            "as first written (the lease stores can: PostgreSQL, SQLite, Redis or Valkey "
            "with strategy 'lease')")

    async def namespaces(self) -> list[str] | None:
        """The namespaces of this store that hold an anarchon store, sorted; reads only.

        Each as the backend's namespace option takes it (a ``table``, a ``prefix``), found
        by its format record; a bounded listing (at most :data:`MAX_NAMESPACES`, a few
        cheap reads). ``None`` when the store cannot list them cheaply. A read-only
        ``start`` that finds no store names them in its :class:`StoreNotSetUp`.
        """
        return None

    async def newest_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """The newest scheduled (not manual) slot each job has a record of (None: none).

        The scheduler reads it on start to account for slots due while every instance was
        down. The default reads each job's history; SQL stores answer in one round trip.
        """
        async def newest(job: str) -> int | None:
            runs = await self.history(job, 1)
            if runs and runs[0].manual:
                runs = [r for r in await self.history(job, 50) if not r.manual]
            return runs[0].slot if runs else None

        found = await asyncio.gather(*(newest(job) for job in jobs))
        return dict(zip(jobs, found, strict=True))

    async def slot_states(self, slots: Sequence[tuple[str, int]]
                          ) -> dict[tuple[str, int], str] | None:
        """The status of the newest attempt of each scheduled ``(job, slot)`` on record.

        A read that writes nothing, made by a later contender of a slot (see
        :mod:`anarchon_core.contenders`) to learn whether it was claimed: slots without a
        record, or whose record is not readable, are left out (the claim that follows
        decides, and reports a corrupt record). ``None``: this store cannot tell cheaply,
        so the caller claims instead. Lease stores answer in one round trip.
        """
        return None

    async def expired_runs(self, job: str, limit: int = 100) -> list[ExpiredRun]:
        """Runs of ``job`` still ``running`` whose lease expired (by the store's clock).

        The scheduler claims them (the decision table takes them over or gives them up),
        so a run whose watchers are all gone is recovered. Claim-only stores have none.
        """
        return []

    async def write_control(self, name: str, value: str | None) -> None:
        """Set the namespace's control record ``name`` to ``value`` (``None`` deletes it).

        Control records are small texts every instance of the namespace shares: paused
        jobs (``paused:<job>``) and the fleet registry (``instance:<id>``, ``jobs:<id>``).
        The last write wins; expiry is the reader's business (records carry their own).
        A store that cannot keep them raises :class:`UnsupportedStrategyError`.
        """
        raise UnsupportedStrategyError(self._no_controls())

    async def read_controls(self, prefix: str) -> dict[str, str]:
        """Every control record whose name starts with ``prefix``, by name."""
        raise UnsupportedStrategyError(self._no_controls())

    def _no_controls(self) -> str:
        return (f"{self.describe()} keeps no shared control records: pausing jobs and the "
                "fleet view need Redis/Valkey, PostgreSQL or SQLite")

    def describe(self) -> str:
        """A one-line description safe to log (no secrets)."""
        return type(self).__name__

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


class ClaimOnlyBackend(Backend):
    """A store that only decides who runs a slot: no leases, no backups, no overlap."""

    supports_leases: bool = False

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        """Nothing to extend: a claim-only run can never be taken over."""
        refuse_write(self, "heartbeat")
        return True

    async def release(self, ref: RunRef) -> bool:
        """Nothing to hand over: claim-only runs have no lease."""
        refuse_write(self, "release")
        return False
