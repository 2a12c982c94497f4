"""The history table and its options, one for every command that shows runs.

``anarchon history``, ``manage.py anarchon history`` and ``python -m anarchon_celery
history`` take the same options (``[JOB] [-n/--limit N] [--status S] [--runner ID]``),
print the same columns (times in UTC, ISO 8601) and say the same thing when there is
nothing to show: a job the store holds no runs of is named with the jobs it does hold.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ..models import RUN_STATUSES, Run
from ..scheduler import Scheduler

__all__ = ["MAX_COUNT", "HistoryAnswer", "add_history_options", "count_arg", "format_history",
           "read_history", "unknown_job_message"]

#: Most runs a history command reads (and most slots ``anarchon next`` prints).
MAX_COUNT = 10_000
#: Most job names an "unknown job" message lists.
_MAX_NAMES = 20


def count_arg(text: str) -> int:
    """An argparse type for counts (``-n``, ``--limit``): a whole number, 1 to MAX_COUNT."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_COUNT}, got {value}")
    return value


def add_history_options(parser: argparse.ArgumentParser, *, job_help: str | None = None,
                        default_limit: int = 20) -> None:
    """``[JOB] -n/--limit --status --runner`` on a ``history`` (sub)command."""
    parser.add_argument("job", nargs="?", default=None,
                        help=job_help or "only this job's runs (default: every job's)")
    parser.add_argument("-n", "--limit", type=count_arg, default=default_limit, dest="limit",
                        help=f"how many runs, newest first (1 to {MAX_COUNT}, default "
                             f"{default_limit})")
    parser.add_argument("--status", choices=RUN_STATUSES,
                        help="only runs that ended so (or are still running)")
    parser.add_argument("--runner", help="only runs of this instance id")


def _when(run: Run) -> str:
    return run.scheduled_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_history(runs: Sequence[Run]) -> str:
    """History entries as a text table, in the order given (newest first from a store).

    Columns: the slot's time (UTC), job, attempt, status, duration in ms, then the runner
    followed by the error, ``(manual)`` and the run's meta (``[task_id=...]``).
    """
    width = max([len("job"), *(len(r.job) for r in runs)])
    width = min(width, 40)
    lines = [f"{'scheduled (UTC)':<24} {'job':<{width}} {'attempt':>7} {'status':<11} "
             f"{'ms':>7}  runner / error / meta"]
    for r in runs:
        meta = " ".join(f"{k}={v}" for k, v in sorted(r.meta.items()))
        tail = (r.runner + (f"  {r.error}" if r.error else "")
                + ("  (manual)" if r.manual else "") + (f"  [{meta}]" if meta else ""))
        ms = "" if r.duration_ms is None else str(r.duration_ms)
        lines.append(f"{_when(r):<24} {r.job:<{width}} {r.attempt:>7} {r.status:<11} "
                     f"{ms:>7}  {tail}")
    return "\n".join(lines)


def unknown_job_message(job: str, held: Collection[str]) -> str:
    """What to say when the store holds no runs of ``job``: the jobs it does hold."""
    if not held:
        return (f"no runs of {job!r}: this namespace holds no runs yet (is the store, "
                "its prefix or table the one the instances use?)")
    names = sorted(held)
    shown = ", ".join(names[:_MAX_NAMES])
    more = f" and {len(names) - _MAX_NAMES} more" if len(names) > _MAX_NAMES else ""
    return f"no runs of {job!r}; the store holds runs of {len(names)} job(s): {shown}{more}"


@dataclass(frozen=True)
class HistoryAnswer:
    """What a history command prints: the table, or a line saying why there is none.

    ``unknown`` is True when ``job`` was given and the store holds no run of it at all
    (a usage error: exit status 2, the message on stderr).
    """

    runs: list[Run]
    message: str
    unknown: bool = False

    def text(self) -> str:
        """The table, or the message."""
        return format_history(self.runs) if self.runs else self.message


async def read_history(reader: Scheduler, job: str | None, limit: int, *,
                       status: str | None = None, runner: str | None = None
                       ) -> HistoryAnswer:
    """Read runs newest first; with none, say why (naming the jobs the store holds)."""
    runs = list(await reader.history(job, limit, status=status, runner=runner))
    if runs:
        return HistoryAnswer(runs, "")
    if job is not None:
        held = await reader.job_names()
        if job not in held:
            return HistoryAnswer([], unknown_job_message(job, held), unknown=True)
    where = "".join((f" of {job!r}" if job else "",
                     f" with status {status}" if status else "",
                     f" by runner {runner!r}" if runner else ""))
    return HistoryAnswer([], f"no runs{where}")
