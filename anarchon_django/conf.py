"""The ``ANARCHON`` settings dict: parsing, validation and the backend it names.

Parsing is pure: it reads ``settings.ANARCHON`` and ``DATABASES`` and builds backend and
scheduler *objects*, which connect to nothing until started. The system checks
(:mod:`anarchon_django.checks`) report every problem found here with its id; code that
needs a scheduler (:func:`anarchon_django.get_scheduler`) raises the first one as
:class:`~django.core.exceptions.ImproperlyConfigured`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from anarchon_core import (
    Backend,
    ConfigError,
    Scheduler,
    SqliteBackend,
    backend_from_url,
    mask_url,
)
from anarchon_core.options import LEASE_ONLY_OPTIONS

__all__ = [
    "DEFAULTS", "DatabaseTarget", "Problem", "Settings", "build_backend", "database_target",
    "load", "parse",
]

#: Every key of ``settings.ANARCHON`` with its default.
DEFAULTS: dict[str, Any] = {
    "BACKEND": "default",
    "TABLE": None,
    "PREFIX": None,
    "BACKEND_OPTIONS": {},
    "LEASE_MS": None,
    "HEARTBEAT_MS": None,
    "HISTORY_SIZE": 1000,
    "HISTORY_TTL_MS": None,
    "INSTANCE_ID": None,
    "STOP_GRACE_MS": 5_000,
    "HANDLER_THREADS": 32,
    "JOB_DEFAULTS": {},
    "ADMIN_READ_ONLY": True,
    "ADMIN_RUN_NOW_WAIT_MS": 5_000,
    # Scheduled tasks by job name (anarchon_django.tasks), checked as anarchon.E012.
    "TASKS": {},
    # The Schedule table (schedules in the database): read by every worker (True, False,
    # or the target kinds its rows may have), polled for changes this often.
    "DATABASE_SCHEDULES": True,
    "SCHEDULES_POLL_MS": 2_000,
}
#: Job options accepted in ``JOB_DEFAULTS`` and by the decorators.
JOB_OPTIONS = ("timeout_ms", "jitter_ms", "max_late_ms", "overlap", "max_attempts",
               "catch_up_ms", "catch_up")
#: URL schemes whose backends take a ``table`` (SQL) or a ``prefix`` (the others).
_SQL_SCHEMES = frozenset({"postgresql", "postgres", "sqlite"})
_PREFIX_SCHEMES = frozenset({"redis", "rediss", "valkey", "valkeys", "amqp", "amqps", "nats",
                             "tls"})
#: Django ``OPTIONS`` of the PostgreSQL backend that are not libpq connection parameters.
_DJANGO_ONLY_PG_OPTIONS = frozenset({"isolation_level", "server_side_binding", "pool",
                                     "assume_role", "cursor_factory", "prepare_threshold",
                                     "context"})
DEFAULT_TABLE = "anarchon_runs"
#: The target kinds ``DATABASE_SCHEDULES`` may list.
SCHEDULE_KINDS = ("handler", "task", "celery")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the settings: a check id (``anarchon.E003``), text and hint.

    ``warning`` problems (``anarchon.W...``) are reported as warnings: they stop nothing
    but the use of the scheduler.
    """

    id: str
    msg: str
    hint: str | None = None
    warning: bool = False


@dataclass(frozen=True)
class DatabaseTarget:
    """``BACKEND`` names a Django database: its alias, vendor and the runs table."""

    alias: str
    vendor: str
    table: str


