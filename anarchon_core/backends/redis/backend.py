"""Redis and Valkey: :class:`RedisBackend` and :class:`ValkeyBackend`.

The user guide is ``docs/backends/redis.md``.

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
  The backend delegates the strategy's store operations to a store object
  (:class:`~.stores.LeaseStore` or :class:`~.stores.ClaimOnlyStore`).
* ``prefix``: the namespace of every key (``"cron:"``).
* ``read_only``: read history only; the scripts run as ``EVALSHA_RO`` (Redis 7+), so an
  ACL user limited to reads (``+@read +time +evalsha_ro +eval_ro``) is enough.

The key layout is in :mod:`.keys`, the Lua scripts in ``lua/``. The set
``<prefix>jobs`` lists the namespace's jobs (each process adds a job when it first claims
it) for :meth:`~RedisBackend.job_names` and :meth:`~RedisBackend.runs`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ...backend import FORMAT_VERSION, MAX_NAMESPACES, Backend
from ...errors import ConfigError, UnsupportedStrategyError
from ...models import (
    RUN_STATUSES,
    ClaimRequest,
    ClaimResult,
    ExpiredRun,
    HistoryQuery,
    Run,
    RunPage,
    RunRef,
)
from ...naming import validate_job_name, validate_prefix
from ...readmodel import dump_meta, history_reader, page_jobs
from ...records import record_ms
from ...url import check_redis_url, mask_url, split_namespace_params
from ..common import check_format_value, missing_store, parse_flag, refuse_write, time_ms
from ..storeerrors import StoreErrors
from .acks import AckedCommands, check_acks, pipelining_client, split_acks_param
from .clients import (
    DEFAULT_URL,
    Commands,
    LuaScript,
    adapt_client,
    check_options,
    check_url,
    classify,
    open_client,
)
from .keys import redis_key
from .lease import corrupt_records
from .stores import LeaseStore, RedisStore, store_for
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

__all__ = ["Idmp", "Lease", "RedisBackend", "Script", "StreamId", "ValkeyBackend"]

log = logging.getLogger("anarchon.redis")
#: Job names listed by one ``SADD`` at most.
_REGISTER_BATCH = 500
#: ``HSCAN`` of the control records: fields asked per call, and calls at most.
_SCAN_COUNT = 1_000
_MAX_SCAN_CALLS = 10_000
#: Characters a glob pattern gives a meaning (escaped in a ``MATCH`` prefix).
_GLOB_SPECIAL = re.compile(r"[\\*?\[\]]")
#: The bounds of :meth:`RedisBackend.namespaces`: ``SCAN`` calls, and keys each looks at.
SCAN_CALLS, SCAN_COUNT = 10, 1_000
_OTHERS = "'lease' (the default), 'stream-id' or 'script', which work on Redis 5+ and Valkey"


class RedisBackend(Backend):
    """Redis backend (see the module docstring for the options).

    The strategy decides ``supports_leases`` (an instance attribute): ``lease`` holds
    leases; ``stream-id``, ``idmp`` and ``script`` only claim.
    """

    _display: ClassVar[str] = "RedisBackend"
    _option: ClassVar[str] = "redis"
    _allow_idmp: ClassVar[bool] = True

    def __init__(self, redis: str | Mapping[str, Any] | object | None = None, *,
                 strategy: RedisStrategy = "lease", prefix: str = "cron:",
                 min_replicas_acks: int = 0, read_only: bool = False) -> None:
        self._setup(redis, strategy, prefix, read_only)
        self._setup_acks(redis, min_replicas_acks)

    def _setup(self, connection: object, strategy: object, prefix: object,
               read_only: object) -> None:
        self.strategy: Strategy = parse_strategy(strategy, allow_idmp=self._allow_idmp)
        #: The strategy's store operations, which this backend delegates to.
        self.store: RedisStore = store_for(self.strategy)
        self.supports_leases = self.store.leases
        self.read_only = parse_flag("read_only", read_only)
        self._registered: set[str] = set()
        self.prefix = validate_prefix(prefix)
        if not self.prefix.endswith(":"):
            # Job names are escaped so they hold no ':' (see .keys); a prefix ending in ':'
            # then marks where the namespace ends, so two namespaces never share a key.
            raise ConfigError(f"invalid prefix {self.prefix!r}: a Redis prefix must end "
                              f"with ':' (e.g. {self.prefix + ':'!r})")
        self._lease_ms: int | None = None
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
            self._conn.errors = StoreErrors(self.describe, classify)

    def _setup_acks(self, connection: object, acks: object) -> None:
        """``min_replicas_acks`` (see :mod:`.acks`): checked here, at construction."""
        self.min_replicas_acks = check_acks(acks)
        self._acked: AckedCommands | None = None
        if self.min_replicas_acks and self._conn is not None:
            if not pipelining_client(connection):
                raise ConfigError(
                    f"min_replicas_acks needs a redis-py or valkey-py asyncio client (WAIT "
                    f"must follow each write on its connection); got {self._conn.label}")
            self._conn.client = connection

    async def _writes(self) -> Commands:
        """The connection for lease writes: followed by ``WAIT`` when acks are asked for."""
        conn = self._conn or await self._connection()
        if not self.min_replicas_acks:
            return conn
        if self._acked is None or self._acked._conn is not conn:
            self._acked = AckedCommands(conn, conn.client, self.min_replicas_acks)
        return self._acked

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisBackend:
        """``redis://[user:password@]host:port/db?prefix=billing:cron:&strategy=script``.

        ``prefix`` and ``strategy`` (a name) are read from the query; other query
        parameters go to redis-py. Keyword ``options`` override them.
        """
        check_redis_url(url, extra=("prefix", "strategy", "read_only", "min_replicas_acks"))
        url, acks = split_acks_param(url)
        if acks is not None:
            options.setdefault("min_replicas_acks", acks)
        rest, params = split_namespace_params(url)
        unknown = sorted(set(params) - {"prefix", "strategy", "read_only"})
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
        acks = (f", min_replicas_acks={self.min_replicas_acks}"
                if getattr(self, "min_replicas_acks", 0) else "")
        return (f"{self._display}({self._option}={target}, strategy={self.strategy.name!r}, "
                f"prefix={self.prefix!r}{acks})")

    # ------------------------------------------------------------------ lifecycle

    async def _connection(self) -> Commands:
        if self._conn is None:
            await self.start()
        assert self._conn is not None
        return self._conn

    def _connect(self) -> Commands:
        """The connection, opened if need be (nothing sent yet)."""
        if self._conn is None:
            conn = open_client(self._url if self._url is not None else self._options or {},
                               cluster=self._cluster,
                               **({} if self._lease_ms is None else {"lease_ms": self._lease_ms}))
            conn.errors = StoreErrors(self.describe, classify)
            self._conn = conn
        return self._conn

    async def start(self) -> None:
        """Connect, check the server supports the strategy and check the store format."""
        conn = self._connect()
        key = redis_key(self.prefix, "format")
        if self.read_only:
            # INFO needs more than reads; a reader runs no strategy, so skip the check.
            found = await LuaScript.load("format_read").run(conn, [key], [], read_only=True)
            if found is None:
                raise await missing_store(self, "prefix", self.prefix,
                                          f"there is no {key!r} key in this database")
        else:
            await self._check_server(conn)
            found = await LuaScript.load("format").run(conn, [key], [FORMAT_VERSION])
        check_format_value(found)
        log.debug("started %s", self.describe())

    async def namespaces(self) -> list[str] | None:
        """The prefixes of this database that hold a ``<prefix>format`` key.

        A bounded ``SCAN`` (at most :data:`SCAN_CALLS` calls of ``COUNT``
        :data:`SCAN_COUNT`) for ``*:format`` keys whose value is a format number; reads
        only. None on a cluster, where one node's keys would be a partial answer.
        """
        if self._cluster:
            return None
        conn = self._connect()  # no start(): the namespace of this backend may not exist
        keys: set[str] = set()
        cursor = "0"
        for _ in range(SCAN_CALLS):
            reply = await conn.call("SCAN", cursor, "MATCH", "*:format", "COUNT", SCAN_COUNT)
            if not isinstance(reply, list) or len(reply) != 2:
                return None  # a cluster client answering per node
            cursor = str(reply[0])
            keys.update(str(k) for k in reply[1] or [])
            if cursor == "0":
                break
        candidates = sorted(keys)[:MAX_NAMESPACES]
        values = await conn.call_many([("GET", k) for k in candidates])
        return [k[:-len("format")] for k, v in zip(candidates, values, strict=True)
                if isinstance(v, str) and v.isdigit()]

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

    def tune_timeouts(self, lease_ms: int) -> None:
        """Fit the socket, connect and health-check timeouts of anarchon's own connection.

        Socket and connect timeouts become a third of the lease (at most 10 s and 5 s),
        TCP keepalives are on, and an idle connection is checked every half lease. The
        shortest lease of the schedulers using this backend wins; it applies to the
        connection :meth:`start` opens. A client you passed in is left as it is.
        """
        self._lease_ms = lease_ms if self._lease_ms is None else min(self._lease_ms, lease_ms)

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
        return time_ms(await (await self._connection()).call("TIME"))

    async def _register(self, conn: Commands, job: str) -> None:
        """Add ``job`` to ``<prefix>jobs`` (once per job and backend object)."""
        await conn.call("SADD", redis_key(self.prefix, "jobs"), job)
        self._registered.add(job)

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """Claim with the strategy (the lease decision table, or first claim wins)."""
        refuse_write(self, "claim")
        conn = await self._writes()
        claiming = self.store.claim(conn, self.prefix, request, self.retention)
        if request.job in self._registered:
            return await claiming
        # The first claim of a job here also lists it; both go in one pipeline.
        _, result = await asyncio.gather(self._register(conn, request.job), claiming)
        return result

    async def claim_many(self, requests: Sequence[ClaimRequest]
                         ) -> list[ClaimResult | BaseException]:
        """Claim each request, all scripts sent at once (a few pipelines)."""
        refuse_write(self, "claim")
        conn = await self._writes()
        new = sorted({r.job for r in requests} - self._registered)
        if new:
            # Their first claims here also list the jobs: a few SADDs of many members each
            # (a burst after a start lists thousands of jobs at once).
            key = redis_key(self.prefix, "jobs")
            groups = [new[i:i + _REGISTER_BATCH] for i in range(0, len(new), _REGISTER_BATCH)]
            listed = await conn.call_many([("SADD", key, *group) for group in groups])
            for group, reply in zip(groups, listed, strict=True):
                if not isinstance(reply, BaseException):
                    self._registered.update(group)
        return await self.store.claim_many(conn, self.prefix, requests, self.retention)

    async def heartbeat(self, ref: RunRef, lease_ms: int) -> bool:
        """Extend the lease to server-now + ``lease_ms`` if ``ref`` is the current attempt."""
        refuse_write(self, "heartbeat")
        return await self.store.heartbeat(await self._writes(), self.prefix, ref, lease_ms)

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the attempt's end and meta if ``ref`` is the current, running attempt."""
        refuse_write(self, "finish")
        stored = dump_meta(meta)
        return await self.store.finish(await self._writes(), self.prefix, ref, status=status,
                                       error=error, meta=stored, retention=self.retention)

    async def release(self, ref: RunRef) -> bool:
        """End the lease now so a backup takes the next attempt at once."""
        refuse_write(self, "release")
        return await self.store.release(await self._writes(), self.prefix, ref)

    async def add_meta(self, ref: RunRef, meta: Mapping[str, str]) -> bool:
        """Merge ``meta`` into an ended attempt's meta (the ``lease`` strategy only).

        The claim-only strategies keep a run's one result as written and refuse it
        (:class:`UnsupportedStrategyError`).
        """
        refuse_write(self, "add_meta")
        if not isinstance(self.store, LeaseStore):
            return await super().add_meta(ref, meta)
        return await self.store.add_meta(await self._writes(), self.prefix, ref, meta)

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Attempts of ``job``, newest first; an expired running attempt reads interrupted."""
        return await self.store.history(await self._connection(), self.prefix, job, limit,
                                        read_only=self.read_only)

    async def expired_runs(self, job: str, limit: int = 100) -> list[ExpiredRun]:
        """Runs of ``job`` still running whose lease expired (none without leases)."""
        return await self.store.expired_runs(await self._connection(), self.prefix, job,
                                             limit)

    async def _jobs(self) -> list[str]:
        conn = await self._connection()
        names = await LuaScript.load("read_set").run(
            conn, [redis_key(self.prefix, "jobs")], [], read_only=self.read_only)
        return sorted(str(n) for n in names or [])

    async def job_names(self) -> dict[str, Run | None]:
        """The jobs in ``<prefix>jobs``, each with its newest attempt (or None)."""
        return {job: next(iter(await self.history(job, 1)), None)
                for job in await self._jobs()}

    async def newest_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """The newest scheduled slot of each job: the top of ``{..}:slots``, pipelined.

        Manual runs are listed there as ``m<slot>``; the first member that is not one is
        the newest scheduled slot (five looked at, then the history as a fallback).
        """
        if not self.supports_leases:
            return await super().newest_slots(jobs)
        conn = await self._connection()
        replies = await conn.call_many([
            ("ZREVRANGEBYSCORE", redis_key(self.prefix, "slots", job, tagged=True), "+inf",
             "-inf", "LIMIT", 0, 5) for job in jobs])
        out: dict[str, int | None] = {}
        fallback = []
        for job, reply in zip(jobs, replies, strict=True):
            if isinstance(reply, BaseException):
                raise reply
            members = [str(m) for m in reply or []]
            scheduled = next((m for m in members if not m.startswith("m")), None)
            slot = _newest_slot(self.prefix, job, scheduled)
            if slot is not None:
                out[job] = slot
            elif len(members) < 5:
                out[job] = None
            else:
                fallback.append(job)
        if fallback:
            out.update(await super().newest_slots(fallback))
        return out

    async def write_control(self, name: str, value: str | None) -> None:
        """Set (``HSET``) or delete (``HDEL``) a field of ``<prefix>control``."""
        refuse_write(self, "write_control")
        conn = await self._writes()
        key = redis_key(self.prefix, "control")
        if value is None:
            await conn.call("HDEL", key, name)
        else:
            await conn.call("HSET", key, name, value)

    async def read_controls(self, prefix: str) -> dict[str, str]:
        """The fields of ``<prefix>control`` that start with ``prefix`` (``HSCAN ... MATCH``).

        Only the matching fields come back: every instance reads its fleet's registry
        records every couple of seconds, and the ``jobs:`` records beside them are large.
        """
        conn = await self._connection()
        key = redis_key(self.prefix, "control")
        pattern = _GLOB_SPECIAL.sub(r"\\\g<0>", prefix) + "*"
        out: dict[str, str] = {}
        cursor: Any = 0
        for _ in range(_MAX_SCAN_CALLS):
            cursor, flat = await conn.call("HSCAN", key, cursor, "MATCH", pattern,
                                           "COUNT", _SCAN_COUNT)
            out.update(_field_pairs(flat))
            if str(cursor) == "0":
                break
        return {name: value for name, value in out.items() if name.startswith(prefix)}

    async def slot_states(self, slots: Sequence[tuple[str, int]]
                          ) -> dict[tuple[str, int], str] | None:
        """Each slot's field of its job's ``{..}:state`` hash (``HGET``, pipelined)."""
        if not self.supports_leases:
            return None
        if not slots:
            return {}
        conn = await self._connection()
        replies = await conn.call_many([
            ("HGET", redis_key(self.prefix, "state", job, tagged=True), str(slot))
            for job, slot in slots])
        out: dict[tuple[str, int], str] = {}
        for key, reply in zip(slots, replies, strict=True):
            if isinstance(reply, BaseException):
                raise reply
            status = None if reply is None else _state_status(str(reply))
            if status is not None:
                out[key] = status
        return out

    async def runs(self, query: HistoryQuery) -> RunPage:
        """One page of history across the namespace's jobs, newest first."""
        names = [query.job] if query.job is not None else await self._jobs()
        return await page_jobs(names, history_reader(self.history), query)


