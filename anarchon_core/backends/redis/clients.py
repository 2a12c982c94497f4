"""How anarchon talks to a Redis or Valkey server through whatever client it was given.

Every client is adapted to one small async interface, :class:`Commands`: ``call(*args)``
sends one command and returns its reply as plain Python values (``bytes`` decoded to
``str``, arrays as lists). anarchon's own reads and writes are Lua scripts whose replies are
plain arrays, so they look the same through every client.

* redis-py / valkey-py asyncio clients (standalone and cluster): ``execute_command``.
* redis-py / valkey-py sync clients, and any object whose ``execute_command`` is not a
  coroutine function: called in a worker thread so the event loop never blocks.
* Valkey GLIDE async and sync clients (standalone and cluster): ``custom_command``.

A URL or an options dict opens anarchon's own ``redis.asyncio`` client (``RedisCluster``
with ``?cluster=true`` in the URL or ``"cluster": True`` in the options), which ``close()``
closes; a client the user passed in is never closed (``Commands.owned`` says which).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, partial
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.exceptions import ResponseError

try:
    import hiredis
except ImportError:  # pragma: no cover - the [redis] extra installs it
    hiredis = None  # type: ignore[assignment]

from ...batching import CallBatcher
from ...decision import (
    ALREADY_BUFFERED,
    CANCELLED,
    EARLY_TOLERANCE_MS,
    GAVE_UP,
    HANDED_OVER,
    LEASE_EXPIRED,
    MAX_LEASE_AHEAD_MS,
    OVERLAP_SKIP,
    WAITING,
    WAITING_HANDED_OVER,
)
from ...errors import ConfigError, StoreError
from ...url import check_redis_url, mask_url
from ..storeerrors import STORE, TRANSIENT, Kind, StoreErrors

__all__ = ["Commands", "LuaScript", "adapt_client", "client_label", "open_client", "plain"]

Arg = str | int | bytes
DEFAULT_URL = "redis://localhost:6379/0"
_SCHEMES = {"redis": "redis", "rediss": "rediss", "valkey": "redis", "valkeys": "rediss"}
#: The lease the timeouts of anarchon's own connection fit when no scheduler said
#: (:func:`own_timeouts`).
DEFAULT_LEASE_MS = 30_000
#: Connections anarchon's own standalone client opens at most; callers beyond wait for one.
POOL_SIZE = 32
#: Commands sent in one pipeline at most, and pipelines in flight at once per client.
PIPELINE_SIZE = 256
PIPELINES_IN_FLIGHT = 8
#: Scripts that a standalone server runs for many calls at once (:meth:`LuaScript.batched`).
BATCHED_SCRIPTS = frozenset({"lease_claim", "lease_update"})
#: The calls one batched script runs at most (about 45 µs of server time each).
SCRIPT_BATCH = 128


def own_timeouts(lease_ms: int = DEFAULT_LEASE_MS) -> dict[str, Any]:
    """Timeouts and keepalives of anarchon's own connection, all below ``lease_ms``.

    A hung server or a half-open connection must fail a call (the scheduler retries a
    :class:`StoreUnavailable`) while the lease can still be saved, never block it. The
    URL or options given by the user win over these.
    """
    lease_s = lease_ms / 1000
    return {
        "socket_timeout": round(min(10.0, max(0.5, lease_s / 3)), 3),
        "socket_connect_timeout": round(min(5.0, max(0.5, lease_s / 3)), 3),
        "socket_keepalive": True,
        "health_check_interval": max(1, min(30, int(lease_s // 2))),
    }


# Error replies a server gives while it loads, fails over, reshards or is busy: retried.
_TRANSIENT_REPLIES = frozenset({
    "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK", "READONLY", "MASTERDOWN",
    "BUSY", "NOREPLICAS", "UNBLOCKED", "FAILOVER",
})
# Exception classes of redis-py, valkey-py and Valkey GLIDE, by name (the same in each).
_TRANSIENT_CLASSES = frozenset({
    "ConnectionError", "TimeoutError", "BusyLoadingError", "TryAgainError",
    "ClusterDownError", "MasterDownError", "MaxConnectionsError", "ClusterError",
    "SlotNotCoveredError", "MovedError", "AskError", "ReadOnlyError",
    "RedisClusterException", "ValkeyClusterException", "ClosingError",
})
_NOT_TRANSIENT = frozenset({
    "AuthenticationError", "AuthenticationWrongNumberOfArgsError", "AuthorizationError",
    "NoPermissionError", "ExternalAuthProviderError",
})
_DRIVERS = ("redis", "valkey", "glide")


def classify(exc: BaseException) -> Kind:
    """The Redis/Valkey error table (every client kind): transient, store, or not ours."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    driver = type(exc).__module__.split(".")[0].startswith(_DRIVERS)
    if names & _NOT_TRANSIENT:
        return STORE
    word = str(exc).lstrip("-").split(" ", 1)[0].upper()
    if word in _TRANSIENT_REPLIES:
        return TRANSIENT
    if not driver:
        return None
    if "DataError" in names:  # a bad argument: ours to fix, not the store's
        return None
    if names & _TRANSIENT_CLASSES:
        return TRANSIENT
    if "RequestError" in names and "timed out" in str(exc).lower():  # GLIDE
        return TRANSIENT
    return STORE


