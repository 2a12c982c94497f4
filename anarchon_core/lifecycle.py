"""One way to run schedulers until told to stop: start with retry, signals, graceful stop.

:func:`serve` is what :func:`~anarchon_core.run_forever`, ``anarchon run``, the Django
worker (``manage.py anarchon``) and the instance processes of the demo and the tests run;
the Celery beat, whose process and signals are Celery's, uses :func:`start_with_retry` on
its own thread. A store that does not answer at start is retried with back-off (1 s,
doubling up to 30 s) until it does or the process is asked to stop; SIGINT or SIGTERM
stops every scheduler gracefully (its runs handed over); a second Ctrl-C exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import ConfigError, StoreUnavailable

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ["START_RETRY_FIRST_S", "START_RETRY_MAX_S", "StopSignals", "serve",
           "start_with_retry"]

log = logging.getLogger("anarchon.scheduler")

#: The first wait after a start the store did not answer (s), and the longest.
START_RETRY_FIRST_S = 1.0
START_RETRY_MAX_S = 30.0
#: Exit status of a process stopped by a second Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


async def start_with_retry(
    scheduler: Scheduler, stop: asyncio.Event, *,
    retry: tuple[type[BaseException], ...] = (StoreUnavailable,),
    call_timeout_s: float | None = None,
    first_delay_s: float = START_RETRY_FIRST_S, max_delay_s: float = START_RETRY_MAX_S,
    meanwhile: str = "retrying with back-off until it answers", announce: bool = False,
) -> bool:
    """Start ``scheduler``, retrying the errors in ``retry`` until it starts or ``stop`` is set.

    True once started; False if ``stop`` was set first. The first failure is logged once
    (a warning ending with ``meanwhile``: what the process does until the store answers),
    the next ones at DEBUG, and the start that follows them at INFO; with ``announce`` the
    start is logged ("connected") even without a failure before it. With
    ``call_timeout_s`` a start that hangs longer counts as a failure. Errors not in
    ``retry`` (a bad configuration, a store written by a newer anarchon) are raised.
    """
    errors: tuple[type[BaseException], ...] = \
        retry if call_timeout_s is None else (*retry, TimeoutError)
    describe = scheduler.backend.describe()
    delay, failures = first_delay_s, 0
    while not stop.is_set():
        try:
            if call_timeout_s is None:
                await scheduler.start()
            else:
                await asyncio.wait_for(scheduler.start(), call_timeout_s)
        except errors as exc:
            failures += 1
            log.log(logging.WARNING if failures == 1 else logging.DEBUG,
                    "store %s unreachable (%s); %s", describe, exc or "no answer", meanwhile)
        else:
            if failures or announce:
                log.info("store %s connected%s", describe,
                         f" after {failures} failed start(s)" if failures else "")
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, max_delay_s)
    return False


class StopSignals:
    """SIGINT and SIGTERM set :attr:`event`; a second SIGINT exits the process at once.

    A repeated SIGTERM (a supervisor signalling the whole process group) does not cut the
    graceful stop short. :attr:`received` names the first signal.
    """

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.received: str | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Handle SIGINT and SIGTERM on ``loop`` (its thread must be the main thread)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def remove(self, loop: asyncio.AbstractEventLoop) -> None:
        """Give SIGINT and SIGTERM back to their default handlers."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.event.is_set():
            if sig is signal.SIGINT and self.received == "SIGINT":
                log.warning("SIGINT again: exiting now; unfinished runs' leases expire on "
                            "their own")
                os._exit(EXIT_INTERRUPTED)
            return
        self.received = sig.name
        self.event.set()


async def serve(*schedulers: Scheduler, stop: asyncio.Event | None = None,
                signals: bool = True, seconds: float | None = None,
                grace_ms: int | None = None,
                on_running: Callable[[], None] | None = None) -> None:
    """Start every scheduler, run until stopped, then stop them all gracefully.

    Stopped by SIGINT/SIGTERM (with ``signals``), by ``stop`` being set, or after
    ``seconds``. A store that does not answer at start is retried (see
    :func:`start_with_retry`); ``on_running()`` is called once every scheduler runs.
    ``grace_ms`` overrides each scheduler's ``stop_grace_ms``.
    """
    if not schedulers:
        raise ConfigError("serve() needs at least one scheduler")
    loop = asyncio.get_running_loop()
    watcher = StopSignals()
    if stop is not None:
        watcher.event = stop
    if signals:
        watcher.install(loop)
    started: list[Scheduler] = []
    try:
        for scheduler in schedulers:
            if not await start_with_retry(scheduler, watcher.event):
                return
            started.append(scheduler)
        if on_running is not None:
            on_running()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watcher.event.wait(), seconds)
        if watcher.received:
            log.info("%s: stopping; unfinished runs are handed over", watcher.received)
    finally:
        await asyncio.gather(*(s.stop(grace_ms) for s in started), return_exceptions=True)
        if signals:
            watcher.remove(loop)
