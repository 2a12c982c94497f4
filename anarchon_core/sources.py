"""Jobs defined outside the code: a source (a database table) kept in step with a scheduler.

A :class:`JobSource` says which records it holds and a revision of each (a value that
changes whenever the record does); :class:`SourceSync` asks it, every ``interval_s``, for
the records changed lately only, loads those, and tells its consumer which jobs to put and
which to drop. It never re-reads the whole source on a quiet poll: a full listing of
``(key, revision)`` pairs is made only when the count of records says a change was missed
(a record deleted), and as a safety net every ``full_every_s``.

The consumer is a :class:`~anarchon_core.Scheduler` (:meth:`Scheduler.add_source
<anarchon_core.Scheduler.add_source>`) or an adapter's own (a Celery beat's entries). A
record a source cannot turn into a job (a corrupt or hostile row) is a warning naming it,
and the other records go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .errors import ConfigError
from .schedules import Schedule
from .supervision import LoopGuard

if TYPE_CHECKING:
    from .execution import Handler
    from .scheduler import Scheduler

__all__ = ["JobSource", "SchedulerJobs", "SourceChanges", "SourceSync", "SourcedJob"]

log = logging.getLogger("anarchon.sources")

#: How often a source is polled by default (s): changes are live within about this.
DEFAULT_INTERVAL_S = 2.0
#: The safety-net full listing (s), whatever the counts say.
DEFAULT_FULL_EVERY_S = 300.0


@dataclass(frozen=True)
class SourcedJob:
    """One job as a source defines it: name, schedule, job options and what it runs.

    ``target`` is the source's own description of the work (a task path and its
    arguments...); the consumer turns it into a handler. ``starts_at_ms`` and
    ``ends_at_ms`` (epoch ms) bound the time the job is scheduled in: before the one and
    from the other on, the consumer does not have it.
    """

    key: str
    name: str
    revision: str
    schedule: Schedule
    options: Mapping[str, Any] = field(default_factory=dict)
    target: Any = None
    starts_at_ms: int | None = None
    ends_at_ms: int | None = None

    def active(self, now_ms: float) -> bool:
        """Whether the job is scheduled at ``now_ms``."""
        return ((self.starts_at_ms is None or now_ms >= self.starts_at_ms)
                and (self.ends_at_ms is None or now_ms < self.ends_at_ms))


@runtime_checkable
class JobSource(Protocol):
    """Where job definitions are kept. Its methods are blocking; they run in a thread.

    Keys are stable ids (a row's primary key, not its name: a renamed job is the same
    record). A key whose record is disabled is still listed, so that enabling it again
    changes its revision.
    """

    #: What the source is, for log lines ("the anarchon_django Schedule table").
    description: str

    def changed_since(self, since_ms: float | None) -> dict[str, str]:
        """``{key: revision}`` of the records changed at or after ``since_ms`` (all if None).

        A source whose writers may commit late includes a look-back of its own.
        """
        ...

    def count(self) -> int:
        """How many records the source holds (enabled or not)."""
        ...

    def load(self, keys: Collection[str]) -> list[SourcedJob | str]:
        """The enabled records of ``keys`` as jobs; a text naming each one that is not a job.

        A record that cannot be turned into a job gives a text saying which and why. Keys
        not in the answer are disabled or gone.
        """
        ...


@dataclass
class SourceChanges:
    """What one poll found: jobs to put (new or changed) and keys whose jobs go."""

    put: list[SourcedJob] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.put or self.dropped or self.problems)


class SourceSync:
    """Keeps a consumer in step with a :class:`JobSource`, polling only what changed.

    ``apply(changes)`` is called with every change found (on the event loop running
    :meth:`loop`); it must put and drop jobs without blocking. :attr:`definitions` is what
    the consumer holds now, by key. ``clock`` gives epoch ms (the store's clock where there
    is one), for the records' start and end times.
    """

    def __init__(self, source: JobSource, apply: Callable[[SourceChanges], None], *,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 full_every_s: float = DEFAULT_FULL_EVERY_S,
                 clock: Callable[[], float] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.source = source
        self.interval_s = interval_s
        self.full_every_s = full_every_s
        self._apply = apply
        self._clock = clock or (lambda: time.time() * 1000)
        #: Every record the source holds, by key: its revision as last read.
        self._revisions: dict[str, str] = {}
        #: The enabled, well-formed records, by key (active now or later).
        self.definitions: dict[str, SourcedJob] = {}
        #: Keys whose definition is held back by its time window (put when it opens).
        self._waiting: set[str] = set()
        self._since_ms: float | None = None
        self._last_full = float("-inf")
        #: How many polls read the full listing (for tests and the bench).
        self.full_listings = 0
        self.polls = 0

    def active_names(self) -> set[str]:
        """The names of the jobs the consumer has now."""
        return {d.name for k, d in self.definitions.items() if k not in self._waiting}

    def poll(self) -> SourceChanges:
        """One poll (blocking: call it from a thread). Returns what changed."""
        self.polls += 1
        started_ms = self._clock()
        full = self._since_ms is None or time.monotonic() - self._last_full >= self.full_every_s
        if full:
            listing = self.source.changed_since(None)
        else:
            listing = self.source.changed_since(self._since_ms)
        changed = {k: r for k, r in listing.items() if self._revisions.get(k) != r}
        gone: list[str] = []
        if full:
            gone = [k for k in self._revisions if k not in listing]
        elif self.source.count() != len(self._revisions.keys() | changed.keys()):
            # Something was deleted (or changed out of the look-back): list everything.
            listing = self.source.changed_since(None)
            full = True
            changed = {k: r for k, r in listing.items() if self._revisions.get(k) != r}
            gone = [k for k in self._revisions if k not in listing]
        if full:
            self._last_full = time.monotonic()
            self.full_listings += 1
        changes = SourceChanges()
        loaded: dict[str, SourcedJob] = {}
        if changed:
            for item in self.source.load(list(changed)):
                if isinstance(item, str):
                    changes.problems.append(item)
                else:
                    loaded[item.key] = item
        for key, revision in changed.items():
            self._revisions[key] = revision
            if key in loaded:
                self.definitions[key] = loaded[key]
                self._waiting.discard(key)
            elif key in self.definitions:
                del self.definitions[key]
                changes.dropped.append(key)
                self._waiting.discard(key)
        for key in gone:
            self._revisions.pop(key, None)
            if key in self.definitions:
                del self.definitions[key]
                changes.dropped.append(key)
            self._waiting.discard(key)
        changes.put.extend(loaded.values())
        self._windows(changes, started_ms)
        # A change committed while this poll ran is found by the next one.
        self._since_ms = started_ms
        return changes

    def _windows(self, changes: SourceChanges, now_ms: float) -> None:
        """Hold back definitions outside their time window; put those whose window opened."""
        fresh = {d.key for d in changes.put}
        put: list[SourcedJob] = []
        for definition in changes.put:
            if definition.active(now_ms):
                self._waiting.discard(definition.key)
                put.append(definition)
            else:  # not started yet, or over: the consumer must not have it
                self._waiting.add(definition.key)
                changes.dropped.append(definition.key)
        for key in list(self._waiting - fresh):
            waiting = self.definitions.get(key)
            if waiting is None:
                self._waiting.discard(key)
            elif waiting.active(now_ms):
                self._waiting.discard(key)
                put.append(waiting)
        for key, held in self.definitions.items():
            if key not in self._waiting and key not in fresh and held.ends_at_ms is not None \
                    and now_ms >= held.ends_at_ms:
                self._waiting.add(key)
                changes.dropped.append(key)
        changes.put = put

    def poll_now(self) -> SourceChanges:
        """:meth:`poll` and apply here, for a consumer that is not running.

        E.g. a web process whose scheduler never starts, before a "run now" of a sourced
        job. Blocking.
        """
        changes = self.poll()
        self._apply_found(changes)
        return changes

    async def poll_and_apply(self) -> SourceChanges:
        """:meth:`poll` in a thread, then ``apply`` here; problems logged as warnings."""
        changes = await asyncio.to_thread(self.poll)
        self._apply_found(changes)
        return changes

    def _apply_found(self, changes: SourceChanges) -> None:
        for problem in changes.problems:
            log.warning("%s: %s", self.source.description, problem)
        if changes.put or changes.dropped:
            self._apply(changes)
            put = [job.name for job in changes.put]
            log.info("%s: %d job(s) put%s, %d dropped", self.source.description, len(put),
                     f" ({', '.join(put[:5])}{', ...' if len(put) > 5 else ''})" if put
                     else "", len(changes.dropped))

    async def loop(self, guard: LoopGuard) -> None:
        """Poll every ``interval_s`` until cancelled; a failed poll is retried next time.

        The first poll is one interval in: the one before it is the caller's first load.
        """
        while True:
            await asyncio.sleep(self.interval_s)
            with guard.item(f"poll of {self.source.description}"):
                await self.poll_and_apply()



class SchedulerJobs:
    """What a scheduler's :class:`SourceSync` applies changes to: the scheduler's jobs.

    Made by :meth:`Scheduler.add_source <anarchon_core.Scheduler.add_source>`; it
    registers, replaces and removes jobs.

    ``handler_for(job)`` makes the handler of a sourced job. A sourced job whose name is
    taken by a job declared in code, or that the scheduler refuses (an option out of
    range), is a warning naming it; the code's job stays.
    """

    def __init__(self, scheduler: Scheduler, handler_for: Callable[[SourcedJob], Handler],
                 description: str) -> None:
        self._scheduler = scheduler
        self._description = description
        self._handler_for = handler_for
        #: The job name registered for each key of the source.
        self.names: dict[str, str] = {}

    def __call__(self, changes: SourceChanges) -> None:
        """Apply ``changes``: drop first (a rename frees its old name), then put."""
        for key in [*changes.dropped, *(job.key for job in changes.put)]:
            name = self.names.pop(key, None)
            if name is not None:
                self._scheduler.remove(name)
        for job in changes.put:
            if self._scheduler.has_job(job.name):
                log.warning("%s: job %r is not scheduled: a job of that name is declared "
                            "in code", self._description, job.name)
                continue
            try:
                handler = self._handler_for(job)
                self._scheduler.add(job.name, job.schedule, handler, **dict(job.options))
            except ConfigError as exc:
                log.warning("%s: job %r is not scheduled: %s", self._description,
                            job.name, exc)
                continue
            self.names[job.key] = job.name
