"""How anarchon talks to a Redis or Valkey server through whatever client it was given.

Every client is adapted to one small async interface, :class:`Commands`: ``call(*args)``
sends one command and returns its reply as plain Python values (``bytes`` decoded to
``str``, arrays as lists). anarchon's own reads and writes are Lua scripts whose replies are
plain arrays, so they look the same through every client.

* redis-py / valkey-py asyncio clients (standalone and cluster): ``execute_command``.
* redis-py / valkey-py sync clients, and any object whose ``execute_command`` is not a
  coroutine function: called in a worker thread so the event loop never blocks.
* Valkey GLIDE async and sync clients (standalone and cluster): ``custom_command``.

A URL or an options dict opens anarchon's own ``redis.asyncio`` client, which ``close()``
closes; a client the user passed in is never closed (``Commands.owned`` says which).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, partial
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..url import mask_url

__all__ = ["Commands", "LuaScript", "adapt_client", "client_label", "open_client", "plain"]

Arg = str | int | bytes
DEFAULT_URL = "redis://localhost:6379/0"
_SCHEMES = {"redis": "redis", "rediss": "rediss", "valkey": "redis", "valkeys": "rediss"}
#: Timeouts for anarchon's own connection unless the URL or options set them: a hung
#: server must fail a claim (the scheduler retries) rather than block it forever.
_OWN_DEFAULTS = {"socket_timeout": 10.0, "socket_connect_timeout": 5.0}


def plain(value: Any) -> Any:
    """A reply as plain values: ``bytes`` → ``str``, tuples → lists, recursively."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    return value


class Commands:
    """One client, adapted: ``await call("GET", key)``; ``await close()`` if we own it."""

    def __init__(self, send: Callable[[Sequence[Arg]], Any], *, label: str, owned: bool,
                 blocking: bool, closer: Callable[[], Any] | None = None) -> None:
        self._send = send
        self._closer = closer
        self.label = label
        self.owned = owned
        self.blocking = blocking

    async def call(self, *args: Arg) -> Any:
        """Send one command and return its reply as plain values."""
        if self.blocking:
            reply = await asyncio.to_thread(self._send, args)
        else:
            reply = self._send(args)
        if inspect.isawaitable(reply):
            reply = await reply
        return plain(reply)

    async def close(self) -> None:
        """Close the client if anarchon opened it; a user's client is left open."""
        closer, self._closer = self._closer, None
        if not self.owned or closer is None:
            return
        result = closer()
        if inspect.isawaitable(result):
            await result


@dataclass(frozen=True)
class LuaScript:
    """A Lua script shipped in ``anarchon_core/backends/lua/``, run by SHA."""

    name: str
    source: str
    sha: str

    @classmethod
    @cache
    def load(cls, name: str) -> LuaScript:
        """Read ``lua/<name>.lua`` from the package."""
        source = resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())  # noqa: S324

    async def run(self, conn: Commands, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """EVALSHA, falling back to EVAL when the server does not have the script yet."""
        try:
            return await conn.call("EVALSHA", self.sha, len(keys), *keys, *args)
        except Exception as exc:
            if not is_noscript(exc):
                raise
        return await conn.call("EVAL", self.source, len(keys), *keys, *args)


def is_noscript(exc: BaseException) -> bool:
    """Whether a client error is the server's NOSCRIPT (the script is not cached)."""
    text = str(exc)
    return (type(exc).__name__ == "NoScriptError" or "NOSCRIPT" in text
            or "No matching script" in text)


def client_label(client: object) -> str:
    """``module.Class`` of a client, for logs and reprs."""
    cls = type(client)
    return f"{cls.__module__.split('.')[0]}.{cls.__qualname__}"


def adapt_client(client: object) -> Commands:
    """Adapt a user's client (never closed by anarchon); ConfigError if unusable."""
    label = client_label(client)
    glide = getattr(client, "custom_command", None)
    if callable(glide):  # Valkey GLIDE takes the command as one list
        blocking = not inspect.iscoroutinefunction(glide)
        return Commands(lambda args: glide(list(args)), label=label, owned=False,
                        blocking=blocking)
    execute = getattr(client, "execute_command", None)
    if callable(execute):
        blocking = not inspect.iscoroutinefunction(execute)
        return Commands(lambda args: execute(*args), label=label, owned=False,
                        blocking=blocking)
    raise ConfigError(
        f"unsupported Redis client {label}: pass a URL, an options dict, a redis-py or "
        "valkey-py client, a Valkey GLIDE client, or an object with execute_command(*args)"
    )


def check_url(url: str) -> str:
    """Validate a redis/rediss/valkey/valkeys URL; return it for redis-py's ``from_url``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError(f"invalid Redis URL {mask_url(url)!r}") from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"invalid Redis URL {mask_url(url)!r}: expected redis://, rediss://, valkey:// "
            "or valkeys://"
        )
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"invalid Redis URL {mask_url(url)!r}: bad port") from None
    return parts._replace(scheme=_SCHEMES[scheme]).geturl()


@cache
def _option_names() -> frozenset[str]:
    from redis.asyncio import Redis

    params = inspect.signature(Redis.__init__).parameters
    return frozenset(name for name in params if name != "self")


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate an options dict for ``redis.asyncio.Redis(**options)``."""
    unknown = sorted(set(options) - _option_names())
    if unknown:
        raise ConfigError(
            f"unknown Redis connection option(s) {', '.join(map(repr, unknown))}; use "
            "redis.asyncio.Redis arguments such as host, port, db, username, password, ssl"
        )
    return dict(options)


def open_client(target: str | Mapping[str, Any]) -> Commands:
    """Open anarchon's own ``redis.asyncio`` client from a checked URL or options dict."""
    from redis.asyncio import Redis

    if isinstance(target, str):
        client = Redis.from_url(target, **_OWN_DEFAULTS)
    else:
        client = Redis(**{**_OWN_DEFAULTS, **target})
    return Commands(partial(_execute, client), label="redis.asyncio.Redis", owned=True,
                    blocking=False, closer=client.aclose)


def _execute(client: Any, args: Sequence[Arg]) -> Any:
    return client.execute_command(*args)
