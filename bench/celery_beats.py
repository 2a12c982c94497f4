"""Celery beat schedulers side by side: Celery's default, celery-redbeat, anarchon_celery.

    python -m bench.celery_beats [--smoke] [--redis URL]

Real ``celery beat`` processes on one Redis (a server of this run's own on a free port, or
``--redis URL`` with unique key prefixes and queues, never flushed); each beat writes every
publish (``before_task_publish``) to a ledger of its own.

1. **three beats**: 3 beats of each scheduler at once, 20 entries every 1 s, 60 s measured:
   sends, duplicates (sends beyond the first of a slot), missing slots, and the mean period
   between an entry's sends. A send belongs to the slot in its ``anarchon_slot`` header,
   else to the 1-s grid second it was published in.
2. **SIGKILL**: then the beat that sent the latest slot is SIGKILLed; the two others run
   35 s more: the longest time without any send, and the slots lost after the kill.
   redbeat runs with ``beat_max_loop_interval=5`` (its lock then expires after 25 s; with
   defaults, 25 minutes).
3. **1,000 entries**: one beat of each scheduler in turn, 1,000 entries every 10 s, 40 s
   measured: the beat's CPU seconds per minute (user + system, all its threads) beside
   the floor, a loop making the same sends with Celery's ``apply_async`` and no scheduler
   (what publishing itself costs), and the
   share of due sends made on time (published before the entry's next due time), the share
   published at most 1 s late, and the 95th percentile of lateness. Due times are the grid
   for anarchon, and the entry's first send plus whole periods for the others.

Durations: about 2 minutes for 1–2 (all schedulers at once), 3 × ~55 s for 3; ~5 minutes
in all. ``--smoke`` runs every table in well under a minute; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import add_smoke_flag

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("default", "redbeat", "anarchon")
SCHEDULERS = {"default": "celery.beat:PersistentScheduler",
              "redbeat": "redbeat:RedBeatScheduler",
              "anarchon": "anarchon_celery:Scheduler"}
#: A due send is made on time when published before the entry's next due time; the
#: share published at most this late is shown too.
PROMPT_S = 1.0

APP_SOURCE = '''
import json, os, time
from datetime import timedelta
from celery import Celery
from celery.signals import before_task_publish

app = Celery("benchapp", broker=os.environ["BROKER"])
app.conf.update(json.loads(os.environ["CONF"]))
period = float(os.environ["PERIOD"])
app.conf.beat_schedule = {
    f"e{i}": {"task": "benchapp.noop", "schedule": timedelta(seconds=period),
              "args": (f"e{i}",), "options": {"queue": os.environ["QUEUE"]}}
    for i in range(int(os.environ["ENTRIES"]))}
_ledger = None


@before_task_publish.connect
def _record(sender=None, body=None, headers=None, **kwargs):
    global _ledger
    if _ledger is None:
        _ledger = open(os.path.join(os.environ["LEDGER_DIR"], f"{os.getpid()}.jsonl"), "a",
                       buffering=1)
    headers = headers or {}
    _ledger.write(json.dumps({"t": time.time(), "pid": os.getpid(), "entry": body[0][0],
                              "slot": headers.get("anarchon_slot")}) + "\\n")


@app.task(name="benchapp.noop")
def noop(name):
    return name
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server(given: str | None, workdir: Path) -> Iterator[str]:
    """``given``, or a redis-server of this run's own on a free port (stopped by PID)."""
    if given:
        yield given
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH; pass --redis URL")
    port = free_port()
    log = (workdir / "redis.log").open("ab")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--dir", str(workdir)], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        import redis  # noqa: PLC0415

        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port, socket_timeout=1).ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass
