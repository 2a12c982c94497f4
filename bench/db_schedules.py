"""Schedules in the database at scale: anarchon's ``Schedule`` table beside django-celery-beat.

    python -m bench.db_schedules [--rows 10000,100000] [--minutes 2] [--period 60]
                                 [--workers 3] [--smoke]
    python -m bench.db_schedules --idle [--rows 10000,100000] [--workers 3] [--smoke]

Everything runs on servers of this run's own: a PostgreSQL cluster (``initdb`` +
``pg_ctl``, :class:`chaos.servers.PostgresServer`) holding the Django project's tables
(:mod:`bench.dbproject`), and a ``redis-server`` as the beat's broker; both are stopped at
the end. For each size (``--rows``), three runs one after the other, each with every
process started afresh:

* **Schedule table**: ``--rows`` ``Schedule`` rows (``every`` one period, a no-op async
  handler registered with ``@anarchon_django.handler``) run by ``--workers`` processes
  ``manage.py anarchon`` (the runs table in the same database). The rows' ``updated_at``
  is set ten minutes back before the workers start, so the polls measured are the quiet
  ones of a table nobody has just imported.
* **code-declared**: the same count of jobs declared in code (``@anarchon_django.every``,
  the same handler), the table left out (``DATABASE_SCHEDULES`` False): what the table
  costs is the difference.
* **django-celery-beat**: one ``celery beat -S django_celery_beat.schedulers:
  DatabaseScheduler``, as its users run it, on the same count of ``PeriodicTask`` rows (a
  crontab ``* * * * *``; an interval schedule when ``--period`` is not 60), broker the
  dedicated Redis (nothing consumes the messages).

Columns:

* **start-up s**: from the process's start to its first log line saying it has every
  row: a worker's "<source>: N job(s) put" line and "worker ... running" line (the later
  of the two; code-declared workers: the running line), beat's first "beat: Waking up"
  (its first tick is over). The slowest of the workers.
* **late p50 / p99 ms**: a run's ``started_at`` minus its slot, from the runs table; for
  beat, the time of each "Sending due task" line minus the period it falls in. Over
  ``--minutes`` slots of every job (the first slot after every process is up). The
  ``× code`` column is the ratio to the code-declared run of the same size.
* **runs / due**: runs (sends) of distinct slots made against the slots due; fewer means
  slots missed or started after the run's measured window (a run is looked for up to
  the end of the next period's first half).
* **CPU s/min**: CPU seconds (user + system, all threads) of a worker per minute over
  whole periods, the mean of the workers; **idle** is the same over the quiet part of
  the last period (from its middle to just before the next slot; a burst still going on
  then shows here). **PG s/min** is the PostgreSQL server's (every backend process).
* **bytes per row**: resident memory of a worker (beat) with the rows loaded, taken just
  before the first measured slot, minus that of one with no rows, over the row count.
* **edit → live s**: ``save()`` of one row (its description) as the admin does it, to
  the log line saying the last worker (beat) has it: the "1 job(s) put" line of each
  worker; beat's first "Waking up" after its "Schedule changed." line (the reload is
  over). Median and max of three edits made in the quiet part of the last period.
* **warning lines**: WARNING and ERROR lines the processes logged (a few are printed
  under the table), e.g. a lease that expired before its run's end was recorded.

``--idle`` is the other profile: every row (and code-declared job, and ``PeriodicTask``)
on one daily cron, in UTC, twelve hours from the run's start, so nothing is due and what
is measured is the cost of holding the rows and of picking up a change. Per size and
scheduler: **start-up s** (until the first load's "N job(s) put" line has every row;
code-declared workers: the "running" line; beat: its first tick), **bytes per row** as
above, **idle CPU s/min** over :data:`IDLE_S` seconds (per process: mean and max), and
for the table **edit → live** of :data:`IDLE_EDITS` ``save()`` calls changing one row's
``kwargs``, :data:`IDLE_EDIT_SPACING_S` apart (until every worker logged the put line
naming it; median and max), then one disable and one delete (until every worker logged
the job dropped). Beat gets the same edits (of its ``description``), live at its first
tick after "Schedule changed.". About 5 minutes at 10,000 rows, 13 at 100,000.

The every-period profile takes about ``3 × (start-up + minutes + 1)`` periods per size;
with the default periods 100,000 rows may take half an hour on a 2-core machine.
``--smoke`` runs 20 rows on one worker with a 2-second period, one edit, polls every
0.5 s (about 40 s; with ``--idle``, 5 s of idle CPU); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.servers import PostgresServer, RedisServer

from .celery_beats import cpu_seconds
from .common import add_smoke_flag

ROOT = Path(__file__).resolve().parents[1]
MANAGE = ROOT / "bench" / "dbproject" / "manage.py"
HANDLER = "bench-noop"
#: Edits per run (each waits for every process to have it).
EDITS = 3
#: Bounds: a process's start-up; one edit going live; a process stopping.
START_TIMEOUT_S = 900.0
EDIT_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
_LINE = re.compile(r"^(\d+\.\d+) (\d+) (\S+) (\w+) (.*)$")
_PUT = re.compile(r"Schedule table: (\d+) job\(s\) put")
#: The log lines the bench reads; the others (a line per run) are only counted.
_KEPT = re.compile(r"job\(s\) put|^anarchon worker|^beat: Waking up|Schedule changed\.|"
                   r"Sending due task")


# ------------------------------------------------------------------ processes


@dataclass
class Proc:
    """A process of the run, its log (epoch-stamped lines) and when it was started."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float
    #: The stamped lines the bench reads (:data:`_KEPT`), as ``(time, message)``.
    kept: list[tuple[float, str]] = field(default_factory=list)
    #: WARNING and ERROR lines: how many, and the first few.
    warnings: int = 0
    samples: list[str] = field(default_factory=list)
    _offset: int = 0

    def lines(self) -> Iterator[tuple[float, str]]:
        """``(time, message)`` of the kept log lines so far (the new ones read first).

        The log is read from where the last call stopped: a worker logs a line per run
        start and end, which at 100,000 jobs is megabytes a minute.
        """
        with contextlib.suppress(FileNotFoundError), self.log.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
            end = data.rfind(b"\n") + 1
            self._offset += end
            for raw in data[:end].decode(errors="replace").splitlines():
                match = _LINE.match(raw)
                if match is None:
                    continue
                if match.group(4) in ("WARNING", "ERROR", "CRITICAL"):
                    self.warnings += 1
                    if len(self.samples) < 3:
                        self.samples.append(match.group(5)[:200])
                if _KEPT.search(match.group(5)):
                    self.kept.append((float(match.group(1)), match.group(5)))
        return iter(list(self.kept))

    def rss(self) -> int:
        """Resident memory, bytes."""
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def cpu(self) -> float:
        """CPU seconds so far (user + system, every thread)."""
        return cpu_seconds(self.popen.pid)

    def check_alive(self) -> None:
        """Stop the bench with the log's end if the process has exited."""
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise SystemExit(f"{self.name} exited with status {self.popen.returncode}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


def count_warnings(row: Row | IdleRow, procs: list[Proc]) -> None:
    """The processes' WARNING/ERROR lines, their last lines read first."""
    for proc in procs:
        proc.lines()
        row.warnings += proc.warnings
        row.samples.extend(proc.samples[:3 - len(row.samples)])


def stop_all(procs: list[Proc]) -> None:
    """SIGTERM to every process at once, then wait for each (SIGKILL when it lingers)."""
    for proc in procs:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.stop()


def spawn(name: str, command: list[str], env: dict[str, str], workdir: Path) -> Proc:
    """Start ``command`` from the repository root, its output to ``workdir/name.log``."""
    log = workdir / f"{name}.log"
    with log.open("ab") as out:
        started = time.time()
        popen = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Proc(name, popen, log, started)


class WaitTimeout(SystemExit):
    """A process did not log what was waited for in time."""


def wait_each(procs: list[Proc], found: Callable[[Proc], float | None],
              timeout: float, what: str) -> list[float]:
    """The time ``found(proc)`` gives for each process, polling its log until it does."""
    deadline = time.monotonic() + timeout
    times: dict[str, float] = {}
    while len(times) < len(procs):
        for proc in procs:
            if proc.name not in times:
                at = found(proc)
                if at is not None:
                    times[proc.name] = at
                else:
                    proc.check_alive()
        if len(times) == len(procs):
            break
        if time.monotonic() > deadline:
            missing = [p.name for p in procs if p.name not in times]
            raise WaitTimeout(f"{what}: no answer from {missing} within {timeout:.0f} s "
                              f"(logs in {procs[0].log.parent})")
        time.sleep(0.2)
    return [times[p.name] for p in procs]


def sleep_until(moment: float) -> None:
    """Sleep until the epoch time ``moment``."""
    time.sleep(max(0.0, moment - time.time()))


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid``, of its children it has waited for and of the live ones.

    PostgreSQL's backends: a Django connection closed after each poll ends its backend,
    whose CPU then counts in the postmaster's ``cutime``/``cstime``.
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                total += cpu_seconds(int(stat.parent.name))
    return total


# ------------------------------------------------------------------ the project


def crontab_path(workdir: Path) -> str | None:
    """A directory holding python-crontab's ``crontab`` module, to put first on the path.

    django-celery-beat imports python-crontab's ``crontab.py``; parse-crontab (which
    django-tasks-rq brings through rq-scheduler) installs a ``crontab`` package in the
    same directory, and a package wins over a module. None when nothing is shadowed.
    """
    import importlib.metadata  # noqa: PLC0415
    import importlib.util  # noqa: PLC0415

    try:
        module = Path(str(importlib.metadata.distribution("python-crontab")
                          .locate_file("crontab.py")))
    except importlib.metadata.PackageNotFoundError:
        return None
    found = importlib.util.find_spec("crontab")
    if not module.exists() or found is None or found.origin == str(module):
        return None
    shim = workdir / "python-crontab"
    shim.mkdir(exist_ok=True)
    (shim / "crontab.py").symlink_to(module)
    return str(shim)



@dataclass
class Project:
    """The Django project on the dedicated servers: environment, rows, runs table."""

    pg: PostgresServer
    broker: str
    period: int
    workdir: Path
    #: Put first on the path of the bench and its processes (see :func:`crontab_path`).
    first_path: str | None = None
    #: Edits per run; the workers' poll interval and beat's longest sleep (None: defaults).
    edits: int = EDITS
    poll_ms: int | None = None
    beat_max_loop_s: int | None = None
    #: Seconds a process is left to settle after start-up before it is measured.
    settle_s: float = 3.0
    #: The rows' (and code jobs') cron expression, in UTC; empty: every ``period``.
    cron: str = ""

    def env(self, *, db_schedules: bool = True, code_jobs: int = 0) -> dict[str, str]:
        """The environment of a worker or a beat."""
        return dict(os.environ, BENCH_DATABASE_URL=self.pg.url, BENCH_BROKER=self.broker,
                    BENCH_PERIOD_S=str(self.period),
                    BENCH_DATABASE_SCHEDULES="1" if db_schedules else "0",
                    BENCH_CODE_JOBS=str(code_jobs), BENCH_CODE_CRON=self.cron,
                    BENCH_POLL_MS=str(self.poll_ms or ""),
                    BENCH_BEAT_MAX_LOOP_S=str(self.beat_max_loop_s or ""),
                    DJANGO_SETTINGS_MODULE=
                    "bench.dbproject.settings", PYTHONUNBUFFERED="1",
                    PYTHONPATH=os.pathsep.join(p for p in (self.first_path, str(ROOT)) if p))

    def setup(self) -> None:
        """Django in this process, on the dedicated database; migrate."""
        os.environ.update(BENCH_DATABASE_URL=self.pg.url, BENCH_BROKER=self.broker,
                          DJANGO_SETTINGS_MODULE="bench.dbproject.settings")
        if self.first_path:
            sys.path.insert(0, self.first_path)
        import django  # noqa: PLC0415 - configured for the server started above
        from django.core.management import call_command  # noqa: PLC0415

        django.setup()
        call_command("migrate", verbosity=0)

    def seed_schedules(self, rows: int) -> None:
        """``rows`` Schedule rows, their ``updated_at`` ten minutes back."""
        from datetime import timedelta  # noqa: PLC0415

        from django.utils import timezone  # noqa: PLC0415

        from anarchon_django.models import Schedule  # noqa: PLC0415

        Schedule.objects.all().delete()
        Schedule.objects.bulk_create(
            (Schedule(name=f"db-{i:06d}", target_kind="handler", target=HANDLER,
                      every="" if self.cron else f"{self.period}s", cron=self.cron,
                      tz="UTC" if self.cron else "") for i in range(rows)), batch_size=5000)
        Schedule.objects.update(updated_at=timezone.now() - timedelta(minutes=10))

    def seed_periodic_tasks(self, rows: int) -> None:
        """``rows`` PeriodicTask rows on one crontab (an interval unless a minute)."""
        from django_celery_beat.models import (  # type: ignore[import-untyped]  # noqa: PLC0415
            CrontabSchedule,
            IntervalSchedule,
            PeriodicTask,
            PeriodicTasks,
        )

        timing: dict[str, Any]
        if self.cron:
            minute, hour, day_of_month, month_of_year, day_of_week = self.cron.split()
            timing = {"crontab": CrontabSchedule.objects.get_or_create(
                minute=minute, hour=hour, day_of_week=day_of_week,
                day_of_month=day_of_month, month_of_year=month_of_year,
                timezone="UTC")[0]}
        elif self.period == 60:
            timing = {"crontab": CrontabSchedule.objects.get_or_create(
                minute="*", hour="*", day_of_week="*", day_of_month="*",
                month_of_year="*", timezone="UTC")[0]}
        else:
            timing = {"interval": IntervalSchedule.objects.get_or_create(
                every=self.period, period=IntervalSchedule.SECONDS)[0]}
        PeriodicTask.objects.bulk_create(
            (PeriodicTask(name=f"beat-{i:06d}", task="bench.noop", **timing)
             for i in range(rows)), batch_size=5000)
        PeriodicTasks.update_changed()

    def clear(self) -> None:
        """No rows of either kind."""
        from django.db import connection  # noqa: PLC0415
        from django_celery_beat.models import (  # noqa: PLC0415
            PeriodicTask,
            PeriodicTasks,
        )

        from anarchon_django.models import Schedule  # noqa: PLC0415

        Schedule.objects.all().delete()
        # One statement: the ORM's delete() would run django-celery-beat's signal handlers
        # (a query or two) once per row.
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {PeriodicTask._meta.db_table}")
        PeriodicTasks.update_changed()

    def edit_schedule(self, index: int, text: str) -> float:
        """Save one Schedule row as the admin does; the time just before."""
        from anarchon_django.models import Schedule  # noqa: PLC0415

        row = Schedule.objects.get(name=f"db-{index:06d}")
        row.description = text
        at = time.time()
        row.save()
        return at

    def change_schedule(self, index: int, change: str) -> float:
        """``change`` one Schedule row as the admin does (``kwargs``: a new ``kwargs``,
        ``disable``, ``delete``); the time just before the write."""
        from anarchon_django.models import Schedule  # noqa: PLC0415

        row = Schedule.objects.get(name=f"db-{index:06d}")
        if change == "kwargs":
            row.kwargs = {"edit": time.time()}
        elif change == "disable":
            row.enabled = False
        at = time.time()
        if change == "delete":
            row.delete()
        else:
            row.save()
        return at

    def edit_periodic_task(self, index: int, text: str) -> float:
        """Save one PeriodicTask as the admin does; the time just before."""
        from django_celery_beat.models import (  # noqa: PLC0415
            PeriodicTask,
        )

        row = PeriodicTask.objects.get(name=f"beat-{index:06d}")
        row.description = text
        at = time.time()
        row.save()
        return at

    def lateness(self, prefix: str, lo_ms: int, hi_ms: int) -> tuple[list[float], int]:
        """Start lateness (ms) of the scheduled runs of jobs ``prefix*`` due in [lo, hi),
        and the count of distinct slots run."""
        from django.db import connection  # noqa: PLC0415

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT job, slot, MIN(started_at) - slot FROM anarchon_runs WHERE job LIKE "
                "%s AND manual = 0 AND slot >= %s AND slot < %s AND started_at IS NOT NULL "
                "GROUP BY job, slot", [f"{prefix}%", lo_ms, hi_ms])
            found = cursor.fetchall()
        return sorted(float(late) for _, _, late in found), len(found)


