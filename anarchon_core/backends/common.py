"""Small helpers several backends share: clocks, masking, flags, format and read-only checks."""

from __future__ import annotations

import asyncio
import difflib
import logging
import random
import time
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ReadOnlyError, StoreFormatError, StoreNotSetUp
from .storeerrors import scrub

if TYPE_CHECKING:
    from ..backend import Backend

__all__ = [
    "LIST_TIMEOUT_S", "TRIM_EVERY", "check_format_value", "local_now_ms", "missing_store",
    "parse_flag", "refuse_write", "scrub", "time_ms", "trim_drawn",
]

log = logging.getLogger("anarchon.backend")
#: How long a "no store here" error may spend listing the namespaces that do exist.
LIST_TIMEOUT_S = 3.0
#: Most of those namespaces its message names.
SHOWN = 10

#: A won claim trims its job's old history about once in this many (drawn at random): the
#: bound stays ``history_size`` give or take a few runs, and most claims skip the work.
TRIM_EVERY = 20


def trim_drawn() -> bool:
    """Whether this won claim is one of the 1 in :data:`TRIM_EVERY` that trims history."""
    return random.random() < 1 / TRIM_EVERY


def local_now_ms() -> int:
    """The local machine's clock in ms since the epoch (for stores that give no time)."""
    return int(time.time() * 1000)


def time_ms(reply: object) -> int:
    """Milliseconds from a Redis ``TIME`` reply (``[seconds, microseconds]``)."""
    if isinstance(reply, dict):  # a cluster client may answer per node
        reply = next(iter(reply.values()))
    pair: Any = reply
    return int(pair[0]) * 1000 + int(pair[1]) // 1000


def parse_flag(name: str, value: object) -> bool:
    """A boolean option from a bool or URL text (``true``/``false``, ``1``/``0``...)."""
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"invalid {name} {value!r}: expected true or false")


def check_format_value(found: object) -> int:
    """The stored format number; StoreFormatError if unreadable or newer than ours."""
    from ..backend import FORMAT_VERSION  # noqa: PLC0415 - backend.py imports this module
    try:
        number = int(str(found))
    except (TypeError, ValueError):
        raise StoreFormatError(str(found), FORMAT_VERSION) from None
    if number > FORMAT_VERSION:
        raise StoreFormatError(number, FORMAT_VERSION)
    return number


def refuse_write(backend: object, operation: str) -> None:
    """Raise ReadOnlyError when ``backend`` was opened with ``read_only=True``."""
    if getattr(backend, "read_only", False):
        describe = getattr(backend, "describe", None)
        what = describe() if callable(describe) else type(backend).__name__
        raise ReadOnlyError(
            f"{operation}() refused: {what} is read-only (read_only=True); it reads "
            "history and writes nothing. Use a backend without read_only to run jobs."
        )


async def missing_store(backend: Backend, kind: str, namespace: str, why: str) -> StoreNotSetUp:
    """The error of a read-only ``start`` that found no anarchon store in ``namespace``.

    One line: the backend (its URL masked), why the ``kind`` (``"table"``, ``"prefix"``)
    named ``namespace`` holds none, and the namespaces of that kind that do hold one, from
    :meth:`~anarchon_core.backend.Backend.namespaces` (bounded by :data:`LIST_TIMEOUT_S`;
    left out when the store cannot list them or the listing fails), closest to
    ``namespace`` first: a typo shows its likely intended name first.
    """
    found: list[str] | None
    try:
        found = await asyncio.wait_for(backend.namespaces(), LIST_TIMEOUT_S)
    except Exception:  # the listing is only a hint; the missing store is the error
        log.debug("%s: listing the namespaces failed", backend.describe(), exc_info=True)
        found = None
    others = None if found is None else sorted(
        (name for name in found if name != namespace),
        key=lambda name: (-difflib.SequenceMatcher(None, name, namespace).ratio(), name))
    text = (f"no anarchon store in {backend.describe()}: {why}, so it was never set up there "
            f"(a scheduler sets it up when it starts) or the {kind} is wrong")
    if others:
        kinds = kind + ("es" if kind.endswith("x") else "s")
        shown = ", ".join(map(repr, others[:SHOWN]))
        more = f" and {len(others) - SHOWN} more" if len(others) > SHOWN else ""
        text += f"; {kinds} with an anarchon store there: {shown}{more}"
    elif others is not None:
        text += f"; no {kind} there holds an anarchon store"
    return StoreNotSetUp(text, namespace=namespace, existing=others)
