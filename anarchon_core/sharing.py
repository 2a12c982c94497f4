"""One backend object shared by several schedulers in a process.

A backend's connections belong to the event loop that opened them. Schedulers using the
same backend object open it once and close it when the last one stops; a backend whose
loop has ended (a scheduler used under ``asyncio.run(...)`` and later from
``scheduler.sync``) is reopened on the new loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from dataclasses import dataclass, field

from .backend import Backend

__all__ = ["acquire", "release"]

log = logging.getLogger("anarchon.scheduler")


@dataclass
class _Use:
    loop: asyncio.AbstractEventLoop
    users: set[int] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


_USES: weakref.WeakKeyDictionary[Backend, _Use] = weakref.WeakKeyDictionary()


async def acquire(backend: Backend, user: object) -> None:
    """Open ``backend`` for ``user`` on the running loop (once for all its users)."""
    loop = asyncio.get_running_loop()
    use = _USES.get(backend)
    if use is not None and use.loop is not loop:
        if use.loop.is_running():
            raise RuntimeError(
                f"{backend.describe()} is in use on another event loop; give each event "
                "loop its own backend object, or use scheduler.sync from other threads"
            )
        # The loop that opened it has ended: its connections died with it.
        log.debug("reopening %s on a new event loop", backend.describe())
        with contextlib.suppress(Exception):
            await backend.stop()
        use = None
    if use is None:
        use = _USES[backend] = _Use(loop)
    async with use.lock:
        if not use.users:
            try:
                await backend.start()
            except BaseException:
                # A failed start (no store in a read-only namespace, a newer format, the
                # store down) leaves no connection open: the next use opens it again.
                with contextlib.suppress(Exception):
                    await backend.stop()
                raise
        use.users.add(id(user))


async def release(backend: Backend, user: object) -> None:
    """Close ``backend`` once its last user releases it."""
    use = _USES.get(backend)
    if use is None or id(user) not in use.users:
        return
    async with use.lock:
        use.users.discard(id(user))
        if not use.users:
            del _USES[backend]
            await backend.stop()


def is_open_for(backend: Backend, user: object) -> bool:
    """Whether ``user`` holds ``backend`` open on the running loop."""
    use = _USES.get(backend)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return use is not None and use.loop is loop and id(user) in use.users
