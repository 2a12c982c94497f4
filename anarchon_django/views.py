"""What the admin pages show: history pages, the job table and its timelines, run now.

Pure functions over the project's scheduler (:func:`~anarchon_django.runtime.get_scheduler`)
and the history reader (:func:`~anarchon_django.runtime.get_reader`); the admin classes in
:mod:`anarchon_django.admin` only check permissions and render. Every read goes through
the core's read model (``scheduler.sync.history`` / ``job_names``); nothing here decides
anything about slots.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from anarchon_core import (
    AnarchonError,
    ConfigError,
    PauseInfo,
    Run,
    RunPage,
    Scheduler,
    StoreNotSetUp,
    mask_url,
    slot_to_datetime,
)
from anarchon_core.models import RUN_STATUSES
from anarchon_core.readmodel import decode_cursor, encode_cursor

from . import conf, registry, runtime

__all__ = [
    "STATUSES", "HistoryPage", "JobRow", "RunNowResult", "TimelineCell",
    "history_page", "job_rows", "page_cursor", "page_size", "run_now",
]

STATUSES = RUN_STATUSES
PAGE_SIZES = (20, 50, 100, 200)
#: How many runs a search reads at most before offering "search older runs".
SEARCH_SCAN = 2_000
_SEARCH_BATCH = 200
#: Slots in each job's timeline, and the most jobs given one.
TIMELINE_SLOTS = 24
TIMELINE_JOBS = 100


def local(moment: datetime | None) -> datetime | None:
    """An aware datetime in the current time zone (``TIME_ZONE`` unless activated)."""
    return None if moment is None else timezone.localtime(moment)


#: What a reader says after "no anarchon store" in Django's terms.
_SET_UP_HINT = (" (ANARCHON's TABLE or PREFIX names it; a worker, manage.py anarchon, sets "
                "it up when it starts; for a database BACKEND, run manage.py migrate)")


def store_error(exc: BaseException) -> str:
    """One line about a failed read, with any credential masked.

    A namespace that holds no anarchon store (a typo in ``TABLE``/``PREFIX``, or no worker
    started yet) is said as such, with the namespaces that do exist when the store lists
    them; readers never create it.
    """
    text = " ".join(str(exc).split()) or type(exc).__name__
    if not isinstance(exc, AnarchonError):
        text = f"{type(exc).__name__}: {text}"
    return mask_url(text)[:900] + (_SET_UP_HINT if isinstance(exc, StoreNotSetUp) else "")


# ---------------------------------------------------------------------------- history


def page_size(text: str | None, default: int = 50) -> int:
    """The ``n`` of a history page, clamped to :data:`PAGE_SIZES`' range (20 to 200)."""
    try:
        size = int(text) if text else default
    except ValueError:
        size = default
    return min(max(size, min(PAGE_SIZES)), max(PAGE_SIZES))


def page_cursor(text: str | None) -> tuple[str | None, str | None]:
    """The ``before`` cursor of a history page, or None and why it was not one.

    A cursor edited by hand or cut short is dropped (the page starts from the newest run)
    rather than answered with an empty page.
    """
    if not text:
        return None, None
    try:
        decode_cursor(text)
    except ConfigError:
        return None, (f"The page link's position ({text[:40]!r}) is not one this page made; "
                      "showing the newest runs instead.")
    return text, None


@dataclass
class HistoryPage:
    """One page of the history list, filters applied."""

    runs: list[Run]
    cursor: str | None
    scanned: int = 0
    #: True when a search stopped after :data:`SEARCH_SCAN` runs with older runs left.
    truncated: bool = False


def _matches(run: Run, query: str) -> bool:
    needle = query.casefold()
    fields = [run.job, run.runner, run.status, run.error or "",
              *run.meta.keys(), *run.meta.values()]
    return any(needle in text.casefold() for text in fields)


