"""The dead-man check: has a job succeeded recently enough? (``anarchon check``).

For Kubernetes probes and cron monitors: the answer is one line and an exit status,

* ``0`` (``ok``): the last scheduled success is within the allowed silence;
* ``1`` (``silent``): it is older, or the job has runs but none succeeded;
* ``2`` (``unknown``): the check could not tell (store unreachable, no run of the job in
  the store at all: a wrong name or namespace).

The allowed silence is a number of slots (``max_silence=3``: alert once more than 3 slots
went by without a success) or a duration (``"2h"``). Counting slots needs the job's
schedule; without one it is inferred from the gaps between the job's recent slots (exact
for ``every`` jobs, a typical gap for cron jobs), and the reason says so.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass

from .durations import Duration, format_ms, parse_duration_ms
from .errors import ConfigError
from .models import Run
from .schedules import Schedule, ms_to_datetime

__all__ = ["OK", "SILENT", "UNKNOWN", "SilenceReport", "judge_silence"]

OK, SILENT, UNKNOWN = 0, 1, 2
#: Most slots counted between the last success and now (a job silent for longer is silent).
_MAX_COUNTED = 100_000


@dataclass(frozen=True)
class SilenceReport:
    """The check's verdict: ``exit_code`` (0, 1, 2), ``state`` and a one-line ``reason``."""

    exit_code: int
    reason: str
    last_success: Run | None = None

    @property
    def state(self) -> str:
        """``ok``, ``silent`` or ``unknown``."""
        return ("ok", "silent", "unknown")[self.exit_code]

    def __str__(self) -> str:
        return f"{self.state}: {self.reason}"


def parse_max_silence(value: object) -> int:
    """``max_silence`` as slots (a positive int, or digits) or as ms (negative: a duration).

    Returns the count of slots for a number, else minus the duration in ms.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError(f"invalid max_silence {value!r}: expected at least 1 slot")
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return parse_max_silence(int(value))
    return -parse_duration_ms(value, what="max_silence")


def judge_silence(job: str, runs: list[Run], *, max_silence: int | Duration, now_ms: int,
                  schedule: Schedule | None = None) -> SilenceReport:
    """Judge ``runs`` (the job's history, newest first) against the allowed silence."""
    limit = parse_max_silence(max_silence)
    scheduled = [r for r in runs if not r.manual]
    if not scheduled:
        return SilenceReport(UNKNOWN, f"no scheduled run of {job!r} in the store (wrong job "
                                      "name or namespace?)")
    last = next((r for r in scheduled if r.status == "success"), None)
    since = last.slot if last is not None else min(r.slot for r in scheduled)
    ago = format_ms(max(0, now_ms - since) // 1000 * 1000) if now_ms - since >= 1000 else "0s"
    what = (f"last success {_when(last.slot)} ({ago} ago)" if last is not None
            else f"no success among its last {len(scheduled)} run(s), the oldest "
                 f"{_when(since)} ({ago} ago)")
    if limit < 0:
        allowed = -limit
        if last is not None and now_ms - since <= allowed:
            return SilenceReport(OK, f"{job}: {what}, within {format_ms(allowed)}", last)
        return SilenceReport(SILENT, f"{job}: {what}, more than {format_ms(allowed)}", last)
    missed, how = _slots_since(scheduled, since, now_ms, schedule)
    if missed is None:
        return SilenceReport(UNKNOWN, f"{job}: {what}; cannot count slots without a schedule "
                                      "(give the schedule, or the silence as a duration)",
                             last)
    verdict = OK if last is not None and missed <= limit else SILENT
    relation = "within" if verdict == OK else "more than"
    return SilenceReport(verdict, f"{job}: {what}, {missed} slot(s) since, {relation} "
                                  f"{limit} ({how})", last)


def _slots_since(scheduled: list[Run], since: int, now_ms: int, schedule: Schedule | None
                 ) -> tuple[int | None, str]:
    if schedule is not None:
        count, at = 0, since
        while count < _MAX_COUNTED:
            at = schedule.next_after(at)
            if at > now_ms:
                break
            count += 1
        return count, schedule.describe()
    slots = sorted({r.slot for r in scheduled})
    gaps = [b - a for a, b in itertools.pairwise(slots) if b > a]
    if not gaps:
        return None, ""
    gap = int(statistics.median(gaps))
    return (now_ms - since) // gap, f"about every {format_ms(gap)}, inferred from history"


def _when(slot: int) -> str:
    return ms_to_datetime(slot).isoformat(timespec="seconds").replace("+00:00", "Z")
