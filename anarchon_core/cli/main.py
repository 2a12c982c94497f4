"""``anarchon``: demo, run, jobs, history, check, doctor, status, pause, resume, backfill, next.

Every failure ends with a non-zero exit status and one line on stderr saying what to fix
(``anarchon <command>: error: ...``): 2 for a usage or configuration error, 1 when a store
or the user's code failed, 130 on Ctrl-C. ``--traceback`` (or ``-v``) prints the full
traceback too, and the log lines that the one-line mode keeps quiet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import math
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

from .. import __version__, deadman
from ..errors import AnarchonError, ConfigError, StoreNotSetUp
from ..fleet import PAUSE_REFRESH_S, PauseInfo
from ..logjson import LOG_FORMATS, install_log_handler
from ..models import Run
from ..scheduler import Scheduler
from ..schedules import CronSchedule, EverySchedule, Schedule, ms_to_datetime
from ..slots import slot_from_datetime
from ..url import backend_from_url, redact
from .history import (
    MAX_COUNT,
    HistoryAnswer,
    add_history_options,
    count_arg,
    format_history,
    read_history,
)

__all__ = ["MAX_COUNT", "CliError", "add_log_format_option", "add_metrics_options",
           "build_parser", "count_arg", "format_history", "load_scheduler", "main",
           "seconds_arg"]

T = TypeVar("T")
_MAX_MESSAGE = 600


class CliError(AnarchonError):
    """A command-line failure whose message says what to fix (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (``anarchon next: error: ...``), not usage + error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def seconds_arg(text: str) -> float:
    """An argparse type for ``--timeout`` and ``--seconds``: more than 0, at most 86400."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value > 86_400:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0 and at most "
                                         f"86400 (e.g. 0.5 or 30), got {text!r}")
    return value


_seconds = seconds_arg


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65_535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return int(text)


def add_log_format_option(parser: argparse.ArgumentParser) -> None:
    """``--log-format text|json`` (also ``manage.py anarchon``'s)."""
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                        help="log lines as text (default) or as one JSON object per line "
                             "with the run's fields (job, slot, attempt, runner, status, "
                             "duration_ms)")


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-addr`` (also ``manage.py anarchon``'s)."""
    parser.add_argument("--metrics-port", type=_port, default=None,
                        help="serve Prometheus metrics on this port (/metrics; needs "
                             "anarchon[prometheus])")
    parser.add_argument("--metrics-addr", default="0.0.0.0",
                        help="address for --metrics-port (default 0.0.0.0)")


def _instances(text: str) -> int:
    value = count_arg(text)
    if value > 32:
        raise argparse.ArgumentTypeError(f"expected 1 to 32 instances, got {value}")
    return value


def load_scheduler(target: str) -> Scheduler:
    """Import ``module:attribute``; the attribute is a Scheduler or returns one.

    Raises :class:`CliError` saying what is wrong: no such module, an error while
    importing it (with the exception), no such attribute, or not a Scheduler.
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise CliError(f"expected module:attribute (e.g. myapp.jobs:scheduler), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise CliError(
                f"no module named {missing!r}: run anarchon from your project's directory "
                "or add it to PYTHONPATH") from exc
        raise CliError(f"importing {module_name!r} failed: {_one_line(exc)}") from exc
    except ConfigError as exc:
        raise ConfigError(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise CliError(f"importing {module_name!r} failed: {_one_line(exc)}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, Scheduler):
        try:
            obj = obj()
        except Exception as exc:
            raise CliError(f"calling {target}() failed: {_one_line(exc)}") from exc
    if not isinstance(obj, Scheduler):
        raise CliError(f"{target} is a {type(obj).__name__}, not an anarchon Scheduler")
    return obj


def cmd_run(args: argparse.Namespace) -> int:
    """Run a scheduler until SIGINT/SIGTERM (serving Prometheus metrics if asked)."""
    # Every logger's lines (the drivers' too) in one format: JSON lines stay one per line.
    install_log_handler(args.log_format, level=logging.DEBUG if args.verbose else logging.INFO,
                        logger="")
    scheduler = load_scheduler(args.target)
    if args.metrics_port is not None:
        from ..metrics.prometheus import serve_metrics  # noqa: PLC0415 - optional extra

        serve_metrics(scheduler, args.metrics_port, args.metrics_addr)
    scheduler.run_forever()
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    """List a scheduler's jobs with their next run."""
    scheduler = load_scheduler(args.target)
    print(f"{'job':<24} {'schedule':<36} next run (UTC)")
    for job in scheduler.jobs():
        print(f"{job.name:<24} {job.schedule:<36} {job.next_run_at.isoformat()}")
    return 0


def _with_store(args: argparse.Namespace, what: str,
                call: Callable[[Scheduler], Awaitable[T]], *, writes: bool = False) -> T:
    """``call(reader)``: a job-less scheduler on ``--backend`` (or ``$ANARCHON_URL``).

    Bounded by ``--timeout``; ``what`` names the operation in errors. The backend is
    read-only unless the command ``writes``: a read creates nothing, and a namespace that
    does not exist is a :class:`~anarchon_core.errors.StoreNotSetUp` (exit status 1).
    """
    url = args.backend or os.environ.get("ANARCHON_URL")
    if not url:
        raise CliError("give --backend URL (or set ANARCHON_URL)")
    backend = backend_from_url(url) if writes else backend_from_url(url, read_only=True)
    reader = Scheduler(backend)

    async def go() -> T:
        try:
            return await asyncio.wait_for(call(reader), args.timeout)
        except TimeoutError:
            raise AnarchonError(f"no answer from {backend.describe()} within {args.timeout:g} s "
                                "(is the store up? --timeout sets the limit)") from None
        except AnarchonError:
            raise  # the store's own errors already name the backend
        except Exception as exc:
            raise AnarchonError(f"cannot {what} {backend.describe()}: "
                                f"{_one_line(exc)}") from exc
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reader.stop(), 5)

    return asyncio.run(go())


def _read_history(args: argparse.Namespace, job: str, limit: int) -> list[Run]:
    """A job's history from ``--backend`` (or ``$ANARCHON_URL``), bounded by ``--timeout``."""
    return _with_store(args, "read history from", lambda r: r.history(job, limit))


async def _pause_known(reader: Scheduler, job: str, reason: str | None,
                       force: bool) -> PauseInfo:
    """Pause ``job`` if a live instance defines it or the store holds runs of it (or force)."""
    if not force:
        view = await reader.status()
        defined = {j.name for j in view.jobs if j.definitions}
        held = set(await reader.job_names())
        if job not in defined and job not in held:
            known = sorted(defined | held)
            listed = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
            raise CliError(f"no live instance defines {job!r} and the store holds no runs of "
                           f"it (known jobs: {listed or 'none'}); check the name, or pause "
                           "it anyway with --force")
    return await reader.pause(job, reason)


def cmd_pause(args: argparse.Namespace) -> int:
    """Pause a job for the whole fleet (a job nobody knows only with ``--force``)."""
    info = _with_store(args, "pause a job on",
                       lambda r: _pause_known(r, args.job, args.reason, args.force), writes=True)
    why = f" ({info.reason})" if info.reason else ""
    print(f"paused {info.job!r}{why} for every instance (they notice within "
          f"{PAUSE_REFRESH_S:g} s); resume with: anarchon resume {args.job}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """Resume a paused job fleet-wide."""
    was = _with_store(args, "resume a job on", lambda r: r.resume(args.job), writes=True)
    print(f"resumed {args.job!r}" if was else f"{args.job!r} was not paused")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Print the fleet view: live instances and every job's state."""
    view = _with_store(args, "read the fleet from", lambda r: r.status())
    print(view.format())
    return 0


def _moment(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 date-time, got {text!r}"
                                         ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def cmd_backfill(args: argparse.Namespace) -> int:
    """Run the past slots of a job in a range, each once fleet-wide."""
    scheduler = load_scheduler(args.target)

    async def go() -> list[Run]:
        try:
            return await scheduler.backfill(args.job, args.start, args.end, limit=args.limit)
        finally:
            await scheduler.stop()

    runs = asyncio.run(go())
    print(format_history(runs) if runs else "nothing to backfill: every slot in the range "
          "has already succeeded or was backfilled")
    return 0 if all(r.status == "success" for r in runs) else 1


def cmd_history(args: argparse.Namespace) -> int:
    """Print the newest runs (of one job, or of every job) from a store."""
    answer: HistoryAnswer = _with_store(args, "read history from", lambda r: read_history(
        r, args.job, args.limit, status=args.status, runner=args.runner))
    if answer.unknown:
        raise CliError(answer.message)
    print(answer.text())
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check a set-up: config, handlers, store, format, clock, namespace. 1 on a failure."""
    from .doctor import Finding, format_findings, run_checks  # noqa: PLC0415 - only here

    try:
        scheduler = load_scheduler(args.target)
    except AnarchonError as exc:
        print(Finding("config", "FAIL", _one_line(exc)))
        return 1
    url = args.backend
    reader = (Scheduler(backend_from_url(url, read_only=True)) if url
              else Scheduler(scheduler.backend))
    head = Finding("config", "ok", f"{args.target}: {len(scheduler.jobs())} job(s) on "
                                   f"{reader.backend.describe()}")
    findings = [head, *run_checks(scheduler, reader, args.timeout)]
    print(format_findings(findings))
    return 1 if any(f.failed for f in findings) else 0


#: How many of a job's newest runs ``anarchon check`` reads.
CHECK_RUNS = 200


def cmd_check(args: argparse.Namespace) -> int:
    """Dead-man check: 0 if the job succeeded recently enough, 1 if not, 2 if unknown."""
    schedule: Schedule | None = None
    if args.every is not None:
        schedule = EverySchedule(args.every)
    elif args.cron is not None:
        schedule = CronSchedule(args.cron, args.tz)
    deadman.parse_max_silence(args.max_silence)  # a bad value is a usage error (2)
    try:
        runs = _read_history(args, args.job, CHECK_RUNS)
    except (CliError, StoreNotSetUp):
        raise  # a usage error (2); no store in that namespace (1, like a silent job)
    except Exception as exc:  # noqa: BLE001 - cannot tell: the "unknown" verdict
        print(f"unknown: {args.job}: cannot read the store: {_one_line(exc)}")
        return deadman.UNKNOWN
    now = round(datetime.now(UTC).timestamp() * 1000)
    report = deadman.judge_silence(args.job, runs, max_silence=args.max_silence, now_ms=now,
                                   schedule=schedule)
    print(report)
    return report.exit_code


def cmd_next(args: argparse.Namespace) -> int:
    """Print the next slots of a cron expression, one ISO 8601 time per line.

    A slot a daylight-saving change decided is followed by two spaces and what the rule
    did (``DST fall-back, second pass (both)``).
    """
    schedule = CronSchedule(args.expression, args.tz, args.dst)
    after = args.after if args.after is not None else datetime.now(UTC)
    for slot in schedule.upcoming(slot_from_datetime(after), args.n):
        line = ms_to_datetime(slot).astimezone(schedule.zone).isoformat()
        note = schedule.dst_note(slot)
        print(f"{line}  {note}" if note else line)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Several instances, one killed mid-run: every slot runs once."""
    from .demo import run_demo  # noqa: PLC0415 - spawns processes; load only when asked

    if args.backend is not None:
        backend_from_url(args.backend)  # a bad URL fails here, in one line
    return run_demo(backend=args.backend, instances=args.instances, seconds=args.seconds)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also reused by framework commands)."""
    common = _Parser(add_help=False)
    common.add_argument("--traceback", "-v", action="store_true", default=argparse.SUPPRESS,
                        help="on failure, print the full traceback and debug logs")
    parser = _Parser(
        prog="anarchon", parents=[common],
        description="Distributed cron: every instance runs, each slot once.")
    parser.add_argument("--version", action="version", version=f"anarchon {__version__}",
                        help="print anarchon's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                metavar="COMMAND")

    demo = sub.add_parser("demo", parents=[common],
                          help="several instances, one killed mid-run")
    demo.add_argument("--backend", help="store URL (default: a temporary SQLite file)")
    demo.add_argument("--instances", type=_instances, default=3,
                      help="how many instance processes race for the slots (1 to 32, "
                           "default 3)")
    demo.add_argument("--seconds", type=_seconds, default=20.0,
                      help="how long the instances run before the table is printed "
                           "(default 20)")
    demo.set_defaults(func=cmd_demo)

    run = sub.add_parser("run", parents=[common],
                         help="run module:scheduler until SIGINT/SIGTERM")
    run.add_argument("target", help="module:attribute of a Scheduler")
    add_log_format_option(run)
    add_metrics_options(run)
    run.set_defaults(func=cmd_run)

    jobs = sub.add_parser("jobs", parents=[common], help="list the jobs of module:scheduler")
    jobs.add_argument("target", help="module:attribute of a Scheduler")
    jobs.set_defaults(func=cmd_jobs)

    history = sub.add_parser("history", parents=[common],
                             help="show the newest runs of every job, or of JOB")
    add_history_options(history)
    history.add_argument("--backend", help="store URL (default: $ANARCHON_URL)")
    history.add_argument("--timeout", type=_seconds, default=30.0,
                         help="seconds to wait for the store (default 30)")
    history.set_defaults(func=cmd_history)

    check = sub.add_parser(
        "check", parents=[common],
        help="dead-man check: exit 0 if JOB succeeded recently, 1 if silent, 2 if unknown")
    check.add_argument("job", help="the job whose successes are checked")
    check.add_argument("--max-silence", required=True,
                       help="slots without a success before alerting (e.g. 3), or a "
                            "duration (e.g. 2h)")
    check.add_argument("--backend", help="store URL (default: $ANARCHON_URL)")
    when = check.add_mutually_exclusive_group()
    when.add_argument("--every", help="the job's interval, to count slots exactly (e.g. 10m)")
    when.add_argument("--cron", help="the job's cron expression, to count slots exactly")
    check.add_argument("--tz", default="UTC", help="time zone of --cron (default UTC)")
    check.add_argument("--timeout", type=_seconds, default=10.0,
                       help="seconds to wait for the store (default 10)")
    check.set_defaults(func=cmd_check)

    for name, helptext in (("pause", "pause JOB for every instance of the namespace"),
                           ("resume", "resume a paused JOB")):
        control = sub.add_parser(name, parents=[common], help=helptext)
        control.add_argument("job", help=f"the job to {name}")
        control.add_argument("--backend", help="store URL (default: $ANARCHON_URL)")
        if name == "pause":
            control.add_argument("--reason", help="why (shown by status and in the logs)")
            control.add_argument("--force", action="store_true",
                                 help="pause a job that no live instance defines and the "
                                      "store holds no runs of")
        control.add_argument("--timeout", type=_seconds, default=30.0,
                             help="seconds to wait for the store (default 30)")
        control.set_defaults(func=cmd_pause if name == "pause" else cmd_resume)

    status = sub.add_parser("status", parents=[common],
                            help="live instances, and per job schedule, last and next run")
    status.add_argument("--backend", help="store URL (default: $ANARCHON_URL)")
    status.add_argument("--timeout", type=_seconds, default=30.0,
                        help="seconds to wait for the store (default 30)")
    status.set_defaults(func=cmd_status)

    backfill = sub.add_parser("backfill", parents=[common],
                              help="run past slots of a job of module:scheduler, each once")
    backfill.add_argument("target", help="module:attribute of a Scheduler")
    backfill.add_argument("job", help="the job whose past slots are run")
    backfill.add_argument("--from", dest="start", type=_moment, required=True,
                          help="first slot (ISO 8601; UTC unless it has an offset)")
    backfill.add_argument("--to", dest="end", type=_moment, required=True,
                          help="last slot (ISO 8601; UTC unless it has an offset)")
    backfill.add_argument("--limit", type=count_arg, default=1_000,
                          help="refuse ranges with more slots than this (default 1000)")
    backfill.set_defaults(func=cmd_backfill)

    nxt = sub.add_parser("next", parents=[common], help="the next times of a cron expression")
    nxt.add_argument("expression", help='a 5- or 6-field cron expression, e.g. "0 8 * * *"')
    nxt.add_argument("--tz", default="UTC",
                     help="IANA time zone the expression is read in (default UTC)")
    nxt.add_argument("-n", type=count_arg, default=5, help=f"how many (1 to {MAX_COUNT})")
    nxt.add_argument("--dst", default=None,
                     help="what the job does when clocks change: once_first, once_last or "
                          "both for the repeated hour, shift or skip for the gap, or one of "
                          "each as once_last,skip (default: cron(8)'s rule)")
    nxt.add_argument("--after", type=_moment, default=None,
                     help="slots after this time (ISO 8601; UTC unless it has an offset; "
                          "default now)")
    nxt.set_defaults(func=cmd_next)

    doctor = sub.add_parser(
        "doctor", parents=[common],
        help="check module:scheduler: handlers, store, format, clock, namespace (exit 1 on "
             "a failure)")
    doctor.add_argument("target", help="module:attribute of a Scheduler")
    doctor.add_argument("--backend", help="store URL (default: the scheduler's own)")
    doctor.add_argument("--timeout", type=_seconds, default=30.0,
                        help="seconds to wait for the store (default 30)")
    doctor.set_defaults(func=cmd_doctor)
    return parser


def _one_line(exc: BaseException) -> str:
    """An exception as one line: its type (unless it is ours) and message, secrets masked."""
    text = " ".join(str(exc).split()) or "(no message)"
    if not isinstance(exc, AnarchonError):
        text = f"{type(exc).__name__}: {text}"
    text = redact(text, os.environ.get("ANARCHON_URL", ""))
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE - 3] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``anarchon`` console script."""
    args = build_parser().parse_args(argv)
    verbose = args.verbose = bool(getattr(args, "traceback", False))
    # Given back on return: main() also runs inside other programs (tests, a shell).
    disabled = logging.root.manager.disable
    if verbose and args.command != "run":  # cmd_run logs in the --log-format asked for
        install_log_handler("text", level=logging.DEBUG, logger="")
    elif args.command != "run":
        # The error line says what failed; drivers' and retry log lines would only repeat
        # it (and a driver's may show more than it should).
        logging.disable(logging.CRITICAL)
    try:
        return _run_command(args, verbose)
    finally:
        logging.disable(disabled)


def _run_command(args: argparse.Namespace, verbose: bool) -> int:
    """Run the parsed command; its exit status, every failure one line on stderr."""
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line
        if verbose:
            traceback.print_exc()
        message = _one_line(exc)
        if getattr(args, "backend", None):
            message = redact(message, args.backend)
        hint = "" if verbose else " (--traceback for details)"
        print(f"anarchon {args.command}: error: {message}{hint}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError | CliError) else 1
    return code


if __name__ == "__main__":
    sys.exit(main())
