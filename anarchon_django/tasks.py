"""Scheduled Django tasks: a ``django.tasks`` ``Task`` as the target of a schedule.

Each slot of the schedule is enqueued once across every worker::

    @anarchon_django.every("expire-carts", "5m")
    @task
    def expire_carts(): ...

    anarchon_django.schedule(send_report, cron="0 2 * * *", kwargs={"kind": "daily"})

    ANARCHON = {"TASKS": {"nightly-report": {"task": "shop.tasks.report",
                                             "cron": "0 2 * * *", "kwargs": {...}}}}

The run's handler calls ``task.using(...).enqueue(*args, **kwargs)`` and records the
result in the run's meta (:data:`META_KEYS`). A task whose function takes a ``slot_key``
parameter receives ``"<job>@<slot>"`` to deduplicate on. When the task backend is
``django-tasks-db`` writing to the database that holds the runs table, the enqueue and
the run's end commit in one transaction (:func:`anarchon_django.atomic`): one task row
per slot whatever crashes. Works with Django 6's ``django.tasks`` and with the
``django-tasks`` backport (Django 5.2).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from anarchon_core import ConfigError, JobContext

__all__ = [
    "META_KEYS", "SLOT_KEY_ARG", "TaskTarget", "is_task", "schedule", "slot_key",
    "task_classes", "task_handler",
]

log = logging.getLogger("anarchon.django.tasks")

#: The keyword argument a task opts into to receive its slot key.
SLOT_KEY_ARG = "slot_key"
#: Keys of ``Run.meta`` a scheduled task's run records.
META_KEYS = ("task_id", "task_backend", "task_name", "task_status")
#: Settings of a task target (the rest of an entry are schedule and job options).
_TARGET_KEYS = ("args", "kwargs", "queue_name", "priority", "backend")
#: Set while this thread enqueues a slot's task (an immediate backend reports its end then).
_enqueuing = threading.local()


def task_classes() -> tuple[type, ...]:
    """The ``Task`` classes importable here: ``django.tasks`` and the backport."""
    found: list[type] = []
    for module in ("django.tasks.base", "django_tasks.base"):
        try:
            imported = __import__(module, fromlist=["Task"])
        except ImportError:
            continue
        cls = getattr(imported, "Task", None)
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


def is_task(obj: object) -> bool:
    """True for a ``django.tasks`` (or backport) ``Task``."""
    classes = task_classes()
    return bool(classes) and isinstance(obj, classes)


def slot_key(ctx: JobContext) -> str:
    """``"<job>@<slot>"``: one value per run across the cluster."""
    return f"{ctx.job}@{ctx.slot}"


def _json(value: Any, what: str) -> Any:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what} must be JSON (a task's arguments are stored as JSON): "
                          f"{exc}") from None
    return json.loads(text)


@dataclass(frozen=True)
class TaskTarget:
    """A task with the arguments and ``using()`` options each slot enqueues it with."""

    task: Any
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue_name: str | None = None
    priority: int | None = None
    backend: str | None = None

    @property
    def name(self) -> str:
        """The task's module path (``shop.tasks.report``)."""
        return str(self.task.module_path)

    @functools.cached_property
    def takes_slot_key(self) -> bool:
        """Whether the task's function has a ``slot_key`` parameter."""
        try:
            params = inspect.signature(self.task.func).parameters
        except (TypeError, ValueError):
            return False
        param = params.get(SLOT_KEY_ARG)
        return param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD,
                                                    param.KEYWORD_ONLY)

    def bound(self) -> Any:
        """The task with this target's ``using()`` options."""
        changes = {k: v for k, v in (("queue_name", self.queue_name),
                                     ("priority", self.priority),
                                     ("backend", self.backend)) if v is not None}
        return self.task.using(**changes) if changes else self.task

    def validate(self, job: str) -> None:
        """ConfigError unless the arguments are JSON the task accepts and the options work."""
        if not isinstance(self.args, Sequence) or isinstance(self.args, str | bytes):
            raise ConfigError(f"job {job!r}: args must be a list, not {self.args!r}")
        if not isinstance(self.kwargs, Mapping) or not all(isinstance(k, str)
                                                           for k in self.kwargs):
            raise ConfigError(f"job {job!r}: kwargs must be a dict with str keys")
        args = _json(list(self.args), f"job {job!r}: args")
        kwargs = _json(dict(self.kwargs), f"job {job!r}: kwargs")
        if args != list(self.args) or kwargs != dict(self.kwargs):
            raise ConfigError(f"job {job!r}: args and kwargs must survive a JSON round trip "
                              "unchanged (use lists, dicts, str, int, float, bool, None)")
        if SLOT_KEY_ARG in kwargs and self.takes_slot_key:
            raise ConfigError(f"job {job!r}: {SLOT_KEY_ARG!r} is given by anarchon; remove "
                              "it from kwargs")
        extra = {SLOT_KEY_ARG: ""} if self.takes_slot_key else {}
        lead = (None,) if getattr(self.task, "takes_context", False) else ()
        try:
            inspect.signature(self.task.func).bind(*lead, *args, **kwargs, **extra)
        except TypeError as exc:
            raise ConfigError(f"job {job!r}: task {self.name} does not accept these "
                              f"arguments: {exc}") from None
        except ValueError:
            pass  # no signature to check (a builtin): the backend decides
        try:
            self.bound()
        except Exception as exc:  # noqa: BLE001 - the backend's own validation, any kind
            raise ConfigError(f"job {job!r}: task {self.name} cannot be enqueued with "
                              f"these options: {exc}") from None


