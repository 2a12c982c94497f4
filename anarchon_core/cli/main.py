"""``anarchon``: demo, run, jobs, history and next."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

from ..errors import AnarchonError
from ..models import Run
from ..scheduler import Scheduler
from ..schedules import CronSchedule, ms_to_datetime
from ..url import backend_from_url

__all__ = ["build_parser", "main"]


def load_scheduler(target: str) -> Scheduler:
    """Import ``module:attribute``; the attribute is a Scheduler or returns one."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise AnarchonError(f"expected module:scheduler, got {target!r}")
    sys.path.insert(0, os.getcwd())
    obj = getattr(importlib.import_module(module_name), attr)
    if callable(obj) and not isinstance(obj, Scheduler):
        obj = obj()
    if not isinstance(obj, Scheduler):
        raise AnarchonError(f"{target} is a {type(obj).__name__}, not an anarchon Scheduler")
    return obj


def format_history(runs: Sequence[Run]) -> str:
    """A text table of history entries."""
    lines = [f"{'scheduled (UTC)':<24} {'attempt':>7} {'status':<12} {'ms':>7}  runner / error"]
    for r in runs:
        when = r.scheduled_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        tail = r.runner + (f"  {r.error}" if r.error else "") + ("  (manual)" if r.manual else "")
        ms = "" if r.duration_ms is None else str(r.duration_ms)
        lines.append(f"{when:<24} {r.attempt:>7} {r.status:<12} {ms:>7}  {tail}")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    """Run a scheduler until SIGINT/SIGTERM."""
    load_scheduler(args.target).run_forever()
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    """List a scheduler's jobs with their next run."""
    scheduler = load_scheduler(args.target)
    print(f"{'job':<24} {'schedule':<36} next run (UTC)")
    for job in scheduler.jobs():
        print(f"{job.name:<24} {job.schedule:<36} {job.next_run_at.isoformat()}")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """Print a job's history from a store."""
    url = args.backend or os.environ.get("ANARCHON_URL")
    if not url:
        raise AnarchonError("give --backend URL (or set ANARCHON_URL)")
    reader = Scheduler(backend_from_url(url))

    async def read() -> list[Run]:
        try:
            return await reader.history(args.job, args.limit)
        finally:
            await reader.stop()

    runs = asyncio.run(read())
    print(format_history(runs) if runs else f"no history for {args.job!r}")
    return 0


def cmd_next(args: argparse.Namespace) -> int:
    """Print the next slots of a cron expression, one ISO 8601 time per line."""
    schedule = CronSchedule(args.expression, args.tz)
    now = round(datetime.now(timezone.utc).timestamp() * 1000)
    zone = ZoneInfo(args.tz)
    for slot in schedule.upcoming(now, args.n):
        print(ms_to_datetime(slot).astimezone(zone).isoformat())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Several instances, one killed mid-run: every slot runs once."""
    from .demo import run_demo  # noqa: PLC0415 - spawns processes; load only when asked

    return run_demo(backend=args.backend, instances=args.instances, seconds=args.seconds)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also reused by framework commands)."""
    parser = argparse.ArgumentParser(
        prog="anarchon", description="Distributed cron: every instance runs, each slot once.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="several instances, one killed mid-run")
    demo.add_argument("--backend", help="store URL (default: a temporary SQLite file)")
    demo.add_argument("--instances", type=int, default=3)
    demo.add_argument("--seconds", type=float, default=20.0)
    demo.set_defaults(func=cmd_demo)

    run = sub.add_parser("run", help="run module:scheduler until SIGINT/SIGTERM")
    run.add_argument("target", help="module:attribute of a Scheduler")
    run.set_defaults(func=cmd_run)

    jobs = sub.add_parser("jobs", help="list the jobs of module:scheduler")
    jobs.add_argument("target")
    jobs.set_defaults(func=cmd_jobs)

    history = sub.add_parser("history", help="show a job's runs, newest first")
    history.add_argument("job")
    history.add_argument("--backend", help="store URL (default: $ANARCHON_URL)")
    history.add_argument("--limit", type=int, default=20)
    history.set_defaults(func=cmd_history)

    nxt = sub.add_parser("next", help="the next times of a cron expression")
    nxt.add_argument("expression")
    nxt.add_argument("--tz", default="UTC")
    nxt.add_argument("-n", type=int, default=5)
    nxt.set_defaults(func=cmd_next)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``anarchon`` console script."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except AnarchonError as exc:
        print(f"anarchon: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
