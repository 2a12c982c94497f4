"""The Redis claim strategies as typed objects, each holding only its own settings.

``strategy=Script(window_ms=600_000)`` or ``strategy={"name": "script", "window_ms":
600_000}`` or ``strategy="script"``; a setting the strategy does not use is a type error
with the objects (and with the typed dicts) and a :class:`ConfigError` at construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, TypedDict, Union

from ...errors import ConfigError

__all__ = [
    "Idmp", "IdmpDict", "Lease", "LeaseDict", "RedisStrategy", "Script", "ScriptDict",
    "Strategy", "StreamId", "StreamIdDict", "ValkeyStrategy", "parse_strategy",
]


def _int_in(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or \
            (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f"≥ {low}"
        raise ConfigError(f"invalid {name} {value!r}: expected an int in {bound}")
    return value


@dataclass(frozen=True)
class Strategy:
    """Base of the strategies: ``name`` as ``strategy=`` takes it, ``leases`` if it holds leases."""

    name: ClassVar[str]
    leases: ClassVar[bool] = False

    def as_dict(self) -> dict[str, Any]:
        """The strategy as a ``{"name": ..., setting: value}`` dict."""
        return {"name": self.name, **{f.name: getattr(self, f.name) for f in fields(self)}}


@dataclass(frozen=True)
class Lease(Strategy):
    """The default: one Lua script applies the lease decision table.

    Backups, takeover, overlap protection, catch-up and hand-over. Redis 5+ and Valkey.
    """

    name: ClassVar[str] = "lease"
    leases: ClassVar[bool] = True


@dataclass(frozen=True)
class StreamId(Strategy):
    """Claim-only: ``XADD`` with the slot as the entry id; the first claim wins.

    A late claim for an earlier slot loses once a later slot was written (that run is
    skipped, never duplicated). Redis 5+ and Valkey.
    """

    name: ClassVar[str] = "stream-id"


@dataclass(frozen=True)
class Idmp(Strategy):
    """Claim-only: Redis 8.6 idempotent ``XADD ... IDMP``.

    The server remembers each run for ``duration_sec`` (1..86400), at most ``max_size``
    runs per job (1..10000).
    """

    name: ClassVar[str] = "idmp"
    duration_sec: int = 300
    max_size: int = 1000

    def __post_init__(self) -> None:
        _int_in("Idmp duration_sec", self.duration_sec, 1, 86_400)
        _int_in("Idmp max_size", self.max_size, 1, 10_000)


@dataclass(frozen=True)
class Script(Strategy):
    """Claim-only: a Lua script adds the claim unless the slot is in the last ``window_ms``.

    ``window_ms`` must exceed every job's ``jitter_ms + max_late_ms``. Redis 5+ and Valkey.
    """

    name: ClassVar[str] = "script"
    window_ms: int = 300_000

    def __post_init__(self) -> None:
        _int_in("Script window_ms", self.window_ms, 1)


class LeaseDict(TypedDict):
    """``{"name": "lease"}``."""

    name: Literal["lease"]


class StreamIdDict(TypedDict):
    """``{"name": "stream-id"}``."""

    name: Literal["stream-id"]


class _IdmpName(TypedDict):
    name: Literal["idmp"]


class IdmpDict(_IdmpName, total=False):
    """``{"name": "idmp", "duration_sec": 300, "max_size": 1000}``."""

    duration_sec: int
    max_size: int


class _ScriptName(TypedDict):
    name: Literal["script"]


class ScriptDict(_ScriptName, total=False):
    """``{"name": "script", "window_ms": 300_000}``."""

    window_ms: int


#: What ``ValkeyBackend(strategy=...)`` accepts: no ``idmp`` (Valkey has no IDMP).
ValkeyStrategy = Union[  # noqa: UP007 - a runtime alias, one member per line
    Lease, StreamId, Script, LeaseDict, StreamIdDict, ScriptDict,
    Literal["lease", "stream-id", "script"],
]
#: What ``RedisBackend(strategy=...)`` accepts.
RedisStrategy = Union[  # noqa: UP007
    ValkeyStrategy, Idmp, IdmpDict, Literal["idmp"],
]

_CLASSES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (Lease, StreamId, Idmp, Script)
}


def parse_strategy(value: object, *, allow_idmp: bool = True) -> Strategy:
    """A strategy object from an object, a name or a dict; ConfigError if wrong."""
    if isinstance(value, Strategy):
        strategy = value
    elif isinstance(value, str):
        strategy = _from_dict({"name": value})
    elif isinstance(value, Mapping):
        strategy = _from_dict(value)
    else:
        raise ConfigError(
            f"invalid strategy {value!r}: expected a name ({', '.join(_CLASSES)}), a dict "
            "like {'name': 'script', 'window_ms': 600000}, or Lease()/StreamId()/Idmp()/Script()"
        )
    if isinstance(strategy, Idmp) and not allow_idmp:
        raise ConfigError(
            "strategy 'idmp' needs Redis 8.6+ idempotent XADD, which Valkey does not have; "
            "use 'lease' (the default), 'stream-id' or 'script' with ValkeyBackend"
        )
    return strategy


def _from_dict(value: Mapping[object, object]) -> Strategy:
    name = value.get("name")
    cls = _CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ConfigError(
            f"unknown strategy {name!r}; known: {', '.join(_CLASSES)}"
        )
    settings = {k: v for k, v in value.items() if k != "name"}
    known = {f.name for f in fields(cls)}
    wrong = sorted(str(k) for k in settings if k not in known)
    if wrong:
        accepted = ", ".join(sorted(known)) or "no settings"
        raise ConfigError(
            f"strategy {name!r} does not use {', '.join(map(repr, wrong))} "
            f"(it accepts {accepted})"
        )
    return cls(**{str(k): v for k, v in settings.items()})