#: Texts the Lua scripts take from Python (``"@NAME@"`` in a script), so that
#: :mod:`anarchon_core.decision` stays their one source.
_LUA_CONSTANTS = {"LEASE_EXPIRED": LEASE_EXPIRED, "GAVE_UP": GAVE_UP, "HANDED_OVER": HANDED_OVER,
                  "OVERLAP_SKIP": OVERLAP_SKIP, "EARLY_TOLERANCE_MS": str(EARLY_TOLERANCE_MS),
                  "MAX_LEASE_AHEAD_MS": str(MAX_LEASE_AHEAD_MS), "WAITING": WAITING,
                  "WAITING_HANDED_OVER": WAITING_HANDED_OVER, "CANCELLED": CANCELLED,
                  "ALREADY_BUFFERED": ALREADY_BUFFERED}


def plain(value: Any) -> Any:
    """A reply as plain values: ``bytes`` → ``str``, tuples → lists, recursively."""
    kind = type(value)
    if kind is bytes:  # exact types first: every reply of every call passes here
        return value.decode("utf-8", "surrogateescape")
    if kind is int or kind is str or value is None:
        return value
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
        #: The client object itself when it can pipeline (``min_replicas_acks``), else None.
        self.client: Any = None
        #: The error layer; the backend replaces it with one that names itself.
        self.errors = StoreErrors(lambda: label, classify)
        #: Pipelines the commands sent at the same moment (see :meth:`pipeline_calls`).
        self.batcher: CallBatcher[tuple[Arg, ...], Any] | None = None
        #: Whether the server runs one script over the keys of many jobs (a standalone
        #: server: set by :meth:`pipeline_calls`; a proxy that refuses it turns it off).
        self.batch_scripts = False
        self._script_batchers: dict[str, CallBatcher[Call, Any]] = {}
        # Without pipelining, at most POOL_SIZE commands in flight per event loop: a burst
        # waits its turn instead of failing with "Too many connections" (cluster clients).
        self._limits: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                asyncio.Semaphore] = weakref.WeakKeyDictionary()

    def pipeline_calls(self, client: Any) -> None:
        """Send commands made at the same moment in one pipeline of ``client``.

        For a standalone redis-py/valkey-py asyncio client: each command keeps its own
        reply or error (the pipeline is not a transaction), but a thousand claims due at
        one instant take a few round trips and connections instead of a thousand.
        """
        self.client = client
        self.batcher = CallBatcher(self._pipeline, max_batch=PIPELINE_SIZE,
                                   max_in_flight=PIPELINES_IN_FLIGHT)
        self.batch_scripts = True

    def script_batcher(self, script: LuaScript) -> CallBatcher[Call, Any] | None:
        """Runs of ``script`` made at the same moment as one batched script, if it can."""
        if not self.batch_scripts or script.name not in BATCHED_SCRIPTS:
            return None
        batcher = self._script_batchers.get(script.name)
        if batcher is None:
            batcher = self._script_batchers[script.name] = CallBatcher(
                partial(self.run_batched, script), max_batch=SCRIPT_BATCH,
                max_in_flight=PIPELINES_IN_FLIGHT)
        return batcher

    async def run_batched(self, script: LuaScript, calls: Sequence[Call]) -> list[Any]:
        """Run ``script`` for each ``(keys, args)`` in one command.

        In order, each call's reply, or the error it failed with (not raised). The
        calls still run one after another, each deciding on its own keys; one that fails
        (a key of another type, say) fails alone.
        """
        if len(calls) == 1:  # alone: the script itself, without the batch around it
            keys, call_args = calls[0]
            reply = await self.send_one(("EVALSHA", script.sha, len(keys), *keys, *call_args))
            if isinstance(reply, StoreError) and is_noscript(reply):
                return await script.run_many(self, calls, batched=False)  # loads the script
            return [script.explain(reply, keys) if isinstance(reply, BaseException) else reply]
        keys = [key for call_keys, _ in calls for key in call_keys]
        args: list[Arg] = [len(calls[0][0])]
        for _, call_args in calls:
            args.append(len(call_args))
            args.extend(call_args)
        try:
            replies = await LuaScript.batched(script.name).run(self, keys, args)
        except StoreError as exc:
            if "CROSSSLOT" not in str(exc):
                raise
            # A proxy in front of several servers: one script per call from now on.
            self.batch_scripts = False
            return await script.run_many(self, calls, batched=False)
        if not isinstance(replies, list) or len(replies) != len(calls):
            raise StoreError(f"a batched {script.name} script answered "
                             f"{len(replies) if isinstance(replies, list) else replies!r} "
                             f"for {len(calls)} calls")
        out: list[Any] = []
        for reply in replies:
            if isinstance(reply, list) and len(reply) == 2 and reply[0] == _CALL_FAILED:
                out.append(script.explain(self._failure(ResponseError(reply[1]), "EVALSHA"),
                                          calls[len(out)][0]))
            else:
                out.append(reply)
        return out

    async def _pipeline(self, batch: Sequence[tuple[Arg, ...]]) -> list[Any]:
        """Raw replies of ``batch`` sent in one pipeline (an exception object per failure)."""
        if len(batch) == 1:  # cheaper without a pipeline object
            return [await self.client.execute_command(*batch[0])]
        pipe = self.client.pipeline(transaction=False)
        for args in batch:
            pipe.execute_command(*args)
        return list(await pipe.execute(raise_on_error=False))

    async def call_many(self, commands: Sequence[tuple[Arg, ...]]) -> list[Any]:
        """Send ``commands`` at once; each one's reply in order, or its error (not raised).

        A failed command's entry is the :class:`StoreUnavailable`/:class:`StoreError` that
        :meth:`call` would have raised. A pipelining client sends them in pipelines of
        :data:`PIPELINE_SIZE`, at most :data:`PIPELINES_IN_FLIGHT` at a time; other
        clients send them concurrently.
        """
        if self.batcher is None:
            return list(await asyncio.gather(*(self.call(*c) for c in commands),
                                              return_exceptions=True))
        chunks = [commands[i:i + PIPELINE_SIZE] for i in range(0, len(commands), PIPELINE_SIZE)]
        out: list[Any] = []
        for first in range(0, len(chunks), PIPELINES_IN_FLIGHT):
            group = chunks[first:first + PIPELINES_IN_FLIGHT]
            answers: list[Any]
            if len(group) == 1:  # most calls: no task to gather
                try:
                    answers = [await self._pipeline(group[0])]
                except Exception as exc:  # noqa: BLE001 - each command's error, as gather
                    answers = [exc]
            else:
                answers = await asyncio.gather(*(self._pipeline(c) for c in group),
                                               return_exceptions=True)
            for chunk, answer in zip(group, answers, strict=True):
                replies = [answer] * len(chunk) if isinstance(answer, BaseException) else answer
                for args, reply in zip(chunk, replies, strict=True):
                    out.append(self._failure(reply, str(args[0])) if isinstance(
                        reply, BaseException) else plain(reply))
        return out

    async def send_one(self, command: tuple[Arg, ...]) -> Any:
        """:meth:`call_many` of one command: its plain reply, or its error (not raised)."""
        if self.batcher is None:
            try:
                return await self.call(*command)
            except Exception as exc:  # noqa: BLE001 - returned, as call_many does
                return exc
        try:
            reply = await self.client.execute_command(*command)
        except Exception as exc:  # noqa: BLE001 - returned, as call_many does
            return self._failure(exc, str(command[0]))
        return plain(reply)

    def _failure(self, exc: BaseException, what: str) -> BaseException:
        """``exc`` as the error :meth:`call` would have raised for it."""
        error = self.errors.translate(exc, what)
        if error is None:
            return exc
        error.__cause__ = exc
        return error

    async def call(self, *args: Arg) -> Any:
        """Send one command and return its reply as plain values.

        Failures are :class:`StoreUnavailable` (transient) or :class:`StoreError`, with
        the client's exception as the cause (see :func:`classify`).
        """
        with self.errors.guard(str(args[0]) if args else "call"):
            if self.batcher is not None:
                reply = await self.batcher.call(args)
            else:
                async with self._limit():
                    if self.blocking:
                        reply = await asyncio.to_thread(self._send, args)
                    else:
                        reply = self._send(args)
                    if inspect.isawaitable(reply):
                        reply = await reply
        return plain(reply)

    def _limit(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        limit = self._limits.get(loop)
        if limit is None:
            limit = self._limits[loop] = asyncio.Semaphore(POOL_SIZE)
        return limit

    async def close(self) -> None:
        """Close the client if anarchon opened it; a user's client is left open."""
        closer, self._closer = self._closer, None
        if not self.owned or closer is None:
            return
        result = closer()
        if inspect.isawaitable(result):
            await result


#: The marker of a failed call in a batched script's answer.
_CALL_FAILED = "@error@"
#: A script (put in place of ``--@BODY@``) as a function run once per call, in order.
#: ``pcall`` keeps one call's error (a key of another type, say) from failing the others;
#: an error reply the script returns is kept as that call's failure too.
_BATCHED_SOURCE = """
local function one(KEYS, ARGV)
--@BODY@
end
local out, k, i = {}, 0, 2
local width = tonumber(ARGV[1])
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local keys, args = {}, {}
  for j = 1, width do keys[j] = KEYS[k + j] end
  for j = 1, n do args[j] = ARGV[i + j] end
  k, i = k + width, i + n + 1
  local ok, reply = pcall(one, keys, args)
  if not ok then
    if type(reply) == 'table' and reply.err then reply = reply.err end
    reply = {'@error@', tostring(reply)}
  elseif type(reply) == 'table' and reply.err then
    reply = {'@error@', reply.err}
  elseif reply == nil then
    reply = false  -- a nil would leave no slot in the answer
  end
  out[#out + 1] = reply
end
return out
"""
#: One call of a script: its keys and its arguments.
Call = tuple[Sequence[str], Sequence[Arg]]


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
        folder = resources.files("anarchon_core.backends.redis").joinpath("lua")
        source = folder.joinpath(f"{name}.lua").read_text("utf-8")
        for constant, text in _LUA_CONSTANTS.items():
            # A Lua string literal: JSON's escapes of '"' and '\\' are Lua's too.
            source = source.replace(f'"@{constant}@"', json.dumps(text, ensure_ascii=False))
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())

    @classmethod
    @cache
    def batched(cls, name: str) -> LuaScript:
        """Script ``name`` run for many calls in one command.

        ``KEYS`` are every call's keys in turn; ``ARGV`` is the number of keys per call,
        then per call its number of arguments and the arguments. Answers one reply per
        call, or ``{"@error@", text}``.
        """
        one = cls.load(name)
        source = _BATCHED_SOURCE.replace("--@BODY@", one.source)
        return cls(f"{name}[batched]", source, hashlib.sha1(source.encode()).hexdigest())

    def explain(self, error: BaseException, keys: Sequence[str]) -> BaseException:
        """``error`` of a run over ``keys``; a ``WRONGTYPE`` one says what it means."""
        if not isinstance(error, StoreError) or "WRONGTYPE" not in str(error):
            return error
        explained = StoreError(
            f"{error}; one of the keys {', '.join(map(repr, keys))} holds a value of another "
            "type than anarchon writes (another application uses this prefix?)")
        explained.__cause__ = error.__cause__
        return explained

    def run(self, conn: Commands, keys: Sequence[str], args: Sequence[Arg], *,
            read_only: bool = False) -> Awaitable[Any]:
        """EVALSHA, falling back to EVAL when the server does not have the script yet.

        ``read_only`` runs a script that only reads as ``EVALSHA_RO``/``EVAL_RO`` (Redis
        7+, Valkey), which an ACL user limited to reads may run and which a replica
        accepts; older servers get the plain commands. A key of another type than
        anarchon writes (``WRONGTYPE``) is a :class:`StoreError` naming the keys. Runs of
        the same script made at the same moment share one command where the server
        allows (:meth:`batched`). Returns the awaitable of the reply (the batch's future
        itself when batched: no coroutine per call).
        """
        batcher = None if read_only else conn.script_batcher(self)
        if batcher is not None:
            return batcher.call((keys, args))
        return self._run_alone(conn, keys, args, read_only=read_only)

    async def _run_alone(self, conn: Commands, keys: Sequence[str], args: Sequence[Arg], *,
                         read_only: bool = False) -> Any:
        ro = "_RO" if read_only and not getattr(conn, "_anarchon_no_ro", False) else ""
        try:
            try:
                return await conn.call(f"EVALSHA{ro}", self.sha, len(keys), *keys, *args)
            except StoreError as exc:
                if ro and _unknown_command(exc):
                    conn._anarchon_no_ro = True  # type: ignore[attr-defined]
                    return await self._run_alone(conn, keys, args, read_only=read_only)
                if not is_noscript(exc):
                    raise
            return await conn.call(f"EVAL{ro}", self.source, len(keys), *keys, *args)
        except StoreError as exc:
            explained = self.explain(exc, keys)
            if explained is exc:
                raise
            raise explained from exc.__cause__


    async def run_many(self, conn: Commands,
                       calls: Sequence[tuple[Sequence[str], Sequence[Arg]]], *,
                       batched: bool = True) -> list[Any]:
        """Run the script once per ``(keys, args)``, all sent at once.

        In order, each call's reply, or the :class:`StoreError` it failed with (not raised).
        As batched scripts where the server allows (``batched``), else one command per
        call (:meth:`Commands.call_many`).
        """
        if batched and conn.script_batcher(self) is not None:
            chunks = [calls[i:i + SCRIPT_BATCH] for i in range(0, len(calls), SCRIPT_BATCH)]
            answers: list[Any]
            if len(chunks) == 1:
                try:
                    answers = [await conn.run_batched(self, chunks[0])]
                except Exception as exc:  # noqa: BLE001 - each call's error, as gather
                    answers = [exc]
            else:
                answers = await asyncio.gather(*(conn.run_batched(self, c) for c in chunks),
                                               return_exceptions=True)
            return [reply for chunk, answer in zip(chunks, answers, strict=True)
                    for reply in ([answer] * len(chunk) if isinstance(answer, BaseException)
                                  else answer)]
        commands = [("EVALSHA", self.sha, len(keys), *keys, *args) for keys, args in calls]
        replies = (await conn.call_many(commands) if len(commands) > 1
                   else [await conn.send_one(commands[0])])
        if not any(isinstance(r, BaseException) for r in replies):
            return replies
        missing = [i for i, r in enumerate(replies) if isinstance(r, StoreError)
                   and is_noscript(r)]
        if missing:  # the server lost its scripts (a restart, SCRIPT FLUSH): load and redo
            redone = await asyncio.gather(*(self._run_alone(conn, *calls[i]) for i in missing),
                                          return_exceptions=True)
            for i, reply in zip(missing, redone, strict=True):
                replies[i] = reply
        return [self.explain(reply, calls[i][0]) if isinstance(reply, BaseException) else reply
                for i, reply in enumerate(replies)]


