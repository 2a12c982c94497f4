"""3 APScheduler processes on one SQLAlchemyJobStore: runs per firing, without and with anarchon.

    python -m bench.apscheduler_duplicates             # 60 s per store, SQLite and PostgreSQL
    python -m bench.apscheduler_duplicates --smoke     # a few seconds, SQLite only

For each store, three deployments run side by side, at the same time, each as three
processes of the same ``BackgroundScheduler`` setup with five ``interval`` jobs (every
second, fixed start) in a shared ``SQLAlchemyJobStore``:

* ``no wrapper``: APScheduler as it is (the floor: what the shared store alone gives);
* ``AnarchonExecutor``: the same with the executor wrapped (anarchon on the same database);
* ``+ AnarchonJobStore``: the job store wrapped too.

Each process appends one line per ``EVENT_JOB_EXECUTED`` to a ledger; the table counts,
over the firings due in the measured window, how many runs each had, the duplicates
(runs beyond the first) and the firings nobody ran.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import add_smoke_flag

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
SETUPS = [("plain", "no wrapper (shared store)"), ("executor", "AnarchonExecutor"),
          ("both", "+ AnarchonJobStore")]
PROCESSES = 3
EPOCH = "1970-01-01 00:00:00+00:00"


def job() -> None:
    """The benchmark's job: nothing; the listener records that it ran."""


def worker(config: dict[str, Any]) -> None:
    """One process of one deployment (``--worker CONFIG``)."""
    from apscheduler.events import EVENT_JOB_EXECUTED  # noqa: PLC0415
    from apscheduler.executors.pool import ThreadPoolExecutor  # noqa: PLC0415
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore  # noqa: PLC0415
    from apscheduler.schedulers.background import BackgroundScheduler  # noqa: PLC0415

    from anarchon_apscheduler import AnarchonExecutor, AnarchonJobStore  # noqa: PLC0415

    store: Any = SQLAlchemyJobStore(url=config["jobstore"], tablename=config["table"])
    executor: Any = ThreadPoolExecutor(10)
    if config["setup"] != "plain":
        executor = AnarchonExecutor(executor, backend=config["backend"])
    if config["setup"] == "both":
        store = AnarchonJobStore(store, sync_interval=2.0)
    scheduler = BackgroundScheduler(jobstores={"default": store},
                                    executors={"default": executor}, timezone="UTC")
    for index in range(config["jobs"]):
        scheduler.add_job("bench.apscheduler_duplicates:job", "interval", seconds=1,
                          start_date=EPOCH, id=f"job{index}", replace_existing=True)
    ledger = open(config["ledger"], "a", buffering=1)  # noqa: SIM115 - open for the run

    def executed(event: Any) -> None:
        run_ms = round(event.scheduled_run_time.timestamp() * 1000)
        ledger.write(json.dumps([event.job_id, run_ms]) + "\n")

    scheduler.add_listener(executed, EVENT_JOB_EXECUTED)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    scheduler.start()
    Path(config["ledger"] + ".ready").touch()
    while not stop["now"]:
        time.sleep(0.1)
    scheduler.shutdown()
    ledger.close()


def _create_table(url: str, table: str) -> None:
    # Processes starting together race to create the table; create it once beforehand.
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore  # noqa: PLC0415

    store = SQLAlchemyJobStore(url=url, tablename=table)
    store.jobs_t.create(store.engine, checkfirst=True)
    store.engine.dispose()


def _drop(url: str, tables: list[str]) -> None:
    from sqlalchemy import create_engine, text  # noqa: PLC0415

    engine = create_engine(url)
    with engine.begin() as conn:
        for table in tables:
            conn.execute(text(f'DROP TABLE IF EXISTS "{table}"'))
    engine.dispose()