def history_page(reader: Scheduler, *, job: str | None, status: str | None,
                 runner: str | None, search: str | None, limit: int,
                 before: str | None) -> HistoryPage:
    """A page of history newest first, through the read model's cursor pagination.

    ``job``/``status``/``runner`` are the read model's own filters. ``search`` keeps the
    runs whose job, runner, status, error or meta contain the text; it reads at most
    :data:`SEARCH_SCAN` runs per page, and the cursor then continues the search.
    """
    decode_cursor(before)  # a bad cursor is the caller's error, whatever the store holds
    return _history_page(reader, job=job, status=status, runner=runner, search=search,
                         limit=limit, before=before)


def _history_page(reader: Scheduler, *, job: str | None, status: str | None,
                  runner: str | None, search: str | None, limit: int,
                  before: str | None) -> HistoryPage:
    if not search:
        page = reader.sync.history(job, limit, status=status, runner=runner, before=before)
        return HistoryPage(list(page), page.cursor, len(page))
    found: list[Run] = []
    cursor, scanned = before, 0
    while scanned < SEARCH_SCAN:
        batch: RunPage = reader.sync.history(job, _SEARCH_BATCH, status=status,
                                             runner=runner, before=cursor)
        for run in batch:
            scanned += 1
            if _matches(run, search):
                found.append(run)
                if len(found) == limit:
                    more = batch.cursor is not None or run is not batch[-1]
                    return HistoryPage(found, encode_cursor(run) if more else None, scanned)
        cursor = batch.cursor
        if cursor is None:
            return HistoryPage(found, None, scanned)
    return HistoryPage(found, cursor, scanned, truncated=True)


def job_choices(scheduler: Scheduler | None, reader: Scheduler | None) -> list[str]:
    """Job names for the filter: those declared here and those the store holds."""
    names = {d.name for d in registry.declarations()}
    if scheduler is not None:
        names |= {j.name for j in scheduler.jobs()}
    if reader is not None:
        # A failed read shows on the page through its own query; the list then has fewer jobs.
        with contextlib.suppress(Exception):
            names |= set(reader.sync.job_names())
    return sorted(names)


# ---------------------------------------------------------------------------- jobs


@dataclass
class TimelineCell:
    """One slot of a job's recent timeline."""

    slot: int
    at: datetime
    #: A run status, ``missed`` (no run recorded though older and newer slots have runs),
    #: ``pending`` (may still be claimed) or ``unknown`` (older than the oldest run kept).
    state: str
    attempt: int = 0
    duration_ms: int | None = None
    error: str | None = None

    @property
    def title(self) -> str:
        """The cell's tooltip."""
        when = local(self.at)
        text = f"{when:%Y-%m-%d %H:%M:%S} — {self.state}" if when else self.state
        if self.attempt > 1:
            text += f" (attempt {self.attempt})"
        if self.duration_ms is not None:
            text += f", {self.duration_ms} ms"
        if self.error:
            text += f": {self.error[:200]}"
        return text


@dataclass
class JobRow:
    """A row of the admin's job table."""

    name: str
    schedule: str
    declared: bool
    module: str = ""
    next_run: datetime | None = None
    last: Run | None = None
    last_manual: Run | None = None
    options: dict[str, Any] = field(default_factory=dict)
    timeline: list[TimelineCell] = field(default_factory=list)
    #: Set when the job is paused for every worker.
    paused: PauseInfo | None = None

    @property
    def paused_at(self) -> datetime | None:
        """When the job was paused, in the current time zone."""
        return local(slot_to_datetime(self.paused.at_ms)) if self.paused else None


def _recent_slots(declaration: registry.Declaration, now_ms: int, count: int) -> list[int]:
    schedule = declaration.schedule()
    slots: list[int] = []
    at = now_ms
    for _ in range(count):
        slot = schedule.latest_at_or_before(at)
        slots.append(slot)
        at = slot - 1
    return slots[::-1]


