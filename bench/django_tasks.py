"""Scheduled Django tasks: a slot's enqueue beside a bare ``enqueue()`` loop (the floor).

    python -m bench.django_tasks [--smoke] [--entries 1000] [--every 10] [--seconds 60]

One process, one SQLite database file holding both the runs table (``ANARCHON['BACKEND']
= "default"``) and django-tasks-db's task rows, so every scheduled slot's enqueue and its
run's end commit in one transaction (the exactly-once path). Two rows, each measured for
``--seconds`` after a warm-up slot:

* **floor**: a loop that, at every ``--every`` grid instant, calls ``task.enqueue()`` once
  per entry (``--entries``), no scheduler, no transaction around it: what enqueueing costs.
* **anarchon**: ``--entries`` scheduled tasks (``anarchon_django.schedule(..., every=...)``)
  run by one started scheduler (jitter 0: one worker has no one to spread the load with).

Columns: CPU seconds per minute of the process (user + system, all threads) and its ratio
to the floor's; lateness of each task row (its ``enqueued_at`` minus its slot) p50/p99; and
task rows per slot (min/max over every slot due in the window: 1/1 means once each).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import django
from django.conf import settings

WORKDIR = Path(tempfile.mkdtemp(prefix="anarchon-bench-tasks-"))
if not settings.configured:
    settings.configure(
        USE_TZ=True, TIME_ZONE="UTC", SECRET_KEY="bench",
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            *([] if importlib.util.find_spec("django.tasks") else ["django_tasks"]),
            "django_tasks_db", "anarchon_django",
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3",
                               "NAME": str(WORKDIR / "bench.sqlite3"),
                               "OPTIONS": {"timeout": 30}}},
        TASKS={"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}},
        ANARCHON={"BACKEND": "default", "JOB_DEFAULTS": {"jitter_ms": 0}},
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )
    django.setup()

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def noop(slot_key: str = "") -> None:
    """The scheduled task (never run here: the bench measures enqueueing)."""


def _rows() -> list[tuple[str, float]]:
    """(slot key, enqueued_at as epoch seconds) of every task row."""
    from django_tasks_db.models import DBTaskResult  # noqa: PLC0415

    return [(r.args_kwargs["kwargs"].get("slot_key", ""), r.enqueued_at.timestamp())
            for r in DBTaskResult.objects.all().only("args_kwargs", "enqueued_at")]


def _clear() -> None:
    from django_tasks_db.models import DBTaskResult  # noqa: PLC0415

    DBTaskResult.objects.all().delete()


def _next_grid(every_s: int, after: float) -> float:
    return (int(after) // every_s + 1) * every_s


def _floor(entries: int, every_s: int, seconds: float) -> dict[str, Any]:
    """Enqueue ``entries`` times at every grid instant of the window, plainly."""
    first = _next_grid(every_s, time.time())
    while time.time() < first:
        time.sleep(0.01)
    _clear()
    start_cpu, start = time.process_time(), time.time()
    slot = first
    while slot < start + seconds:
        while time.time() < slot:
            time.sleep(0.005)
        for i in range(entries):
            noop.enqueue(slot_key=f"floor-{i}@{int(slot * 1000)}")
        slot += every_s
    while time.time() < start + seconds:
        time.sleep(0.05)
    cpu = time.process_time() - start_cpu
    return _summary("floor: enqueue() loop", cpu, time.time() - start, _rows())


def _scheduled(entries: int, every_s: int, seconds: float) -> dict[str, Any]:
    import anarchon_django  # noqa: PLC0415

    for i in range(entries):
        anarchon_django.schedule(noop, every=f"{every_s}s", name=f"bench-{i}")
    anarchon_django.start()
    try:
        # One slot of warm-up (connections, first claims), then the window on the grid.
        first = _next_grid(every_s, time.time() + every_s)
        while time.time() < first - 0.5:
            time.sleep(0.05)
        _clear()
        start_cpu, start = time.process_time(), time.time()
        while time.time() < start + seconds:
            time.sleep(0.05)
        cpu = time.process_time() - start_cpu
        elapsed = time.time() - start
        time.sleep(min(every_s, 5))  # the window's last slots finish
    finally:
        anarchon_django.stop()
    rows = [(key, at) for key, at in _rows() if int(key.rpartition("@")[2]) / 1000 < start +
            seconds]
    return _summary("anarchon: scheduled tasks", cpu, elapsed, rows)


def _summary(name: str, cpu: float, elapsed: float,
             rows: list[tuple[str, float]]) -> dict[str, Any]:
    lateness = sorted((at - int(key.rpartition("@")[2]) / 1000) * 1000 for key, at in rows)
    per_slot = Counter(key for key, _ in rows)
    counts = list(per_slot.values()) or [0]

    def pct(q: float) -> float:
        return lateness[min(len(lateness) - 1, int(len(lateness) * q))] if lateness else 0.0

    return {"name": name, "cpu_per_min": cpu / elapsed * 60, "tasks": len(rows),
            "p50": statistics.median(lateness) if lateness else 0.0, "p99": pct(0.99),
            "min": min(counts), "max": max(counts), "slots": len(per_slot)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--every", type=int, default=10, help="seconds between slots")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured per row")
    parser.add_argument("--smoke", action="store_true",
                        help="20 entries every 1 s for 3 s: checks the command runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.entries, args.every, args.seconds = 20, 1, 3.0
    from django.core.management import call_command  # noqa: PLC0415

    call_command("migrate", verbosity=0)
    floor = _floor(args.entries, args.every, args.seconds)
    row = _scheduled(args.entries, args.every, args.seconds)
    print(f"\nDjango {django.get_version()}, Python {sys.version.split()[0]}, SQLite; "
          f"{args.entries} entries every {args.every} s, {args.seconds:g} s measured per row")
    header = (f"{'row':<28} {'tasks':>7} {'CPU s/min':>10} {'×floor':>7} "
              f"{'late p50 ms':>12} {'late p99 ms':>12} {'tasks/slot':>11}")
    print(header)
    print("-" * len(header))
    for r in (floor, row):
        print(f"{r['name']:<28} {r['tasks']:>7} {r['cpu_per_min']:>10.2f} "
              f"{r['cpu_per_min'] / floor['cpu_per_min']:>7.2f} {r['p50']:>12.1f} "
              f"{r['p99']:>12.1f} {str(r['min']) + '/' + str(r['max']):>11}")


if __name__ == "__main__":
    main()
