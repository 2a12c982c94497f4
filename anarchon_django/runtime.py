"""The project's scheduler: built from the settings on first use, started and stopped.

Nothing here runs at import time. :func:`get_scheduler` builds the scheduler once the app
registry is ready (after ``AppConfig.ready()`` has imported every ``jobs.py``); before
that it raises :class:`~django.core.exceptions.AppRegistryNotReady` saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core.exceptions import AppRegistryNotReady, ImproperlyConfigured
from django.db import close_old_connections

from anarchon_core import ConfigError, JobContext, Scheduler

from . import conf, dbschedules, registry, tasks

__all__ = [
    "astart", "astop", "build_scheduler", "get_reader", "get_scheduler", "load_schedule",
    "load_schedules",
    "register_job",
    "requested_by", "reset", "start", "stop", "wrap_handler",
]

log = logging.getLogger("anarchon.django")

_lock = threading.RLock()
_scheduler: Scheduler | None = None
_reader: Scheduler | None = None
_ready = False
#: The names :func:`load_schedule` registered on the process's scheduler.
_row_jobs: set[str] = set()
#: Who asked for a manual run (recorded as ``meta["requested_by"]``).
_requested_by: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "anarchon_django_requested_by", default=None)


def mark_ready() -> None:
    """Called by ``AppConfig.ready()`` once every ``jobs.py`` is imported."""
    global _ready  # noqa: PLW0603 - one flag per process, like the app registry's
    _ready = True
    registry.add_listener(_on_declared)


def _check_ready() -> None:
    if not apps.is_installed("anarchon_django"):
        raise ImproperlyConfigured(
            "anarchon_django is not in INSTALLED_APPS: add it to use the project's scheduler")
    if not _ready or not apps.ready:
        raise AppRegistryNotReady(
            "the anarchon scheduler is not ready yet: it is built after Django's setup has "
            "imported every app's jobs.py. Call get_scheduler()/start() from a view, a "
            "management command, wsgi.py/asgi.py after get_*_application(), or "
            "AppConfig.ready() — not while modules are being imported.")


def wrap_handler(handler: Callable[..., Any]) -> Callable[[JobContext], Any]:
    """``handler`` run as Django runs a request: stale DB connections closed around it.

    Sync handlers run in the scheduler's thread pool, so the ORM opens a connection per
    thread; ``close_old_connections()`` before and after each run drops connections that
    broke (a database restart) or outlived ``CONN_MAX_AGE``. Async handlers do the same
    on the thread Django's async ORM uses.
    """
    if inspect.iscoroutinefunction(handler):

        @functools.wraps(handler)
        async def run_async(ctx: JobContext) -> Any:
            await sync_to_async(close_old_connections)()
            _note_requester(ctx)
            try:
                return await handler(ctx)
            finally:
                await sync_to_async(close_old_connections)()

        return run_async

    @functools.wraps(handler)
    def run(ctx: JobContext) -> Any:
        close_old_connections()
        _note_requester(ctx)
        try:
            return handler(ctx)
        finally:
            close_old_connections()

    return run


def _note_requester(ctx: JobContext) -> None:
    who = _requested_by.get()
    if ctx.manual and who:
        ctx.meta.setdefault("requested_by", who[:200])


@contextlib.contextmanager
def requested_by(who: str) -> Iterator[None]:
    """Record ``who`` as ``meta["requested_by"]`` of manual runs started inside the block."""
    token = _requested_by.set(who)
    try:
        yield
    finally:
        _requested_by.reset(token)


def register_job(scheduler: Scheduler, declaration: registry.Declaration,
                 defaults: dict[str, Any]) -> None:
    """Register a declared job on ``scheduler``, its handler wrapped (:func:`wrap_handler`)."""
    options = {**defaults, **declaration.options}
    handler = wrap_handler(declaration.handler)
    try:
        if declaration.kind == "every":
            scheduler.every(declaration.name, declaration.spec, handler,
                            offset=declaration.offset, **options)
        else:
            scheduler.cron(declaration.name, declaration.spec, handler,
                           tz=declaration.zone(), dst=declaration.dst, **options)
    except ConfigError as exc:
        raise ConfigError(f"job {declaration.name!r} (declared in {declaration.module}): "
                          f"{exc}") from exc


def build_scheduler(*, read_only: bool = False) -> Scheduler:
    """A new scheduler from the settings, with every declared job (none when read-only).

    Unless ``DATABASE_SCHEDULES`` is False, it also runs the ``Schedule`` table's jobs,
    polled every ``SCHEDULES_POLL_MS`` while it runs.

    ``read_only`` builds a history reader whose backend writes nothing, where the backend
    supports it. Connects to nothing until used. For the shared instance of the process
    use :func:`get_scheduler`.
    """
    _check_ready()
    parsed = conf.load()
    backend = conf.build_backend(parsed, read_only=read_only)
    scheduler = Scheduler(backend, **parsed.scheduler_options())
    if not read_only:
        problems = tasks.declare_from_settings(conf.settings_tasks())
        if problems:
            raise ImproperlyConfigured(f"{problems[0]} (anarchon.E012; run manage.py check "
                                       "for every problem)")
        for declaration in registry.declarations():
            register_job(scheduler, declaration, parsed.job_defaults)
        if parsed.database_schedules:
            kinds = parsed.database_schedules \
                if isinstance(parsed.database_schedules, tuple) else None
            dbschedules.attach(scheduler, defaults=parsed.job_defaults,
                               interval_s=parsed.schedules_poll_ms / 1000, kinds=kinds)
    return scheduler


def _on_declared(declaration: registry.Declaration) -> None:
    with _lock:
        scheduler = _scheduler
    if scheduler is not None:
        register_job(scheduler, declaration, conf.load().job_defaults)


def get_scheduler() -> Scheduler:
    """The process's scheduler, with every job of every app's ``jobs.py``.

    Built on first call. Use ``get_scheduler().sync`` from sync code (``.run_now(name)``,
    ``.history(...)``), or :func:`start`/:func:`stop` to run it inside this process.
    """
    global _scheduler  # noqa: PLW0603
    with _lock:
        if _scheduler is None:
            _scheduler = build_scheduler()
        return _scheduler


def load_schedules() -> Scheduler:
    """The process's scheduler with the ``Schedule`` table's jobs loaded now (blocking).

    A running scheduler keeps them up to date itself; one that is not running (a web
    process that only shows the admin) loads them here, e.g. before a "run now".
    """
    scheduler = get_scheduler()
    if not scheduler.running:
        for sync in scheduler.sources:
            sync.poll_now()
    return scheduler


def load_schedule(name: str) -> Scheduler:
    """The process's scheduler with the ``Schedule`` row ``name`` registered (blocking).

    For a "run now" in a process whose scheduler does not run (a web process that only
    shows the admin): that one row is read, not the table. A running scheduler, or a row
    that is not there, leaves the scheduler as it is; a row that is not a job raises
    :class:`~anarchon_core.ConfigError` saying why.
    """
    scheduler = get_scheduler()
    sources = [s.source for s in scheduler.sources
               if isinstance(s.source, dbschedules.DatabaseSchedules)]
    if scheduler.running or not sources:
        return scheduler
    with _lock:
        if scheduler.has_job(name) and name not in _row_jobs:
            return scheduler  # declared in code: a row of that name is not scheduled
        found = sources[0].by_name(name)  # read again each time: it may have changed
        if scheduler.has_job(name):
            scheduler.remove(name)
        _row_jobs.discard(name)
        if isinstance(found, str):
            raise ConfigError(found)
        if found is not None:
            scheduler.add(found.name, found.schedule, dbschedules.handler_for(found),
                          **dict(found.options))
            _row_jobs.add(name)
    return scheduler


def get_reader() -> Scheduler:
    """A scheduler for reading history: read-only when ``ADMIN_READ_ONLY`` (the default).

    Falls back to :func:`get_scheduler` when ``ADMIN_READ_ONLY`` is False.
    """
    global _reader  # noqa: PLW0603
    _check_ready()
    if not conf.load().admin_read_only:
        return get_scheduler()
    with _lock:
        if _reader is None:
            _reader = build_scheduler(read_only=True)
        return _reader


def start() -> Scheduler:
    """Run the project's scheduler inside this process (a web server, a Celery worker).

    Returns once started; the scheduler runs on its own event-loop thread, and sync
    handlers on its thread pool. Call :func:`stop` on shutdown so runs are handed over.
    Calling it again while running does nothing.
    """
    scheduler = get_scheduler()
    if not scheduler.running:
        scheduler.sync.start()
    return scheduler


def stop(grace_ms: int | None = None) -> None:
    """Stop the scheduler started by :func:`start` (hand-over) and close its connections.

    Also closes the admin's history reader. Safe to call when nothing was started.
    """
    with _lock:
        scheduler, reader = _scheduler, _reader
    for s in (scheduler, reader):
        if s is not None:
            s.sync.stop(grace_ms)


async def astart() -> Scheduler:
    """:func:`start` for async code (an ASGI lifespan handler)."""
    return await asyncio.to_thread(start)


async def astop(grace_ms: int | None = None) -> None:
    """:func:`stop` for async code."""
    await asyncio.to_thread(stop, grace_ms)


def reset() -> None:
    """Stop and forget the process's scheduler and reader; the next use builds new ones.

    Called when ``ANARCHON``, ``DATABASES`` or ``TIME_ZONE`` change (``override_settings``).
    """
    global _scheduler, _reader  # noqa: PLW0603
    with _lock:
        old = [s for s in (_scheduler, _reader) if s is not None]
        _scheduler = _reader = None
        _row_jobs.clear()
    for scheduler in old:
        try:
            scheduler.sync.stop(0)
        except Exception:  # a store that is down must not block a reset
            log.warning("stopping the old scheduler failed", exc_info=True)