def _task_db_alias(task: Any) -> str | None:
    """The database a ``django-tasks-db`` backend writes ``task``'s rows to, else None."""
    try:
        from django_tasks_db.backend import DatabaseBackend  # noqa: PLC0415
    except ImportError:
        return None
    if not isinstance(task.get_backend(), DatabaseBackend):
        return None
    from django.db import router  # noqa: PLC0415
    from django_tasks_db.models import DBTaskResult  # noqa: PLC0415

    return str(router.db_for_write(DBTaskResult))


def _same_database(task: Any) -> bool:
    from . import conf  # noqa: PLC0415

    target = conf.load().database
    return target is not None and _task_db_alias(task) == target.alias


def result_status(result: Any) -> str:
    """A task result's status as text (``SUCCESSFUL``, ``FAILED``...)."""
    status = getattr(result, "status", "")
    return str(getattr(status, "value", status))


def _note(ctx: JobContext, result: Any, name: str) -> None:
    ctx.meta["task_id"] = str(result.id)[:500]
    ctx.meta["task_backend"] = str(result.backend)[:500]
    ctx.meta["task_name"] = name[:500]
    if getattr(result, "is_finished", False):
        ctx.meta["task_status"] = result_status(result)


def task_handler(target: TaskTarget) -> Callable[[JobContext], None]:
    """The run handler that enqueues ``target`` for its slot."""

    def enqueue_slot(ctx: JobContext) -> None:
        from .transactions import atomic  # noqa: PLC0415 - needs the app registry

        task = target.bound()
        kwargs = dict(target.kwargs)
        if target.takes_slot_key:
            kwargs[SLOT_KEY_ARG] = slot_key(ctx)
        _enqueuing.active = True
        try:
            if _same_database(task):
                # One commit for the task's row and the run's end: never zero, never two.
                with atomic(ctx):
                    _note(ctx, task.enqueue(*target.args, **kwargs), target.name)
            else:
                _note(ctx, task.enqueue(*target.args, **kwargs), target.name)
        finally:
            _enqueuing.active = False

    enqueue_slot.__module__ = str(getattr(target.task.func, "__module__", __name__))
    enqueue_slot.__qualname__ = str(getattr(target.task.func, "__qualname__", target.name))
    enqueue_slot.__doc__ = f"Enqueue {target.name} once per slot."
    return enqueue_slot


