"""The exceptions anarchon raises. All derive from :class:`AnarchonError`."""

from __future__ import annotations

from collections.abc import Sequence


class AnarchonError(Exception):
    """Base class of every error anarchon raises on purpose."""


class ConfigError(AnarchonError, ValueError):
    """A bad option, raised where the option is given (construction or registration)."""


class UnsupportedStrategyError(AnarchonError):
    """The store lacks a feature the chosen strategy needs; raised by ``start()``."""


class StoreFormatError(AnarchonError):
    """The store was written by a newer anarchon than this one reads."""

    code = "ANARCHON_STORE_FORMAT"

    def __init__(self, found: int | str, supported: int) -> None:
        self.found = found
        self.supported = supported
        super().__init__(
            f"{self.code}: the store has format {found!r}, this anarchon reads up to "
            f"{supported}; upgrade anarchon on this instance or use another namespace"
        )


class CorruptRecordError(StoreFormatError):
    """One record of the store cannot be read: a wrong type, a number out of range, bad text.

    Raised where a caller asked for that one record. Where records are read in bulk
    (history, the paused jobs, the fleet view, the scheduler's own scans), each corrupt
    record is logged once at WARNING, naming it, and skipped instead. ``key`` names the
    record (a key, a row, a control record) and ``detail`` says what is wrong with it.
    """

    def __init__(self, key: str, detail: str) -> None:
        from .backend import FORMAT_VERSION  # noqa: PLC0415 - backend.py imports this module

        self.key = key
        self.detail = detail
        self.found = key
        self.supported = FORMAT_VERSION
        AnarchonError.__init__(self, f"{self.code}: corrupt record {key}: {detail}")


class StoreError(AnarchonError):
    """The store failed or answered something anarchon cannot use (corrupt or foreign data).

    Every backend wraps its driver's errors in this class (the driver's exception is the
    ``__cause__``), so callers handle one family whatever the store.
    """


class StoreUnavailable(StoreError):  # noqa: N818 - reads as a state, like Cancelled
    """A transient store failure: unreachable, timed out, connection lost, failing over.

    The only store error the scheduler retries; any other error surfaces at once.
    """


class StoreNotSetUp(StoreError):  # noqa: N818 - reads as a state, like StoreUnavailable
    """A read-only backend found no anarchon store in its namespace (never written to).

    ``namespace`` is the table, prefix or stream looked for; ``existing`` lists the
    namespaces of the same store that do hold an anarchon store, when the store can list
    them (``None`` when it cannot). Both are also in the message. Readers such as
    dashboards may show it as "no history yet" or as a likely typo.
    """

    def __init__(self, message: str, *, namespace: str | None = None,
                 existing: Sequence[str] | None = None) -> None:
        super().__init__(message)
        self.namespace = namespace
        self.existing = None if existing is None else list(existing)


class ReadOnlyError(StoreError):
    """A write was asked of a backend opened with ``read_only=True``."""


class Cancelled(AnarchonError):  # noqa: N818 - the spec's public name
    """The run was cancelled: timeout, ``stop()`` or a lost lease."""


class LeaseLost(Cancelled):
    """Another attempt has taken over this run; this runner is fenced."""