class ValkeyBackend(RedisBackend):
    """Valkey: a :class:`RedisBackend` that takes ``valkey=`` and only Valkey's strategies.

    ``strategy`` is typed without :class:`Idmp` (a type error) and refuses it with a
    :class:`ConfigError` at construction.
    """

    _display: ClassVar[str] = "ValkeyBackend"
    _option: ClassVar[str] = "valkey"
    _allow_idmp: ClassVar[bool] = False

    def __init__(self, valkey: str | Mapping[str, Any] | object | None = None, *,
                 strategy: ValkeyStrategy = "lease", prefix: str = "cron:",
                 min_replicas_acks: int = 0, read_only: bool = False) -> None:
        self._setup(valkey, strategy, prefix, read_only)
        self._setup_acks(valkey, min_replicas_acks)


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


def _field_pairs(reply: Any) -> dict[str, str]:
    """An ``HSCAN`` page's fields: a mapping (redis-py parses it so) or a flat list."""
    if isinstance(reply, Mapping):
        return {str(k): str(v) for k, v in reply.items()}
    flat = [str(v) for v in reply or []]
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _state_status(text: str) -> str | None:
    """The status in a run's state (None if it is not a state anarchon wrote)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    status = value.get("s") if isinstance(value, dict) else None
    return status if status in RUN_STATUSES else None


def _newest_slot(prefix: str, job: str, member: str | None) -> int | None:
    """The slot a ``{..}:slots`` member names; None (reported) if it is not a slot."""
    if member is None:
        return None
    try:
        return record_ms(member, "slot")
    except ValueError as exc:
        corrupt_records.report(redis_key(prefix, "slots", job, tagged=True), job, member,
                               f"unreadable slot: {exc}")
        return None


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
