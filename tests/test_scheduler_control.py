"""Thread- and loop-safe control of a Scheduler, shared backends, the handler pool."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from anarchon_core import ConfigError, JobContext
from anarchon_core.backends.sqlite import SqliteBackend

from .support.helpers import STEADY_LEASE, await_until, make_scheduler, wait_for

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]


make = functools.partial(make_scheduler, **STEADY_LEASE)


def sqlite(tmp_path: Path, table: str = "runs") -> SqliteBackend:
    return SqliteBackend(tmp_path / "store.db", table=table)





async def test_registration_from_another_thread_while_running(tmp_path: Path) -> None:
    scheduler = make(sqlite(tmp_path))
    ran: list[int] = []
    await scheduler.start()
    try:
        def register() -> None:
            scheduler.every("late", "1s", lambda ctx: ran.append(ctx.slot))

        thread = threading.Thread(target=register)
        thread.start()
        thread.join(5)
        await await_until(lambda: ran, 5, "the job registered from a thread to run")
        removed: list[bool] = []
        thread = threading.Thread(target=lambda: removed.append(scheduler.remove("late")))
        thread.start()
        thread.join(5)
        assert removed == [True]
        await asyncio.sleep(0.2)
        count = len(ran)
        await asyncio.sleep(1.6)
        assert len(ran) == count, "a removed job kept running"
    finally:
        await scheduler.stop()


def test_registration_on_the_main_thread_after_sync_start(tmp_path: Path) -> None:
    scheduler = make(sqlite(tmp_path))
    scheduler.sync.start()
    try:
        ran: list[int] = []
        scheduler.every("added", "1s", lambda ctx: ran.append(ctx.slot))
        wait_for(lambda: ran, 5, "the job registered on the main thread to run")
        with pytest.raises(ConfigError, match="already registered"):
            scheduler.every("added", "1s", lambda ctx: None)
    finally:
        scheduler.sync.stop()


def test_sync_twins_work_after_the_scheduler_was_used_under_asyncio_run(
        tmp_path: Path) -> None:
    scheduler = make(sqlite(tmp_path))
    scheduler.every("tick", "1h", lambda ctx: None)
    first = asyncio.run(scheduler.run_now("tick"))
    assert first.status == "success"
    # The loop that opened the backend is gone; the sync facade reopens it on its own.
    try:
        second = scheduler.sync.run_now("tick", timeout=10)
        history = scheduler.sync.history("tick")
    finally:
        scheduler.sync.stop()
    assert second.status == "success"
    assert {r.slot for r in history} >= {first.slot, second.slot}


async def test_two_schedulers_share_one_backend_object(tmp_path: Path) -> None:
    backend = sqlite(tmp_path)
    one = make(backend, "one")
    two = make(backend, "two")
    runs: dict[str, list[int]] = {"a": [], "b": []}
    one.every("a", "1s", lambda ctx: runs["a"].append(ctx.slot))
    two.every("b", "1s", lambda ctx: runs["b"].append(ctx.slot))
    await one.start()
    await two.start()
    try:
        await await_until(lambda: runs["a"] and runs["b"], 5, "both schedulers to run")
        await one.stop()  # must not close the connection the other one still uses
        count = len(runs["b"])
        await await_until(lambda: len(runs["b"]) > count + 1, 5, "the other to go on")
        history = await two.history("b")
        assert history
        assert {r.status for r in history} <= {"success", "running"}
    finally:
        await one.stop()
        await two.stop()


async def test_handler_threads_bound_the_sync_pool(tmp_path: Path) -> None:
    scheduler = make(sqlite(tmp_path), handler_threads=1)
    active: list[int] = []
    most = [0]
    lock = threading.Lock()

    def busy(ctx: JobContext) -> None:
        with lock:
            active.append(ctx.slot)
            most[0] = max(most[0], len(active))
        time.sleep(0.3)
        with lock:
            active.remove(ctx.slot)

    for name in ("a", "b", "c"):
        scheduler.every(name, "1s", busy, jitter_ms=0, max_late_ms=5_000)
    await scheduler.start()
    try:
        await asyncio.sleep(2.5)
    finally:
        await scheduler.stop()
    history = [r for name in ("a", "b", "c") for r in await scheduler.history(name)]
    await scheduler.stop()
    assert sum(r.status == "success" for r in history) >= 3
    assert most[0] == 1


def test_handler_threads_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid handler_threads 0"):
        make(sqlite(tmp_path), handler_threads=0)


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


async def test_contextvars_reach_sync_handlers(tmp_path: Path) -> None:
    scheduler = make(sqlite(tmp_path))
    seen: list[str] = []
    scheduler.every("ctxvar", "1h", lambda ctx: seen.append(REQUEST_ID.get()))
    REQUEST_ID.set("req-42")
    try:
        run = await scheduler.run_now("ctxvar")
    finally:
        await scheduler.stop()
    assert run.status == "success"
    assert seen == ["req-42"]


async def test_async_handlers_get_the_stop_grace_before_cancellation(tmp_path: Path) -> None:
    scheduler = make(sqlite(tmp_path))
    started = asyncio.Event()
    finished: list[str] = []

    @scheduler.every("tidy", "1s", jitter_ms=0)
    async def tidy(ctx: JobContext) -> None:
        started.set()
        await asyncio.to_thread(ctx.cancel_event.wait, 10)
        await asyncio.sleep(0.3)  # wraps up its work: within the grace, never cancelled
        finished.append(ctx.cancel_reason or "")

    await scheduler.start()
    await asyncio.wait_for(started.wait(), 5)
    await scheduler.stop(grace_ms=2_000)
    assert finished == ["stopping"]
    runs = await scheduler.history("tidy")
    await scheduler.stop()
    assert runs[0].status == "success"


def test_run_forever_runs_and_stops_several_schedulers(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        from anarchon_core import Scheduler, run_forever
        from anarchon_core.backends.sqlite import SqliteBackend

        def job(name):
            def handler(ctx):
                print(name, flush=True)
            return handler

        one = Scheduler(SqliteBackend({str(tmp_path / 'a.db')!r}), lease_ms=3000)
        two = Scheduler(SqliteBackend({str(tmp_path / 'b.db')!r}), lease_ms=3000)
        one.every("one", "1s", job("one"))
        two.every("two", "1s", job("two"))
        print("ready", flush=True)
        run_forever(one, two)
        print("stopped", one.running, two.running, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    seen: set[str] = set()
    deadline = time.monotonic() + 20
    while seen != {"ready", "one", "two"} and time.monotonic() < deadline:
        seen.add(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert seen >= {"one", "two"}
    assert proc.returncode == 0
    assert "stopped False False" in out
