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

from . import conf, registry, tasks

__all__ = [
    "astart", "astop", "build_scheduler", "get_reader", "get_scheduler", "register_job",
    "requested_by", "reset", "start", "stop", "wrap_handler",
]

log = logging.getLogger("anarchon.django")

_lock = threading.RLock()
_scheduler: Scheduler | None = None
_reader: Scheduler | None = None
_ready = False
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
                           tz=declaration.zone(), **options)
    except ConfigError as exc:
        raise ConfigError(f"job {declaration.name!r} (declared in {declaration.module}): "
                          f"{exc}") from exc


def build_scheduler(*, read_only: bool = False) -> Scheduler:
    """A new scheduler from the settings, with every declared job (none when read-only).

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
    for scheduler in old:
        try:
            scheduler.sync.stop(0)
        except Exception:  # a store that is down must not block a reset
            log.warning("stopping the old scheduler failed", exc_info=True)