def schedule(task: Any, *, every: Any = None, cron: str | None = None,
             args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
             name: str | None = None, queue_name: str | None = None,
             priority: int | None = None, backend: str | None = None,
             **options: Any) -> Any:
    """Schedule a ``Task`` defined elsewhere; returns the task.

    Exactly one of ``every`` (an interval, with ``offset=`` in ``options``) and ``cron``
    (an expression, with ``tz=`` and ``dst=``). ``name`` is the job's name, by default the task's
    module path. ``queue_name``, ``priority`` and ``backend`` go to ``task.using()``;
    ``args`` and ``kwargs`` (JSON) to ``enqueue()``. Other ``options`` as for
    :func:`anarchon_django.every`.
    """
    from . import registry  # noqa: PLC0415 - registry imports this module

    if not is_task(task):
        raise ConfigError(f"schedule() takes a django.tasks Task, not {task!r}")
    if (every is None) == (cron is None):
        raise ConfigError(f"schedule({task.module_path}): give exactly one of every= and "
                          "cron=")
    target = TaskTarget(task, tuple(args) if isinstance(args, list | tuple) else args,  # type: ignore[arg-type]
                        dict(kwargs or {}), queue_name, priority, backend)
    job = name if name is not None else str(task.module_path)
    target.validate(job)
    handler = task_handler(target)
    if every is not None:
        registry.every(job, every, handler, **options)
    else:
        assert cron is not None
        registry.cron(job, cron, handler, **options)
    _scheduled[job] = target
    return task


#: Every scheduled task by job name (for the task_finished receiver).
_scheduled: dict[str, TaskTarget] = {}


def scheduled() -> dict[str, TaskTarget]:
    """The scheduled tasks by job name."""
    return dict(_scheduled)


def forget(name: str) -> None:
    """Drop a scheduled task (for tests, beside ``registry.forget``)."""
    _scheduled.pop(name, None)


def entries_from_settings(raw: object) -> Iterator[tuple[str, dict[str, Any] | None, str]]:
    """``ANARCHON['TASKS']`` as ``(name, schedule() keywords or None, problem)`` items.

    A problem is one message naming the entry; the keywords are None when it has one.
    """
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        yield "", None, "ANARCHON['TASKS'] must be a dict of entries by job name"
        return
    from django.utils.module_loading import import_string  # noqa: PLC0415

    from .conf import JOB_OPTIONS  # noqa: PLC0415

    known = ("task", "every", "cron", "tz", "dst", "offset", *_TARGET_KEYS, *JOB_OPTIONS)
    for name, entry in raw.items():
        where = f"ANARCHON['TASKS'][{name!r}]"
        if not isinstance(entry, Mapping):
            yield str(name), None, f"{where} must be a dict with 'task' and 'every' or 'cron'"
            continue
        unknown = sorted(str(k) for k in entry if k not in known)
        if unknown:
            import difflib  # noqa: PLC0415

            close = difflib.get_close_matches(unknown[0], known, n=1)
            yield str(name), None, (f"{where} has an unknown key {unknown[0]!r}" +
                                    (f"; did you mean {close[0]!r}?" if close else
                                     f"; valid keys: {', '.join(known)}"))
            continue
        path = entry.get("task")
        if not isinstance(path, str) or not path:
            yield str(name), None, f"{where} needs 'task': the dotted path of a Task"
            continue
        try:
            task = import_string(path)
        except ImportError as exc:
            yield str(name), None, f"{where}: cannot import {path!r}: {exc}"
            continue
        if not is_task(task):
            yield str(name), None, f"{where}: {path!r} is {task!r}, not a django.tasks Task"
            continue
        keywords = {k: v for k, v in entry.items() if k != "task"}
        yield str(name), {"task": task, "name": str(name), **keywords}, ""


def declare_from_settings(raw: object) -> list[str]:
    """Schedule every valid ``ANARCHON['TASKS']`` entry; the problems, each naming its entry."""
    problems = []
    for name, keywords, problem in entries_from_settings(raw):
        if keywords is None:
            problems.append(problem)
            continue
        try:
            schedule(**keywords)
        except ConfigError as exc:
            text = str(exc)
            problems.append(f"ANARCHON['TASKS'][{name!r}]: {text}")
        except TypeError as exc:  # schedule() keywords of the wrong kind
            problems.append(f"ANARCHON['TASKS'][{name!r}]: {exc}")
    return problems


def enqueuing_here() -> bool:
    """True while this thread enqueues a slot's task."""
    return bool(getattr(_enqueuing, "active", False))
