"""Job declarations: ``@anarchon_django.every(...)`` and ``@anarchon_django.cron(...)``.

A decorator records a :class:`Declaration` (validated at once: the name and the schedule)
and returns the function unchanged. The project's scheduler is built later, from the
settings, with every declaration registered (see :mod:`anarchon_django.runtime`); a
declaration made after that is added to it at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

from anarchon_core import ConfigError, CronSchedule, EverySchedule, Schedule
from anarchon_core.durations import Duration
from anarchon_core.naming import validate_job_name
from anarchon_core.schedules import Dst

__all__ = ["Declaration", "cron", "declarations", "every", "forget", "handler", "handlers"]

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.RLock()
_declared: dict[str, Declaration] = {}
#: Handlers that database schedules name as their target (``@handler("send-digest")``).
_handlers: dict[str, Callable[..., Any]] = {}
#: Called with each new declaration (the runtime adds it to a scheduler already built).
_listeners: list[Callable[[Declaration], None]] = []


@dataclass(frozen=True)
class Declaration:
    """One job declared in a ``jobs.py``: its schedule, handler and options.

    ``tz`` is None for a cron job that follows ``settings.TIME_ZONE``; ``dst`` is a cron
    job's DST choice (None: cron(8)'s rule).
    """

    name: str
    kind: Literal["every", "cron"]
    spec: Any
    handler: Callable[..., Any]
    offset: Any = 0
    tz: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    dst: Dst = None

    @property
    def module(self) -> str:
        """The module that declared the job (``shop.jobs``)."""
        return str(getattr(self.handler, "__module__", "?"))

    def zone(self) -> str:
        """The cron time zone: ``tz``, else ``settings.TIME_ZONE``, else UTC."""
        if self.tz is not None:
            return self.tz
        from django.conf import settings  # noqa: PLC0415 - read when needed, not at import

        return (getattr(settings, "TIME_ZONE", None) or "UTC") if settings.configured \
            else "UTC"

    def schedule(self) -> Schedule:
        """A fresh schedule object (ConfigError for a bad interval, expression or zone)."""
        if self.kind == "every":
            return EverySchedule(self.spec, self.offset)
        return CronSchedule(self.spec, self.zone(), self.dst)


def _declare(declaration: Declaration) -> None:
    validate_job_name(declaration.name)
    declaration.schedule()
    if not callable(declaration.handler):
        raise ConfigError(f"invalid handler {declaration.handler!r} for job "
                          f"{declaration.name!r}: not callable")
    with _lock:
        old = _declared.get(declaration.name)
        if old is not None and _key(old) != _key(declaration):
            raise ConfigError(
                f"job {declaration.name!r} is declared twice: in {old.module} and in "
                f"{declaration.module}; job names are unique across the project")
        _declared[declaration.name] = declaration
        listeners = list(_listeners)
    if old is None:
        for listener in listeners:
            listener(declaration)


def _scheduled_task(target: object, name: str, **schedule: Any) -> bool:
    """Schedule ``target`` if it is a ``django.tasks`` Task (``@every`` on ``@task``)."""
    from . import tasks  # noqa: PLC0415 - imports Django's task framework when present

    if not tasks.is_task(target):
        return False
    tasks.schedule(target, name=name, **{k: v for k, v in schedule.items()
                                         if v is not None or k in ("every", "cron")})
    return True


def _key(d: Declaration) -> tuple[str, str]:
    # The same function declared again (a module imported under two names, a reload) is
    # the same job, not a clash.
    return d.module, str(getattr(d.handler, "__qualname__", d.handler))


@overload
def every(name: str, interval: Duration, handler: None = None, *, offset: Duration = 0,
          **options: Any) -> Callable[[F], F]: ...
@overload
def every(name: str, interval: Duration, handler: F, *, offset: Duration = 0,
          **options: Any) -> F: ...


def every(name: str, interval: Duration, handler: Callable[..., Any] | None = None, *,
          offset: Duration = 0, **options: Any) -> Any:
    """Declare a job on the epoch grid, e.g. ``@every("expire-carts", "5m")``.

    ``interval`` and ``offset`` as in :meth:`anarchon_core.Scheduler.every`; ``options``
    (``timeout_ms``, ``jitter_ms``, ``max_late_ms``, ``overlap``, ``max_attempts``,
    ``catch_up_ms``) override ``ANARCHON['JOB_DEFAULTS']``. The handler receives a
    :class:`~anarchon_core.JobContext`; plain ``def`` handlers may use the ORM.

    Stacked on a ``django.tasks`` ``@task`` it schedules the task instead: each slot
    enqueues it once (:func:`anarchon_django.schedule`; ``args=``, ``kwargs=``,
    ``queue_name=``, ``priority=``, ``backend=`` go in ``options``), and returns the task.
    """

    def add(fn: F) -> F:
        if _scheduled_task(fn, name, every=interval, offset=offset, **options):
            return fn
        _declare(Declaration(name, "every", interval, fn, offset=offset, options=options))
        return fn

    return add if handler is None else add(handler)


@overload
def cron(name: str, expression: str, handler: None = None, *, tz: str | None = None,
         dst: Dst = None, **options: Any) -> Callable[[F], F]: ...
@overload
def cron(name: str, expression: str, handler: F, *, tz: str | None = None,
         dst: Dst = None, **options: Any) -> F: ...


def cron(name: str, expression: str, handler: Callable[..., Any] | None = None, *,
         tz: str | None = None, dst: Dst = None, **options: Any) -> Any:
    """Declare a cron job, e.g. ``@cron("daily-report", "0 8 * * *")``.

    The expression is read in ``tz``, by default the project's ``TIME_ZONE`` (UTC when
    unset). ``dst`` as in :meth:`anarchon_core.Scheduler.cron` (``"once_last"``,
    ``"skip"``...; by default cron(8)'s rule). Options as for :func:`every`, and like
    it, it schedules a ``Task`` it decorates.
    """
    if tz is not None and not isinstance(tz, str):
        raise ConfigError(f"invalid tz {tz!r} for job {name!r}: expected an IANA zone name")

    def add(fn: F) -> F:
        if _scheduled_task(fn, name, cron=expression, tz=tz, dst=dst, **options):
            return fn
        _declare(Declaration(name, "cron", expression, fn, tz=tz, options=options, dst=dst))
        return fn

    return add if handler is None else add(handler)


def declarations() -> list[Declaration]:
    """Every declared job, in declaration order."""
    with _lock:
        return list(_declared.values())


def forget(name: str) -> bool:
    """Drop a declaration (for tests); a scheduler built already keeps the job."""
    with _lock:
        return _declared.pop(name, None) is not None


def add_listener(listener: Callable[[Declaration], None]) -> None:
    """Call ``listener`` with every declaration made from now on (once, if added again).

    The app registry may become ready more than once in a process (a change of
    ``INSTALLED_APPS`` under a test runner runs ``AppConfig.ready()`` again).
    """
    with _lock:
        if listener not in _listeners:
            _listeners.append(listener)


def handler(name: str) -> Callable[[F], F]:
    """Register a function as a target of database schedules: ``@handler("send-digest")``.

    A :class:`~anarchon_django.models.Schedule` whose ``target`` is ``"send-digest"``
    runs it at each slot as ``fn(ctx, *schedule.args, **schedule.kwargs)``; ``ctx`` is
    the run's :class:`~anarchon_core.JobContext`. Names are unique across the project.
    """
    if not isinstance(name, str) or not 0 < len(name) <= 300:
        raise ConfigError(f"invalid handler name {name!r}: expected a text of 1 to 300 "
                          "characters")

    def add(fn: F) -> F:
        if not callable(fn):
            raise ConfigError(f"invalid handler {fn!r} for {name!r}: not callable")
        with _lock:
            old = _handlers.get(name)
            if old is not None and _function_key(old) != _function_key(fn):
                raise ConfigError(f"handler {name!r} is registered twice: in "
                                  f"{getattr(old, '__module__', '?')} and in "
                                  f"{getattr(fn, '__module__', '?')}")
            _handlers[name] = fn
        return fn

    return add


def _function_key(fn: Callable[..., Any]) -> tuple[str, str]:
    return str(getattr(fn, "__module__", "?")), str(getattr(fn, "__qualname__", fn))


def handlers() -> dict[str, Callable[..., Any]]:
    """Every handler registered with :func:`handler`, by name."""
    with _lock:
        return dict(_handlers)