def _timeline(declaration: registry.Declaration | None, runs: list[Run], options: dict[str, Any],
              now_ms: int) -> list[TimelineCell]:
    scheduled = [r for r in runs if not r.manual]
    newest: dict[int, Run] = {}
    for run in scheduled:  # newest first: keep each slot's latest attempt
        newest.setdefault(run.slot, run)
    if declaration is None:
        slots = sorted(newest)[-TIMELINE_SLOTS:]
    else:
        slots = _recent_slots(declaration, now_ms, TIMELINE_SLOTS)
    oldest = min(newest, default=None)
    grace = int(options.get("max_late_ms", 60_000)) + int(options.get("jitter_ms", 0)) + 2_000
    cells = []
    for slot in slots:
        found = newest.get(slot)
        if found is not None:
            cells.append(TimelineCell(slot, slot_to_datetime(slot), found.status, found.attempt,
                                      found.duration_ms, found.error))
        elif now_ms - slot < grace:
            cells.append(TimelineCell(slot, slot_to_datetime(slot), "pending"))
        elif oldest is None or slot < oldest:
            cells.append(TimelineCell(slot, slot_to_datetime(slot), "unknown"))
        else:
            cells.append(TimelineCell(slot, slot_to_datetime(slot), "missed"))
    return cells


def job_rows(scheduler: Scheduler, reader: Scheduler | None, *,
             with_timeline: bool = True) -> tuple[list[JobRow], str | None]:
    """Every job declared here or known to the store; and the store error, if any."""
    declared = {d.name: d for d in registry.declarations()}
    rows: dict[str, JobRow] = {}
    for info in scheduler.jobs():
        decl = declared.get(info.name)
        rows[info.name] = JobRow(info.name, info.schedule, True,
                                 decl.module if decl else "", info.next_run_at,
                                 options=dict(info.options))
    error: str | None = None
    last: dict[str, Run | None] = {}
    if reader is not None:
        try:
            last = reader.sync.job_names()
        except Exception as exc:  # noqa: BLE001 - shown on the page
            error = store_error(exc)
            reader = None
    for name, run in last.items():
        row = rows.setdefault(name, JobRow(name, "", False))
        row.last = run
    now_ms = round(time.time() * 1000)
    if reader is not None and error is None:
        for row in sorted(rows.values(), key=lambda r: r.name)[:TIMELINE_JOBS]:
            try:
                runs = list(reader.sync.history(row.name, 3 * TIMELINE_SLOTS))
            except Exception as exc:  # noqa: BLE001
                error = store_error(exc)
                break
            scheduled = [r for r in runs if not r.manual]
            if scheduled:
                row.last = scheduled[0]
            elif row.last is not None and row.last.manual:
                row.last = None  # "last run" is the schedule's; manual runs show apart
            row.last_manual = next((r for r in runs if r.manual), None)
            if with_timeline:
                row.timeline = _timeline(declared.get(row.name) if row.declared else None,
                                         runs, row.options, now_ms)
    return sorted(rows.values(), key=lambda r: (not r.declared, r.name)), error


# ---------------------------------------------------------------------------- run now


@dataclass
class RunNowResult:
    """What a "run now" request got: the finished run, or None while it still runs."""

    job: str
    run: Run | None
    error: str | None = None


def run_now(job: str, *, who: str, wait_ms: int | None = None) -> RunNowResult:
    """Run ``job`` now in this process, recorded as manual with ``requested_by=who``.

    Waits up to ``wait_ms`` (default ``ADMIN_RUN_NOW_WAIT_MS``) for the run to end; a
    longer run goes on in the background and shows as ``running`` in history.
    """
    if wait_ms is None:
        wait_ms = conf.load().admin_run_now_wait_ms
    scheduler = runtime.get_scheduler()
    try:
        if not scheduler.running:  # a schedule in the database is read here
            scheduler = runtime.load_schedule(job)
    except Exception as exc:  # noqa: BLE001 - reported to the user who pressed the button
        return RunNowResult(job, None, str(exc))
    try:
        with runtime.requested_by(who):
            run = scheduler.sync.run_now(job, timeout=wait_ms / 1000)
    except (concurrent.futures.TimeoutError, TimeoutError):
        return RunNowResult(job, None)
    except Exception as exc:  # noqa: BLE001 - reported to the user who pressed the button
        return RunNowResult(job, None, store_error(exc))
    return RunNowResult(job, run)


def declared_names(names: Iterable[str] | None = None) -> set[str]:
    """The names of the jobs this project's scheduler runs."""
    return {j.name for j in runtime.get_scheduler().jobs()} if names is None else set(names)