# ------------------------------------------------------------------ one run


@dataclass
class Row:
    """One line of the table."""

    rows: int
    label: str
    startup_s: float = math.nan
    late_ms: list[float] = field(default_factory=list)
    made: int = 0
    due: int = 0
    cpu_per_min: float = math.nan
    idle_per_min: float = math.nan
    pg_per_min: float = math.nan
    rss: float = math.nan
    edits_s: list[float] = field(default_factory=list)
    warnings: int = 0
    samples: list[str] = field(default_factory=list)

    def pct(self, q: float) -> float:
        """The ``q`` quantile of lateness (nan without runs)."""
        ordered = self.late_ms
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else math.nan


@dataclass
class Window:
    """The measured slots of a run and the CPU read across them."""

    lo: float
    period: int
    minutes: int

    @property
    def hi(self) -> float:
        return self.lo + self.minutes * self.period

    @classmethod
    def after(cls, ready: float, period: int, minutes: int) -> Window:
        """The first slot at least half a period after ``ready``."""
        return cls(math.ceil((ready + period / 2) / period) * period, period, minutes)


def measure(procs: list[Proc], pg_pid: int, window: Window, row: Row,  # noqa: PLR0917
            edits: int, edit: Callable[[int], float] | None,
            live: Callable[[Proc, float, int], float | None]) -> float:
    """CPU over the window's whole periods, idle CPU, RSS before the window; ``edit(n)``
    (if given) ``edits`` times, each until ``live(proc, edited_at, n)`` says when every
    process had it.

    Returns the RSS per process before the first slot (mean).
    """
    period = window.period
    sleep_until(window.lo - period / 2 - 0.5)
    rss = statistics.mean(p.rss() for p in procs)
    sleep_until(window.lo - period / 2)
    cpu0, pg0, t0 = [p.cpu() for p in procs], tree_cpu(pg_pid), time.time()
    sleep_until(window.hi - period / 2)
    cpu1, pg1, t1 = [p.cpu() for p in procs], tree_cpu(pg_pid), time.time()
    quiet_end = window.hi - period * 0.2
    sleep_until(quiet_end)
    cpu2, t2 = [p.cpu() for p in procs], time.time()
    row.cpu_per_min = statistics.mean(b - a for a, b in zip(cpu0, cpu1, strict=True)) \
        / (t1 - t0) * 60
    row.pg_per_min = (pg1 - pg0) / (t1 - t0) * 60
    row.idle_per_min = statistics.mean(b - a for a, b in zip(cpu1, cpu2, strict=True)) \
        / (t2 - t1) * 60
    if edit is None:
        return rss
    for n in range(edits):
        at = edit(n)
        try:
            seen = wait_each(procs, functools.partial(_live_after, live, at, n),
                             EDIT_TIMEOUT_S, "edit → live")
        except WaitTimeout:  # the table says so; the other columns are still measured
            row.edits_s.append(math.inf)
            break
        row.edits_s.append(max(seen) - at)
        time.sleep(0.3)
    return rss


