"""``anarchon_track_tasks``: a slot's lease is kept until its task finished on a worker.

Worker side (Celery task signals, connected when ``anarchon_celery`` is imported): when a
task sent by anarchon starts, the worker claims the run ``<entry>~task`` of the same slot
in the store and holds its lease while the task runs (so the worker that runs it shows in
history); when the task ends it records ``success`` or ``failed`` with the task id.

Beat side: after publishing, the slot's handler keeps the slot's own lease and waits until
that ``~task`` run has ended (or ``anarchon_track_timeout_ms`` passed). The entry's next
slots are meanwhile skipped as ``overlap``, so a long task is never started twice. A beat
taking over a slot whose task already reached a worker does not send it again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from celery import signals  # type: ignore[import-untyped]

from anarchon_core import AnarchonError, JobContext, Run, StoreUnavailable
from anarchon_core import Scheduler as CoreScheduler

from .settings import Settings

__all__ = ["TASK_SUFFIX", "task_job", "task_record", "wait_task"]

log = logging.getLogger("anarchon.celery")

#: The ``~task`` run of entry ``e`` is job ``e~task``: one per slot, held by the worker.
TASK_SUFFIX = "~task"
_HISTORY_PAGE = 50
_POLL_FIRST_S, _POLL_MAX_S = 0.25, 5.0


def task_job(entry: str) -> str:
    """The job name of an entry's task runs."""
    return f"{entry}{TASK_SUFFIX}"


async def task_record(core: CoreScheduler, entry: str, slot: int) -> Run | None:
    """The newest ``~task`` attempt of ``slot``, if a worker started its task."""
    page = await core.history(task_job(entry), _HISTORY_PAGE)
    return next((run for run in page if run.slot == slot), None)


async def wait_task(core: CoreScheduler, ctx: JobContext, entry: str, timeout_ms: int) -> None:
    """Hold the slot (its lease is heartbeated meanwhile) until its task has ended."""
    deadline = time.monotonic() + timeout_ms / 1000
    delay = _POLL_FIRST_S
    while time.monotonic() < deadline:
        ctx.raise_if_cancelled()
        try:
            run = await task_record(core, entry, ctx.slot)
        except StoreUnavailable as exc:
            log.debug("%s slot %s: task state unknown (%s)", entry, ctx.slot, exc)
            run = None
        if run is not None and run.status != "running":
            ctx.meta["task_status"] = run.status
            ctx.meta["worker"] = run.runner
            return
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, _POLL_MAX_S)
    ctx.meta["task_status"] = "unknown"
    log.warning("%s slot %s: its task did not finish within anarchon_track_timeout_ms "
                "(%d); the slot is released", entry, ctx.slot, timeout_ms)


class _Worker:
    """One per worker process: a core scheduler holding the ``~task`` runs it executes."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.settings = settings
        self.core = settings.make_scheduler("worker")
        self.core.sync.start()
        self.defined: set[str] = set()
        self.held: dict[str, Any] = {}
        self.lock = threading.Lock()

    def started(self, task_id: str, entry: str, slot: int) -> None:
        name = task_job(entry)
        with self.lock:
            if name not in self.defined:
                self.core.define(name, max_late_ms=self.settings.track_timeout_ms)
                self.defined.add(name)
        claim = self.core.sync.claim(name, slot, timeout=30)
        if not claim:
            log.warning("%s slot %s: task %s started although this slot's task already ran "
                        "or runs (%s); deduplicate on the anarchon_id header", entry, slot,
                        task_id, getattr(claim, "reason", claim))
            return
        with self.lock:
            self.held[task_id] = claim

    def finished(self, task_id: str, state: str | None) -> None:
        with self.lock:
            claim = self.held.pop(task_id, None)
        if claim is None:
            return
        status = "success" if state in (None, "SUCCESS") else "failed"
        claim.finish(status, None if status == "success" else f"task {state}",
                     meta={"task_id": task_id, "state": str(state)})


_WORKERS: dict[int, _Worker] = {}
_WORKERS_LOCK = threading.Lock()


def _headers(task: Any) -> tuple[str, int] | None:
    request = getattr(task, "request", None)
    if request is None:
        return None
    headers = getattr(request, "headers", None) or {}
    entry = getattr(request, "anarchon_job", None) or headers.get("anarchon_job")
    slot = getattr(request, "anarchon_slot", None) or headers.get("anarchon_slot")
    if not entry or slot is None:
        return None
    try:
        return str(entry), int(slot)
    except (TypeError, ValueError):
        return None


def _worker(task: Any) -> _Worker | None:
    app = getattr(task, "app", None)
    if app is None or not app.conf.get("anarchon_track_tasks"):
        return None
    with _WORKERS_LOCK:
        worker = _WORKERS.get(id(app))
        if worker is None:
            worker = _WORKERS[id(app)] = _Worker(app, Settings.from_app(app))
        return worker


def _on_prerun(sender: Any = None, task_id: str | None = None, task: Any = None,
               **_: Any) -> None:
    found = _headers(task)
    if found is None or task_id is None:
        return
    try:
        worker = _worker(task)
        if worker is not None:
            worker.started(task_id, *found)
    except (AnarchonError, TimeoutError) as exc:
        log.error("%s slot %s: could not record the task's start: %s", *found, exc)


def _on_postrun(sender: Any = None, task_id: str | None = None, task: Any = None,
                state: str | None = None, **_: Any) -> None:
    if task_id is None or _headers(task) is None:
        return
    worker = _WORKERS.get(id(getattr(task, "app", None)))
    if worker is None:
        return
    try:
        worker.finished(task_id, state)
    except (AnarchonError, TimeoutError) as exc:
        log.error("task %s: could not record its end: %s", task_id, exc)


signals.task_prerun.connect(_on_prerun, weak=False)
signals.task_postrun.connect(_on_postrun, weak=False)
