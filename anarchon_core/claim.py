"""Holding a won claim: the lease, its heartbeats, self-fencing and the recorded end.

A :class:`ClaimHandle` is what :meth:`Scheduler.claim` returns for a slot this instance
won, and what the scheduler's own runs hold while their handler works. It is the one way
anarchon holds a lease:

* While the handle is held it heartbeats every ``heartbeat_ms``, also while its end is
  being recorded, until the store acknowledges that end.
* Every store call has a deadline. The lease is known to be held until ``lease_ms``
  after the *sending* of the last heartbeat the store accepted (the store computes the
  expiry from its clock when it receives the call, which is later). The handle fences
  itself a safety margin before that instant, whether or not a heartbeat call ever
  returns: it sets ``cancelled`` (reason ``lease lost``) and runs the cancel callbacks,
  so a backup can only start after this runner was told to stop.
* A rejected heartbeat or end record means another attempt took over: the handle is
  fenced and records nothing more.

Handles are bound to the event loop they were made on; :class:`SyncClaimHandle` is the
blocking twin for threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from .clocks import SYSTEM_CLOCK, Clock
from .errors import Cancelled, LeaseLost, StoreUnavailable
from .events import EventBus, EventKind, run_fields
from .health import StoreHealth
from .models import RunRef, validate_meta
from .schedules import ms_to_datetime
from .sharedtimers import EndDeadlines, KeeperStarts
from .transactional import TransactionEnd

if TYPE_CHECKING:
    from .backend import Backend

__all__ = [
    "LEASE_LOST", "STOPPING", "TIMEOUT", "ClaimHandle", "LeaseTimings", "SyncClaimHandle",
    "fence_margin_ms",
]

log = logging.getLogger("anarchon.lease")
T = TypeVar("T")

#: Cancellation reasons, as ``cancel_reason`` reports them.
TIMEOUT, STOPPING, LEASE_LOST = "timeout", "stopping", "lease lost"
#: Delays between tries of a store call that failed transiently.
RETRY_DELAYS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
#: How long recording a run's end is retried at least (lease runs: also 2 leases).
_CLAIM_ONLY_END_RETRY_S = 30.0
#: Lease runs retry their end record at least this often, to be first once the store is back.
_END_RETRY_MAX_S = 0.25
_EVENTS_LOCK = threading.Lock()
#: The shortest wait for one end-record call whose answer is late.
_END_CALL_S = 1.0


#: Why a handle fences itself when the store refuses its heartbeat.
REFUSED = ("heartbeat refused: another attempt took over, a later slot cancelled this "
           "run (overlap cancel_other), or it has ended")

@dataclass(frozen=True)
class LeaseTimings:
    """Lease length and heartbeat period, in ms."""

    lease_ms: int
    heartbeat_ms: int


def fence_margin_ms(lease_ms: int) -> int:
    """How long before the lease could expire a runner fences itself.

    A fifth of the lease, at least 50 ms and at most 5 s: room for clock-rate differences
    between this machine and the store, and for the handler to see its cancellation
    before any backup could claim the run.
    """
    return min(max(lease_ms // 5, 50), 5_000)


def retry_delay(tries: int) -> float:
    """The pause before try ``tries + 1`` of a store call that failed transiently."""
    return RETRY_DELAYS_S[min(tries, len(RETRY_DELAYS_S) - 1)]


class ClaimHandle:
    """A won attempt of one run: keeps its lease alive and records its end.

    Use it as ``async with handle:`` (leaving the block records ``success``, or
    ``failed`` with the exception) or end it with :meth:`finish`. Attributes: ``job``,
    ``slot``, ``attempt``, ``token``, ``manual``, ``runner``, ``cancel_event`` (a
    :class:`threading.Event`), ``cancelled``, ``cancel_reason``, ``fenced``, ``meta``
    (a dict recorded with the end). On a claim-only backend there is no lease: nothing is
    heartbeated and only the end is recorded.
    """

    def __init__(self, *, backend: Backend, ref: RunRef, runner: str,
                 timings: LeaseTimings | None, sent_at: float,
                 events: EventBus | None = None, health: StoreHealth | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.backend = backend
        #: The local clocks this handle reckons its lease on (the scheduler's).
        self.clock = clock
        self._events = events if events is not None else EventBus(runner)
        self._health = health if health is not None else StoreHealth(self._events,
                                                                     backend.describe())
        self.ref = ref
        self.runner = runner
        self.timings = timings if backend.supports_leases else None
        # Made when first asked for (most runs never are): see cancel_event.
        self._cancel_event: threading.Event | None = None
        self.cancel_reason: str | None = None
        #: Recorded with the attempt's end (``Run.meta``); ``finish(meta=...)`` adds to it.
        self.meta: dict[str, str] = {}
        self.fenced = False
        #: True once the store acknowledged the end (or the hand-over).
        self.ended = False
        #: ``(status, error)`` of an end recorded in the caller's transaction
        #: (:meth:`end_in_transaction`), else None.
        self.end_status: tuple[str, str | None] | None = None
        self.loop = asyncio.get_running_loop()
        self._callbacks: list[Callable[[str], None]] = []
        lease_s = self.timings.lease_ms / 1000 if self.timings else 0.0
        #: When the claim was sent (monotonic): the end's log line says how long since.
        self._sent_at = sent_at
        self._confirmed_until = sent_at + lease_s
        self._margin_s = fence_margin_ms(self.timings.lease_ms) / 1000 if self.timings else 0
        self._next_beat = sent_at + (self.timings.heartbeat_ms / 1000 if self.timings else 0)
        self._beat: asyncio.Task[None] | None = None
        self._beat_failures = 0
        #: What the keeper waits on now; set to wake it early (a heartbeat's answer, the end).
        self._wake: asyncio.Future[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._closing = False
        #: The store refused a heartbeat: see :meth:`release_refused`.
        self._refused = False
        #: An end record (finish/release) is on its way: a heartbeat refused meanwhile is
        #: the store seeing that end, not another attempt.
        self._ending = False
        #: The handles whose keeper starts with this one's (see sharedtimers); None once
        #: started or no longer wanted.
        self._keeper_start: set[Any] | None = None
        #: The task awaiting an end record's call, and whether its deadline cut it.
        self._end_task: asyncio.Task[Any] | None = None
        self._end_cut = False
        if self.timings is not None:
            # Most runs end before their first heartbeat is due: the keeper task starts
            # only then (and always before the fence deadline, which it watches).
            delay = max(0.0, min(self._next_beat, self._confirmed_until - self._margin_s)
                        - self.clock.monotonic())
            self._keeper_start = KeeperStarts.for_loop(self.loop).add(self, delay)

    # ------------------------------------------------------------------ identity

    @property
    def job(self) -> str:
        """The job's name."""
        return self.ref.job

    @property
    def slot(self) -> int:
        """The slot (ms since the epoch)."""
        return self.ref.slot

    @property
    def scheduled_at(self) -> datetime:
        """The slot as an aware UTC datetime."""
        return ms_to_datetime(self.ref.slot)

    @property
    def attempt(self) -> int:
        """1 for the first attempt; one more after each takeover (a fencing number)."""
        return self.ref.attempt

    @property
    def token(self) -> str:
        """The fencing token of this attempt."""
        return self.ref.token

    @property
    def manual(self) -> bool:
        """True for a ``run_now()`` run."""
        return self.ref.manual

    @property
    def cancel_event(self) -> threading.Event:
        """A :class:`threading.Event` set once the holder is asked to stop."""
        event = self._cancel_event
        if event is None:
            with _EVENTS_LOCK:  # one event, whichever thread asks first
                event = self._cancel_event
                if event is None:
                    event = self._cancel_event = threading.Event()
        if self.cancel_reason is not None:  # cancelled before the event was made
            event.set()
        return event

    @property
    def cancelled(self) -> bool:
        """True once the holder has been asked to stop (timeout, stop, lease lost)."""
        return self.cancel_reason is not None

    @property
    def lease_deadline(self) -> float | None:
        """Monotonic instant at which this handle fences itself (None: no lease)."""
        if self.timings is None:
            return None
        return self._confirmed_until - self._margin_s

    # ------------------------------------------------------------------ cancellation

    def fence_if_expired(self) -> bool:
        """Fence this handle now if its lease can no longer be confirmed in time.

        True if it is fenced (now or before). A claim whose answer took longer than the
        lease to arrive (a network partition, a paused process) is such a handle: a backup
        may already run the slot, so its holder must not start.
        """
        deadline = self.lease_deadline
        if not self.fenced and not self.ended and deadline is not None and \
                self.clock.monotonic() >= deadline:
            self._fence("the claim's answer came after its lease could be confirmed")
        return self.fenced

    def add_cancel_callback(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` on the handle's loop when it is cancelled."""
        self._callbacks.append(callback)
        if self.cancel_reason is not None:
            callback(self.cancel_reason)

    def remove_cancel_callback(self, callback: Callable[[str], None]) -> None:
        """Forget a callback given to :meth:`add_cancel_callback` (no error if unknown)."""
        if callback in self._callbacks:  # a short list; no exception machinery per run
            self._callbacks.remove(callback)

    def cancel(self, reason: str) -> None:
        """Ask the holder to stop (``timeout``, ``stopping``, ``lease lost``).

        The first reason wins, except a lost lease: it overrides ``stopping`` or
        ``timeout``, and the callbacks hear it too. Another attempt may run the slot now,
        so code still inside its stop grace must be cancelled at once.
        """
        current = self.cancel_reason
        if current is not None and (current == LEASE_LOST or reason != LEASE_LOST):
            return
        self.cancel_reason = reason
        event = self._cancel_event
        if event is not None:
            event.set()
        for callback in list(self._callbacks):
            try:
                callback(reason)
            except Exception:  # a callback's bug must not stop the others
                log.exception("%s: cancel callback failed", self._label())

    def raise_if_cancelled(self) -> None:
        """Raise :class:`Cancelled` (:class:`LeaseLost` if fenced) once cancelled."""
        if self.cancel_reason is not None:
            if self.cancel_reason == LEASE_LOST:
                raise LeaseLost(f"{self._label()}: another attempt took over or the lease "
                                "could not be confirmed in time")
            raise Cancelled(f"{self._label()}: cancelled ({self.cancel_reason})")

    def _fence(self, why: str) -> None:
        if self.fenced:
            return
        self.fenced = True
        self._closing = True
        log.warning("%s: fenced (%s); cancelling", self._label(), why, extra=self._fields())
        self.cancel(LEASE_LOST)
        self._emit(EventKind.FENCED, reason=why)
        self._wake_keeper()
        if self._beat is not None:
            self._beat.cancel()

    # ------------------------------------------------------------------ the lease

    async def _keep(self) -> None:
        assert self.timings is not None
        period = self.timings.heartbeat_ms / 1000
        loop = self.loop
        while not self._closing:
            now = self.clock.monotonic()
            deadline = self._confirmed_until - self._margin_s
            if now >= deadline and not self._ending:
                self._fence("lease not confirmed in time: the store may be unreachable")
                return
            if self._ending:
                # The code has returned; its end is being recorded. Nothing to cancel any
                # more: go on heartbeating, a confirmed one keeps backups away meanwhile.
                deadline = now + period
            if self._beat is None and now >= self._next_beat:
                self._beat = asyncio.ensure_future(self._heartbeat_once(period))
            wake_at = deadline if self._beat is not None else min(deadline, self._next_beat)
            # One future woken by a timer, a heartbeat's answer or the end: nothing is
            # cancelled, so no CancelledError ties the handle into a reference cycle.
            wake = self._wake = loop.create_future()
            timer = loop.call_later(max(0.0, wake_at - now), _set_done, wake)
            try:
                await wake
            finally:
                timer.cancel()
                self._wake = None

    async def _heartbeat_once(self, period: float) -> None:
        assert self.timings is not None
        sent = self.clock.monotonic()
        accepted: bool | None = None
        try:
            accepted = await self.backend.heartbeat(self.ref, self.timings.lease_ms)
        except StoreUnavailable as exc:
            self._beat_failures += 1
            self._health.failed("heartbeat", exc, sent)
            log.debug("%s: heartbeat failed (%s); lease confirmed for %.1fs more",
                      self._label(), exc, self._confirmed_until - self._margin_s - sent)
        except Exception:
            self._beat_failures += 1
            log.exception("%s: heartbeat raised an unexpected error", self._label())
        else:
            self._health.succeeded("heartbeat", sent)
        finally:
            self._beat = None
        if accepted:
            if self._beat_failures:
                log.debug("%s: heartbeat confirmed again", self._label())
            self._beat_failures = 0
            self._confirmed_until = max(self._confirmed_until, sent + self.timings.lease_ms / 1000)
            self._next_beat = sent + period
        elif accepted is False:
            if not self._closing and not self._ending:
                self._refused = True
                self._fence(REFUSED)
        else:
            # Try again soon: every confirmed heartbeat pushes the fence further away.
            self._next_beat = self.clock.monotonic() + min(period,
                                                           retry_delay(self._beat_failures))
        self._wake_keeper()

    async def check_lease(self) -> None:
        """Heartbeat now; raise :class:`LeaseLost` if another attempt has taken over.

        Call it right before a side effect that must not happen twice. Raises
        :class:`~anarchon_core.StoreUnavailable` when the store cannot confirm the lease
        in time (the side effect should not happen then either). On a claim-only backend
        it only raises if the holder was cancelled.
        """
        self.raise_if_cancelled()
        if self.timings is None:
            return
        sent = self.clock.monotonic()
        deadline = self.lease_deadline
        if deadline is not None and sent >= deadline and not self.ended:
            self._fence("lease not confirmed in time")
            self.raise_if_cancelled()
        try:
            accepted = await self._bounded(
                self.backend.heartbeat(self.ref, self.timings.lease_ms), "check_lease")
        except StoreUnavailable as exc:
            self._health.failed("heartbeat", exc, sent)
            raise
        self._health.succeeded("heartbeat", sent)
        if not accepted:
            if not self.ended:
                self._refused = True
                self._fence(REFUSED)
            self.raise_if_cancelled()
            raise LeaseLost(f"{self._label()}: the run has ended")
        self._confirmed_until = max(self._confirmed_until, sent + self.timings.lease_ms / 1000)
        self.raise_if_cancelled()

    acheck_lease = check_lease

    async def _bounded(self, call: Awaitable[T], what: str) -> T:
        """Await a store call, but never past the instant this handle fences itself.

        The call is awaited in the caller's task (no task of its own: every run records
        its end through here) and the task is cancelled past the deadline: by
        :func:`asyncio.timeout`, or for an end record by a timer shared with the runs
        ending around it (see :class:`~anarchon_core.sharedtimers.EndDeadlines`).
        anarchon's own connections time out on their own well within a lease, so a client
        that swallowed the cancellation still returns.
        """
        deadline = self.lease_deadline
        if deadline is None:
            return await call
        timeout = max(0.0, deadline - self.clock.monotonic())
        if self._ending and self.timings is not None:
            # Recording the end of code that has returned: late is still useful (the store
            # refuses it if another attempt took over), only a hung call is cut.
            timeout = max(timeout, self.timings.heartbeat_ms / 1000, _END_CALL_S)
            task = asyncio.current_task()
            assert task is not None
            before = task.cancelling()
            self._end_task, self._end_cut = task, False
            due = EndDeadlines.for_loop(self.loop).add(self, timeout)
            try:
                return await call
            except asyncio.CancelledError:
                if not self._end_cut or task.uncancel() > before:
                    raise
            finally:
                due.discard(self)
                self._end_task = None
            raise StoreUnavailable(f"{self._label()}: {what} got no answer in "
                                   f"{timeout:.1f}s")
        limit = asyncio.timeout(timeout)
        try:
            async with limit:
                return await call
        except TimeoutError:
            if not limit.expired():
                raise
        raise StoreUnavailable(f"{self._label()}: {what} got no answer before the lease "
                               "deadline")

    def _cut_end(self) -> None:
        """The end record's call got no answer in time (called by ``EndDeadlines``)."""
        task = self._end_task
        if task is not None and not self._end_cut:
            self._end_cut = True
            task.cancel()

    # ------------------------------------------------------------------ the end

    async def finish(self, status: str = "success", error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the attempt's end; ``False`` if this handle was fenced (nothing recorded).

        ``status`` is ``success``, ``failed``, ``interrupted`` or ``skipped`` (the slot was
        won but deliberately not run, e.g. its job is paused). Heartbeats go on until
        the store acknowledges the end; a transient store failure is retried while the
        lease is still ours. ``meta`` is merged into :attr:`meta` and stored with the run.
        """
        if status not in ("success", "failed", "interrupted", "skipped"):
            raise ValueError(f"invalid status {status!r}: expected 'success', 'failed', "
                             "'interrupted' or 'skipped'")
        if meta:
            self.meta.update(meta)
        record = validate_meta(self.meta)
        if self.fenced:
            return False
        if self.ended:
            raise RuntimeError(f"{self._label()}: its end was already recorded")
        return await self._end(self.backend.finish, (self.ref, status, error, record or None),
                               f"{status}{f' ({error})' if error else ''}",
                               outcome={"status": status, "error": error})

    async def release(self) -> bool:
        """Hand over: end the lease now so a backup takes the next attempt at once.

        Only once the holder's code has stopped. ``False`` if fenced; on a claim-only
        backend there is nothing to hand over and it returns ``False``.
        """
        if self.fenced or self.ended:
            return False
        if self.timings is None:
            self.ended = True
            return False
        # No heartbeat from here on: one answered after the release would hand the lease
        # back to a runner that is leaving (the store refuses it too: decision.update_applies).
        self._stop_keeping()
        return await self._end(self.backend.release, (self.ref,), "handed over", "release",
                               outcome={"status": "interrupted", "error": "handed over"})

    async def release_refused(self) -> bool:
        """After the store refused a heartbeat and the code has stopped: release, once.

        Only a run a later slot cancelled (overlap ``cancel_other``) still holds this
        token in the store: the release ends its lease, so that slot starts now instead of
        after the lease. For any other refusal the store refuses the release too. Best
        effort: a failure leaves the lease to expire on its own.
        """
        if not self._refused or self.ended or self.timings is None:
            return False
        self.ended = True
        try:
            async with asyncio.timeout(self.timings.heartbeat_ms / 1000):
                return await self.backend.release(self.ref)
        except (StoreUnavailable, TimeoutError) as exc:
            log.debug("%s: release after the refusal failed: %s", self._label(), exc)
            return False

    async def _end(self, send: Callable[..., Awaitable[bool]], args: tuple[Any, ...],
                   what: str, name: str = "finish",
                   outcome: Mapping[str, Any] | None = None) -> bool:
        # The code has returned, so a late end record is safe (the store refuses it once
        # another attempt took over) and worth it: while the store is unreachable nobody can
        # take over either, and the first record after it is back keeps the run from being
        # run again. Tries go on for a bounded time, quickly, heartbeats beside them.
        lease_s = self.timings.lease_ms / 1000 if self.timings else 0.0
        give_up = self.clock.monotonic() + max(_CLAIM_ONLY_END_RETRY_S, 2 * lease_s)
        tries = 0
        self._ending = True
        while True:
            sent = self.clock.monotonic()
            try:
                accepted = await self._bounded(send(*args), "recording the end")
                self._health.succeeded(name, sent)
                break
            except StoreUnavailable as exc:
                self._health.failed(name, exc, sent)
                tries += 1
                delay = min(retry_delay(tries), _END_RETRY_MAX_S) if self.timings \
                    else retry_delay(tries)
                if self.fenced or self.clock.monotonic() + delay > give_up:
                    log.error("%s: could not record its end (%s): %s", self._label(), what, exc,
                              extra=self._fields())
                    self._stop_keeping()
                    return False
                if tries == 1:
                    log.debug("%s: recording its end failed (%s); retrying", self._label(),
                              exc)
                await asyncio.sleep(delay)
            except BaseException:
                self._stop_keeping()
                raise
        if not accepted:
            if not self.fenced:
                self.fenced = True
                log.warning("%s: end rejected, another attempt took over", self._label(),
                            extra=self._fields())
                self._emit(EventKind.FENCED, reason="end rejected: another attempt took over")
            self._stop_keeping()
            return False
        self.ended = True
        self._stop_keeping()
        if log.isEnabledFor(logging.INFO):
            took = round((self.clock.monotonic() - self._sent_at) * 1000)
            log.info("%s: %s", self._label(), what,
                     extra={**self._fields(), **(outcome or {}), "duration_ms": took})
        if name == "release":
            self._emit(EventKind.HANDED_OVER)
        return True

    def end_in_transaction(self, status: str = "success", error: str | None = None,
                           meta: Mapping[str, str] | None = None) -> TransactionEnd:
        """Record this attempt's end in a transaction of the caller's own connection.

        For SQL stores whose database the caller also writes to: the returned
        :class:`~anarchon_core.transactional.TransactionEnd` carries the fenced statement
        to run last in that transaction, and is told how the transaction ended (see
        :mod:`anarchon_core.transactional`). Raises :class:`LeaseLost` if this handle is
        fenced already, and :class:`~anarchon_core.UnsupportedStrategyError` for a store
        that cannot (``Backend.finish_statement``). May be called from any thread.
        """
        if status not in ("success", "failed", "skipped"):
            raise ValueError(f"invalid status {status!r}: expected 'success', 'failed' or "
                             "'skipped'")
        if self.fenced or self.cancel_reason == LEASE_LOST:
            self.raise_if_cancelled()
            raise LeaseLost(f"{self._label()}: fenced")
        if self.ended:
            raise RuntimeError(f"{self._label()}: its end was already recorded")
        if meta:
            self.meta.update(meta)
        statement = self.backend.finish_statement(self.ref, status, error,
                                                  validate_meta(self.meta) or None)
        # From here a refused heartbeat is this end being seen, not another attempt.
        self._ending = True
        return TransactionEnd(self, statement, status, error)

    def _external_end_committed(self, status: str, error: str | None) -> None:
        self.ended = True
        self.end_status = (status, error)
        self._on_loop(self._external_end_done)

    def _external_end_done(self) -> None:
        self._stop_keeping()
        if log.isEnabledFor(logging.INFO):
            log.info("%s: %s (in the caller's transaction)", self._label(),
                     self.end_status[0] if self.end_status else "ended",
                     extra=self._fields())

    def _external_end_refused(self) -> None:
        self._on_loop(lambda: self._fence("end rejected: another attempt took over"))

    def _external_end_abandoned(self) -> None:
        self._ending = False
        self._on_loop(self._wake_keeper)

    def _on_loop(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the handle's loop: now if this is its thread, else soon."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            call()
        else:
            self.loop.call_soon_threadsafe(call)

    def _wake_keeper(self) -> None:
        if self._wake is not None:
            _set_done(self._wake)

    def _start_keeper(self) -> None:
        self._keeper_start = None
        if not self._closing:
            self._keeper = asyncio.ensure_future(self._keep())

    def _stop_keeping(self) -> None:
        self._closing = True
        if self._keeper_start is not None:
            self._keeper_start.discard(self)
            self._keeper_start = None
        self._wake_keeper()
        if self._beat is not None:
            self._beat.cancel()
            self._beat.add_done_callback(_consume)
        # The keeper, woken above, sees _closing and returns: not cancelled, so it leaves
        # no CancelledError (and no reference cycle through it) behind.

    def abandon(self) -> None:
        """Stop heartbeating without recording anything: the lease expires on its own."""
        self._stop_keeping()

    async def __aenter__(self) -> ClaimHandle:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.ended or self.fenced:
            self._stop_keeping()
            return
        if exc is None:
            await self.finish("success")
        elif isinstance(exc, LeaseLost):
            self._stop_keeping()
        elif isinstance(exc, (Cancelled, asyncio.CancelledError)):
            await asyncio.shield(self.finish("interrupted", "cancelled"))
        else:
            await self.finish("failed", f"{type(exc).__name__}: {exc}")

    def _label(self) -> str:
        return f"{self.ref.job} slot {self.ref.slot} attempt {self.ref.attempt}"

    def _fields(self) -> dict[str, Any]:
        return run_fields(self.ref.job, self.ref.slot, self.ref.attempt, self.runner)

    def _emit(self, kind: EventKind, **fields: Any) -> None:
        if self._events:
            ref = self.ref
            self._events.emit(kind, job=ref.job, slot=ref.slot, attempt=ref.attempt,
                              manual=ref.manual, **fields)

    def __repr__(self) -> str:
        state = "fenced" if self.fenced else "ended" if self.ended else "held"
        return f"<ClaimHandle {self._label()} {state}>"


class SyncClaimHandle:
    """The blocking twin of :class:`ClaimHandle`, for threads (``scheduler.sync.claim``).

    ``with scheduler.sync.claim("report", slot) as claim:`` — leaving the block records
    ``success`` (or ``failed`` with the exception). The lease is kept by the scheduler's
    event loop meanwhile, so a busy thread never delays a heartbeat.
    """

    def __init__(self, handle: ClaimHandle, timeout: float | None = 60.0) -> None:
        self.handle = handle
        self._timeout = timeout

    def _call(self, coro: Awaitable[T]) -> T:
        async def run() -> T:
            return await coro
        return asyncio.run_coroutine_threadsafe(run(), self.handle.loop).result(self._timeout)

    def __getattr__(self, name: str) -> Any:
        # job, slot, attempt, token, manual, cancel_event, cancelled, meta, fenced, ...
        return getattr(self.handle, name)

    def check_lease(self) -> None:
        """Blocking :meth:`ClaimHandle.check_lease`."""
        self._call(self.handle.check_lease())

    def raise_if_cancelled(self) -> None:
        """Raise :class:`Cancelled` (:class:`LeaseLost` if fenced) once cancelled."""
        self.handle.raise_if_cancelled()

    def finish(self, status: str = "success", error: str | None = None,
               meta: Mapping[str, str] | None = None) -> bool:
        """Blocking :meth:`ClaimHandle.finish`."""
        return self._call(self.handle.finish(status, error, meta))

    def release(self) -> bool:
        """Blocking :meth:`ClaimHandle.release`."""
        return self._call(self.handle.release())

    def __enter__(self) -> SyncClaimHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._call(self.handle.__aexit__(exc_type, exc, tb))

    def __repr__(self) -> str:
        return repr(self.handle).replace("<ClaimHandle", "<SyncClaimHandle", 1)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