def _live_after(live: Callable[[Proc, float, int], float | None], at: float, n: int,
                proc: Proc) -> float | None:
    return live(proc, at, n)


def anarchon_run(project: Project, rows: int, workers: int, minutes: int, *,
                 code: bool, empty_rss: float) -> Row:
    """``workers`` ``manage.py anarchon`` processes on the table's rows (or code jobs)."""
    label = "anarchon: code-declared jobs" if code else "anarchon: Schedule table"
    row = Row(rows, f"{label} ({workers} worker{'s' if workers > 1 else ''})")
    prefix = "code-" if code else "db-"
    env = project.env(db_schedules=not code, code_jobs=rows if code else 0)
    if not code:
        project.seed_schedules(rows)
    tag = "code" if code else "table"
    procs = [spawn(f"{tag}-{rows}-w{i}", [sys.executable, str(MANAGE), "anarchon"], env,
                   project.workdir) for i in range(workers)]
    try:
        ready = wait_each(procs, lambda p: loaded_at(p, None if code else rows),
                          START_TIMEOUT_S, f"{label} start-up")
        row.startup_s = max(at - p.started for at, p in zip(ready, procs, strict=True))
        window = Window.after(max(ready) + project.settle_s, project.period, minutes)

        def live(proc: Proc, at: float, n: int) -> float | None:
            return next((t for t, msg in proc.lines() if t >= at and
                         f"1 job(s) put (db-{n:06d})" in msg), None)

        def edit(n: int) -> float:
            return project.edit_schedule(n, f"edit {n}")

        # Jobs declared in code have nothing to edit: no edit column for them.
        rss = measure(procs, project.pg.pid() or 0, window, row, project.edits,
                      None if code else edit, live)
        sleep_until(window.hi + project.period / 2)  # late runs of the last slot start
        row.rss = (rss - empty_rss) / rows
        row.late_ms, row.made = project.lateness(prefix, int(window.lo * 1000),
                                                 int(window.hi * 1000))
        row.due = rows * minutes
    finally:
        stop_all(procs)
        count_warnings(row, procs)
    if not code:
        project.clear()
    return row


