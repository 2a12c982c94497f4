"""``min_replicas_acks``: lease writes acknowledged by replicas (``WAIT``) before they count.

Redis replicates asynchronously: a primary that dies right after answering a claim may
take the claim with it, and the promoted replica lets another instance claim the run
again. With ``RedisBackend(..., min_replicas_acks=n)`` every lease write (claim,
heartbeat, finish, release) is followed by ``WAIT n <timeout>`` on the same connection and
the same node, in one pipeline, so the reply tells how many replicas hold the write.

When fewer than ``n`` replicas acknowledged it within :data:`WAIT_TIMEOUT_MS`, the write
raises :class:`~anarchon_core.errors.StoreUnavailable` (a transient error): a claim is
then not won by this instance (the store may hold it: the run starts after that lease
expires, as the next attempt), a heartbeat is unconfirmed (the runner fences itself when
its lease can no longer be confirmed), and a finish is retried.

``WAIT`` only covers writes made on the connection it is sent on, so it needs a client
that can pipeline on one connection: redis-py or valkey-py asyncio, standalone or cluster
(anarchon's own connection from a URL or options is one). Other clients are refused with
a :class:`~anarchon_core.errors.ConfigError` at construction.
"""

from __future__ import annotations

import inspect
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from ...errors import ConfigError, StoreUnavailable
from ...url import mask_url
from .clients import Arg, Commands, plain

__all__ = ["WAIT_TIMEOUT_MS", "AckedCommands", "check_acks", "pipelining_client",
           "split_acks_param"]

#: How long a write waits for its replicas before it counts as not acknowledged. Below
#: every sensible ``heartbeat_ms``, so a slow replica cannot hold up the heartbeats.
WAIT_TIMEOUT_MS = 500
PARAM = "min_replicas_acks"
_WRITES = frozenset({"EVALSHA", "EVAL"})


def check_acks(value: object) -> int:
    """Validate ``min_replicas_acks``: an int from 0 to 16 (a URL gives it as text)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 16:
        raise ConfigError(f"invalid min_replicas_acks {value!r}: expected an int 0..16")
    return value


def split_acks_param(url: str) -> tuple[str, int | None]:
    """Remove ``min_replicas_acks`` from a URL's query; its value if present."""
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    found = [v for k, v in pairs if k == PARAM]
    if not found:
        return url, None
    try:
        value = check_acks(found[-1])
    except ConfigError:
        raise ConfigError(f"invalid Redis URL {mask_url(url)!r}: {PARAM} must be an int "
                          f"0..16, not {found[-1]!r}") from None
    rest = urlencode([(k, v) for k, v in pairs if k != PARAM])
    return parts._replace(query=rest).geturl(), value


def pipelining_client(client: object) -> bool:
    """Whether ``client`` is a redis-py/valkey-py asyncio client (can pipeline on one link)."""
    execute = getattr(client, "execute_command", None)
    return callable(getattr(client, "pipeline", None)) and callable(execute) and \
        inspect.iscoroutinefunction(execute)


class AckedCommands(Commands):
    """``conn`` whose script calls are followed by ``WAIT acks`` on the same connection."""

    def __init__(self, conn: Commands, client: Any, acks: int) -> None:
        super().__init__(lambda args: conn.call(*args), label=conn.label, owned=False,
                         blocking=False)
        self._conn = conn
        self._client = client
        self.acks = acks

    async def call(self, *args: Arg) -> Any:
        """A script and ``WAIT`` in one pipeline; other commands as they are.

        Errors go through the connection's error layer (transient ones become
        :class:`StoreUnavailable`), like every other call.
        """
        if not args or str(args[0]).upper() not in _WRITES:
            return await self._conn.call(*args)
        client = self._client
        node: Any = None
        with self._conn.errors.guard(str(args[0])):
            pipe = client.pipeline(transaction=False)
            pipe.execute_command(*args)
            if hasattr(client, "get_node_from_key"):  # a cluster: WAIT on the key's node
                node = client.get_node_from_key(str(args[3]))
                pipe.execute_command("WAIT", self.acks, WAIT_TIMEOUT_MS, target_nodes=node)
            else:
                pipe.execute_command("WAIT", self.acks, WAIT_TIMEOUT_MS)
            reply, reached = await pipe.execute(raise_on_error=False)
            if isinstance(reply, BaseException):
                raise reply
        if node is not None and client.get_node_from_key(str(args[3])) is not node:
            # The key moved (a failover) between the write and WAIT: WAIT measured the
            # old node, so the write's replication is unknown.
            raise StoreUnavailable("the key's primary changed during a replicated write")
        if isinstance(reached, BaseException) or int(reached) < self.acks:
            got = reached if isinstance(reached, BaseException) else int(reached)
            raise StoreUnavailable(
                f"write acknowledged by {got} replicas within {WAIT_TIMEOUT_MS} ms; "
                f"min_replicas_acks={self.acks}")
        return plain(reply)