def run_store(store: str, seconds: float, jobs: int, postgres: str,
              workdir: Path) -> list[tuple[str, str, int, int, int, int]]:
    """Run the three deployments on one store at once; one row per deployment."""
    tag = f"b{os.getpid()}_{int(time.time())}"
    if store == "sqlite":
        jobstore = f"sqlite:///{workdir / 'jobs.db'}"
        backend = f"sqlite:///{workdir / 'anarchon.db'}?table={{table}}"
    else:
        jobstore = postgres.replace("postgresql://", "postgresql+psycopg://", 1)
        backend = f"{postgres}{'&' if '?' in postgres else '?'}table={{table}}"
    tables = [f"{tag}_{setup}" for setup, _ in SETUPS]
    for table in tables:
        _create_table(jobstore, table)
    procs: list[subprocess.Popen[bytes]] = []
    ledgers: dict[str, list[Path]] = {setup: [] for setup, _ in SETUPS}
    try:
        for setup, _ in SETUPS:
            for index in range(PROCESSES):
                ledger = workdir / f"{store}-{setup}-{index}.jsonl"
                ledgers[setup].append(ledger)
                config = {"setup": setup, "jobstore": jobstore, "table": f"{tag}_{setup}",
                          "backend": backend.format(table=f"{tag}_{setup}_runs"),
                          "jobs": jobs, "ledger": str(ledger)}
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "bench.apscheduler_duplicates", "--worker",
                     json.dumps(config)], cwd=ROOT, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        for paths in ledgers.values():
            for path in paths:
                while not Path(f"{path}.ready").exists():
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"a {store} worker did not start")
                    time.sleep(0.1)
        begin = time.time() + 2
        time.sleep(seconds)
        end = time.time() - 2
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        if store == "postgres":
            runs = [f"{tag}_{setup}_runs" for setup, _ in SETUPS]
            _drop(jobstore, tables + runs + [f"{t}_meta" for t in runs])
    first, last = int(begin) + 1, int(end)
    due = [(f"job{i}", s * 1000) for i in range(jobs) for s in range(first, last + 1)]
    rows = []
    for setup, label in SETUPS:
        runs: Counter[tuple[str, int]] = Counter()
        for path in ledgers[setup]:
            if path.exists():
                for line in path.read_text().splitlines():
                    job_id, run_ms = json.loads(line)
                    runs[(job_id, run_ms)] += 1
        total = sum(runs[f] for f in due)
        duplicates = sum(max(0, runs[f] - 1) for f in due)
        missing = sum(1 for f in due if runs[f] == 0)
        rows.append((store, label, len(due), total, duplicates, missing))
    return rows


def print_rows(rows: list[tuple[str, str, int, int, int, int]]) -> None:
    """The table: one row per store and deployment."""
    print(f"{'store':<9} {'setup':<27} {'firings':>7} {'runs':>6} {'runs/firing':>11} "
          f"{'duplicates':>10} {'missing':>7}")
    for store, label, firings, runs, duplicates, missing in rows:
        print(f"{store:<9} {label:<27} {firings:>7} {runs:>6} "
              f"{runs / max(firings, 1):>11.2f} {duplicates:>10} {missing:>7}")


def main() -> None:
    """Parse the arguments and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_smoke_flag(parser)
    parser.add_argument("--seconds", type=float, default=None, help="per store (default 60)")
    parser.add_argument("--jobs", type=int, default=5, help="interval jobs (default 5)")
    parser.add_argument("--stores", default=None,
                        help="comma-separated: sqlite,postgres (default both; --smoke: sqlite)")
    parser.add_argument("--postgres", default=os.environ.get(
        "ANARCHON_TEST_POSTGRES_URL", DEFAULT_POSTGRES), help="PostgreSQL URL")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    seconds = args.seconds or (8.0 if args.smoke else 60.0)
    jobs = 2 if args.smoke and args.jobs == 5 else args.jobs
    stores = (args.stores or ("sqlite" if args.smoke else "sqlite,postgres")).split(",")
    print(f"{PROCESSES} processes per setup, {jobs} interval jobs (every 1 s), "
          f"{seconds:.0f} s per store; the setups run at the same time")
    rows = []
    with tempfile.TemporaryDirectory(prefix="anarchon-aps-bench-") as tmp:
        for store in stores:
            workdir = Path(tmp) / store
            workdir.mkdir()
            rows.extend(run_store(store, seconds, jobs, args.postgres, workdir))
    print_rows(rows)


if __name__ == "__main__":
    main()
