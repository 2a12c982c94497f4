"""RabbitMQ: a claim-only backend (one winner per run; no leases).

Built on aio-pika (asyncio, like the core: no thread per connection, and claims of many
jobs share one connection and channels with publisher confirms in flight together).

Connections: claims (run queues, the format record) and history (streams) each have a
connection of their own. RabbitMQ 3.10 closes the whole connection (``INTERNAL_ERROR``:
its channel crashed, or ``RESOURCE_ERROR``) of a client that publishes to a stream while
another client is still creating it: a concurrent declaration answers ``declare-ok``
before the broker knows the stream's writer. On a connection of its own, that costs a
history write (tried again, see :meth:`_append`), never a claim. On each connection,
declarations and publishes use separate channels: a declaration the broker refuses
closes its channel and fails everything in flight on it, and a declaration can be tried
again where a publish cannot. A connection passed in is shared by both.

How a claim works: each run has its own queue ``<prefix><job>.<slot>`` (manual runs:
``<prefix><job>.<slot>.manual``; ``<job>`` escaped by :func:`queue_token`), declared by
every claimant as a durable **classic** queue with ``x-max-length: 1`` and ``x-overflow:
reject-publish``, and never consumed. Every claimant publishes one persistent message to
it with publisher confirms: the broker accepts the first (``basic.ack``: the claimant
won) and refuses every later one (``basic.nack``: taken). Quorum queues are not used:
they do not enforce the length limit exactly. The queue deletes itself
``run_expires_ms`` after its last declaration (``x-expires``), which must outlast any
late claim: :meth:`check_job` refuses a job whose ``max_late_ms + jitter_ms`` exceeds
half of it.

History: each job has a **stream queue** ``<prefix><job>.history`` holding one claim
record per won run and one result record per finished run (see
:mod:`anarchon_core.backends.claimrecords`). A stream is read without being consumed, so
concurrent readers and writers never disturb each other. Because AMQP cannot tell a
stream reader where the stream ends, :meth:`history` first appends a small marker
record and reads from the start of the stream until it sees its own marker. The stream
keeps about the namespace's ``retention.history_size`` runs (``x-max-length-bytes``,
whole segments at a time) and, when ``retention.history_ttl_ms`` is set, drops older
records (``x-max-age``). AMQP cannot list queues, so the jobs of a namespace are recorded
in the stream ``<prefix>jobs`` (one record per job and process, when the process first
writes its history), which :meth:`job_names` and :meth:`runs` read.

Read-only (``read_only=True``): nothing is declared or published. History is read without
a marker: the read ends when the stream has delivered nothing for
:data:`READ_ONLY_QUIET_S` (so a read takes at least that long, and records appended during
the read may or may not be included).

Clock: RabbitMQ does not give clients its time, so late claims are judged by this
machine's clock (:meth:`clock_ms`). Clock skew can only change whether a late slot runs,
never make it run twice: the queue alone decides the winner.

The store-format record is the durable queue ``<prefix>format``, whose ``x-max-length``
argument holds the format number (RabbitMQ refuses to redeclare a queue with another
value and names the current one, which is how a newer format is detected).

What it cannot do (documented in ``docs/backends/rabbitmq.md``): leases, backups,
takeover, overlap protection, catch-up; a run whose runner died stays ``running`` in
history; a claim whose confirm was lost with the connection is not retried as won (the
run is skipped rather than run twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from aio_pika.exceptions import (
    AMQPConnectionError,
    AMQPError,
    ChannelClosed,
    ChannelInvalidStateError,
    ChannelNotFoundEntity,
    ChannelPreconditionFailed,
    ConnectionClosed,
    DeliveryError,
    ProbableAuthenticationError,
    PublishError,
)
from aiormq.exceptions import ChannelAccessRefused

from ..backend import FORMAT_VERSION, ClaimOnlyBackend
from ..decision import not_run
from ..errors import ConfigError, StoreError, StoreFormatError, StoreUnavailable
from ..models import ClaimOutcome, ClaimRequest, ClaimResult, HistoryQuery, Run, RunPage, RunRef
from ..naming import validate_job_name, validate_prefix
from ..readmodel import dump_meta, page_jobs
from ..url import check_amqp_url, mask_url, split_namespace_params
from .claimrecords import (
    claim_record,
    corrupt_records,
    decode_json,
    encode_json,
    parse_many,
    result_record,
    runs_from_records,
)
from .common import local_now_ms, missing_store, parse_flag, refuse_write
from .storeerrors import STORE, TRANSIENT, Kind, StoreErrors

if TYPE_CHECKING:
    from ..options import JobOptions

__all__ = ["RabbitMQBackend", "queue_token"]

log = logging.getLogger("anarchon.rabbitmq")

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"
MAX_QUEUE_NAME = 255
#: Stream bytes per run of history: a claim and a result record with their AMQP headers.
_BYTES_PER_RUN = 1_200
_MIN_HISTORY_BYTES = 64_000
_CURRENT_FORMAT = re.compile(r"current is (?:the value )?'?(\w+)'?")
#: Read-only history reads end after the stream delivered nothing for this long.
READ_ONLY_QUIET_S = 0.5
_JOBS_STREAM_ARGS: dict[str, Any] = {
    "x-queue-type": "stream", "x-max-length-bytes": 8_000_000,
    "x-stream-max-segment-size-bytes": 1_000_000,
}
#: Attempts at a declaration whose channel was closed under it (see :meth:`_declare`).
_DECLARE_TRIES = 3


# What AMQP clients accept in a queue name (pamqp: ``[a-zA-Z0-9-_.:@#,/+ ]``), less ``.``
# (it separates the prefix, the job and the run) and ``+`` (it starts an escape).
_PLAIN = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_:@#,/ "
)
#: Starts the token of a job whose escaped name is too long: ``+H`` and a SHA-256 prefix
#: (no escape is ``+H``: escapes are ``+`` and two hex digits).
_HASHED = "+H"


def queue_token(job: str) -> str:
    """Escape a job name into one token of a queue name.

    Letters, digits, ``-_:@#,/`` and space stay; every other byte of the UTF-8 name
    (``.`` and ``+`` included) becomes ``+XX`` (two upper-case hex digits):
    ``"bericht-ü"`` → ``"bericht-+C3+BC"``, ``"eu.sync"`` → ``"eu+2Esync"``. The token
    holds no ``.``, so with a prefix ending in ``.`` no two namespaces share a queue.
    """
    out = []
    for char in job:
        if char in _PLAIN:
            out.append(char)
        else:
            out.extend(f"+{byte:02X}" for byte in char.encode())
    return "".join(out)


def _classify(exc: BaseException) -> Kind:
    """RabbitMQ's error table.

    A connection or channel that closed or could not be opened is transient; a refused
    login or permission, a missing queue or one with other arguments, and any other AMQP
    error are the store's. So is what aiormq and aio-pika raise for calls caught on a
    connection that is dying (:func:`_dying_connection`). Anything else is not a store
    error.
    """
    if isinstance(exc, ProbableAuthenticationError | ChannelAccessRefused |
                  ChannelNotFoundEntity | ChannelPreconditionFailed):
        return STORE
    if isinstance(exc, AMQPConnectionError | ConnectionClosed | ChannelClosed |
                  ChannelInvalidStateError):
        return TRANSIENT
    if isinstance(exc, AMQPError):
        return STORE
    if _dying_connection(exc):
        return TRANSIENT
    return None


_CLOSED_TEXTS = ("closed", "not opened", "not ready", "no active transport")


def _dying_connection(exc: BaseException) -> bool:
    """Whether the driver raised ``exc`` for a call caught on a connection that is dying.

    aiormq rejects the calls in flight on a connection that closes without a reason with
    a bare ``Exception``; aiormq and aio-pika refuse a channel on a closed connection with
    a ``RuntimeError`` ("... closed", "Connection was not opened"); a channel iterator
    closed under a call ends it with ``StopAsyncIteration``. Only when the driver's own
    code raised them: the same types from anywhere else are not the store's.
    """
    if not (type(exc) is Exception or isinstance(exc, StopAsyncIteration) or (
            isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _CLOSED_TEXTS))):
        return False
    tb = exc.__traceback__
    for _ in range(1_000):
        if tb is None:
            return False
        if tb.tb_frame.f_globals.get("__name__", "").startswith(("aiormq", "aio_pika")):
            return True
        tb = tb.tb_next
    return False


@dataclass
class _Won:
    runner: str
    at_ms: int
    stream_args: dict[str, Any]



def _alive(conn: AbstractConnection) -> bool:
    """Whether a connection can still be used.

    A connection the broker closed (for example with INTERNAL_ERROR) can still report
    ``is_closed`` False in aio-pika; the aiormq connection under it tells the truth.
    """
    amqp = getattr(getattr(conn, "transport", None), "connection", None)
    return not conn.is_closed and amqp is not None and not amqp.is_closed


class _Link:
    """A connection (opened by ``opener``, or ``given``) and its two pools of channels.

    ``channel(publish=False)`` serves declarations, ``channel(publish=True)`` publishes;
    a closed channel is reopened, a dead connection too (``on_reset`` is called first).
    """

    def __init__(self, opener: Callable[[], Awaitable[AbstractConnection]],
                 given: AbstractConnection | None, channels: int,
                 on_reset: Callable[[], None] = lambda: None) -> None:
        self._opener, self._given, self._on_reset = opener, given, on_reset
        self._size = channels
        self.conn: AbstractConnection | None = None
        self._pools = self._new_pools()
        self._next = 0
        self._conn_lock = asyncio.Lock()
        self._channel_lock = asyncio.Lock()

    def _new_pools(self) -> tuple[list[AbstractChannel | None], list[AbstractChannel | None]]:
        return [None] * self._size, [None] * self._size

    async def connection(self) -> AbstractConnection:
        """The open connection, reopened if it died."""
        if self._given is not None:
            return self._given
        conn = self.conn
        if conn is not None and _alive(conn):
            return conn
        async with self._conn_lock:
            current = self.conn
            if current is None or not _alive(current):
                self._on_reset()
                self._pools = self._new_pools()
                self.conn = current = await self._opener()
            return current

    async def channel(self, publish: bool) -> AbstractChannel:
        """The next channel of a pool (publisher confirms on), opening it if needed."""
        self._next = index = (self._next + 1) % self._size
        conn = await self.connection()
        channel = self._pools[publish][index]
        if channel is not None and not channel.is_closed:
            return channel
        async with self._channel_lock:
            # The connection may have died (and the pools been reset) while this waited.
            conn = await self.connection()
            pool = self._pools[publish]
            channel = pool[index]
            if channel is None or channel.is_closed:
                channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
                pool[index] = channel
            return channel

    async def close(self) -> None:
        """Close the connection if it was opened here, else the channels opened on it."""
        conn, pools = self.conn, self._pools
        self.conn, self._pools = None, self._new_pools()
        if conn is not None and not conn.is_closed:
            await conn.close()
        elif self._given is not None:
            for channel in (*pools[0], *pools[1]):
                if channel is not None and not channel.is_closed:
                    with contextlib.suppress(Exception):
                        await channel.close()



class RabbitMQBackend(ClaimOnlyBackend):
    """Claim-only backend on RabbitMQ (classic queues as first-writer-wins, see module).

    :param url: an AMQP URL (``amqp://`` or ``amqps://``; user, password and vhost in
        it), default ``"amqp://guest:guest@localhost:5672/"``, or an open aio-pika
        connection, which this backend uses and never closes.
    :param prefix: the namespace of every queue name, default ``"cron."``.
    :param run_expires_ms: how long a run's queue outlives its last claim (``x-expires``,
        default 10 minutes). Every instance of a namespace must use the same value.
    :param timeout_s: how long a connect, declaration or publisher confirm may take.
    :param channels: channels for declarations, and as many for publishes, on each of
        the two connections (default 4): a channel waits for one queue declaration at a
        time, so several let concurrent claims overlap.
    :param read_only: read history only: declare and publish nothing (every write raises
        :class:`~anarchon_core.errors.ReadOnlyError`).
    """

    def __init__(
        self, url: str | AbstractConnection = DEFAULT_URL, *, prefix: str = "cron.",
        run_expires_ms: int = 600_000, timeout_s: float = 10.0, channels: int = 4,
        read_only: bool = False,
    ) -> None:
        self.read_only = parse_flag("read_only", read_only)
        self.prefix = validate_prefix(prefix)
        if not self.prefix.endswith("."):
            # Job tokens hold no '.', so a prefix ending in '.' marks where the namespace
            # ends: prefix "P." with job "eu.sync" and "P.eu." with "sync" never meet.
            raise ConfigError(f"invalid prefix {self.prefix!r}: a RabbitMQ prefix must end "
                              f"with '.' (e.g. {self.prefix + '.'!r})")
        if self.prefix.lower().startswith("amq."):
            raise ConfigError(f"invalid prefix {prefix!r}: names starting 'amq.' are "
                              "reserved by RabbitMQ")
        if isinstance(run_expires_ms, bool) or not isinstance(run_expires_ms, int) or \
                run_expires_ms < 10_000:
            raise ConfigError(f"invalid run_expires_ms {run_expires_ms!r}: expected an int "
                              "≥ 10000")
        if isinstance(url, str):
            check_amqp_url(url)  # ConfigError with the URL masked
            self._url: str | None = url
            self._given: AbstractConnection | None = None
        elif isinstance(url, AbstractConnection):
            self._url, self._given = None, url
        else:
            raise ConfigError(f"invalid url {type(url).__name__}: expected an AMQP URL or an "
                              "aio-pika connection")
        if isinstance(channels, bool) or not isinstance(channels, int) or \
                not 1 <= channels <= 64:
            raise ConfigError(f"invalid channels {channels!r}: expected an int from 1 to 64")
        self.run_expires_ms = run_expires_ms
        self.timeout_s = timeout_s
        self._heartbeat_s: int | None = None
        self._errors = StoreErrors(self.describe, _classify)
        self._streams: set[str] = set()
        self._claim_link = _Link(self._open_connection, self._given, channels)
        self._history_link = _Link(self._open_connection, self._given, channels,
                                   on_reset=self._streams.clear)
        self._stream_locks: dict[str, asyncio.Lock] = {}
        self._won: dict[str, _Won] = {}
        self._stream_args: dict[str, dict[str, Any]] = {}
        self._run_args = {
            "x-queue-type": "classic", "x-max-length": 1, "x-overflow": "reject-publish",
            "x-expires": run_expires_ms,
        }

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RabbitMQBackend:
        """``amqp://user:pass@host:5672/vhost?prefix=billing.cron.`` (``prefix`` optional)."""
        rest, params = split_namespace_params(url)
        unknown = sorted(set(params) - {"prefix", "read_only"})
        if unknown:
            raise ConfigError(f"invalid RabbitMQ URL {mask_url(url)!r}: unknown parameter "
                              f"{unknown[0]!r}")
        return cls(rest, **{**params, **options})

    def describe(self) -> str:
        """E.g. ``RabbitMQBackend(url='amqp://guest:***@localhost:5672/', prefix='cron.')``."""
        where = mask_url(self._url) if self._url is not None else "<connection>"
        return f"RabbitMQBackend(url={where!r}, prefix={self.prefix!r})"

    # ------------------------------------------------------------------ names

    def _name(self, job: str, suffix: str) -> str:
        name = f"{self.prefix}{queue_token(job)}.{suffix}"
        if len(name.encode()) > MAX_QUEUE_NAME:
            digest = hashlib.sha256(job.encode()).hexdigest()[:40]
            name = f"{self.prefix}{_HASHED}{digest}.{suffix}"
        return name

    def run_queue(self, job: str, slot: int, manual: bool = False) -> str:
        """Return the queue that decides the run ``(job, slot, manual)``."""
        return self._name(job, f"{slot}.manual" if manual else str(slot))

    def history_stream(self, job: str) -> str:
        """Return the stream queue holding ``job``'s claim and result records."""
        return self._name(job, "history")

    @property
    def jobs_stream(self) -> str:
        """The stream recording the namespace's job names (AMQP cannot list queues)."""
        return f"{self.prefix}jobs"

    @property
    def format_queue(self) -> str:
        """The queue whose ``x-max-length`` is the namespace's store format."""
        return f"{self.prefix}format"

    # ------------------------------------------------------------------ connection

    @property
    def _conn(self) -> AbstractConnection | None:
        """The claims' connection, if this backend opened it."""
        return self._claim_link.conn

    async def _connection(self) -> AbstractConnection:
        """The claims' connection."""
        return await self._claim_link.connection()

    async def _open_connection(self) -> AbstractConnection:
        assert self._url is not None
        # Errors are classified by the caller's guard (URL masked there).
        return await asyncio.wait_for(
            aio_pika.connect(self._url, timeout=self.timeout_s, **self._connect_options()),
            self.timeout_s)

    def _connect_options(self) -> dict[str, Any]:
        query = self._url.partition("?")[2] if self._url else ""
        given = {part.split("=", 1)[0] for part in query.split("&") if part}
        options: dict[str, Any] = {}
        if self._heartbeat_s is not None and "heartbeat" not in given:
            options["heartbeat"] = self._heartbeat_s
        return options

    def tune_timeouts(self, lease_ms: int) -> None:
        """Fit the connections anarchon opens to ``lease_ms`` (the shortest lease wins).

        AMQP heartbeats every quarter lease (1 s to 60 s; a ``heartbeat`` in the URL wins),
        so a dead connection is noticed within the lease, and connect, declaration and
        publisher-confirm timeouts of at most half the lease (never above ``timeout_s``).
        A connection you passed in is left as it is.
        """
        lease_s = lease_ms / 1000
        heartbeat = int(min(60, max(1, lease_s // 4)))
        self._heartbeat_s = heartbeat if self._heartbeat_s is None else \
            min(self._heartbeat_s, heartbeat)
        self.timeout_s = min(self.timeout_s, max(1.0, lease_s / 2))

    async def _confirm_channel(self) -> AbstractChannel:
        """The next publish channel of the claims' connection (publisher confirms on)."""
        return await self._claim_link.channel(publish=True)

    async def _declare(self, link: _Link, name: str, arguments: dict[str, Any]) -> None:
        """Declare ``name``; if it exists with other arguments, accept it as it is.

        A declaration racing another client's first declaration of the same queue can be
        refused with NOT_FOUND ("home node ... is down or inaccessible": RabbitMQ looks
        the queue up in two tables outside a transaction while the other one writes
        both), which closes the channel and fails the declarations queued on it. Declaring
        is idempotent, so those are tried again.
        """
        for attempt in range(1, _DECLARE_TRIES + 1):
            channel = await link.channel(publish=False)
            try:
                await channel.declare_queue(name, durable=True, arguments=arguments,
                                            timeout=self.timeout_s)
            except ChannelPreconditionFailed as exc:
                # Another instance declared it with other settings (say, another
                # x-expires); its queue decides all the same.
                log.warning("queue %s exists with other arguments (%s); using it as it is",
                            name, exc.args[0] if exc.args else exc)
                channel = await link.channel(publish=False)
                await channel.declare_queue(name, passive=True, timeout=self.timeout_s)
            except (ChannelNotFoundEntity, ChannelInvalidStateError):
                if attempt == _DECLARE_TRIES:
                    raise
                continue
            return

    async def _publish(self, link: _Link, name: str, body: bytes,
                       message_id: str | None = None) -> None:
        """Publish persistently to queue ``name``; raise DeliveryError if refused."""
        channel = await link.channel(publish=True)
        message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                   message_id=message_id, content_type="application/json")
        await channel.default_exchange.publish(message, routing_key=name, mandatory=True,
                                               timeout=self.timeout_s)

    async def start(self) -> None:
        """Connect and check (or write) the namespace's store-format record.

        A writer also declares the namespace's jobs stream, so instances that first write
        history at the same instant never create it together (see the module docstring).
        If this fails, the connections it opened are closed again.
        """
        try:
            with self._errors.guard("start"):
                await self._check_format()
                if not self.read_only:
                    await self._declare_stream(self.jobs_stream, _JOBS_STREAM_ARGS)
        except BaseException:
            await self.stop()
            raise

    async def _check_format(self) -> None:
        conn = await self._connection()
        if self.read_only:
            channel = await conn.channel()
            try:
                await channel.declare_queue(self.format_queue, passive=True,
                                            timeout=self.timeout_s)
            except ChannelNotFoundEntity:
                raise await missing_store(self, "prefix", self.prefix,
                                          f"there is no queue {self.format_queue!r}") from None
            finally:
                if not channel.is_closed:
                    await channel.close()
        channel = await conn.channel()
        try:
            await channel.declare_queue(
                self.format_queue, durable=True, timeout=self.timeout_s,
                arguments={"x-max-length": FORMAT_VERSION, "x-anarchon": "store format"},
            )
        except ChannelPreconditionFailed as exc:
            text = str(exc.args[0]) if exc.args else str(exc)
            match = _CURRENT_FORMAT.search(text)
            found = match.group(1) if match else text
            try:
                number = int(found)
            except ValueError:
                raise StoreFormatError(found, FORMAT_VERSION) from None
            if number > FORMAT_VERSION:
                raise StoreFormatError(number, FORMAT_VERSION) from None
        finally:
            if not channel.is_closed:
                await channel.close()

    async def stop(self) -> None:
        """Close the connections this backend opened (never one passed in)."""
        self._streams.clear()
        try:
            await self._claim_link.close()
        finally:
            await self._history_link.close()

    def check_job(self, name: str, options: JobOptions) -> None:
        """Refuse a job whose late claims could outlive its run queues."""
        validate_job_name(name)
        if 2 * (options.max_late_ms + options.jitter_ms) > self.run_expires_ms:
            raise ConfigError(
                f"job {name!r}: max_late_ms + jitter_ms ({options.max_late_ms} + "
                f"{options.jitter_ms}) must be at most half of the backend's run_expires_ms "
                f"({self.run_expires_ms}); raise run_expires_ms or lower max_late_ms"
            )

    async def clock_ms(self) -> int:
        """Return the local clock: RabbitMQ gives clients no time of its own."""
        return local_now_ms()

    # ------------------------------------------------------------------ claims

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """``won`` for the first claimant of the run, ``taken`` for every other.

        See :meth:`_claim`; store failures raise StoreUnavailable or StoreError.
        """
        refuse_write(self, "claim")
        with self._errors.guard("claim"):
            return await self._claim(request)

    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        """``won`` for the first claimant of the run, ``taken`` for every other.

        A won claim older than ``max_late_ms`` (by this machine's clock) is recorded
        ``skipped`` and answers ``late``. A claim so late that its run's queue may have
        expired answers ``late`` without touching the store.
        """
        now = local_now_ms()
        late = not_run(request, now)
        if late and now - request.slot > self.run_expires_ms // 2:
            return ClaimResult(ClaimOutcome.LATE, 1)
        name = self.run_queue(request.job, request.slot, request.manual)
        record = claim_record(request, now)
        await self._declare(self._claim_link, name, self._run_args)
        try:
            await self._publish(self._claim_link, name, encode_json(record),
                                message_id=request.token)
        except PublishError as exc:  # returned unroutable: the queue vanished meanwhile
            raise StoreError(f"claim queue {name} disappeared before the publish: {exc}") \
                from None
        except DeliveryError:
            return ClaimResult(ClaimOutcome.TAKEN, 1)
        stream_args = self._stream_arguments()
        self._stream_args.setdefault(request.job, stream_args)
        try:
            await self._append(request.job, record)
        except Exception as exc:  # noqa: BLE001 - the run is ours; only history suffers
            log.warning("%s slot %s: won, but the claim record was not written to history "
                        "(%s: %s)", request.job, request.slot, type(exc).__name__, exc)
        if late:
            ref = RunRef(request.job, request.slot, request.token, 1, request.manual)
            skipped = result_record(ref, status=late[0], error=late[1],
                                    runner=request.runner, started_ms=now, at_ms=now)
            await self._append(request.job, skipped)
            return ClaimResult(ClaimOutcome.LATE, 1)
        self._won[request.token] = _Won(request.runner, now, stream_args)
        return ClaimResult(ClaimOutcome.WON, 1, request.token)

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Append the run's result record (see :meth:`_finish`)."""
        refuse_write(self, "finish")
        with self._errors.guard("finish"):
            return await self._finish(ref, status, error, meta)

    async def _finish(self, ref: RunRef, status: str, error: str | None = None,
                      meta: Mapping[str, str] | None = None) -> bool:
        """Append the run's result record; False if this backend did not win ``ref``.

        Only the backend object that won a run can finish it (it remembers the runner
        and start time), and only once.
        """
        stored_meta = dump_meta(meta)
        won = self._won.pop(ref.token, None)
        if won is None:
            return False
        record = result_record(ref, status=status, error=error, runner=won.runner,
                               started_ms=won.at_ms, at_ms=local_now_ms(), meta=stored_meta)
        try:
            await self._append(ref.job, record, won.stream_args)
        except BaseException:
            self._won[ref.token] = won
            raise
        return True

    # ------------------------------------------------------------------ history

    def _stream_arguments(self) -> dict[str, Any]:
        keep = self.retention
        max_bytes = max(_MIN_HISTORY_BYTES, keep.history_size * _BYTES_PER_RUN)
        arguments: dict[str, Any] = {
            "x-queue-type": "stream", "x-max-length-bytes": max_bytes,
            "x-stream-max-segment-size-bytes": max(max_bytes // 8, 8_000),
        }
        if keep.history_ttl_ms is not None:
            arguments["x-max-age"] = f"{max(1, keep.history_ttl_ms // 1000)}s"
        return arguments

    async def _append(self, job: str, record: dict[str, str],
                      arguments: dict[str, Any] | None = None) -> None:
        """Append ``record`` to ``job``'s history stream, declaring it first if needed.

        A failed append is tried once more: the history connection may have died under it
        (say, closed by another client's stream race), which, depending on the moment,
        surfaces as a connection or channel error, a plain ``Exception``, a RuntimeError
        or a timeout. A record written twice is read once.
        """
        name = self.history_stream(job)
        args = arguments or self._stream_args.get(job) or self._stream_arguments()
        for attempt in (1, 2):
            try:
                await self._declare_stream(name, args, job)
                await self._publish(self._history_link, name, encode_json(record))
            except Exception:
                if attempt == 2:
                    raise
                continue
            return

    async def _declare_stream(self, name: str, arguments: dict[str, Any],
                              job: str | None = None) -> None:
        """Declare the stream ``name`` (then record ``job``) once per history connection.

        One declaration per stream at a time: a publish racing this backend's own
        creation of the stream would crash the history connection (module docstring).
        """
        if name in self._streams:
            return
        async with self._stream_locks.setdefault(name, asyncio.Lock()):
            if name not in self._streams:
                await self._declare(self._history_link, name, arguments)
                if job is not None:
                    await self._register_job(job)
                self._streams.add(name)

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Runs of ``job``, newest first (see :meth:`_history`)."""
        with self._errors.guard("history read"):
            return await self._history(job, limit)

    async def _history(self, job: str, limit: int = 20) -> list[Run]:
        """Return runs of ``job``, newest first: one entry per run (one attempt each).

        A run whose runner died reads ``running`` for as long as the stream keeps it.
        """
        return (await self._job_runs(job))[:limit]

    async def _register_job(self, job: str) -> None:
        """Record ``job`` in the namespace's jobs stream (once per stream and process)."""
        await self._declare_stream(self.jobs_stream, _JOBS_STREAM_ARGS)
        await self._publish(self._history_link, self.jobs_stream,
                            encode_json({"v": "1", "kind": "job", "job": job}))

    async def _read_stream(self, name: str, job: str = "") -> list[dict[str, str]] | None:
        """Every record of the stream ``name`` (None if it does not exist).

        Writers append a marker and read up to it; a read-only backend reads until the
        stream goes quiet (see the module docstring).
        """
        conn = await self._history_link.connection()
        channel = await conn.channel(publisher_confirms=True)
        try:
            try:
                queue = await channel.declare_queue(name, passive=True,
                                                    timeout=self.timeout_s)
            except ChannelNotFoundEntity:
                return None
            if self.read_only:
                return await self._read_until(channel, queue, None, job)
            marker = uuid.uuid4().hex
            await channel.default_exchange.publish(
                aio_pika.Message(encode_json({"v": "1", "kind": "mark", "id": marker})),
                routing_key=name, timeout=self.timeout_s)
            return await self._read_until(channel, queue, marker, job)
        finally:
            if not channel.is_closed:
                await channel.close()

    async def _job_runs(self, job: str) -> list[Run]:
        name = self.history_stream(job)
        items = await self._read_stream(name, job)
        return runs_from_records(parse_many(items or [], key=name, job=job))

    async def _recorded_jobs(self) -> list[str]:
        items = await self._read_stream(self.jobs_stream) or []
        return sorted({i["job"] for i in items if i.get("kind") == "job" and "job" in i})

    async def job_names(self) -> dict[str, Run | None]:
        """The jobs recorded in ``<prefix>jobs``, each with its newest run (or None)."""
        with self._errors.guard("job list read"):
            names = await self._recorded_jobs()
            newest = await asyncio.gather(*(self._job_runs(job) for job in names))
        return {job: (runs[0] if runs else None)
                for job, runs in zip(names, newest, strict=True)}

    async def runs(self, query: HistoryQuery) -> RunPage:
        """One page of history across the namespace's jobs (each stream read once)."""
        cache: dict[str, list[Run]] = {}

        async def read(job: str, n: int) -> tuple[list[Run], bool]:
            if job not in cache:
                cache[job] = await self._job_runs(job)
            return cache[job], True

        with self._errors.guard("history read"):
            names = [query.job] if query.job is not None else await self._recorded_jobs()
            await asyncio.gather(*(read(job, 0) for job in names))
            return await page_jobs(names, read, query)

    async def _read_until(self, channel: AbstractChannel, queue: aio_pika.abc.AbstractQueue,
                          marker: str | None, job: str = "") -> list[dict[str, str]]:
        """Read from the stream's start up to ``marker`` (without one: until it is quiet)."""
        items: list[dict[str, str]] = []
        done = asyncio.Event()
        delivered = asyncio.Event()

        async def on_message(message: AbstractIncomingMessage) -> None:
            delivered.set()
            await message.ack()
            try:
                fields = decode_json(message.body)
            except StoreError as exc:
                corrupt_records.report(queue.name, job, message.body.decode("utf-8", "replace"),
                                       str(exc))
                return
            if fields.get("kind") == "mark":
                if fields.get("id") == marker:
                    done.set()
                return
            items.append(fields)

        await channel.set_qos(prefetch_count=500)
        tag = await queue.consume(on_message, arguments={"x-stream-offset": "first"})
        try:
            if marker is not None:
                await asyncio.wait_for(done.wait(), self.timeout_s)
            else:
                await asyncio.wait_for(self._until_quiet(delivered), self.timeout_s)
        except TimeoutError:
            raise StoreUnavailable(f"reading {queue.name} took longer than {self.timeout_s}s") \
                from None
        finally:
            with contextlib.suppress(Exception):
                await queue.cancel(tag)
        return items

    @staticmethod
    async def _until_quiet(delivered: asyncio.Event) -> None:
        """Return once nothing was delivered for :data:`READ_ONLY_QUIET_S`."""
        while True:
            delivered.clear()
            try:
                await asyncio.wait_for(delivered.wait(), READ_ONLY_QUIET_S)
            except TimeoutError:
                return
