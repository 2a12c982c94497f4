"""Waiting for one future with a timeout, without cancelling it (``asyncio.wait`` for one).

Every run waits like this for its handler, so thousands of runs at one instant make it a
hot path: one waiter future and one callback, instead of
the sets, counters and closures ``asyncio.wait`` builds for any number of futures.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["until_done"]


async def until_done(future: asyncio.Future[Any], timeout: float | None) -> bool:
    """Wait until ``future`` is done or ``timeout`` seconds passed; True if it is done.

    ``future`` is never cancelled here; cancelling the waiting task stops only the wait.
    """
    if future.done():
        return True
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    timer = None if timeout is None else loop.call_later(max(0.0, timeout), wake)
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
        future.remove_done_callback(wake)
    return future.done()
