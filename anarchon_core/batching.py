"""Store calls made at the same moment go out together: one round trip per batch.

Thousands of jobs share instants (every minute, every hour at :00), so thousands of
claims, and then of end records, are due at once. A backend that can send many calls in one
round trip (a Redis pipeline, one SQL transaction) puts a :class:`CallBatcher` in front of
it: each caller still makes its own call and gets its own answer or exception, and every
decision is still taken per call by the store, but the calls made in one turn of the event
loop, and those made while earlier batches are in flight, share round trips.

A call alone goes out in the next turn of the loop, so a lone call is not delayed by a
timer; at most ``max_in_flight`` batches of at most ``max_batch`` calls are in flight, and
the calls that arrive meanwhile wait for the next batch instead of opening connections.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

__all__ = ["CallBatcher", "rounds"]

T = TypeVar("T")
R = TypeVar("R")

#: ``send_many(items)`` answers each item in order: its result, or the exception it raised.
SendMany = Callable[[list[T]], Awaitable[Sequence["R | BaseException"]]]


class _Queue(Generic[T, R]):
    """The calls waiting on one event loop, and how many batches of them are in flight."""

    def __init__(self) -> None:
        self.waiting: deque[tuple[T, asyncio.Future[R]]] = deque()
        self.in_flight = 0
        self.scheduled = False


class CallBatcher(Generic[T, R]):
    """Coalesce concurrent calls into batches for ``send_many`` (see the module docstring).

    ``send_many`` receives a list of items and returns one answer per item, in order: a
    result, or an exception instance to raise in that item's caller. If it raises, every
    caller of the batch gets that exception. Works on any number of event loops (each has
    its own queue).
    """

    def __init__(self, send_many: SendMany[T, R], *, max_batch: int = 256,
                 max_in_flight: int = 4) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be at least 1")
        self._send_many = send_many
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue[T, R]] = \
            weakref.WeakKeyDictionary()
        #: Batches sent and calls answered, for benchmarks and tests.
        self.batches = 0
        self.calls = 0

    def call(self, item: T) -> asyncio.Future[R]:
        """Send ``item`` with the calls made around it: a future of its answer or exception.

        The item is queued at once (a plain function, not a coroutine: thousands of
        calls at one instant each save a coroutine); awaiting the future waits for it.
        """
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = _Queue()
        future: asyncio.Future[R] = loop.create_future()
        queue.waiting.append((item, future))
        self._schedule(loop, queue)
        return future

    def _schedule(self, loop: asyncio.AbstractEventLoop, queue: _Queue[T, R]) -> None:
        if not queue.scheduled and queue.waiting and queue.in_flight < self.max_in_flight:
            queue.scheduled = True
            # The next turn of the loop: every call made in this turn joins the batch.
            loop.call_soon(self._flush, loop, queue)

    def _flush(self, loop: asyncio.AbstractEventLoop, queue: _Queue[T, R]) -> None:
        queue.scheduled = False
        while queue.waiting and queue.in_flight < self.max_in_flight:
            batch: list[tuple[T, asyncio.Future[R]]] = []
            while queue.waiting and len(batch) < self.max_batch:
                item, future = queue.waiting.popleft()
                if not future.done():  # a caller that gave up (cancelled) is not sent
                    batch.append((item, future))
            if not batch:
                continue
            queue.in_flight += 1
            loop.create_task(self._send(loop, queue, batch))

    async def _send(self, loop: asyncio.AbstractEventLoop, queue: _Queue[T, R],
                    batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            try:
                answers = await self._send_many([item for item, _ in batch])
            except asyncio.CancelledError:
                for _, future in batch:
                    future.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - each caller raises it
                answers = [exc] * len(batch)
            if len(answers) != len(batch):
                error = RuntimeError(f"a batch of {len(batch)} calls got {len(answers)} "
                                     "answers")
                answers = [error] * len(batch)
            self.batches += 1
            self.calls += len(batch)
            for (_, future), answer in zip(batch, answers, strict=True):
                if future.done():
                    continue
                if isinstance(answer, BaseException):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
        finally:
            queue.in_flight -= 1
            self._schedule(loop, queue)


def rounds(items: Sequence[T], key: Callable[[T], Hashable]) -> list[list[int]]:
    """Split ``items`` into rounds (lists of indexes, in order), one item per key each.

    The n-th item of a key goes to the n-th round: a key's items keep their order when
    each round is sent only after the one before has been answered.
    """
    seen: dict[Hashable, int] = {}
    out: list[list[int]] = []
    for i, item in enumerate(items):
        n = seen[key(item)] = seen.get(key(item), -1) + 1
        if n == len(out):
            out.append([])
        out[n].append(i)
    return out