@dataclass(frozen=True)
class Settings:
    """``settings.ANARCHON`` with defaults filled in and types checked."""

    backend: str
    table: str | None
    prefix: str | None
    backend_options: dict[str, Any]
    lease_ms: int | None
    heartbeat_ms: int | None
    history_size: int
    history_ttl_ms: int | None
    instance_id: str | None
    stop_grace_ms: int
    handler_threads: int
    job_defaults: dict[str, Any]
    admin_read_only: bool
    admin_run_now_wait_ms: int
    database: DatabaseTarget | None = None
    #: True, False, or the target kinds of the rows this project's workers run.
    database_schedules: bool | tuple[str, ...] = True
    schedules_poll_ms: int = 2_000
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    def scheduler_options(self) -> dict[str, Any]:
        """Keyword arguments for :class:`anarchon_core.Scheduler` (besides the backend)."""
        return {"instance_id": self.instance_id, "lease_ms": self.lease_ms,
                "heartbeat_ms": self.heartbeat_ms, "history_size": self.history_size,
                "history_ttl_ms": self.history_ttl_ms, "handler_threads": self.handler_threads,
                "stop_grace_ms": self.stop_grace_ms}


def _raw() -> object:
    return getattr(settings, "ANARCHON", {})


def _is_url(value: str) -> bool:
    return "://" in value


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower()


def _test_runner_memory_db(name: object) -> bool:
    """Whether ``name`` is the test runner's in-memory stand-in for a SQLite database.

    Django's test runner names it ``file:memorydb_<alias>...`` when ``TEST`` has no ``NAME``.
    """
    return str(name or "").startswith("file:memorydb_")


def _in_memory_sqlite(name: object) -> bool:
    text = str(name or "")
    return text in ("", ":memory:") or "mode=memory" in text or text.startswith(
        "file::memory:")


def _database(alias: str) -> tuple[str, dict[str, Any]]:
    from django.db import connections  # noqa: PLC0415 - needs configured settings

    connection = connections[alias]
    return connection.vendor, connection.settings_dict


def _postgres_conninfo(params: Mapping[str, Any]) -> str:
    from psycopg.conninfo import make_conninfo  # noqa: PLC0415 - optional dependency

    options = {k: v for k, v in (params.get("OPTIONS") or {}).items()
               if k not in _DJANGO_ONLY_PG_OPTIONS and isinstance(v, str | int)}
    keys = {"dbname": params.get("NAME"), "user": params.get("USER"),
            "password": params.get("PASSWORD"), "host": params.get("HOST"),
            "port": params.get("PORT")}
    keys.update(options)
    return make_conninfo(**{k: str(v) for k, v in keys.items() if v not in (None, "")})


def database_target(parsed: Settings | None = None) -> DatabaseTarget | None:
    """The Django database ``BACKEND`` names, or None for a URL (or unusable settings)."""
    if parsed is None:
        parsed, problems = parse()
        if parsed is None or problems:
            return None
    return parsed.database


def build_backend(parsed: Settings, *, read_only: bool = False) -> Backend:
    """The backend object ``parsed`` names (it connects only when started).

    A database alias is read from Django's connection settings at call time (so under a
    test runner it is the test database). Raises :class:`ConfigError` on bad values.
    """
    options = dict(parsed.backend_options)
    if read_only:
        options["read_only"] = True
    target = parsed.database
    if target is not None:
        _, params = _database(target.alias)
        if target.vendor == "sqlite":
            return SqliteBackend(str(params["NAME"]), table=target.table, **options)
        from anarchon_core.backends.postgres import PostgresBackend  # noqa: PLC0415

        return PostgresBackend(_postgres_conninfo(params), table=target.table, **options)
    if parsed.table is not None:
        options.setdefault("table", parsed.table)
    if parsed.prefix is not None:
        options.setdefault("prefix", parsed.prefix)
    return backend_from_url(parsed.backend, **options)


#: The E008 hint for each integer setting: what the number counts.
_INT_HINTS = {
    "LEASE_MS": "A duration in whole milliseconds, e.g. 30000 for 30 s.",
    "HEARTBEAT_MS": "A duration in whole milliseconds, smaller than LEASE_MS; None is a "
                    "third of the lease.",
    "HISTORY_TTL_MS": "A duration in whole milliseconds, e.g. 604800000 for 7 days; None "
                      "keeps runs until HISTORY_SIZE drops them.",
    "STOP_GRACE_MS": "A duration in whole milliseconds, e.g. 5000 for 5 s.",
    "ADMIN_RUN_NOW_WAIT_MS": "A duration in whole milliseconds, e.g. 5000 for 5 s; 0 answers "
                             "at once.",
    "HISTORY_SIZE": "The number of runs kept per job, e.g. 1000.",
    "HANDLER_THREADS": "The number of threads running plain `def` handlers, e.g. 32.",
    "SCHEDULES_POLL_MS": "A duration in whole milliseconds, e.g. 2000: a change to a "
                         "database schedule is live on every worker within about this.",
}