def _unknown_command(exc: BaseException) -> bool:
    """Whether the server does not know the command (``EVALSHA_RO`` before Redis 7)."""
    return any("unknown command" in str(e).lower() for e in (exc, exc.__cause__) if e)


def is_noscript(exc: BaseException) -> bool:
    """Whether a client error (or its cause) is the server's NOSCRIPT."""
    for error in (exc, exc.__cause__):
        if error is None:
            continue
        text = str(error)
        if (type(error).__name__ == "NoScriptError" or "NOSCRIPT" in text
                or "No matching script" in text):
            return True
    return False


def _text(arg: Arg) -> str | bytes:
    return arg if isinstance(arg, str | bytes) else str(arg)


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
        return Commands(lambda args: glide([_text(a) for a in args]), label=label,
                        owned=False, blocking=blocking)
    execute = getattr(client, "execute_command", None)
    if callable(execute):
        blocking = not inspect.iscoroutinefunction(execute)
        commands = Commands(lambda args: execute(*args), label=label, owned=False,
                            blocking=blocking)
        if can_pipeline(client):
            commands.pipeline_calls(client)
        return commands
    raise ConfigError(
        f"unsupported Redis client {label}: pass a URL, an options dict, a redis-py or "
        "valkey-py client, a Valkey GLIDE client, or an object with execute_command(*args)"
    )


