"""``python -m anarchon_celery history -A proj [ENTRY]``: who sent each slot, and the task id.

Reads the store the app's ``anarchon_*`` settings name, newest slot first, through a
read-only backend: nothing is claimed or created. Exit status 1 when the store fails or
holds no anarchon store in that namespace, 2 for a bad setting.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from celery.app.utils import find_app  # type: ignore[import-untyped]

from anarchon_core import AnarchonError, ConfigError, Scheduler
from anarchon_core.cli.history import HistoryAnswer, add_history_options, read_history

from .settings import Settings

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m anarchon_celery``."""
    parser = argparse.ArgumentParser(prog="python -m anarchon_celery")
    sub = parser.add_subparsers(dest="command", required=True)
    history = sub.add_parser("history", help="the runs of the beat_schedule entries, newest "
                             "first (times in UTC)")
    history.add_argument("-A", "--app", required=True, help="the Celery app, as for celery -A")
    add_history_options(history, job_help="only this beat_schedule entry's runs (default: "
                                          "every entry's)")
    args = parser.parse_args(argv)
    try:
        app = find_app(args.app)
        core = Settings.from_app(app).make_scheduler("reader")
        answer = asyncio.run(_read(core, args))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except AnarchonError as exc:  # the store failed, or holds no anarchon store there
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if answer.unknown:
        print(f"error: {answer.message}", file=sys.stderr)
        return 2
    print(answer.text())
    return 0


async def _read(core: Scheduler, args: argparse.Namespace) -> HistoryAnswer:
    try:
        return await read_history(core, args.job, args.limit, status=args.status,
                                  runner=args.runner)
    finally:
        await core.stop()


if __name__ == "__main__":
    sys.exit(main())
