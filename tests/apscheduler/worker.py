"""One APScheduler process for the multi-process tests: ``python -m tests.apscheduler.worker``.

It runs the setup described by a JSON config (scheduler kind, inner executor, job store,
jobs) with an ``AnarchonExecutor``, and appends to an fsynced ledger (one file per
process): ``start``/``end`` lines written by the job functions themselves, and one line per
APScheduler event its listener receives. Commands dropped as ``<control>/<name>.json``
(add, pause, resume, remove a job) are applied at run time. SIGTERM shuts it down.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import os
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from apscheduler.events import EVENT_ALL
from apscheduler.executors.asyncio import AsyncIOExecutor
from apscheduler.executors.pool import ProcessPoolExecutor, ThreadPoolExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.blocking import BlockingScheduler

from anarchon_apscheduler import AnarchonExecutor, AnarchonJobStore, current_run, slot_for

#: Job id → trigger, to give each event its slots (the listener must not take the
#: scheduler's locks: APScheduler holds them while it shuts its executors down).
TRIGGERS: dict[str, Any] = {}
LEDGER_DIR = Path(os.environ.get("APS_LEDGER_DIR", "."))


def append(line: dict[str, Any]) -> None:
    """Append one JSON line to this process's ledger file and fsync it."""
    path = LEDGER_DIR / f"ledger-{os.getpid()}.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _line(event: str, job: str, grid_ms: int) -> dict[str, Any]:
    run = current_run()
    now = time.time()
    if run is not None:
        slot, attempt = run.slot, run.attempt
    else:  # a process pool: no context in the child; the job's grid gives the slot
        slot, attempt = int(now * 1000) // grid_ms * grid_ms, 0
    return {"event": event, "job": job, "slot": slot, "attempt": attempt, "pid": os.getpid(),
            "instance": os.environ.get("APS_NAME", "?"), "t": now,
            "mono_ns": time.monotonic_ns()}


def record(job: str, sleep_s: float = 0.05, grid_ms: int = 1000, fail: bool = False) -> str:
    """The job function: ledger ``start``, work, ledger ``end`` (the side effect)."""
    append(_line("start", job, grid_ms))
    time.sleep(sleep_s)
    if fail:
        raise RuntimeError(f"{job} failed on purpose")
    append(_line("end", job, grid_ms))
    return "ok"


async def record_async(job: str, sleep_s: float = 0.05, grid_ms: int = 1000) -> str:
    """The coroutine twin of :func:`record` (runs on the asyncio scheduler's loop)."""
    append(_line("start", job, grid_ms))
    await asyncio.sleep(sleep_s)
    append(_line("end", job, grid_ms))
    return "ok"


def add_job(scheduler: Any, spec: dict[str, Any], coroutine: bool) -> None:
    func = "tests.apscheduler.worker:record_async" if coroutine and not spec.get("fail") \
        else "tests.apscheduler.worker:record"
    kwargs = {"job": spec["id"], "sleep_s": spec.get("sleep_s", 0.05),
              "grid_ms": spec.get("grid_ms", 1000)}
    if spec.get("fail"):
        kwargs["fail"] = True
    options = dict(spec.get("options", {}))
    if spec.get("first_run_now"):  # the "run at start, then every interval" idiom
        options["next_run_time"] = datetime.now(UTC)
    job = scheduler.add_job(func, spec["trigger"], id=spec["id"], kwargs=kwargs,
                            replace_existing=True, **options, **spec["args"])
    TRIGGERS[spec["id"]] = job.trigger


def make(config: dict[str, Any]) -> Any:
    kind = config.get("executor", "threadpool")
    inner = {"threadpool": lambda: ThreadPoolExecutor(8),
             "processpool": lambda: ProcessPoolExecutor(2),
             "asyncio": AsyncIOExecutor}[kind]()
    executor = AnarchonExecutor(inner, backend=config["backend"],
                                instance_id=config["name"], **config.get("scheduler_options",
                                                                         {}))
    jobstores: dict[str, Any] = {}
    if config.get("jobstore"):
        from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore  # noqa: PLC0415
        jobstores["default"] = AnarchonJobStore(
            SQLAlchemyJobStore(url=config["jobstore"], tablename=config["jobstore_table"]),
            sync_interval=config.get("sync_interval", 1.0))
    cls = {"background": BackgroundScheduler, "blocking": BlockingScheduler,
           "asyncio": AsyncIOScheduler}[config.get("scheduler", "background")]
    return cls(executors={"default": executor}, jobstores=jobstores, timezone="UTC")


def on_event(scheduler: Any, event: Any) -> None:
    line: dict[str, Any] = {"event": "aps", "code": event.code,
                            "job": getattr(event, "job_id", None),
                            "instance": os.environ.get("APS_NAME", "?"), "pid": os.getpid()}
    job_id = getattr(event, "job_id", None)
    trigger = TRIGGERS.get(job_id) if job_id else None
    if job_id and trigger is None:
        job = scheduler._jobstores["default"].lookup_job(job_id)
        trigger = job.trigger if job is not None else None
    times = getattr(event, "scheduled_run_times", None)
    if times is None and getattr(event, "scheduled_run_time", None) is not None:
        times = [event.scheduled_run_time]
    if times is not None:
        line["run_times"] = [t.isoformat() for t in times]
        if trigger is not None:
            line["slots"] = [slot_for(trigger, t) for t in times]
    append(line)


def control(scheduler: Any, config: dict[str, Any], stop: threading.Event,
            coroutine: bool) -> None:
    directory = Path(config["control"])
    while not stop.wait(0.1):
        for path in sorted(directory.glob(f"{config['name']}.*.json")):
            apply(scheduler, json.loads(path.read_text()), coroutine)
            path.unlink()


def apply(scheduler: Any, command: dict[str, Any], coroutine: bool) -> None:
    op = command["op"]
    if op == "add":
        add_job(scheduler, command["job"], coroutine)
    elif op == "pause":
        scheduler.pause_job(command["id"])
    elif op == "resume":
        scheduler.resume_job(command["id"])
    elif op == "remove":
        scheduler.remove_job(command["id"])
    append({"event": "control", "op": op, "t": time.time(), "pid": os.getpid()})


def main() -> None:
    faulthandler.register(signal.SIGUSR1)
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    config = json.loads(Path(parser.parse_args().config).read_text())
    scheduler = make(config)
    coroutine = config.get("executor") == "asyncio"
    for spec in config.get("jobs", []):
        add_job(scheduler, spec, coroutine)
    scheduler.add_listener(lambda e: on_event(scheduler, e), EVENT_ALL)
    stop = threading.Event()
    ready = LEDGER_DIR / f"{config['name']}.ready"
    threading.Thread(target=control, args=(scheduler, config, stop, coroutine),
                     daemon=True).start()
    kind = config.get("scheduler", "background")
    if kind == "asyncio":
        async def run() -> None:
            done = asyncio.Event()
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGTERM, done.set)
            scheduler.start()
            ready.touch()
            await done.wait()
            scheduler.shutdown()
        asyncio.run(run())
    elif kind == "blocking":
        def handler(*_: object) -> None:
            threading.Thread(target=scheduler.shutdown).start()
        signal.signal(signal.SIGTERM, handler)
        threading.Timer(1.0, ready.touch).start()
        scheduler.start()
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        scheduler.start()
        ready.touch()
        while not stop.wait(0.2):
            pass
        scheduler.shutdown()
    stop.set()


if __name__ == "__main__":
    main()
