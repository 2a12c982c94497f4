"""The admin's view of the fleet: the live workers, the paused jobs, and what that implies.

Read through the core's fleet view (``scheduler.sync.status()``, what ``anarchon status``
prints) on the admin's read-only reader: every running scheduler keeps a registry record
(instance id, version, last seen) that expires 30 s after its last refresh, and deletes it
on ``stop()``. Pure functions; the admin classes only render what they return.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.utils import timezone

from anarchon_core import (
    PauseInfo,
    Scheduler,
    StoreNotSetUp,
    UnsupportedStrategyError,
    slot_to_datetime,
)

from . import views

__all__ = ["NO_WORKER", "Fleet", "Worker", "apply", "read_fleet"]

#: The timeline state of a slot left unrun while no worker is alive.
NO_WORKER = "no-worker"
#: The most workers the banner names one by one.
SHOWN_WORKERS = 20


@dataclass(frozen=True)
class Worker:
    """A live scheduler instance, as its registry record says."""

    instance_id: str
    version: str
    started_at: datetime
    seen_at: datetime
    #: Seconds since the record was last refreshed (it is refreshed every 10 s).
    seen_ago_s: int
    jobs: int


@dataclass
class Fleet:
    """What the store says about the fleet, or why it cannot say."""

    workers: list[Worker] = field(default_factory=list)
    paused: dict[str, PauseInfo] = field(default_factory=dict)
    #: False when the store keeps no fleet records (RabbitMQ, NATS): liveness is unknown.
    known: bool = True
    error: str | None = None
    #: Why liveness is unknown, for the banner (a store without records, or a failed read).
    unknown_reason: str | None = None

    @property
    def none_alive(self) -> bool:
        """True when the store was read and no worker's record is live."""
        return self.known and self.error is None and not self.workers

    @property
    def shown(self) -> list[Worker]:
        """The workers the banner names (the rest are counted)."""
        return self.workers[:SHOWN_WORKERS]

    @property
    def hidden(self) -> int:
        """How many live workers the banner only counts."""
        return max(0, len(self.workers) - SHOWN_WORKERS)


def read_fleet(reader: Scheduler | None) -> Fleet:
    """The live workers and paused jobs of the store ``reader`` reads (never writes)."""
    if reader is None:
        return Fleet(known=False, unknown_reason="the store could not be opened")
    try:
        status = reader.sync.status()
    except UnsupportedStrategyError as exc:
        return Fleet(known=False, unknown_reason=views.store_error(exc))
    except StoreNotSetUp:
        return Fleet()  # nothing was ever written: no worker has run yet
    except Exception as exc:  # noqa: BLE001 - shown on the page
        message = views.store_error(exc)
        return Fleet(known=False, error=message, unknown_reason=message)
    now_ms = round(time.time() * 1000)
    workers = [Worker(i.instance_id, i.version, _local(i.started_at_ms), _local(i.seen_at_ms),
                      max(0, now_ms - i.seen_at_ms) // 1000, i.jobs)
               for i in status.instances]
    paused = {job.name: job.paused for job in status.jobs if job.paused is not None}
    return Fleet(workers, paused)


def apply(fleet: Fleet, rows: list[views.JobRow]) -> list[views.JobRow]:
    """The job table with the fleet's state: paused jobs marked, unrun slots explained.

    A job paused in the store but neither declared here nor in history gets a row of its
    own, so it can be resumed.
    """
    by_name = {row.name: row for row in rows}
    for name, info in fleet.paused.items():
        row = by_name.get(name)
        if row is None:
            row = by_name[name] = views.JobRow(name, "", False)
            rows.append(row)
        row.paused = info
    if fleet.none_alive:
        _without_workers(rows)
    return rows


def _without_workers(rows: list[views.JobRow]) -> None:
    """Mark what the job table must not promise while no worker is alive.

    Slots that could still be claimed will not be, and slots left unrun after the fleet's
    last scheduled run (across every job) were left so for want of a worker, not missed
    by one: both show as :data:`NO_WORKER`. Older unrun slots were missed while something
    ran, and stay so.
    """
    starts = [row.last.started_at for row in rows
              if row.last is not None and row.last.started_at is not None]
    last_life = max(starts, default=None)
    since_ms = round(last_life.timestamp() * 1000) if last_life is not None else None
    for row in rows:
        row.timeline = [
            replace(cell, state=NO_WORKER)
            if cell.state == "pending" or (cell.state == "missed"
                                           and (since_ms is None or cell.slot > since_ms))
            else cell
            for cell in row.timeline]


def _local(ms: int) -> datetime:
    return timezone.localtime(slot_to_datetime(ms))
