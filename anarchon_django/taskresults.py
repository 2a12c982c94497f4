"""A scheduled task's own outcome, recorded beside its run (``Run.meta["task_status"]``).

The task backend sends ``task_finished`` in the process that ran the task (a worker of
``django-tasks-db`` or ``django-tasks-rq``, or the enqueuing thread itself with
``ImmediateBackend``). The receiver here finds the run that enqueued it (by its slot key
when the task takes one, else by the task id among the newest runs of the jobs that
schedule it; while a run that may be the one still runs, it waits a few seconds for that
run's end) and adds ``task_status`` to that run's meta (``Backend.add_meta``: every
lease store). Claim-only stores, which cannot update an ended run's meta (RabbitMQ, NATS,
Redis's claim-only strategies), keep only what the enqueue saw; the receiver never fails
a task.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from anarchon_core import Run
from anarchon_core.backend import Backend
from anarchon_core.errors import UnsupportedStrategyError
from anarchon_core.models import RunRef

from . import tasks

__all__ = ["connect", "find_run", "on_task_finished"]

log = logging.getLogger("anarchon.django.tasks")
#: Runs of each job looked through for a task id.
_SEARCH_RUNS = 100
#: The longest a receiver waits for the store.
_TIMEOUT_S = 10.0
#: How long a receiver waits for a running run to record its end, and how often it looks.
_END_WAIT_S = 5.0
_END_POLL_S = 0.1
_unsupported_said = False


def connect() -> None:
    """Connect :func:`on_task_finished` to the ``task_finished`` signals found here."""
    for module in ("django.tasks.signals", "django_tasks.signals"):
        try:
            signals = __import__(module, fromlist=["task_finished"])
        except ImportError:
            continue
        signals.task_finished.connect(on_task_finished,
                                      dispatch_uid=f"anarchon_django.task_finished.{module}")


def find_run(runs: list[Run], task_id: str, slot: int | None = None) -> Run | None:
    """The ended attempt among ``runs`` that enqueued ``task_id`` (newest first)."""
    for run in runs:
        if run.meta.get("task_id") == task_id and (slot is None or run.slot == slot) and \
                run.status != "running":
            return run
    return None


def _slot_of(result: Any) -> tuple[str, int] | None:
    value = (getattr(result, "kwargs", None) or {}).get(tasks.SLOT_KEY_ARG)
    if not isinstance(value, str) or "@" not in value:
        return None
    job, _, slot = value.rpartition("@")
    return (job, int(slot)) if slot.isdigit() else None


def on_task_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    """``task_finished``: add the task's status to the meta of the run that enqueued it."""
    if tasks.enqueuing_here():
        return  # an immediate backend: the enqueue records the status itself
    try:
        path = str(task_result.task.module_path)
    except Exception:  # noqa: BLE001 - a result anarchon cannot read is not ours
        return
    jobs = [name for name, target in tasks.scheduled().items() if target.name == path]
    if not jobs:
        return
    status = tasks.result_status(task_result)
    found = _slot_of(task_result)
    if found is not None and found[0] in jobs:
        jobs = [found[0]]
    work = _record(jobs, str(task_result.id), found[1] if found else None, status)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(asyncio.wait_for(work, _TIMEOUT_S))
        except BaseException as exc:  # noqa: BLE001 - reported below, never raised
            failure.append(exc)

    thread = threading.Thread(target=run, name="anarchon-task-status", daemon=True)
    thread.start()
    thread.join(_TIMEOUT_S + 1)
    if failure and not isinstance(failure[0], UnsupportedStrategyError):
        log.warning("could not record task %s's status %s beside its run: %s",
                    task_result.id, status, failure[0])


async def _record(jobs: list[str], task_id: str, slot: int | None, status: str) -> None:
    global _unsupported_said  # noqa: PLW0603 - said once per process
    from . import conf  # noqa: PLC0415

    backend = conf.build_backend(conf.load())
    await backend.start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _END_WAIT_S
    try:
        while True:
            run, pending = await _find(backend, jobs, task_id, slot)
            if run is not None or not pending or loop.time() >= deadline:
                break
            # A worker can finish the task before the worker that enqueued it has recorded
            # the run's end (and with it the task id): wait for that end, briefly.
            await asyncio.sleep(_END_POLL_S)
        if run is not None:
            try:
                await backend.add_meta(RunRef(run.job, run.slot, "", run.attempt, run.manual),
                                       {"task_status": status})
            except UnsupportedStrategyError:
                if not _unsupported_said:
                    _unsupported_said = True
                    log.info("%s keeps no task status beside ended runs; Run.meta has the "
                             "task id only", backend.describe())
                raise
            return
        log.debug("task %s (%s): no run of %s enqueued it among the newest %d", task_id,
                  status, ", ".join(jobs), _SEARCH_RUNS)
    finally:
        await backend.stop()


async def _find(backend: Backend, jobs: list[str], task_id: str,
                slot: int | None) -> tuple[Run | None, bool]:
    """The ended run that enqueued ``task_id``, and whether a run that may have is running."""
    pending = False
    for job in jobs:
        runs = await backend.history(job, _SEARCH_RUNS)
        run = find_run(runs, task_id, slot)
        if run is not None:
            return run, False
        pending = pending or any(r.status == "running" and (slot is None or r.slot == slot)
                                 for r in runs)
    return None, pending