class Fleet:
    """The beats of one scheduler kind on one generated app."""

    kind: str
    workdir: Path
    broker: str
    entries: int
    period: float
    tag: str
    short_lease: bool = False
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.dir = self.workdir / f"{self.kind}-{self.tag}"
        self.ledgers = self.dir / "ledger"
        self.ledgers.mkdir(parents=True)
        (self.dir / "benchapp.py").write_text(APP_SOURCE)
        self.queue = f"bench-{self.kind}-{self.tag}"

    def conf(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"broker_connection_retry_on_startup": True}
        if self.kind == "redbeat":
            conf.update(redbeat_redis_url=self.broker, beat_max_loop_interval=5,
                        redbeat_key_prefix=f"bench-redbeat-{self.tag}:")
        elif self.kind == "anarchon":
            conf.update(anarchon_prefix=f"bench-anarchon-{self.tag}:")
            if self.short_lease:  # a claimed-but-unsent slot is taken over after 2 s
                conf.update(anarchon_lease_ms=2_000)
        return conf

    def start(self, count: int) -> None:
        env = dict(os.environ, BROKER=self.broker, CONF=json.dumps(self.conf()),
                   PERIOD=str(self.period), ENTRIES=str(self.entries), QUEUE=self.queue,
                   LEDGER_DIR=str(self.ledgers),
                   PYTHONPATH=os.pathsep.join([str(self.dir), str(ROOT)]))
        for index in range(count):
            log = (self.dir / f"beat{index}.log").open("ab")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "benchapp", "beat",
                 "-S", SCHEDULERS[self.kind], "-s", str(self.dir / f"schedule{index}"),
                 "--pidfile=", "-l", "warning"],
                cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT))
            log.close()

    def sends(self) -> list[dict[str, Any]]:
        out = []
        for path in self.ledgers.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return sorted(out, key=lambda s: s["t"])

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]


