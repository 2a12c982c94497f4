"""An existing APScheduler 3 setup, run on as many processes as you like.

    ANARCHON_URL=sqlite:///anarchon.db python examples/apscheduler/app.py   # in 3 terminals

Each firing of ``report`` and ``sync`` runs on exactly one of the processes; stop one
(or ``kill -9`` it) and the others go on. The only change from a plain APScheduler setup
is the executor (and, for jobs added at run time, the job store).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from datetime import UTC, datetime

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from anarchon_apscheduler import EPOCH, AnarchonExecutor, current_run

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")


def report() -> None:
    """A job: prints which firing this process runs."""
    run = current_run()
    assert run is not None
    print(f"{os.getpid()}: report for {run.run_time:%H:%M:%S} (attempt {run.attempt})")


def sync() -> None:
    """A job that fences its side effect: check the lease right before writing."""
    run = current_run()
    if run is not None:
        run.check_lease()  # raises LeaseLost if another process took this run over
    print(f"{os.getpid()}: sync at {datetime.now(UTC):%H:%M:%S}")


def main() -> None:
    """Start the scheduler and run until Ctrl-C or SIGTERM."""
    backend = os.environ.get("ANARCHON_URL", "sqlite:///anarchon.db")
    scheduler = BackgroundScheduler(
        executors={"default": AnarchonExecutor(ThreadPoolExecutor(10), backend=backend)},
        timezone="UTC")
    scheduler.add_job(report, "cron", second="*/5", jitter=1, id="report")
    # An interval needs a fixed start, the same on every process (the epoch grid here).
    scheduler.add_job(sync, "interval", seconds=10, start_date=EPOCH, id="sync")
    scheduler.add_listener(lambda e: print(f"event {e.code} for {e.job_id}"),
                           EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    scheduler.start()
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        scheduler.shutdown()


if __name__ == "__main__":
    main()