def _int(raw: Mapping[str, Any], key: str, problems: list[Problem], *, minimum: int,
         optional: bool) -> int | None:
    value = raw.get(key, DEFAULTS[key])
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        want = f"an int ≥ {minimum}" + (" or None" if optional else "")
        problems.append(Problem("anarchon.E008", f"ANARCHON[{key!r}] is {value!r}: expected "
                                f"{want}.", _INT_HINTS[key]))
        return None
    return value


def parse(raw: object | None = None) -> tuple[Settings | None, list[Problem]]:
    """Parse ``settings.ANARCHON`` (or ``raw``); return the settings and every problem.

    The settings are None when the problems leave nothing usable. Problems found by
    building the backend and the scheduler (bad URLs, lease timings) are included.
    """
    raw = _raw() if raw is None else raw
    if not isinstance(raw, Mapping):
        return None, [Problem("anarchon.E001", f"ANARCHON must be a dict, not "
                              f"{type(raw).__name__}.",
                              "ANARCHON = {'BACKEND': 'default'} uses the project's database.")]
    problems: list[Problem] = []
    for key in raw:
        if key not in DEFAULTS:
            close = difflib.get_close_matches(str(key), DEFAULTS, n=1)
            hint = f"Did you mean {close[0]!r}?" if close else \
                f"Valid keys: {', '.join(DEFAULTS)}."
            problems.append(Problem("anarchon.E002", f"ANARCHON has an unknown key {key!r}.",
                                    hint))

    backend = raw.get("BACKEND", DEFAULTS["BACKEND"])
    database: DatabaseTarget | None = None
    table, prefix = raw.get("TABLE"), raw.get("PREFIX")
    if not isinstance(backend, str) or not backend.strip():
        problems.append(Problem(
            "anarchon.E003", f"ANARCHON['BACKEND'] is {backend!r}: expected a store URL or "
            "a database alias.",
            "E.g. 'default' (the project's database) or 'redis://localhost:6379/0'."))
        backend = ""
    elif not _is_url(backend):
        databases = getattr(settings, "DATABASES", {}) or {}
        if backend not in databases:
            problems.append(Problem(
                "anarchon.E003", f"ANARCHON['BACKEND'] is {backend!r}, which is neither a "
                "store URL nor an alias in DATABASES.",
                f"Use one of {', '.join(map(repr, databases)) or 'no aliases'} or a URL such "
                "as 'redis://localhost:6379/0'."))
        else:
            try:
                vendor, params = _database(backend)
            except (ImproperlyConfigured, ImportError) as exc:
                vendor, params = f"not loadable: {exc}", {}
            if vendor not in ("postgresql", "sqlite"):
                problems.append(Problem(
                    "anarchon.E004", f"ANARCHON['BACKEND'] names the database {backend!r}, "
                    f"whose engine ({vendor}) anarchon cannot use.",
                    "Use a PostgreSQL or SQLite alias, or a store URL (Redis, PostgreSQL...)."))
            elif vendor == "sqlite" and _test_runner_memory_db(params.get("NAME")):
                # Only the tests that use the scheduler need it: the others must still run.
                problems.append(Problem(
                    "anarchon.W005", f"ANARCHON['BACKEND'] names the database {backend!r}, "
                    "which the test runner made an in-memory SQLite database: the scheduler "
                    "cannot be used in these tests.",
                    f"Give DATABASES[{backend!r}] a TEST NAME that is a file, e.g. "
                    "{'NAME': 'test_db.sqlite3'}, or use another BACKEND in tests.",
                    warning=True))
            elif vendor == "sqlite" and _in_memory_sqlite(params.get("NAME")):
                problems.append(Problem(
                    "anarchon.E005", f"ANARCHON['BACKEND'] names the database {backend!r}, an "
                    "in-memory SQLite database that no other process can see.",
                    "Give the database a file NAME (and TEST NAME under a test runner)."))
            else:
                if prefix is not None:
                    problems.append(Problem(
                        "anarchon.E007", "ANARCHON['PREFIX'] is set, but a database backend "
                        "is namespaced by TABLE.", "Remove PREFIX or set TABLE instead."))
                database = DatabaseTarget(backend, vendor,
                                          DEFAULT_TABLE if table is None else str(table))
    else:
        scheme = _scheme(backend)
        if table is not None and scheme in _PREFIX_SCHEMES:
            problems.append(Problem(
                "anarchon.E007", f"ANARCHON['TABLE'] is set, but the {scheme}:// backend is "
                "namespaced by PREFIX.", "Remove TABLE or set PREFIX instead."))
            table = None
        if prefix is not None and scheme in _SQL_SCHEMES:
            problems.append(Problem(
                "anarchon.E007", f"ANARCHON['PREFIX'] is set, but the {scheme}:// backend is "
                "namespaced by TABLE.", "Remove PREFIX or set TABLE instead."))
            prefix = None

    options = raw.get("BACKEND_OPTIONS", {})
    if not isinstance(options, Mapping):
        problems.append(Problem("anarchon.E006", "ANARCHON['BACKEND_OPTIONS'] must be a dict "
                                "of keyword options for the backend.",
                                "E.g. {'strategy': 'stream-id'} for Redis."))
        options = {}
    job_defaults = raw.get("JOB_DEFAULTS", {})
    if not isinstance(job_defaults, Mapping):
        problems.append(Problem("anarchon.E009", "ANARCHON['JOB_DEFAULTS'] must be a dict of "
                                "job options.", f"Options: {', '.join(JOB_OPTIONS)}."))
        job_defaults = {}
    unknown = sorted(set(job_defaults) - set(JOB_OPTIONS), key=str)
    if unknown:
        problems.append(Problem("anarchon.E009", f"ANARCHON['JOB_DEFAULTS'] has unknown "
                                f"option(s) {', '.join(map(repr, unknown))}.",
                                f"Options: {', '.join(JOB_OPTIONS)}."))
        job_defaults = {k: v for k, v in job_defaults.items() if k in JOB_OPTIONS}

    lease_ms = _int(raw, "LEASE_MS", problems, minimum=1, optional=True)
    heartbeat_ms = _int(raw, "HEARTBEAT_MS", problems, minimum=1, optional=True)
    history_size = _int(raw, "HISTORY_SIZE", problems, minimum=1, optional=False)
    history_ttl_ms = _int(raw, "HISTORY_TTL_MS", problems, minimum=1, optional=True)
    stop_grace_ms = _int(raw, "STOP_GRACE_MS", problems, minimum=0, optional=False)
    threads = _int(raw, "HANDLER_THREADS", problems, minimum=1, optional=False)
    wait_ms = _int(raw, "ADMIN_RUN_NOW_WAIT_MS", problems, minimum=0, optional=False)
    instance_id = raw.get("INSTANCE_ID")
    if instance_id is not None and (not isinstance(instance_id, str) or not instance_id.strip()):
        problems.append(Problem("anarchon.E008", f"ANARCHON['INSTANCE_ID'] is {instance_id!r}: "
                                "expected a non-empty string or None.",
                                "None records '<hostname>:<pid>' in history."))
        instance_id = None
    poll_ms = _int(raw, "SCHEDULES_POLL_MS", problems, minimum=100, optional=False)
    database_schedules = raw.get("DATABASE_SCHEDULES", True)
    if isinstance(database_schedules, list | tuple) and database_schedules and \
            set(database_schedules) <= set(SCHEDULE_KINDS):
        database_schedules = tuple(database_schedules)
    elif not isinstance(database_schedules, bool):
        problems.append(Problem(
            "anarchon.E011", f"ANARCHON['DATABASE_SCHEDULES'] is {database_schedules!r}: "
            f"expected True, False or a list of target kinds ({', '.join(SCHEDULE_KINDS)}).",
            "E.g. ['handler', 'task'] when Celery beats send the Celery-task rows."))
        database_schedules = True
    read_only = raw.get("ADMIN_READ_ONLY", True)
    if not isinstance(read_only, bool):
        problems.append(Problem("anarchon.E011", f"ANARCHON['ADMIN_READ_ONLY'] is "
                                f"{read_only!r}: expected True or False."))
        read_only = True

    if not backend or any(p.id in ("anarchon.E003", "anarchon.E004", "anarchon.E005",
                                   "anarchon.W005")
                          for p in problems):
        return None, problems
    parsed = Settings(
        backend=backend, table=None if table is None else str(table),
        prefix=None if prefix is None else str(prefix), backend_options=dict(options),
        lease_ms=lease_ms, heartbeat_ms=heartbeat_ms,
        history_size=history_size or DEFAULTS["HISTORY_SIZE"], history_ttl_ms=history_ttl_ms,
        instance_id=instance_id,
        stop_grace_ms=DEFAULTS["STOP_GRACE_MS"] if stop_grace_ms is None else stop_grace_ms,
        handler_threads=threads or DEFAULTS["HANDLER_THREADS"],
        job_defaults=dict(job_defaults), admin_read_only=read_only,
        admin_run_now_wait_ms=DEFAULTS["ADMIN_RUN_NOW_WAIT_MS"] if wait_ms is None else wait_ms,
        database=database, database_schedules=database_schedules,
        schedules_poll_ms=DEFAULTS["SCHEDULES_POLL_MS"] if poll_ms is None else poll_ms,
        raw=dict(raw),
    )
    try:
        built = build_backend(parsed)
    except (ConfigError, TypeError, ValueError) as exc:
        shown = mask_url(str(exc))
        problems.append(Problem("anarchon.E006", f"ANARCHON['BACKEND'] "
                                f"{mask_url(parsed.backend)!r} cannot be used: {shown}",
                                "Check the URL, TABLE/PREFIX and BACKEND_OPTIONS."))
        return None, problems
    if not built.supports_leases:
        lease_only = [o for o in LEASE_ONLY_OPTIONS if o in parsed.job_defaults]
        if lease_only:
            problems.append(Problem(
                "anarchon.E009", f"ANARCHON['JOB_DEFAULTS'] sets {', '.join(lease_only)}, "
                f"which need a lease backend; {built.describe()} only claims.",
                "Remove them or use a lease backend (PostgreSQL, SQLite, Redis 'lease')."))
    try:
        Scheduler(built, **parsed.scheduler_options())
    except ConfigError as exc:
        problems.append(Problem("anarchon.E008", f"ANARCHON scheduler settings are invalid: "
                                f"{exc}", "See LEASE_MS, HEARTBEAT_MS, HISTORY_SIZE, "
                                "HISTORY_TTL_MS, INSTANCE_ID, STOP_GRACE_MS, HANDLER_THREADS."))
    return parsed, problems


def settings_tasks() -> object:
    """``ANARCHON['TASKS']`` as written (None when ``ANARCHON`` is not a dict)."""
    raw = _raw()
    return raw.get("TASKS") if isinstance(raw, Mapping) else None


def load() -> Settings:
    """The parsed settings; :class:`ImproperlyConfigured` on the first error."""
    parsed, problems = parse()
    if problems or parsed is None:
        first = problems[0]
        hint = f" HINT: {first.hint}" if first.hint else ""
        raise ImproperlyConfigured(f"{first.msg}{hint} ({first.id}; run manage.py check "
                                   "for every problem)")
    return parsed