def loaded_at(proc: Proc, rows: int | None) -> float | None:
    """When the worker had every row (``rows``, None: code only) and was running."""
    put, total, running = None, 0, None
    for at, msg in proc.lines():
        match = _PUT.search(msg)
        if match and put is None:
            total += int(match.group(1))
            if total >= (rows or 0):
                put = at
        if running is None and msg.startswith("anarchon worker") and " running " in msg:
            running = at
    if running is None or (rows and put is None):
        return None
    return max(running, put or running)


def beat_command(project: Project) -> list[str]:
    """``celery beat`` with the DatabaseScheduler, as its users run it."""
    return [sys.executable, "-m", "celery", "-A", "bench.dbproject.celeryapp", "beat",
            "-S", "django_celery_beat.schedulers:DatabaseScheduler", "-l", "info",
            "--pidfile=", "-s", str(project.workdir / "celerybeat-schedule")]


def first_wake_up(proc: Proc, after: float = 0.0, changed: bool = False) -> float | None:
    """The first line of beat's loop after ``after`` (and after "Schedule changed.").

    A "Waking up" line ends a tick with nothing due; a beat that is behind never sleeps,
    and its next "Sending due task" line says the tick that (re)loaded is over.
    """
    seen_change = not changed
    for at, msg in proc.lines():
        if at < after:
            continue
        if "Schedule changed." in msg:
            seen_change = True
        elif seen_change and (msg.startswith("beat: Waking up") or "Sending due task" in msg):
            return at
    return None


