"""A scheduler's part in the fleet: its registry record and the paused jobs it honours.

See :mod:`anarchon_core.fleet` for the records. While a scheduler runs, :meth:`loop`
re-reads the paused jobs every couple of seconds and refreshes this instance's registry
record (and deletes the expired records of instances gone without leaving); :meth:`leave`
deletes the record on ``stop()``. With contender sets (:mod:`anarchon_core.contenders`)
the record is refreshed, and the registry read for the live members of this instance's
group, on every turn of the loop. On a store that keeps no control records (RabbitMQ, NATS)
the loop logs that once and ends: nothing is paused there. Reading the fleet view
(:meth:`status`) writes nothing.

A member knows of its scheduler only what :class:`FleetMember`'s arguments give it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .contenders import MEMBER_FRESH_MS
from .errors import (
    CorruptRecordError,
    ReadOnlyError,
    StoreError,
    StoreUnavailable,
    UnsupportedStrategyError,
)
from .fleet import (
    INSTANCE,
    JOBS,
    PAUSE_REFRESH_S,
    PAUSED,
    REGISTER_EVERY_S,
    REGISTER_TTL_MS,
    FleetStatus,
    InstanceInfo,
    PauseInfo,
    assemble,
    corrupt_records,
    encode_jobs,
    read_paused,
)

if TYPE_CHECKING:
    from .backend import Backend
    from .contenders import Contenders
    from .fleet import JobDefinition
    from .health import StoreHealth
    from .storeclock import StoreClock
    from .supervision import LoopGuard

__all__ = ["FleetMember"]

log = logging.getLogger("anarchon.fleet")
#: How often a member deletes expired instances' records (s).
SWEEP_EVERY_S = 6 * REGISTER_EVERY_S
#: How long stop() waits for the registry record to be deleted (s).
_LEAVE_TIMEOUT_S = 2.0


class FleetMember:
    """Keeps one scheduler's registry record and its view of the paused jobs.

    :param jobs_version: a number that changes whenever the scheduler's jobs do.
    :param job_definitions: the scheduler's jobs as the registry lists them.
    :param stopping: whether the scheduler is stopping (the loop ends).
    :param contenders: the view of this instance's group that the loop keeps fresh.
    :param group: the group this instance's record names (the jobs it fires).
    """

    def __init__(self, backend: Backend, instance_id: str, *, health: StoreHealth,
                 clock: StoreClock, jobs_version: Callable[[], int],
                 job_definitions: Callable[[], list[JobDefinition]],
                 stopping: Callable[[], bool], contenders: Contenders | None = None,
                 group: Callable[[], str] | None = None) -> None:
        self._backend = backend
        self._instance_id = instance_id
        self._health = health
        self._clock = clock
        self._jobs_version = jobs_version
        self._job_definitions = job_definitions
        self._stopping = stopping
        self._contenders = contenders if contenders is not None and contenders.enabled \
            else None
        self._group = group
        #: Jobs paused fleet-wide, as last read (refreshed every PAUSE_REFRESH_S).
        self.paused: dict[str, PauseInfo] = {}
        self._started_ms = 0
        self._written_jobs: int | None = None
        self._job_count = 0
        self._registered = False
        self._warned: set[str] = set()

    async def read_paused(self) -> dict[str, PauseInfo]:
        """The jobs paused fleet-wide, read now (and kept for the claims that follow)."""
        records = await self._backend.read_controls(PAUSED)
        self.paused = read_paused({name[len(PAUSED):]: text for name, text in records.items()})
        return dict(self.paused)

    async def loop(self, guard: LoopGuard) -> None:
        """Refresh the paused jobs and this instance's record until the scheduler stops.

        The two are separate items of the loop: one failing never stops the other.
        """
        if not self._started_ms:
            self._started_ms = round(self._clock.now_ms())
        monotonic = self._clock.clock.monotonic
        next_register = next_sweep = 0.0
        try:
            while not self._stopping():
                with guard.item("the paused jobs' refresh"):
                    if not await self._step("paused jobs", self.read_paused):
                        return
                if self._contenders is not None or monotonic() >= next_register:
                    with guard.item("the registry refresh"):
                        if not await self._step("fleet registry", self._register):
                            return
                        next_register = monotonic() + REGISTER_EVERY_S
                if self._contenders is not None:
                    with guard.item("the read of the fleet's live members"):
                        await self._step("fleet members", self._read_members)
                        self._contenders.check()
                if monotonic() >= next_sweep:
                    next_sweep = monotonic() + SWEEP_EVERY_S
                    with guard.item("the sweep of expired instance records"):
                        await self._step("expired instance records", self._sweep)
                await asyncio.sleep(PAUSE_REFRESH_S * random.uniform(0.8, 1.2))
        finally:
            if self._contenders is not None:
                self._contenders.forget()

    async def _step(self, what: str, step: Callable[[], Awaitable[object]]) -> bool:
        """Run one refresh; False when the store keeps no control records (the loop ends)."""
        health = self._health
        sent = self._clock.clock.monotonic()
        try:
            await step()
        except (UnsupportedStrategyError, ReadOnlyError) as exc:
            log.info("no fleet registry or pausing here: %s", exc)
            return False
        except StoreUnavailable as exc:
            health.failed("control", exc, sent)
        except StoreError as exc:  # e.g. a record the store refused: say it, go on
            if what not in self._warned:
                log.warning("%s not readable or writable: %s", what, exc)
                self._warned.add(what)
        else:
            health.succeeded("control", sent)
            self._warned.discard(what)
        return True

    async def _register(self) -> None:
        backend = self._backend
        instance_id = self._instance_id
        version = self._jobs_version()
        if self._written_jobs != version:
            # Thousands of jobs: their definitions are built only when the list changed.
            jobs = self._job_definitions()
            await backend.write_control(JOBS + instance_id, encode_jobs(jobs))
            self._written_jobs, self._job_count = version, len(jobs)
        now = round(self._clock.now_ms())
        group = self._group() if self._contenders is not None and self._group else None
        info = InstanceInfo(instance_id, _version(), self._started_ms, now,
                            now + REGISTER_TTL_MS, self._job_count, group)
        await backend.write_control(INSTANCE + instance_id, info.encode())
        self._registered = True

    async def _read_members(self) -> None:
        """Read the registry; give the contender sets the live members of this group.

        Live: the record names this instance's group and was refreshed within
        :data:`~anarchon_core.contenders.MEMBER_FRESH_MS` (a record claiming a refresh
        further ahead than that is not believed). An unreadable record is left out, with
        the fleet view's warning naming it (once per record and process).
        """
        contenders = self._contenders
        if contenders is None or self._group is None:
            return
        records = await self._backend.read_controls(INSTANCE)
        now = round(self._clock.now_ms())
        group = self._group()
        live = []
        for name, text in records.items():
            instance_id = name[len(INSTANCE):]
            try:
                info = InstanceInfo.decode(instance_id, text)
            except CorruptRecordError as exc:
                corrupt_records.report(f"control record {exc.key}", None, text, exc.detail)
                continue
            if info.group == group and info.expires_at_ms >= now and \
                    abs(info.seen_at_ms - now) <= MEMBER_FRESH_MS:
                live.append(instance_id)
        contenders.update(live)

    async def leave(self) -> None:
        """Delete this instance's records (bounded; an expired record is ignored anyway)."""
        self._started_ms = 0  # a later start() is a new "up since"
        if not self._registered:
            return
        self._registered = False
        instance_id = self._instance_id
        backend = self._backend
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(
                backend.write_control(INSTANCE + instance_id, None),
                backend.write_control(JOBS + instance_id, None)), _LEAVE_TIMEOUT_S)
        self._written_jobs = None

    async def status(self) -> FleetStatus:
        """Read the fleet view (expired records are left out; nothing is written)."""
        backend = self._backend
        instances, jobs, paused, last = await asyncio.gather(
            backend.read_controls(INSTANCE), backend.read_controls(JOBS),
            backend.read_controls(PAUSED), backend.job_names())
        view, _ = assemble(
            round(self._clock.now_ms()),
            {k[len(INSTANCE):]: v for k, v in instances.items()},
            {k[len(JOBS):]: v for k, v in jobs.items()},
            {k[len(PAUSED):]: v for k, v in paused.items()}, last)
        return view

    async def _sweep(self) -> None:
        """Delete the records of instances whose registry record expired (gone unannounced).

        Only expired ``instance:`` records and their ``jobs:`` records: a corrupt record may
        be a newer anarchon's, and a ``jobs:`` record alone may be an instance's first
        write, its ``instance:`` record on the way.
        """
        now = round(self._clock.now_ms())
        stale: list[str] = []
        for name, text in (await self._backend.read_controls(INSTANCE)).items():
            instance_id = name[len(INSTANCE):]
            try:
                info = InstanceInfo.decode(instance_id, text)
            except CorruptRecordError:
                continue  # reported by the readers of the fleet view
            if info.expires_at_ms < now and instance_id != self._instance_id:
                stale += [INSTANCE + instance_id, JOBS + instance_id]
        if stale:
            await asyncio.gather(*(self._backend.write_control(name, None) for name in stale))


def _version() -> str:
    from . import __version__  # noqa: PLC0415 - the package imports the scheduler first

    return __version__
