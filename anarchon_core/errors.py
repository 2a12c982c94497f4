"""The exceptions anarchon raises. All derive from :class:`AnarchonError`."""

from __future__ import annotations


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

    Readers such as dashboards can show it as "no history yet".
    """


class ReadOnlyError(StoreError):
    """A write was asked of a backend opened with ``read_only=True``."""


class Cancelled(AnarchonError):  # noqa: N818 - the spec's public name
    """The run was cancelled: timeout, ``stop()`` or a lost lease."""


class LeaseLost(Cancelled):
    """Another attempt has taken over this run; this runner is fenced."""