def beat_run(project: Project, rows: int, minutes: int, *, empty_rss: float) -> Row:
    """One django-celery-beat on ``rows`` PeriodicTask rows."""
    row = Row(rows, "django-celery-beat DatabaseScheduler (1 beat)")
    project.seed_periodic_tasks(rows)
    proc = spawn(f"beat-{rows}", beat_command(project), project.env(db_schedules=False),
                 project.workdir)
    try:
        (ready,) = wait_each([proc], first_wake_up, START_TIMEOUT_S, "beat start-up")
        row.startup_s = ready - proc.started
        window = Window.after(ready + project.settle_s, project.period, minutes)
        rss = measure([proc], project.pg.pid() or 0, window, row, project.edits,
                      lambda n: project.edit_periodic_task(n, f"edit {n}"),
                      lambda p, at, n: first_wake_up(p, at, changed=True))
        row.rss = (rss - empty_rss) / rows
        row.late_ms, row.made = beat_lateness(proc, window)
        row.due = rows * minutes
    finally:
        proc.stop()
        count_warnings(row, [proc])
    project.clear()
    return row


def beat_lateness(proc: Proc, window: Window) -> tuple[list[float], int]:
    """Lateness (ms) of each send of a period in the window, and distinct sends."""
    sends: dict[tuple[str, int], float] = {}
    pattern = re.compile(r"Sending due task (\S+) ")
    for at, msg in proc.lines():
        match = pattern.search(msg)
        if match is None:
            continue
        # Half a second of tolerance: a send a little early belongs to the coming slot.
        slot = int((at + 0.5) // window.period * window.period)
        if window.lo <= slot < window.hi:
            sends.setdefault((match.group(1), slot), (at - slot) * 1000)
    return sorted(sends.values()), len(sends)


def empty_rss(project: Project) -> tuple[float, float]:
    """RSS of one worker and of one beat with no rows, a few seconds after start-up."""
    project.clear()
    worker = spawn("empty-worker", [sys.executable, str(MANAGE), "anarchon"], project.env(),
                   project.workdir)
    beat = spawn("empty-beat", beat_command(project), project.env(db_schedules=False),
                 project.workdir)
    try:
        wait_each([worker], lambda p: loaded_at(p, None), START_TIMEOUT_S, "empty worker")
        wait_each([beat], first_wake_up, START_TIMEOUT_S, "empty beat")
        time.sleep(project.settle_s)
        return worker.rss(), beat.rss()
    finally:
        stop_all([worker, beat])


# ------------------------------------------------------------------ the idle profile

#: ``--idle``: seconds of idle CPU measured; edits of ``kwargs`` and the seconds between
#: their starts.
IDLE_S = 60.0
IDLE_EDITS = 5
IDLE_EDIT_SPACING_S = 5.0
_DROPPED = re.compile(r"Schedule table: \d+ job\(s\) put.*, [1-9]\d* dropped")


@dataclass
class IdleRow:
    """One line of the ``--idle`` table."""

    rows: int
    label: str
    startup_s: float = math.nan
    rss: float = math.nan
    #: CPU seconds per minute of each process over the idle window.
    idle: list[float] = field(default_factory=list)
    edits_s: list[float] = field(default_factory=list)
    disable_s: float = math.nan
    delete_s: float = math.nan
    warnings: int = 0
    samples: list[str] = field(default_factory=list)


def daily_cron(now: float) -> str:
    """A daily cron (UTC) twelve hours from ``now``: nothing is due during the run."""
    return f"0 {(time.gmtime(now).tm_hour + 12) % 24} * * *"


def put_at(proc: Proc, rows: int) -> float | None:
    """When the worker's "N job(s) put" lines of its first load reached ``rows`` jobs."""
    total = 0
    for at, msg in proc.lines():
        match = _PUT.search(msg)
        if match:
            total += int(match.group(1))
            if total >= rows:
                return at
    return None


def idle_cpu(procs: list[Proc], seconds: float) -> list[float]:
    """CPU seconds per minute of each process over the next ``seconds``."""
    cpu0, t0 = [p.cpu() for p in procs], time.time()
    time.sleep(seconds)
    cpu1, t1 = [p.cpu() for p in procs], time.time()
    return [(b - a) / (t1 - t0) * 60 for a, b in zip(cpu0, cpu1, strict=True)]


def timed_changes(procs: list[Proc], count: int, change: Callable[[int], float],
                  live: Callable[[Proc, float, int], float | None]) -> list[float]:
    """``change(n)`` ``count`` times, :data:`IDLE_EDIT_SPACING_S` apart (or as soon as the
    last went live), each until ``live`` says every process has it: the seconds each took.

    An edit not live within :data:`EDIT_TIMEOUT_S` ends the list with ``inf``.
    """
    took: list[float] = []
    for n in range(count):
        begun = time.time()
        at = change(n)
        try:
            seen = wait_each(procs, functools.partial(_live_after, live, at, n),
                             EDIT_TIMEOUT_S, "edit → live")
        except WaitTimeout:
            took.append(math.inf)
            break
        took.append(max(seen) - at)
        sleep_until(begun + IDLE_EDIT_SPACING_S)
    return took


def idle_anarchon(project: Project, rows: int, workers: int, *, code: bool,
                  empty_rss: float, idle_s: float, edits: int) -> IdleRow:
    """``workers`` workers on ``rows`` not-due rows (or code jobs): start-up, RSS, idle CPU;
    for the table, ``edits`` edits of ``kwargs``, a disable and a delete."""
    label = "anarchon: code-declared jobs" if code else "anarchon: Schedule table"
    row = IdleRow(rows, f"{label} ({workers} worker{'s' if workers > 1 else ''})")
    env = project.env(db_schedules=not code, code_jobs=rows if code else 0)
    if not code:
        project.seed_schedules(rows)
    tag = "idle-code" if code else "idle-table"
    procs = [spawn(f"{tag}-{rows}-w{i}", [sys.executable, str(MANAGE), "anarchon"], env,
                   project.workdir) for i in range(workers)]
    try:
        wait_each(procs, lambda p: loaded_at(p, None if code else rows), START_TIMEOUT_S,
                  f"{label} start-up")
        # Start-up ends at the first load's put line (code-declared: the running line).
        ends = [loaded_at(p, None) if code else put_at(p, rows) for p in procs]
        row.startup_s = max((at or math.nan) - p.started
                            for at, p in zip(ends, procs, strict=True))
        time.sleep(project.settle_s)
        row.rss = (statistics.mean(p.rss() for p in procs) - empty_rss) / rows
        row.idle = idle_cpu(procs, idle_s)
        if not code:
            def put_line(proc: Proc, at: float, n: int) -> float | None:
                return next((t for t, msg in proc.lines() if t >= at and
                             f"1 job(s) put (db-{n:06d})" in msg), None)

            def dropped(proc: Proc, at: float, _: int) -> float | None:
                return next((t for t, msg in proc.lines() if t >= at and _DROPPED.search(msg)),
                            None)

            row.edits_s = timed_changes(procs, edits, functools.partial(
                _change, project, 0, "kwargs"), put_line)
            (row.disable_s,) = timed_changes(procs, 1, functools.partial(
                _change, project, edits, "disable"), dropped)
            (row.delete_s,) = timed_changes(procs, 1, functools.partial(
                _change, project, edits + 1, "delete"), dropped)
    finally:
        stop_all(procs)
        count_warnings(row, procs)
    if not code:
        project.clear()
    return row


def _change(project: Project, first: int, change: str, n: int) -> float:
    return project.change_schedule(first + n, change)


def idle_beat(project: Project, rows: int, *, empty_rss: float, idle_s: float,
              edits: int) -> IdleRow:
    """One django-celery-beat on ``rows`` not-due PeriodicTask rows."""
    row = IdleRow(rows, "django-celery-beat DatabaseScheduler (1 beat)")
    project.seed_periodic_tasks(rows)
    proc = spawn(f"idle-beat-{rows}", beat_command(project), project.env(db_schedules=False),
                 project.workdir)
    try:
        (ready,) = wait_each([proc], first_wake_up, START_TIMEOUT_S, "beat start-up")
        row.startup_s = ready - proc.started
        time.sleep(project.settle_s)
        row.rss = (proc.rss() - empty_rss) / rows
        row.idle = idle_cpu([proc], idle_s)
        row.edits_s = timed_changes(
            [proc], edits, lambda n: project.edit_periodic_task(n, f"edit {n}"),
            lambda p, at, n: first_wake_up(p, at, changed=True))
    finally:
        proc.stop()
        count_warnings(row, [proc])
    project.clear()
    return row


def _seconds(values: list[float]) -> str:
    if not values:
        return "-"
    if math.isinf(values[-1]):
        return f"not live after {EDIT_TIMEOUT_S:.0f} s"
    return f"{statistics.median(values):.2f} / {max(values):.2f}"


def _one(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"not live after {EDIT_TIMEOUT_S:.0f} s" if math.isinf(value) else f"{value:.2f}"


def print_idle_table(rows: list[IdleRow], args: argparse.Namespace, cron: str,
                     idle_s: float, edits: int) -> None:
    """The ``--idle`` markdown table."""
    print(f"\n{args.workers} anarchon workers (manage.py anarchon) or 1 celery beat; every "
          f"row on the daily cron {cron!r} (UTC, not due during the run); idle CPU over "
          f"{idle_s:.0f} s; {edits} edits {IDLE_EDIT_SPACING_S:.0f} s apart; dedicated "
          f"PostgreSQL and Redis; {os.cpu_count()} CPUs\n")
    print("| rows | scheduler | start-up s | bytes per row | idle CPU s/min per process "
          "(mean / max) | edit → live s (median / max) | disable → live s | "
          "delete → live s | warning lines |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        idle = (f"{statistics.mean(r.idle):.3f} / {max(r.idle):.3f}" if r.idle else "-")
        print(f"| {r.rows:,} | {r.label} | {r.startup_s:.1f} | {_fmt(r.rss)} | {idle} | "
              f"{_seconds(r.edits_s)} | {_one(r.disable_s)} | {_one(r.delete_s)} | "
              f"{r.warnings:,} |")
    for r in rows:
        for sample in r.samples:
            print(f"  {r.rows:,} rows, {r.label}, a warning line: {sample}")


# ------------------------------------------------------------------ the table


def _fmt(value: float, spec: str = ",.0f") -> str:
    return "-" if math.isnan(value) else format(value, spec)


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    """The markdown table, then what it rests on."""
    print(f"\n{args.workers} anarchon workers (manage.py anarchon) or 1 celery beat; jobs "
          f"every {args.period} s, {args.minutes} slots measured each; dedicated "
          f"PostgreSQL and Redis; {os.cpu_count()} CPUs\n")
    print("| rows | scheduler | start-up s | late p50 / p99 ms | × code p50 / p99 | "
          "runs / due | CPU s/min per process (all / idle) | PG s/min | bytes per row | "
          "edit → live s (median / max) | warning lines |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    code = {r.rows: r for r in rows if "code-declared" in r.label}
    for r in rows:
        base = code.get(r.rows)
        p50, p99 = r.pct(0.5), r.pct(0.99)
        ratio = "-"
        if base is not None and base.late_ms and r.late_ms:
            ratio = (f"{p50 / base.pct(0.5) if base.pct(0.5) else math.nan:.2f} / "
                     f"{p99 / base.pct(0.99) if base.pct(0.99) else math.nan:.2f}")
        edits = "-"
        if r.edits_s and math.isinf(r.edits_s[-1]):
            edits = f"not live after {EDIT_TIMEOUT_S:.0f} s"
        elif r.edits_s:
            edits = f"{statistics.median(r.edits_s):.2f} / {max(r.edits_s):.2f}"
        print(f"| {r.rows:,} | {r.label} | {r.startup_s:.1f} | {_fmt(p50)} / {_fmt(p99)} | "
              f"{ratio} | {r.made:,} / {r.due:,} | {_fmt(r.cpu_per_min, '.2f')} / "
              f"{_fmt(r.idle_per_min, '.2f')} | {_fmt(r.pg_per_min, '.2f')} | "
              f"{_fmt(r.rss)} | {edits} | {r.warnings:,} |")
    for r in rows:
        for sample in r.samples:
            print(f"  {r.rows:,} rows, {r.label}, a warning line: {sample}")
        if r.made < r.due:
            print(f"  {r.rows:,} rows, {r.label}: {r.due - r.made:,} of {r.due:,} slots not "
                  f"run (or not started within their window)")


_T0 = time.monotonic()


def progress(text: str) -> None:
    """A progress line on stderr, with the seconds since the command started."""
    print(f"[{time.monotonic() - _T0:6.1f} s] {text}", file=sys.stderr, flush=True)


def parse_rows(text: str) -> list[int]:
    """``10000,100000`` as a list of counts."""
    try:
        counts = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 10000,100000, got {text!r}"
                                         ) from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("every count must be at least 1")
    return counts


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m bench.db_schedules``."""
    parser = argparse.ArgumentParser(prog="python -m bench.db_schedules",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=parse_rows, default=[10_000, 100_000],
                        help="row counts, comma-separated (default 10000,100000)")
    parser.add_argument("--minutes", type=int, default=2,
                        help="slots measured per run (default 2)")
    parser.add_argument("--period", type=int, default=60,
                        help="seconds between slots (default 60: every minute, a crontab "
                             "for beat; shorter for a fast try)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--idle", action="store_true",
                        help="the idle profile: rows on a daily cron not due during the run; "
                             "start-up, memory, idle CPU, edit/disable/delete → live")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.idle:
        idle_main(args)
        return
    # SIGTERM stops the run as Ctrl-C does: workers, beat and servers stopped by PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.smoke:
        args.rows, args.minutes, args.period, args.workers = [20], 1, 2, 1
    if min(args.minutes, args.period, args.workers) < 1:
        parser.error("--minutes, --period and --workers must be at least 1")
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-dbschedules-") as tmp:
        workdir = Path(tmp)
        out: list[Row] = []
        pg = PostgresServer(workdir / "pg")
        redis = RedisServer(workdir / "redis", durable=False)
        try:
            pg.start()
            redis.start()
            project = Project(pg, redis.redis_url, args.period, workdir,
                              crontab_path(workdir))
            if args.smoke:  # one edit, polled fast: the smoke's figures mean nothing
                project.edits, project.poll_ms, project.beat_max_loop_s = 1, 500, 1
                project.settle_s = 0.5
            project.setup()
            progress("servers up, migrated; empty worker and beat")
            worker_empty, beat_empty = empty_rss(project)
            for rows in args.rows:
                progress(f"{rows:,} rows: Schedule table")
                out.append(anarchon_run(project, rows, args.workers, args.minutes, code=False,
                                        empty_rss=worker_empty))
                progress(f"{rows:,} rows: code-declared")
                out.append(anarchon_run(project, rows, args.workers, args.minutes, code=True,
                                        empty_rss=worker_empty))
                progress(f"{rows:,} rows: django-celery-beat")
                out.append(beat_run(project, rows, args.minutes, empty_rss=beat_empty))
        except BaseException:
            if out:  # what was measured before the failure
                print_table(out, args)
            raise
        finally:
            if "django.db" in sys.modules:
                from django.db import connections  # noqa: PLC0415

                with contextlib.suppress(Exception):
                    connections.close_all()
            redis.stop()
            pg.stop()
    print_table(out, args)


def idle_main(args: argparse.Namespace) -> None:
    """``--idle``: each size on the Schedule table, code-declared jobs, and beat."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    idle_s, edits = IDLE_S, IDLE_EDITS
    if args.smoke:
        args.rows, args.workers, idle_s, edits = [20], 1, 5.0, 1
    if args.workers < 1:
        raise SystemExit("--workers must be at least 1")
    cron = daily_cron(time.time())
    out: list[IdleRow] = []
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-dbschedules-idle-") as tmp:
        workdir = Path(tmp)
        pg = PostgresServer(workdir / "pg")
        redis = RedisServer(workdir / "redis", durable=False)
        try:
            pg.start()
            redis.start()
            project = Project(pg, redis.redis_url, args.period, workdir,
                              crontab_path(workdir), cron=cron)
            if args.smoke:
                project.poll_ms, project.beat_max_loop_s, project.settle_s = 500, 1, 0.5
            project.setup()
            progress(f"servers up, migrated; rows on {cron!r}; empty worker and beat")
            worker_empty, beat_empty = empty_rss(project)
            for rows in args.rows:
                progress(f"{rows:,} rows: Schedule table")
                out.append(idle_anarchon(project, rows, args.workers, code=False,
                                         empty_rss=worker_empty, idle_s=idle_s, edits=edits))
                progress(f"{rows:,} rows: code-declared")
                out.append(idle_anarchon(project, rows, args.workers, code=True,
                                         empty_rss=worker_empty, idle_s=idle_s, edits=edits))
                progress(f"{rows:,} rows: django-celery-beat")
                out.append(idle_beat(project, rows, empty_rss=beat_empty, idle_s=idle_s,
                                     edits=edits))
        except BaseException:
            if out:
                print_idle_table(out, args, cron, idle_s, edits)
            raise
        finally:
            if "django.db" in sys.modules:
                from django.db import connections  # noqa: PLC0415

                with contextlib.suppress(Exception):
                    connections.close_all()
            redis.stop()
            pg.stop()
    print_idle_table(out, args, cron, idle_s, edits)


if __name__ == "__main__":
    main()
