"""NATS JetStream: a claim-only backend (one winner per run; no leases).

Built on nats-py (asyncio). Everything lives in one JetStream stream (``stream``,
default ``"CRON"``, file storage, one replica), created if missing, whose subjects
include ``<prefix>>``. A prefix is a subject prefix: ``"cron."`` (a prefix without a
trailing dot gets one, so ``"cron"`` and ``"cron."`` are the same namespace).

Subjects (``<job>`` escaped into one subject token, see :func:`job_token`):

==============================================  ==========================================
``<prefix>run.<job>.<slot>``                    claim of a scheduled run (one message)
``<prefix>man.<job>.<slot>``                    claim of a manual run (``run_now``)
``<prefix>res.<job>.<slot>.<s|m>``              result of the run (one message)
==============================================  ==========================================

How a claim works: every claimant publishes its claim record to the run's subject with
the header ``Nats-Expected-Last-Subject-Sequence: 0``. JetStream stores the first and
refuses every later one with error 10071 ("wrong last sequence"), atomically, for as long
as the first message is in the stream: the stream's ``max_age`` (default 24 h), far longer
than the message-id dedupe window (2 min) that plain ``Nats-Msg-Id`` dedupe would give.
The claim's token is also sent as ``Nats-Msg-Id``, so a claim retried after a lost
acknowledgement is recognised as the caller's own. Results use the same header on their
own subject, so a run gets exactly one result.

Clock: a claim counts as late by the **server's** clock: the winner reads back the
timestamp JetStream stored with its claim. A late winner records the run ``skipped``.
:meth:`clock_ms` itself is the local clock (nats-server 2.9 reports no time of its own).

Store format: the stream's description holds ``anarchon-format=<n>``; a stream made by
someone else without a description gets it added, one with another description is used
without a format record.

Jobs of the namespace (:meth:`job_names`, :meth:`runs`) are read from the subjects the
stream holds. With ``read_only=True`` nothing is created or published; history is read
through short-lived consumers, as always (a reader needs permission to create them).

nats-server 2.9.x with ``num_replicas > 1`` could accept two conditional publishes to one
subject in rare leader changes (fixed in later servers): use one replica there (the
default here).
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import api
from nats.js.errors import APIError, NotFoundError

from ..backend import FORMAT_VERSION, ClaimOnlyBackend
from ..decision import not_run
from ..errors import ConfigError, StoreError, StoreFormatError
from ..models import ClaimOutcome, ClaimRequest, ClaimResult, HistoryQuery, Run, RunPage, RunRef
from ..naming import validate_job_name, validate_prefix
from ..readmodel import dump_meta, history_reader, page_jobs
from ..url import check_nats_url, mask_url, split_namespace_params
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

__all__ = ["NatsBackend", "job_token", "token_job"]

log = logging.getLogger("anarchon.nats")

DEFAULT_SERVERS = "nats://localhost:4222"
#: JetStream's "wrong last sequence" error: the run's subject already holds a claim.
WRONG_LAST_SEQUENCE = 10071
_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_MSG_ID = "Nats-Msg-Id"
_FORMAT = re.compile(r"anarchon-format=(\S+)")
_STREAM = re.compile(r"^[A-Za-z0-9_-]{1,200}$")
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_UNCERTAIN_MAX = 10_000


def job_token(job: str) -> str:
    """Escape a job name into one valid subject token, reversibly.

    Letters, digits, ``_`` and ``-`` stay; every other byte of the UTF-8 name becomes
    ``~XX`` (two upper-case hex digits), so ``"report:daily"`` → ``"report~3Adaily"``.
    """
    out = []
    for char in job:
        if char in _PLAIN:
            out.append(char)
        else:
            out.extend(f"~{byte:02X}" for byte in char.encode())
    return "".join(out)


def token_job(token: str) -> str:
    """Reverse :func:`job_token`."""
    data = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "~":
            data.append(int(token[i + 1:i + 3], 16))
            i += 3
        else:
            data.extend(token[i].encode())
            i += 1
    return data.decode()






_NATS_TRANSIENT = (
    nats.errors.TimeoutError, nats.errors.NoServersError, nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError, nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError, nats.errors.FlushTimeoutError,
    nats.errors.NoRespondersError, nats.errors.ConnectionDrainingError,
    nats.errors.UnexpectedEOF, nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError, nats.js.errors.NoStreamResponseError,
    nats.js.errors.FetchTimeoutError,
)


def _classify(exc: BaseException) -> Kind:
    """NATS's error table.

    Timeouts, no servers, a connection closed, stale, reconnecting or draining, no
    responders and JetStream's 5xx answers (no quorum, leader election) are transient;
    other NATS and JetStream errors (a refused login, a bad request, a limit) are the
    store's. Anything else is not a store error.
    """
    if isinstance(exc, _NATS_TRANSIENT):
        return TRANSIENT
    if isinstance(exc, nats.errors.Error | nats.js.errors.Error):
        return STORE
    return None


def _subject_covers(pattern: str, prefix: str) -> bool:
    """Whether stream subject ``pattern`` matches every subject under ``prefix``."""
    want = prefix.rstrip(".").split(".")
    have = pattern.split(".")
    for i, token in enumerate(have):
        if token == ">":
            return True
        if i >= len(want) or (token != "*" and token != want[i]):
            return False
    return False


@dataclass
class _Won:
    runner: str
    at_ms: int


class NatsBackend(ClaimOnlyBackend):
    """Claim-only backend on NATS JetStream (first-writer-wins per subject, see module).

    :param servers: a NATS URL or a list of them (``nats://`` or ``tls://``; user and
        password in the URL), default ``"nats://localhost:4222"``; or a connected nats-py
        ``Client``, which this backend uses and never closes.
    :param prefix: the subject prefix of this namespace, default ``"cron."``.
    :param stream: the JetStream stream, default ``"CRON"``; created if missing, and its
        subjects extended with ``<prefix>>`` if they do not cover it yet.
    :param max_age_ms: the stream's ``max_age`` when this backend creates it (default
        24 h): how long runs are remembered, for late claims and for history.
    :param timeout_s: how long a connect or a JetStream request may take.
    :param connect_options: more keyword arguments for ``nats.connect`` (TLS, creds...).
    :param read_only: read history only: create, update and publish nothing (every write
        raises :class:`~anarchon_core.errors.ReadOnlyError`).
    """

    def __init__(
        self, servers: str | Sequence[str] | Client = DEFAULT_SERVERS, *,
        prefix: str = "cron.", stream: str = "CRON", max_age_ms: int = 86_400_000,
        timeout_s: float = 5.0, connect_options: dict[str, Any] | None = None,
        read_only: bool = False,
    ) -> None:
        self.read_only = parse_flag("read_only", read_only)
        validate_prefix(prefix)
        if prefix.startswith(".") or ".." in prefix:
            raise ConfigError(f"invalid prefix {prefix!r}: empty subject tokens")
        self.prefix = prefix
        self._base = prefix if prefix.endswith(".") else prefix + "."
        if not isinstance(stream, str) or not _STREAM.match(stream):
            raise ConfigError(f"invalid stream {stream!r}: use 1-200 letters, digits, '_', '-'")
        self.stream = stream
        if isinstance(max_age_ms, bool) or not isinstance(max_age_ms, int) or \
                max_age_ms < 60_000:
            raise ConfigError(f"invalid max_age_ms {max_age_ms!r}: expected an int ≥ 60000")
        self.max_age_ms = max_age_ms
        self.timeout_s = timeout_s
        self._ping_s: float | None = None
        self._errors = StoreErrors(self.describe, _classify)
        self._connect_options = dict(connect_options or {})
        if isinstance(servers, Client):
            self._servers: list[str] = []
            self._given: Client | None = servers
        else:
            urls = [servers] if isinstance(servers, str) else list(servers)
            if not urls or not all(isinstance(u, str) and u.lower().startswith(
                    ("nats://", "tls://", "ws://", "wss://")) for u in urls):
                shown = [mask_url(u) if isinstance(u, str) else repr(u) for u in urls]
                raise ConfigError(f"invalid NATS servers {shown!r}: expected nats://host:4222")
            for server in urls:
                check_nats_url(server)  # ConfigError with the URL masked
            self._servers, self._given = urls, None
        self._nc: Client | None = None
        self._closing = False
        self._ready = False
        self._lock = asyncio.Lock()
        self._won: dict[str, _Won] = {}
        self._uncertain: set[str] = set()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> NatsBackend:
        """``nats://host:4222?prefix=billing.cron.&stream=BILLING`` (both optional)."""
        rest, params = split_namespace_params(url)
        unknown = sorted(set(params) - {"prefix", "stream", "read_only"})
        if unknown:
            raise ConfigError(f"invalid NATS URL {mask_url(url)!r}: unknown parameter "
                              f"{unknown[0]!r}")
        rest = rest.rstrip("?")
        return cls(rest, **{**params, **options})

    def describe(self) -> str:
        """E.g. ``NatsBackend(servers=['nats://localhost:4222'], prefix='cron.', ...)``."""
        where = [mask_url(u) for u in self._servers] if self._given is None else "<client>"
        return f"NatsBackend(servers={where!r}, prefix={self.prefix!r}, stream={self.stream!r})"

    # ------------------------------------------------------------------ names

    def claim_subject(self, job: str, slot: int, manual: bool = False) -> str:
        """Return the subject that decides the run ``(job, slot, manual)``."""
        return f"{self._base}{'man' if manual else 'run'}.{job_token(job)}.{slot}"

    def result_subject(self, job: str, slot: int, manual: bool = False) -> str:
        """Return the subject holding the result of the run ``(job, slot, manual)``."""
        return f"{self._base}res.{job_token(job)}.{slot}.{'m' if manual else 's'}"

    # ------------------------------------------------------------------ connection

    async def _client(self) -> Client:
        if self._given is not None:
            return self._given
        if self._nc is None or self._nc.is_closed:
            self._ready = False
            self._nc = await self._connect()
        return self._nc

    async def _connect(self) -> Client:
        errors = 0

        async def on_error(exc: Exception) -> None:
            nonlocal errors
            errors += 1
            # While the server is away every reconnect attempt fails: say it once.
            log.log(logging.WARNING if errors == 1 else logging.DEBUG,
                    "NATS connection error: %s: %s", type(exc).__name__, exc)

        async def on_disconnect() -> None:
            if not self._closing:
                log.warning("disconnected from NATS; reconnecting")

        async def on_reconnect() -> None:
            nonlocal errors
            errors = 0
            log.warning("reconnected to NATS")

        options: dict[str, Any] = {
            "name": "anarchon", "connect_timeout": max(1, round(self.timeout_s)),
            "max_reconnect_attempts": -1, "reconnect_time_wait": 0.5,
            "error_cb": on_error, "disconnected_cb": on_disconnect,
            "reconnected_cb": on_reconnect,
        }
        if self._ping_s is not None:
            # A dead connection is noticed after two unanswered pings, within the lease.
            options.update(ping_interval=self._ping_s, max_outstanding_pings=2)
        options.update(self._connect_options)
        # nats-py retries the first connect as often as a reconnect (here: forever); the
        # caller's guard turns the timeout into StoreUnavailable (URLs masked).
        nc: Client = await asyncio.wait_for(nats.connect(self._servers, **options),
                                            self.timeout_s * 2)
        return nc

    def tune_timeouts(self, lease_ms: int) -> None:
        """Fit the connection anarchon opens to ``lease_ms`` (the shortest lease wins).

        Pings every quarter lease (1 s to 120 s) with at most 2 outstanding, so a dead
        connection is noticed within the lease, and connect and JetStream request
        timeouts of at most half the lease (never above ``timeout_s``). Options in
        ``connect_options`` win; a client you passed in is left as it is.
        """
        lease_s = lease_ms / 1000
        ping = min(120.0, max(1.0, lease_s / 4))
        self._ping_s = ping if self._ping_s is None else min(self._ping_s, ping)
        self.timeout_s = min(self.timeout_s, max(1.0, lease_s / 2))

    async def _js(self) -> Any:
        if not self._ready:
            await self.start()
        return (await self._client()).jetstream(timeout=self.timeout_s)

    async def start(self) -> None:
        """Connect; create the stream or extend its subjects; check the store format.

        If this fails, the connection it opened is closed again.
        """
        async with self._lock:
            if self._ready and (self._given is not None or
                                (self._nc is not None and not self._nc.is_closed)):
                return
            try:
                with self._errors.guard("start"):
                    js = (await self._client()).jetstream(timeout=self.timeout_s)
                    info = await (self._existing_stream(js) if self.read_only
                                  else self._ensure_stream(js))
                self._check_format(info.config.description)
            except BaseException:
                await self.stop()
                raise
            max_age = info.config.max_age or 0
            if max_age and max_age * 1000 < self.max_age_ms:
                log.warning("stream %s keeps messages %.0f s, less than max_age_ms=%s: runs "
                            "are remembered only that long", self.stream, max_age,
                            self.max_age_ms)
            self._ready = True

    async def _existing_stream(self, js: Any) -> Any:
        """The stream's info, or a StoreError if it does not hold this namespace."""
        try:
            info = await js.stream_info(self.stream)
        except NotFoundError:
            raise await missing_store(self, "stream", self.stream,
                                      f"there is no stream {self.stream!r}") from None
        if not any(_subject_covers(s, self._base) for s in info.config.subjects or []):
            raise await missing_store(self, "prefix", self.prefix,
                                      f"stream {self.stream!r} does not hold the subjects "
                                      f"{self._base}>")
        return info

    async def _ensure_stream(self, js: Any) -> Any:
        wanted = f"{self._base}>"
        for _ in range(5):
            try:
                info = await js.stream_info(self.stream)
            except NotFoundError:
                config = api.StreamConfig(
                    name=self.stream, subjects=[wanted], max_age=self.max_age_ms / 1000,
                    storage=api.StorageType.FILE, num_replicas=1,
                    retention=api.RetentionPolicy.LIMITS, discard=api.DiscardPolicy.OLD,
                    duplicate_window=min(120.0, self.max_age_ms / 1000),
                    description=f"anarchon-format={FORMAT_VERSION}",
                )
                try:
                    return await js.add_stream(config)
                except APIError as exc:  # created meanwhile by another instance
                    log.debug("creating stream %s: %s", self.stream, exc)
                    continue
            subjects = list(info.config.subjects or [])
            description = info.config.description
            update: dict[str, Any] = {}
            if not any(_subject_covers(s, self._base) for s in subjects):
                update["subjects"] = [*subjects, wanted]
            if not description:
                update["description"] = f"anarchon-format={FORMAT_VERSION}"
            if not update:
                return info
            try:
                await js.update_stream(info.config.evolve(**update))
            except APIError as exc:
                raise StoreError(f"cannot add subjects {wanted!r} to stream {self.stream}: "
                                 f"{exc.description or exc}") from None
        raise StoreError(f"stream {self.stream} could not be created or read")

    @staticmethod
    def _check_format(description: str | None) -> None:
        match = _FORMAT.search(description or "")
        if match is None:
            return
        try:
            found = int(match.group(1))
        except ValueError:
            raise StoreFormatError(match.group(1), FORMAT_VERSION) from None
        if found > FORMAT_VERSION:
            raise StoreFormatError(found, FORMAT_VERSION)

    async def stop(self) -> None:
        """Close the connection this backend opened (never a client passed in)."""
        nc, self._nc = self._nc, None
        self._ready = False
        if nc is not None and not nc.is_closed:
            self._closing = True
            try:
                await nc.close()
            finally:
                self._closing = False

    def check_job(self, name: str, options: JobOptions) -> None:
        """Refuse a job whose late claims could outlive the stream's memory of a run."""
        validate_job_name(name)
        if 2 * (options.max_late_ms + options.jitter_ms) > self.max_age_ms:
            raise ConfigError(
                f"job {name!r}: max_late_ms + jitter_ms ({options.max_late_ms} + "
                f"{options.jitter_ms}) must be at most half of the backend's max_age_ms "
                f"({self.max_age_ms})"
            )

    async def clock_ms(self) -> int:
        """Return the local clock (claims themselves are judged by the server's)."""
        return local_now_ms()

    # ------------------------------------------------------------------ claims

    async def _publish_once(self, js: Any, subject: str, body: bytes, msg_id: str) -> Any:
        """Publish ``body`` unless ``subject`` holds a message; None if it does."""
        try:
            return await js.publish(subject, body, stream=self.stream,
                                    headers={_EXPECTED: "0", _MSG_ID: msg_id})
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                return None
            raise

    async def _last(self, js: Any, subject: str) -> Any:
        try:
            return await js.get_last_msg(self.stream, subject)
        except NotFoundError:
            return None

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """``won`` for the first claimant of the run, ``taken`` for every other.

        See :meth:`_claim`; store failures raise StoreUnavailable or StoreError.
        """
        refuse_write(self, "claim")
        with self._errors.guard("claim"):
            return await self._claim(request)

    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        """``won`` for the first claimant of the run, ``taken`` for every other.

        A won claim stored later than ``max_late_ms`` after the slot by the server's
        clock is recorded ``skipped`` and answers ``late``.
        """
        js = await self._js()
        subject = self.claim_subject(request.job, request.slot, request.manual)
        record = claim_record(request, local_now_ms())
        try:
            ack = await self._publish_once(js, subject, encode_json(record), request.token)
        except (TimeoutError, APIError, nats.errors.Error):
            # The claim may have been stored with only its acknowledgement lost: a retry
            # with this token must recognise it as ours.
            if len(self._uncertain) >= _UNCERTAIN_MAX:
                self._uncertain.clear()
            self._uncertain.add(request.token)
            raise
        if ack is not None:
            seq = ack.seq
        else:
            if request.token not in self._uncertain:
                return ClaimResult(ClaimOutcome.TAKEN, 1)
            stored = await self._last(js, subject)
            if stored is None or stored.headers is None or \
                    stored.headers.get(_MSG_ID) != request.token:
                self._uncertain.discard(request.token)
                return ClaimResult(ClaimOutcome.TAKEN, 1)
            seq = stored.seq
        self._uncertain.discard(request.token)
        stored_at = await self._stored_ms(js, seq)
        late = not_run(request, stored_at)
        if late:
            ref = RunRef(request.job, request.slot, request.token, 1, request.manual)
            skipped = result_record(ref, status=late[0], error=late[1],
                                    runner=request.runner, started_ms=stored_at,
                                    at_ms=stored_at)
            await self._publish_once(js, self.result_subject(request.job, request.slot,
                                                             request.manual),
                                     encode_json(skipped), f"{request.token}:result")
            return ClaimResult(ClaimOutcome.LATE, 1)
        self._won[request.token] = _Won(request.runner, stored_at)
        return ClaimResult(ClaimOutcome.WON, 1, request.token)

    async def _stored_ms(self, js: Any, seq: int) -> int:
        """Return the server time at which message ``seq`` was stored."""
        message = await js.get_msg(self.stream, seq=seq)
        if message.time is None:
            raise StoreError(f"message {seq} of stream {self.stream} has no timestamp")
        return int(message.time.timestamp() * 1000)

    async def finish(self, ref: RunRef, status: str, error: str | None = None,
                     meta: Mapping[str, str] | None = None) -> bool:
        """Record the run's result once (see :meth:`_finish`)."""
        refuse_write(self, "finish")
        with self._errors.guard("finish"):
            return await self._finish(ref, status, error, meta)

    async def _finish(self, ref: RunRef, status: str, error: str | None = None,
                      meta: Mapping[str, str] | None = None) -> bool:
        """Record the run's result once; False if ``ref`` did not win or already ended."""
        stored_meta = dump_meta(meta)
        js = await self._js()
        won = self._won.get(ref.token)
        if won is None:
            stored = await self._last(js, self.claim_subject(ref.job, ref.slot, ref.manual))
            if stored is None or stored.headers is None or \
                    stored.headers.get(_MSG_ID) != ref.token:
                return False
            claim = decode_json(stored.data)
            started = int(stored.time.timestamp() * 1000) if stored.time else local_now_ms()
            won = _Won(claim.get("runner", ""), started)
        record = result_record(ref, status=status, error=error, runner=won.runner,
                               started_ms=won.at_ms, at_ms=local_now_ms(), meta=stored_meta)
        ack = await self._publish_once(js, self.result_subject(ref.job, ref.slot, ref.manual),
                                       encode_json(record), f"{ref.token}:result")
        self._won.pop(ref.token, None)
        return ack is not None and not ack.duplicate

    # ------------------------------------------------------------------ history

    async def _pending(self, js: Any, subject_filter: str, start_seq: int,
                       keep: bool = False) -> tuple[int, str]:
        """Count messages matching ``subject_filter`` from ``start_seq`` (a consumer)."""
        name = f"anarchon_h_{uuid.uuid4().hex}"
        info = await js.add_consumer(self.stream, api.ConsumerConfig(
            name=name, filter_subject=subject_filter, ack_policy=api.AckPolicy.NONE,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq,
            inactive_threshold=max(10.0, self.timeout_s * 2), mem_storage=True,
        ))
        if not keep:
            await self._delete_consumer(js, name)
        return int(info.num_pending or 0), name

    async def _delete_consumer(self, js: Any, name: str) -> None:
        try:
            await js.delete_consumer(self.stream, name)
        except (TimeoutError, APIError, nats.errors.Error) as exc:
            log.debug("deleting consumer %s: %s (it expires by itself)", name, exc)

    async def history(self, job: str, limit: int = 20) -> list[Run]:
        """Runs of ``job``, newest first (see :meth:`_history`)."""
        with self._errors.guard("history read"):
            return await self._history(job, limit)

    async def job_names(self) -> dict[str, Run | None]:
        """Every job with a claim or result in the stream, with its newest run."""
        with self._errors.guard("job list read"):
            names = await self._jobs()
            newest = [await self._history(job, 1) for job in names]
        return {job: (runs[0] if runs else None)
                for job, runs in zip(names, newest, strict=True)}

    async def runs(self, query: HistoryQuery) -> RunPage:
        """One page of history across the namespace's jobs, newest first."""
        with self._errors.guard("history read"):
            names = [query.job] if query.job is not None else await self._jobs()
            return await page_jobs(names, history_reader(self._history), query)

    async def _jobs(self) -> list[str]:
        """The jobs whose subjects the stream holds in this namespace."""
        js = await self._js()
        info = await js.stream_info(self.stream, subjects_filter=f"{self._base}>")
        names = set()
        for subject in (info.state.subjects or {}):
            parts = subject[len(self._base):].split(".")
            if subject.startswith(self._base) and len(parts) in (3, 4) and \
                    parts[0] in ("run", "man", "res"):
                try:
                    names.add(token_job(parts[1]))
                except (ValueError, UnicodeDecodeError):
                    continue
        return sorted(names)

    def _subject_of(self, subject: str, token: str) -> bool:
        """Whether ``subject`` is a claim or result of job ``token`` in this namespace.

        History reads filter with wildcards, which could also match subjects of a
        namespace whose prefix extends this one; the exact layout tells them apart.
        """
        if not subject.startswith(self._base):
            return False
        parts = subject[len(self._base):].split(".")
        if len(parts) == 3:
            return parts[0] in ("run", "man") and parts[1] == token
        return len(parts) == 4 and parts[0] == "res" and parts[1] == token and \
            parts[3] in ("s", "m")

    async def _history(self, job: str, limit: int = 20) -> list[Run]:
        """Return runs of ``job``, newest first: one entry per run (one attempt each).

        Reads only the tail of the stream that holds the newest ``limit`` runs. Runs
        older than the stream's ``max_age`` are gone; a run whose runner died reads
        ``running`` until then.
        """
        js = await self._js()
        state = (await js.stream_info(self.stream)).state
        if not state.messages:
            return []
        first, last = int(state.first_seq), int(state.last_seq)
        token = job_token(job)
        claims = f"{self._base}*.{token}.*"
        span = max(64, 8 * limit)
        while True:
            start = max(first, last - span + 1)
            found, _ = await self._pending(js, claims, start)
            if found >= limit or start == first:
                break
            span *= 4
        if not found:
            return []
        count, name = await self._pending(js, f"{self._base}*.{token}.>", start, keep=True)
        items: list[dict[str, str]] = []
        try:
            sub = await js.pull_subscribe_bind(name, stream=self.stream)
            try:
                while len(items) < count:
                    messages = await sub.fetch(min(256, count - len(items)),
                                               timeout=self.timeout_s)
                    for message in messages:
                        if not self._subject_of(message.subject, token):
                            count -= 1
                            continue
                        try:
                            items.append(decode_json(message.data))
                        except StoreError as exc:
                            corrupt_records.report(
                                f"{self.stream} {message.subject}", job,
                                message.data.decode("utf-8", "replace"), str(exc))
                            count -= 1
                    if messages and messages[-1].metadata.num_pending == 0:
                        break
            finally:
                await sub.unsubscribe()
        finally:
            await self._delete_consumer(js, name)
        records = [r for r in parse_many(items, key=f"{self.stream} {self._base}*.{token}",
                                         job=job) if r.job == job]
        return runs_from_records(records, limit)