def can_pipeline(client: object) -> bool:
    """Whether ``client`` is a standalone redis-py/valkey-py asyncio client.

    Those pipeline on one connection; a cluster client (its pipeline splits by node) and
    other clients send each command on its own.
    """
    execute = getattr(client, "execute_command", None)
    return (callable(getattr(client, "pipeline", None)) and callable(execute)
            and inspect.iscoroutinefunction(execute)
            and not hasattr(client, "get_node_from_key"))


def check_url(url: str) -> tuple[str, bool]:
    """Validate a redis/rediss/valkey/valkeys URL.

    Returns the URL for redis-py's ``from_url`` and whether ``?cluster=true`` asked for a
    Redis Cluster client.
    """
    check_redis_url(url)  # ConfigError (URL masked) for anything redis-py would refuse later
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
    query = parse_qsl(parts.query, keep_blank_values=True)
    cluster = [v for k, v in query if k == "cluster"]
    rest = urlencode([(k, v) for k, v in query if k != "cluster"])
    return parts._replace(scheme=_SCHEMES[scheme], query=rest).geturl(), \
        _flag("cluster", cluster[-1]) if cluster else False


def _flag(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ConfigError(f"invalid {name} {value!r}: expected true or false")


@cache
def _option_names(cluster: bool) -> frozenset[str]:
    names = set(inspect.signature(Redis.__init__).parameters)
    if cluster:
        names |= set(inspect.signature(RedisCluster.__init__).parameters)
    return frozenset(names - {"self", "kwargs"})


def check_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Validate an options dict for ``redis.asyncio.Redis(**options)``.

    ``"cluster": True`` asks for ``redis.asyncio.RedisCluster(**options)`` instead; the
    flag is returned apart from the options.
    """
    rest = {k: v for k, v in options.items() if k != "cluster"}
    cluster = _flag("cluster", options.get("cluster", False))
    unknown = sorted(set(rest) - _option_names(cluster))
    if unknown:
        raise ConfigError(
            f"unknown Redis connection option(s) {', '.join(map(repr, unknown))}; use "
            "redis.asyncio.Redis arguments such as host, port, db, username, password, ssl"
        )
    return rest, cluster


def open_client(target: str | Mapping[str, Any], *, cluster: bool = False,
                lease_ms: int = DEFAULT_LEASE_MS) -> Commands:
    """Open anarchon's own ``redis.asyncio`` client from a checked URL or options dict.

    Timeouts and keepalives fit ``lease_ms`` (:func:`own_timeouts`) unless the URL or the
    options set them.
    """
    cls: Any = RedisCluster if cluster else Redis
    defaults = own_timeouts(lease_ms)
    if isinstance(target, str) and not cluster:
        # Many calls due at one instant wait for one of POOL_SIZE connections instead of
        # failing with "Too many connections" (redis-py's default pool raises past its size).
        given = {k for k, _ in parse_qsl(urlsplit(target).query)}
        pool = BlockingConnectionPool.from_url(
            target, **{k: v for k, v in {**defaults, "max_connections": POOL_SIZE,
                                         "timeout": max(5.0, lease_ms / 1000)}.items()
                       if k not in given})
        pool.connection_class = hiredis_packing(pool.connection_class)
        client = Redis(connection_pool=pool)
        client.auto_close_connection_pool = True
    elif isinstance(target, str):
        given = {k for k, _ in parse_qsl(urlsplit(target).query)}
        client = cls.from_url(target, **{k: v for k, v in defaults.items() if k not in given})
    else:
        client = cls(**{**defaults, **target})
    commands = Commands(partial(_execute, client), label=f"redis.asyncio.{cls.__name__}",
                        owned=True, blocking=False, closer=client.aclose)
    commands.client = client
    if not cluster:
        commands.pipeline_calls(client)
    return commands


class _HiredisPacking:
    """Pack commands with hiredis (in C), as redis-py's synchronous connection does.

    redis-py's asyncio connection packs every argument in Python: with thousands of claims
    and end records at one instant that is a tenth of the scheduler's CPU. Same bytes.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        # As redis-py does: "CONFIG GET" style names go out as separate arguments.
        if isinstance(first, str):
            args = (*first.encode().split(), *args[1:])
        elif b" " in first:
            args = (*first.split(), *args[1:])
        return [hiredis.pack_command(args)]


_PACKING: dict[type, type] = {}


def hiredis_packing(connection_class: type[Any]) -> type[Any]:
    """``connection_class`` packing with hiredis, if it is installed (else unchanged)."""
    if hiredis is None or not hasattr(connection_class, "pack_command"):
        return connection_class
    packing = _PACKING.get(connection_class)
    if packing is None:
        packing = _PACKING[connection_class] = type(
            f"Hiredis{connection_class.__name__}", (_HiredisPacking, connection_class), {})
    return packing


def _execute(client: Any, args: Sequence[Arg]) -> Any:
    return client.execute_command(*args)
