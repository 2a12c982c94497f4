"""``python manage.py anarchon``: the scheduler worker; ``jobs``, ``history``, ``run``, ``check``.

``import-celery-beat`` copies django-celery-beat's periodic tasks into the Schedule table
(exit status 1 when a task was refused or could not be written).

Without a subcommand it runs the worker until SIGTERM or SIGINT, then stops gracefully
(handlers are asked to stop, unfinished runs are handed over to the other instances).
Exit status: 0 on success; 1 when a store or a job failed (``run`` exits 1 unless the run
succeeded); 2 for a usage error, an unknown job, or a bad configuration (settings the
system checks refuse, a job the settings refuse): one line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from anarchon_core import (
    AnarchonError,
    ConfigError,
    Run,
    Scheduler,
    StoreError,
    StoreFormatError,
    StoreNotSetUp,
    StoreUnavailable,
    UnsupportedStrategyError,
    mask_url,
)
from anarchon_core.cli.history import add_history_options, format_history, read_history
from anarchon_core.cli.main import add_log_format_option, add_metrics_options, seconds_arg
from anarchon_core.lifecycle import serve
from anarchon_core.logjson import install_log_handler

from ... import celerybeat, conf, registry, runtime
from ...views import local, store_error

log = logging.getLogger("anarchon.django")
T = TypeVar("T")
#: Exit statuses: a store or a job failed; a usage error or a bad configuration.
EXIT_FAILED, EXIT_USAGE = 1, 2


_seconds = seconds_arg


def configuration_error(exc: BaseException) -> CommandError:
    """A bad setting or a refused job as one line (secrets masked), exit status 2."""
    text = mask_url(" ".join(str(exc).split()) or type(exc).__name__)
    return CommandError(f"configuration: {text}", returncode=EXIT_USAGE)


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in the environment or the password database
        return "unknown user"


def _when(run: Run | None) -> str:
    moment = local(run.scheduled_at) if run is not None else None
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


class Command(BaseCommand):
    """Run the anarchon worker, or inspect and run the project's jobs."""

    help = ("Run the anarchon scheduler worker (no subcommand), or: jobs, history [JOB], "
            "run JOB, check, import-celery-beat.")
    # `check` runs them; the worker must start fast. (Django reads it per instance.)
    requires_system_checks = []  # noqa: RUF012

    def add_arguments(self, parser: CommandParser) -> None:
        """The subcommands; the worker takes no arguments."""
        sub = parser.add_subparsers(dest="subcommand",
                                    metavar="{jobs,history,run,check,import-celery-beat}")
        sub.add_parser("jobs", help="the declared jobs: schedule, next run, last result")
        history = sub.add_parser("history", help="runs, newest first (times in UTC)")
        add_history_options(history)
        run = sub.add_parser("run", help="run a job now in this process (exit 0 if it "
                             "succeeded)")
        run.add_argument("job")
        sub.add_parser("check", help="settings, store reachable, store format")
        for p in (parser, *sub.choices.values()):
            p.add_argument("--timeout", type=_seconds, default=30.0,
                           help="seconds to wait for the store (default 30)")
        beat = sub.add_parser("import-celery-beat", help="copy django-celery-beat's periodic "
                              "tasks into the Schedule table, with a report per task")
        beat.add_argument("--dry-run", action="store_true",
                          help="write nothing, print the same report")
        beat.add_argument("--disabled", action="store_true",
                          help="import every task disabled (enable them once celery beat "
                          "is stopped)")
        add_log_format_option(parser)
        add_metrics_options(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        """Dispatch to the subcommand."""
        command = options.get("subcommand")
        handlers: dict[str | None, Callable[[dict[str, Any]], None]] = {
            None: self.worker, "jobs": self.jobs, "history": self.history, "run": self.run,
            "check": self.check_store, "import-celery-beat": self.import_celery_beat,
        }
        try:
            handlers[command](options)
        except (ImproperlyConfigured, ConfigError) as exc:
            # The settings or a job declaration: what ``manage.py check`` reports, shown
            # here as a usage error instead of a traceback.
            raise configuration_error(exc) from exc

    # ------------------------------------------------------------------ helpers

    def _read(self, options: dict[str, Any],
              work: Callable[[Scheduler], Awaitable[T]]) -> T:
        """Run ``work`` on a fresh read-only reader, bounded by ``--timeout``."""
        reader = runtime.build_scheduler(read_only=True)
        timeout = options["timeout"]

        async def go() -> T:
            try:
                return await asyncio.wait_for(work(reader), timeout)
            except TimeoutError:
                raise StoreUnavailable(f"no answer from {reader.backend.describe()} within "
                                       f"{timeout:g} s (--timeout sets the limit)") from None
            finally:
                try:
                    await asyncio.wait_for(reader.stop(), 5)
                except Exception:  # closing must not hide the real error
                    log.debug("closing the reader failed", exc_info=True)

        return asyncio.run(go())

    # ------------------------------------------------------------------ subcommands

    def jobs(self, options: dict[str, Any]) -> None:
        """The declared jobs with their schedule, next run and last result."""
        scheduler = runtime.build_scheduler()
        jobs = scheduler.jobs()
        last: dict[str, Run | None] = {}
        failure: str | None = None
        try:
            last = self._read(options, lambda r: r.job_names())
        except (AnarchonError, OSError) as exc:  # no store there too: the jobs, then why
            failure = store_error(exc)
        zone = timezone.get_current_timezone_name()
        self.stdout.write(f"{'job':<24} {'schedule':<34} {'next run (' + zone + ')':<26} "
                          "last result")
        for job in jobs:
            run = last.get(job.name)
            result = (f"{run.status} {_when(run)} on {run.runner}" if run is not None
                      else "?" if failure else "never ran")
            when = local(job.next_run_at)
            self.stdout.write(f"{job.name:<24} {job.schedule:<34} "
                              f"{when.strftime('%Y-%m-%d %H:%M:%S') if when else '':<26} "
                              f"{result}")
        if not jobs:
            self.stdout.write("(no jobs declared: add @anarchon_django.every/cron in an "
                              "app's jobs.py)")
        if failure:
            raise CommandError(f"could not read the last results: {failure}",
                               returncode=EXIT_FAILED)

    def history(self, options: dict[str, Any]) -> None:
        """Runs newest first, optionally of one job, status or runner."""
        job, limit = options.get("job"), options["limit"]
        try:
            answer = self._read(options, lambda r: read_history(
                r, job, limit, status=options.get("status"), runner=options.get("runner")))
        except (AnarchonError, OSError) as exc:
            raise CommandError(f"could not read history: {store_error(exc)}",
                               returncode=EXIT_FAILED) from exc
        if answer.unknown:
            raise CommandError(answer.message, returncode=EXIT_USAGE)
        self.stdout.write(answer.text())

    def run(self, options: dict[str, Any]) -> None:
        """Run a job now in this process; exit status 0 only if it succeeded."""
        name = options["job"]
        scheduler = runtime.build_scheduler()
        if name not in {j.name for j in scheduler.jobs()}:
            known = ", ".join(sorted(d.name for d in registry.declarations())) or "none"
            raise CommandError(f"unknown job {name!r}; declared: {known}",
                               returncode=EXIT_USAGE)

        async def go() -> Run:
            try:
                return await scheduler.run_now(name)
            finally:
                await scheduler.stop()

        try:
            with runtime.requested_by(f"manage.py anarchon run ({_user()})"):
                run = asyncio.run(go())
        except (AnarchonError, OSError) as exc:
            raise CommandError(f"{name}: could not run: {store_error(exc)}",
                               returncode=EXIT_FAILED) from exc
        self.stdout.write(format_history([run]))
        if run.status != "success":
            raise CommandError(f"{name}: {run.status}: {run.error or 'no error text'}",
                               returncode=EXIT_FAILED)

    def check_store(self, options: dict[str, Any]) -> None:
        """Settings (the system checks), then the store: reachable, format, clock."""
        found = checks.run_checks(tags=["anarchon"])
        errors = [m for m in found if m.is_serious()]
        for message in found:
            (self.stderr if message.is_serious() else self.stdout).write(str(message))
        if errors:
            raise CommandError(f"settings: {len(errors)} error(s)", returncode=EXIT_USAGE)
        parsed = conf.load()
        self.stdout.write(f"settings: ok ({len(registry.declarations())} job(s) declared)")

        async def probe(reader: Scheduler) -> float:
            await reader.job_names()
            before = time.time() * 1000
            store_ms = await reader.backend.clock_ms()
            return store_ms - (before + time.time() * 1000) / 2

        try:
            skew = self._read(options, probe)
        except StoreFormatError as exc:
            raise CommandError(f"store format: {store_error(exc)}",
                               returncode=EXIT_FAILED) from exc
        except StoreUnavailable as exc:
            raise CommandError(f"store unreachable: {store_error(exc)}",
                               returncode=EXIT_FAILED) from exc
        except StoreError as exc:
            hint = (" (run manage.py migrate)" if parsed.database is not None and
                    not isinstance(exc, StoreNotSetUp) else "")
            raise CommandError(f"store: {store_error(exc)}{hint}",
                               returncode=EXIT_FAILED) from exc
        except (AnarchonError, OSError) as exc:
            raise CommandError(f"store: {store_error(exc)}",
                               returncode=EXIT_FAILED) from exc
        backend = conf.build_backend(parsed).describe()
        self.stdout.write(f"store: ok, {backend}")
        self.stdout.write("format: ok")
        self.stdout.write(f"clock: this machine is {-skew:+.0f} ms off the store's clock")

    def import_celery_beat(self, options: dict[str, Any]) -> None:
        """Copy the periodic tasks into Schedule rows; exit 1 if a task was not imported."""
        report = celerybeat.import_periodic_tasks(dry_run=options["dry_run"],
                                       disabled=options["disabled"])
        for line in report.lines():
            self.stdout.write(line)
        if not report.ok:
            missing = report.count("refused") + report.count("failed")
            verb = "would not be imported" if report.dry_run else "not imported"
            raise CommandError(f"{missing} periodic task(s) {verb} (see above)",
                               returncode=EXIT_FAILED)

    # ------------------------------------------------------------------ the worker

    def worker(self, options: dict[str, Any]) -> None:
        """Run the project's scheduler until SIGTERM/SIGINT, then stop with hand-over."""
        _ensure_logging(options.get("verbosity", 1), options.get("log_format", "text"))
        scheduler = runtime.get_scheduler()
        if options.get("metrics_port") is not None:
            from anarchon_core.metrics.prometheus import serve_metrics  # noqa: PLC0415

            serve_metrics(scheduler, options["metrics_port"], options["metrics_addr"])
        names = [j.name for j in scheduler.jobs()]
        if not names and not scheduler.sources:
            log.warning("no jobs declared: add @anarchon_django.every/cron in an app's "
                        "jobs.py")
        try:
            asyncio.run(_work(scheduler, names))
        except UnsupportedStrategyError as exc:
            raise configuration_error(exc) from exc
        except AnarchonError as exc:  # e.g. a store written by a newer anarchon
            raise CommandError(f"the worker could not start: {store_error(exc)}",
                               returncode=EXIT_FAILED) from exc


#: How many job names the worker's first line shows.
_NAMES_SHOWN = 20


async def _work(scheduler: Scheduler, names: list[str]) -> None:
    ran = False

    def running() -> None:
        nonlocal ran
        ran = True
        shown = ", ".join(names[:_NAMES_SHOWN]) + (", ..." if len(names) > _NAMES_SHOWN else "")
        rows = sum(len(sync.active_names()) for sync in scheduler.sources)
        log.info("anarchon worker %s running %d job(s) (%s)%s on %s; stop with SIGTERM or "
                 "Ctrl-C", scheduler.instance_id, len(names), shown or "none",
                 f" and {rows} from the Schedule table" if scheduler.sources else "",
                 scheduler.backend.describe())
        if not names and not rows and scheduler.sources:
            log.warning("no jobs: add @anarchon_django.every/cron in an app's jobs.py, or "
                        "rows to the Schedule table (the admin's Schedules)")

    await serve(scheduler, on_running=running)
    if ran:
        log.info("anarchon worker %s stopped", scheduler.instance_id)


def _ensure_logging(verbosity: int, log_format: str = "text") -> None:
    """Show the worker's log lines when the project's LOGGING does not route them.

    A project whose LOGGING configures the ``anarchon`` logger or the root logger decides
    itself; otherwise the lines go to stderr (INFO; DEBUG with ``-v 2``; WARNING with
    ``-v 0``). ``--log-format json`` always sends the ``anarchon.*`` lines to stderr as
    one JSON object per line, instead of through the project's handlers.
    """
    logger = logging.getLogger("anarchon")
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    if log_format == "json":
        install_log_handler("json", level=level, replace=True)
        return
    if logger.handlers or logging.getLogger().handlers:
        return
    install_log_handler("text", level=level)