def slot_of(send: dict[str, Any], period_ms: int) -> int:
    if send.get("slot") is not None:
        return int(send["slot"])
    return int(send["t"] * 1000) // period_ms * period_ms


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_first_sends(fleets: list[Fleet], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(f.sends() for f in fleets):
            return
        time.sleep(0.2)
    missing = [f.kind for f in fleets if not f.sends()]
    raise SystemExit(f"no sends from {missing} within {timeout:.0f} s (logs in "
                     f"{fleets[0].workdir})")


def window_stats(sends: list[dict[str, Any]], entries: int, lo_ms: int, hi_ms: int,
                 period_ms: int) -> dict[str, float]:
    inside = [s for s in sends if lo_ms <= slot_of(s, period_ms) < hi_ms]
    keys = [(s["entry"], slot_of(s, period_ms)) for s in inside]
    distinct = set(keys)
    expected = {(f"e{i}", slot) for i in range(entries)
                for slot in range(-(-lo_ms // period_ms) * period_ms, hi_ms, period_ms)}
    by_entry: dict[str, list[float]] = defaultdict(list)
    seen = set()
    for s in inside:
        key = (s["entry"], slot_of(s, period_ms))
        if key not in seen:
            seen.add(key)
            by_entry[s["entry"]].append(s["t"])
    periods = [(ts[-1] - ts[0]) / (len(ts) - 1) * 1000 for ts in by_entry.values()
               if len(ts) > 1]
    return {"sends": len(inside), "duplicates": len(keys) - len(distinct),
            "missing": len(expected - distinct), "expected": len(expected),
            "period": sum(periods) / len(periods) if periods else float("nan")}


def three_beats(workdir: Path, broker: str, measure_s: float, after_kill_s: float,
                entries: int) -> None:
    tag = uuid.uuid4().hex[:8]
    fleets = [Fleet(kind, workdir, broker, entries, 1.0, tag, short_lease=True)
              for kind in KINDS]
    try:
        for fleet in fleets:
            fleet.start(3)
        wait_first_sends(fleets, 60)
        time.sleep(2)
        lo = (int(time.time() * 1000) // 1000 + 1) * 1000
        time.sleep(measure_s + 1.5)
        hi = lo + int(measure_s * 1000)
        kills: dict[str, int] = {}
        for fleet in fleets:
            last = fleet.sends()[-1]
            victim = next((p for p in fleet.procs if p.pid == last["pid"]), None)
            if victim is not None:
                victim.send_signal(signal.SIGKILL)
                victim.wait(5)
            kills[fleet.kind] = int(time.time() * 1000)
        time.sleep(after_kill_s)
        end = int(time.time() * 1000)
        for fleet in fleets:
            fleet.stop()
        print(f"\n(1) 3 beats, {entries} entries every 1 s, {measure_s:.0f} s measured "
              f"({entries * int(measure_s)} slots)")
        print(f"{'scheduler':<12} {'sends':>7} {'duplicates':>11} {'missing':>8} "
              f"{'period ms':>10}")
        for fleet in fleets:
            st = window_stats(fleet.sends(), entries, lo, hi, 1000)
            print(f"{fleet.kind:<12} {st['sends']:>7.0f} {st['duplicates']:>11.0f} "
                  f"{st['missing']:>8.0f} {st['period']:>10.1f}")
        print(f"\n(2) SIGKILL of the beat that sent the latest slot; {after_kill_s:.0f} s more")
        print(f"{'scheduler':<12} {'longest gap s':>14} {'slots lost':>11} {'of slots':>9}")
        for fleet in fleets:
            killed = kills[fleet.kind]
            times = [killed / 1000] + [s["t"] for s in fleet.sends()
                                       if s["t"] * 1000 >= killed] + [end / 1000]
            gap = max(b - a for a, b in itertools.pairwise(times))
            lost_hi = end - 2_000
            st = window_stats(fleet.sends(), entries, killed - 1_000, lost_hi, 1000)
            print(f"{fleet.kind:<12} {gap:>14.2f} {st['missing']:>11.0f} "
                  f"{st['expected']:>9.0f}")
    finally:
        for fleet in fleets:
            for proc in fleet.alive():
                proc.kill()


def lateness(sends: list[dict[str, Any]], entries: int, lo_ms: int, hi_ms: int,
             period_s: float, *, grid: bool) -> list[float | None]:
    """Seconds late of every send due in [lo, hi) (None: not made within one period).

    Due times are the grid slots for a scheduler whose sends carry their slot, else the
    entry's first send plus whole periods (its own timeline, which drifts when late).
    """
    period_ms = int(period_s * 1000)
    out: list[float | None] = []
    if grid:
        first_send = {}
        for s in sends:
            if s.get("slot") is not None:
                first_send.setdefault((s["entry"], int(s["slot"])), s["t"])
        for i in range(entries):
            for slot in range(-(-lo_ms // period_ms) * period_ms, hi_ms, period_ms):
                sent = first_send.get((f"e{i}", slot))
                late = None if sent is None else sent - slot / 1000
                out.append(late if late is not None and late < period_s else None)
        return out
    by_entry: dict[str, list[float]] = defaultdict(list)
    for s in sends:
        by_entry[s["entry"]].append(s["t"])
    for i in range(entries):
        times = by_entry.get(f"e{i}", [])
        first = next((t for t in times if t * 1000 >= lo_ms - period_ms), None)
        if first is None:
            out.extend([None] * max(0, (hi_ms - lo_ms) // period_ms))
            continue
        k = 0
        while (due_at := first + k * period_s) * 1000 < hi_ms:
            if due_at * 1000 >= lo_ms:
                made = [t - due_at for t in times if due_at - 0.5 <= t < due_at + period_s]
                out.append(max(0.0, min(made)) if made else None)
            k += 1
    return out


#: The floor of table 3: the same sends made by a loop calling Celery's ``apply_async``,
#: no scheduler at all (the ledger signal included, as in every beat).
PUBLISH_LOOP = """\
import os, time
from benchapp import app
period, end = float(os.environ["PERIOD"]), time.time() + float(os.environ["RUN_S"])
entries = list(app.conf.beat_schedule.values())
with app.producer_or_acquire() as producer:
    while time.time() < end:
        time.sleep(max(0.0, (int(time.time() / period) + 1) * period - time.time()))
        for entry in entries:
            app.tasks[entry["task"]].apply_async(entry["args"], producer=producer,
                                                 **entry["options"])
"""


def whole_periods(measure_s: float, period: float) -> float:
    """``measure_s`` rounded to whole periods: each window holds as many bursts of sends.

    Sends come in a burst per period; a window of 4.5 periods holds 4 or 5 of them, which
    alone moves CPU per minute by a fifth.
    """
    return max(1, round(measure_s / period)) * period


def sleep_to_mid_period(period: float) -> None:
    """Wait for the middle of the next grid period, away from the bursts at its edges.

    Called after the first send: the first burst is over by then.
    """
    now = time.time()
    time.sleep((int(now / period) + 1) * period + period / 2 - now)


def publish_floor(workdir: Path, broker: str, entries: int, measure_s: float,
                  period: float) -> float:
    """CPU s/min of a bare ``apply_async`` loop making the same sends as one beat."""
    fleet = Fleet("default", workdir, broker, entries, period, uuid.uuid4().hex[:8])
    (fleet.dir / "publish_loop.py").write_text(PUBLISH_LOOP)
    env = dict(os.environ, BROKER=broker, CONF=json.dumps(fleet.conf()), PERIOD=str(period),
               ENTRIES=str(entries), QUEUE=fleet.queue, LEDGER_DIR=str(fleet.ledgers),
               RUN_S=str(measure_s + 2 * period + 5),
               PYTHONPATH=os.pathsep.join([str(fleet.dir), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "publish_loop.py"], cwd=fleet.dir, env=env)
    try:
        wait_first_sends([fleet], 60)
        sleep_to_mid_period(period)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(whole_periods(measure_s, period))
        cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
    finally:
        proc.kill()
        proc.wait(10)
    return (cpu1 - cpu0) / (t1 - t0) * 60


def thousand_entries(workdir: Path, broker: str, entries: int, measure_s: float,
                     period: float) -> None:
    floor = publish_floor(workdir, broker, entries, measure_s, period)
    rows = []
    for kind in KINDS:
        fleet = Fleet(kind, workdir, broker, entries, period, uuid.uuid4().hex[:8])
        try:
            fleet.start(1)
            wait_first_sends([fleet], 90)
            sleep_to_mid_period(period)
            pid = fleet.procs[0].pid
            cpu0, lo = cpu_seconds(pid), int(time.time() * 1000)
            time.sleep(whole_periods(measure_s, period))
            cpu1, hi = cpu_seconds(pid), int(time.time() * 1000)
            time.sleep(0.5)
            fleet.stop()
            late = lateness(fleet.sends(), entries, lo, hi - int(period * 1000), period,
                            grid=kind == "anarchon")
            rows.append((kind, (cpu1 - cpu0) / (hi - lo) * 60_000, late))
        finally:
            for proc in fleet.alive():
                proc.kill()
    print(f"\n(3) 1 beat, {entries} entries every {period:g} s, "
          f"{whole_periods(measure_s, period):.0f} s measured (whole periods)")
    print(f"{'scheduler':<12} {'CPU s/min':>10} {'due':>6} {'on time %':>10} "
          f"{'≤1 s late %':>12} {'p95 late s':>11}")
    print(f"{'floor':<12} {floor:>10.2f} {'-':>6} {'-':>10} {'-':>12} {'-':>11}"
          "   (apply_async of the same sends in a loop, no scheduler)")
    for kind, cpu, late in rows:
        made = sorted(x for x in late if x is not None)
        due = len(late)
        share = 100 * len(made) / due if due else 0.0
        prompt = 100 * sum(1 for x in made if x <= PROMPT_S) / due if due else 0.0
        p95 = made[min(len(made) - 1, int(len(made) * 0.95))] if made else float("nan")
        print(f"{kind:<12} {cpu:>10.2f} {due:>6} {share:>10.1f} {prompt:>12.1f} {p95:>11.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.celery_beats")
    parser.add_argument("--redis", help="an existing Redis (unique prefixes; never flushed)")
    add_smoke_flag(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-celery-") as tmp:
        workdir = Path(tmp)
        with redis_server(args.redis, workdir) as broker:
            print(f"Celery beat schedulers on {broker.split('@')[-1]} "
                  f"({os.cpu_count()} CPUs)")
            if args.smoke:
                three_beats(workdir, broker, measure_s=2, after_kill_s=3, entries=5)
                thousand_entries(workdir, broker, entries=50, measure_s=2, period=1)
            else:
                three_beats(workdir, broker, measure_s=60, after_kill_s=35, entries=20)
                thousand_entries(workdir, broker, entries=1000, measure_s=40, period=10)


if __name__ == "__main__":
    main()
