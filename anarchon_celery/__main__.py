"""``python -m anarchon_celery history -A proj ENTRY``: who sent each slot, and the task id.

Reads the store the app's ``anarchon_*`` settings name (read-only use: nothing is
claimed), newest slot first.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from celery.app.utils import find_app  # type: ignore[import-untyped]

from anarchon_core import AnarchonError, Run

from .settings import Settings

__all__ = ["format_runs", "main"]


def format_runs(runs: Sequence[Run]) -> str:
    """A text table: slot, attempt, status, the beat that sent it and the task id."""
    lines = [f"{'slot (UTC)':<24} {'attempt':>7} {'status':<11} {'beat':<28} task id / error"]
    for run in runs:
        when = run.scheduled_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        tail = run.meta.get("task_id") or run.error or ""
        lines.append(f"{when:<24} {run.attempt:>7} {run.status:<11} {run.runner:<28} {tail}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m anarchon_celery``."""
    parser = argparse.ArgumentParser(prog="python -m anarchon_celery")
    sub = parser.add_subparsers(dest="command", required=True)
    history = sub.add_parser("history", help="the runs of one beat_schedule entry")
    history.add_argument("-A", "--app", required=True, help="the Celery app, as for celery -A")
    history.add_argument("entry", help="the entry's name in beat_schedule")
    history.add_argument("-n", "--limit", type=int, default=20)
    args = parser.parse_args(argv)
    try:
        app = find_app(args.app)
        core = Settings.from_app(app).make_scheduler("reader")
        try:
            runs = core.sync.history(args.entry, args.limit)
        finally:
            core.sync.stop()
    except AnarchonError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_runs(runs) if runs else f"no history for {args.entry!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
