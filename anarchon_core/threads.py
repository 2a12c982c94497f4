"""A bounded pool of daemon threads for sync handlers.

:class:`concurrent.futures.ThreadPoolExecutor` joins its threads when the interpreter
exits, so one handler that ignores its cancellation would keep a stopped process alive
after it had handed its runs over. These threads are daemons: the process exits without
waiting for them, and the lease of a run whose code was still going then expires on its
own (see docs/concepts.md, "the lease is held until the code has stopped").
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["DEFAULT_HANDLER_THREADS", "HandlerThreads"]

T = TypeVar("T")
#: Default size of a scheduler's pool for sync handlers.
DEFAULT_HANDLER_THREADS = 32

_Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class HandlerThreads(Executor):
    """At most ``max_workers`` daemon threads, started as work arrives.

    Each submission runs in a copy of the submitter's :mod:`contextvars` context, so
    logging and tracing context reach sync handlers.
    """

    def __init__(self, max_workers: int = DEFAULT_HANDLER_THREADS,
                 name: str = "anarchon-handler") -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be ≥ 1, not {max_workers}")
        self.max_workers = max_workers
        self._name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on a pool thread, in a copy of the current context."""
        future: Future[T] = Future()
        context = contextvars.copy_context()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit to a pool that was shut down")
            self._queue.put((future, context.run, (fn, *args), kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self._name}-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - the future carries it to its waiter
                    future.set_exception(exc)
            del item, future, fn, args, kwargs
            self._idle.release()

    @property
    def busy(self) -> int:
        """Threads started and not idle (an estimate, for logs)."""
        return len(self._threads)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; threads end once their current call returns.

        ``wait=True`` joins them; a thread stuck in a handler keeps running (it is a daemon
        and does not hold the process).
        """
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for _ in self._threads:
                self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
