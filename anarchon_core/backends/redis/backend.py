"""Redis and Valkey: :class:`RedisBackend` and :class:`ValkeyBackend` (SPEC §4.1).

``RedisBackend(redis=..., strategy="lease", prefix="cron:")``:

* ``redis``: a URL (``redis://``, ``rediss://``, ``valkey://``, ``valkeys://``; user,
  password and db in the URL), a dict of ``redis.asyncio.Redis`` options, or a client:
  redis-py or valkey-py (sync or asyncio, standalone or cluster), Valkey GLIDE (async or
  sync, standalone or cluster), or any object with ``execute_command(*args)``. anarchon
  opens its own ``redis.asyncio`` connection from a URL or options and closes it in
  :meth:`~RedisBackend.stop`; a client you pass in is yours and stays open.
* ``strategy``: :class:`Lease` (default), :class:`StreamId`, :class:`Idmp`,
  :class:`Script`, a name, or a dict (see :mod:`.strategies`). Only ``lease``
  holds leases; with the others the backend is claim-only (``supports_leases`` is False).
* ``prefix``: the namespace of every key (``"cron:"``).

The key layout is in :mod:`.keys`, the Lua scripts in ``lua/``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ...backend import FORMAT_VERSION, Backend, ClaimOnlyBackend
from ...decision import HANDED_OVER
from ...errors import ConfigError, StoreFormatError, UnsupportedStrategyError
from ...models import ClaimRequest, ClaimResult, Run, RunRef
from ...naming import validate_job_name, validate_prefix
from ...url import mask_url, split_namespace_params
from .claims import IdmpState, claim_only, claim_only_finish, claim_only_history
from .clients import (
    DEFAULT_URL,
    Commands,
    LuaScript,
    adapt_client,
    check_options,
    check_url,
    open_client,
)
from .keys import redis_key
from .lease import lease_claim, lease_history, lease_update, run_score
from .strategies import (
    Idmp,
    Lease,
    RedisStrategy,
    Script,
    Strategy,
    StreamId,
    ValkeyStrategy,
    parse_strategy,
)

if TYPE_CHECKING:
    from ...options import JobOptions

__all__ = [
    "Idmp", "Lease", "RedisBackend", "RedisClaimOnlyBackend", "Script", "StreamId",
    "ValkeyBackend", "ValkeyClaimOnlyBackend",
]

log = logging.getLogger("anarchon.redis")
_B = TypeVar("_B", bound="RedisBackend")
_OTHERS = "'lease' (the default), 'stream-id' or 'script', which work on Redis 5+ and Valkey"


class RedisBackend(Backend):
    """Redis backend (see the module docstring for the options).

    ``RedisBackend(strategy="script")`` and the other claim-only strategies build a
    :class:`RedisClaimOnlyBackend` (a subclass), whose ``supports_leases`` is False.
    """

    _display: ClassVar[str] = "RedisBackend"
    _option: ClassVar[str] = "redis"
    _allow_idmp: ClassVar[bool] = True
    _claim_only_class: ClassVar[type[RedisBackend] | None] = None

    def __new__(cls: type[_B], *args: Any, **kwargs: Any) -> _B:
        """Pick the claim-only subclass when the strategy holds no leases."""
        target: type[Any] = cls
        claim_only_cls = cls.__dict__.get("_claim_only_class")
        if claim_only_cls is not None:
            try:
                strategy = parse_strategy(kwargs.get("strategy", "lease"),
                                          allow_idmp=cls._allow_idmp)
            except ConfigError:
                strategy = Lease()  # __init__ raises it again, where it belongs
            if not strategy.leases:
                target = claim_only_cls
        instance: _B = super().__new__(target)
        return instance

    def __init__(self, redis: str | Mapping[str, Any] | object | None = None, *,
                 strategy: RedisStrategy = "lease", prefix: str = "cron:") -> None:
        self._setup(redis, strategy, prefix)

    def _setup(self, connection: object, strategy: object, prefix: object) -> None:
        self.strategy: Strategy = parse_strategy(strategy, allow_idmp=self._allow_idmp)
        if self.strategy.leases != self.supports_leases:
            kind = "holds leases" if self.strategy.leases else "only claims"
            raise ConfigError(f"strategy {self.strategy.name!r} {kind}: use {self._display}")
        self.prefix = validate_prefix(prefix)
        self._url: str | None = None
        self._options: dict[str, Any] | None = None
        self._conn: Commands | None = None
        self._cluster = False
        if connection is None:
            self._url = DEFAULT_URL
        elif isinstance(connection, str):
            self._url, self._cluster = check_url(connection)
        elif isinstance(connection, Mapping):
            self._options, self._cluster = check_options(connection)
        else:
            self._conn = adapt_client(connection)
        self._idmp = IdmpState()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisBackend:
        """``redis://[user:password@]host:port/db?prefix=billing:cron:&strategy=script``.

        ``prefix`` and ``strategy`` (a name) are read from the query; other query
        parameters go to redis-py. Keyword ``options`` override them.
        """
        rest, params = split_namespace_params(url)
        unknown = sorted(set(params) - {"prefix", "strategy"})
        if unknown:
            raise ConfigError(
                f"invalid Redis URL {mask_url(url)!r}: unknown parameter {unknown[0]!r}"
            )
        kwargs: dict[str, Any] = {**params, **options}
        kwargs.setdefault(cls._option, rest)
        return cls(**kwargs)

    # ------------------------------------------------------------------ describing

    def describe(self) -> str:
        """E.g. ``RedisBackend(redis='redis://:***@host:6379/0', strategy='lease', ...)``."""
        if self._url is not None:
            target = repr(mask_url(self._url))
        elif self._options is not None:
            shown = {k: v for k, v in self._options.items()
                     if k in ("host", "port", "db", "username", "ssl", "unix_socket_path")}
            target = f"options{shown!r}"
        else:
            target = self._conn.label if self._conn is not None else "?"
        if self._cluster:
            target += " (cluster)"
        return (f"{self._display}({self._option}={target}, strategy={self.strategy.name!r}, "
                f"prefix={self.prefix!r})")

    # ------------------------------------------------------------------ lifecycle

    async def _connection(self) -> Commands:
        if self._conn is None:
            await self.start()
        assert self._conn is not None
        return self._conn

    async def start(self) -> None:
        """Connect, check the server supports the strategy and check the store format."""
        if self._conn is None:
            self._conn = open_client(self._url if self._url is not None else
                                     self._options or {}, cluster=self._cluster)
        conn = self._conn
        await self._check_server(conn)
        found = await LuaScript.load("format").run(
            conn, [redis_key(self.prefix, "format")], [FORMAT_VERSION])
        try:
            version = int(found)
        except (TypeError, ValueError):
            raise StoreFormatError(found, FORMAT_VERSION) from None
        if version > FORMAT_VERSION:
            raise StoreFormatError(version, FORMAT_VERSION)
        log.debug("started %s", self.describe())

    async def _check_server(self, conn: Commands) -> None:
        info = parse_info(await LuaScript.load("server_info").run(conn, [], []))
        server = server_label(info)
        version = _version(info.get("redis_version", "0"))
        is_valkey = "valkey_version" in info or info.get("server_name", "").lower() == "valkey"
        if not is_valkey and version < (5, 0):
            raise UnsupportedStrategyError(
                f"anarchon needs Redis 5+ (streams); this server is {server}"
            )
        if isinstance(self.strategy, Idmp) and (is_valkey or version < (8, 6)):
            raise UnsupportedStrategyError(
                f"strategy 'idmp' needs Redis 8.6+ (idempotent XADD ... IDMP); this server "
                f"is {server}. Use {_OTHERS}."
            )

    async def stop(self) -> None:
        """Close the connection anarchon opened (a client you passed in stays open)."""
        conn = self._conn
        if conn is not None and conn.owned:
            self._conn = None
            await conn.close()

    def check_job(self, name: str, options: JobOptions) -> None:
        """``Script.window_ms`` must exceed the job's ``jitter_ms + max_late_ms``."""
        validate_job_name(name)
        if isinstance(self.strategy, Script):
            needed = options.jitter_ms + options.max_late_ms
            if self.strategy.window_ms <= needed:
                raise ConfigError(
                    f"job {name!r}: Script(window_ms={self.strategy.window_ms}) must exceed "
                    f"jitter_ms + max_late_ms = {needed}, or a late claim could run a slot "
                    "twice; raise window_ms or lower max_late_ms"
                )

    # ------------------------------------------------------------------ the lease strategy

    async def clock_ms(self) -> int:
        """The server's clock (``TIME``), the clock leases use."""
        reply = await (await self._connection()).call("TIME")
        if isinstance(reply, dict):  # a cluster client may answer per node
            reply = next(iter(reply.values()))
        return int(reply[0]) * 1000 + int(reply[1]) // 1000

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """Apply the lease decision table in one Lua script (``lua/lease_claim.lua``)."""
        return await lease_claim(await self._connection(), self.prefix, request)

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        """Extend the lease to server-now + ``lease_ms`` if ``ref`` is the current attempt."""
        return await lease_update(await self._connection(), self.prefix, "heartbeat", ref,
                                  lease_ms)

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the attempt's end if ``ref`` is the current, running attempt."""
        return await lease_update(await self._connection(), self.prefix, "finish", ref,
                                  run_score(ref.slot, ref.manual), status, error or "")

    async def release(self, ref: RunRef) -> bool:
        """End the lease now so a backup takes the next attempt at once."""
        return await lease_update(await self._connection(), self.prefix, "release", ref,
                                  HANDED_OVER)

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Attempts of ``job``, newest first; an expired running attempt reads interrupted."""
        return await lease_history(await self._connection(), self.prefix, job, limit)


class RedisClaimOnlyBackend(ClaimOnlyBackend, RedisBackend):
    """A :class:`RedisBackend` with a claim-only strategy: one winner per run, no leases.

    ``RedisBackend(strategy=...)`` builds it for ``stream-id``, ``idmp`` and ``script``.
    """

    #: Results kept per job (the scheduler's history_size arrives with each claim).
    _history_size: int = 1000

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """``won`` for the first claim of a run, ``taken`` for every other."""
        self._history_size = request.history_size
        return await claim_only(await self._connection(), self.prefix, self.strategy,
                                request, self._idmp)

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the run's result; False if it already has one."""
        return await claim_only_finish(await self._connection(), self.prefix, ref,
                                       status=status, error=error,
                                       history_size=self._history_size)

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Claimed runs of ``job`` with their results, newest first (one attempt each)."""
        return await claim_only_history(await self._connection(), self.prefix, job, limit)


class ValkeyBackend(RedisBackend):
    """Valkey: a :class:`RedisBackend` that takes ``valkey=`` and only Valkey's strategies.

    ``strategy`` is typed without :class:`Idmp` (a type error) and refuses it with a
    :class:`ConfigError` at construction.
    """

    _display: ClassVar[str] = "ValkeyBackend"
    _option: ClassVar[str] = "valkey"
    _allow_idmp: ClassVar[bool] = False

    def __init__(self, valkey: str | Mapping[str, Any] | object | None = None, *,
                 strategy: ValkeyStrategy = "lease", prefix: str = "cron:") -> None:
        self._setup(valkey, strategy, prefix)


class ValkeyClaimOnlyBackend(ClaimOnlyBackend, ValkeyBackend):
    """A :class:`ValkeyBackend` with the ``stream-id`` or ``script`` strategy."""

    claim = RedisClaimOnlyBackend.claim
    finish = RedisClaimOnlyBackend.finish
    history = RedisClaimOnlyBackend.history
    _history_size: int = 1000


RedisBackend._claim_only_class = RedisClaimOnlyBackend
ValkeyBackend._claim_only_class = ValkeyClaimOnlyBackend


def parse_info(text: object) -> dict[str, str]:
    """``INFO`` text as a dict (``redis_version``, ``server_name``, ``valkey_version``...)."""
    out: dict[str, str] = {}
    for line in str(text).splitlines():
        if ":" in line and not line.startswith("#"):
            key, _, value = line.partition(":")
            out[key.strip()] = value.strip()
    return out


def server_label(info: Mapping[str, str]) -> str:
    """``Valkey 8.1.1`` or ``Redis 7.0.15`` from ``INFO server``."""
    if "valkey_version" in info or info.get("server_name", "").lower() == "valkey":
        return f"Valkey {info.get('valkey_version', info.get('redis_version', '?'))}"
    return f"Redis {info.get('redis_version', '?')}"


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
