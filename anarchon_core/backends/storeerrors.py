"""One error layer for every backend: driver exceptions become StoreUnavailable/StoreError.

Each backend classifies its own driver's exceptions (a small table per backend module)
and wraps every store call in :meth:`StoreErrors.guard`:

* a **transient** failure (connection refused, reset or closed, a timeout, DNS, a server
  loading, failing over or shutting down, a lock that could not be taken in time) becomes
  :class:`~anarchon_core.errors.StoreUnavailable`, the one error the scheduler retries;
* any other failure of the store (a permission, a corrupt or foreign value, a full disk)
  becomes :class:`~anarchon_core.errors.StoreError`;
* anything else (``TypeError``, ``AttributeError``, ``AssertionError``, anarchon's own
  errors, cancellation) propagates unchanged: a bug must surface once, loudly;
* except a ``CancelledError`` that reaches the call while its task is not being cancelled:
  the driver cancelled a future of its own (a connection closing under calls in flight
  rejects them so), which is a transient failure, not the caller's cancellation.

The driver's exception is the ``__cause__``; the message names the backend as
:meth:`~anarchon_core.backend.Backend.describe` shows it (no secrets) and what failed.

:class:`CorruptRecords` reports a record anarchon cannot read once per record (with its
key and job), so a corrupt entry that is skipped on every claim does not flood the log.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from types import TracebackType
from typing import Literal

from ..errors import AnarchonError, StoreError, StoreUnavailable

__all__ = ["STORE", "TRANSIENT", "Classifier", "CorruptRecords", "Kind", "StoreErrors",
           "network_kind", "scrub"]

TRANSIENT: Literal["transient"] = "transient"
STORE: Literal["store"] = "store"
#: What a classifier says about an exception; None: not a store failure, leave it alone.
Kind = Literal["transient", "store"] | None
Classifier = Callable[[BaseException], Kind]

# Exceptions that are never the store's fault, whatever module raised them.
_NOT_STORE = (AnarchonError, TypeError, AttributeError, AssertionError, NameError,
              NotImplementedError, RecursionError, MemoryError)
_USERINFO = re.compile(r"//(?P<user>[^/@\s:]*)(?P<password>:[^@\s]*)?@")
_MAX_TEXT = 500


def scrub(text: str) -> str:
    """Mask the credentials of any URL in ``text``: ``//user:pw@`` → ``//user:***@``.

    A bare ``//token@`` (NATS token URLs) becomes ``//***@``.
    """
    def mask(match: re.Match[str]) -> str:
        if match.group("password") is not None:
            return f"//{match.group('user')}:***@"
        return "//***@"
    return _USERINFO.sub(mask, text)


def network_kind(exc: BaseException) -> Kind:
    """The classification shared by every backend: socket-level failures are transient."""
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | ConnectionError):
        return TRANSIENT
    if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError | PermissionError):
        return TRANSIENT  # DNS (socket.gaierror), unreachable host, broken pipe...
    return None


class StoreErrors:
    """The error layer of one backend: ``with errors.guard("claim"): await ...``.

    :param where: the backend's ``describe`` (called only when an error is raised).
    :param classify: the backend's table; it is asked first, then :func:`network_kind`.
    """

    def __init__(self, where: Callable[[], str], classify: Classifier) -> None:
        self._where = where
        self._classify = classify

    def kind(self, exc: BaseException) -> Kind:
        """How ``exc`` is classified (None: it propagates unchanged)."""
        if not isinstance(exc, Exception) or isinstance(exc, _NOT_STORE):
            return None
        return self._classify(exc) or network_kind(exc)

    def translate(self, exc: BaseException, what: str) -> StoreError | None:
        """The anarchon error for ``exc`` (its cause is set by the caller), or None."""
        kind = self.kind(exc)
        if kind is None:
            return None
        text = " ".join(scrub(str(exc)).split())
        if len(text) > _MAX_TEXT:
            text = text[:_MAX_TEXT] + "…"
        detail = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        if kind == TRANSIENT:
            return self.unavailable(what, detail)
        return StoreError(f"{self._where()}: {what} failed: {detail}")

    def unavailable(self, what: str, detail: str) -> StoreUnavailable:
        """The :class:`StoreUnavailable` saying ``what`` failed, and why (``detail``)."""
        return StoreUnavailable(f"{self._where()} is unavailable ({what}): {detail}")

    def guard(self, what: str) -> _Guard:
        """Translate what the block raises; ``what`` names the operation in the message."""
        return _Guard(self, what)


class _Guard:
    """``with errors.guard(what):`` (a class, not a generator: it wraps every store call)."""

    __slots__ = ("_errors", "_what")

    def __init__(self, errors: StoreErrors, what: str) -> None:
        self._errors = errors
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            return
        if isinstance(exc, asyncio.CancelledError) and not _cancelling():
            raise self._errors.unavailable(self._what, "the driver cancelled the call") \
                from exc
        if not isinstance(exc, Exception):
            return
        error = self._errors.translate(exc, self._what)
        if error is not None:
            raise error from exc


def _cancelling() -> bool:
    """Whether the running task is being cancelled (True when that cannot be known)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: a worker thread
        return True
    cancelling = getattr(task, "cancelling", None)  # a task class of its own may lack it
    return task is None or cancelling is None or cancelling() > 0


class CorruptRecords:
    """Reports records a backend cannot read, once per record (bounded memory).

    ``report(key, job, detail)`` logs a warning the first time a ``(key, record)`` is seen
    and stays silent after that, so a record skipped on every claim is reported once.
    """

    def __init__(self, log: logging.Logger, limit: int = 10_000) -> None:
        self._log = log
        self._seen: set[tuple[str, str]] = set()
        self._limit = limit

    def report(self, key: str, job: str | None, record: str, detail: str) -> None:
        """Log that ``record`` in ``key`` (of ``job``, if it has one) is corrupt and skipped."""
        marker = (key, record[:200])
        if marker in self._seen:
            return
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen.add(marker)
        if job is None:
            self._log.warning("skipping a corrupt record in %s (%s): %.200r", key, detail,
                              record)
        else:
            self._log.warning("job %r: skipping a corrupt record in %s (%s): %.200r",
                              job, key, detail, record)
