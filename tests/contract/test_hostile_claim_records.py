"""Hostile claim and result records on every claim-only store: reported once, skipped.

The claim-only stores keep history as claim and result records (RabbitMQ stream messages,
NATS JetStream messages, Redis stream entries and result members) that any client of the
store can write. Each test writes records with numbers out of range (``1e400``,
``10**30``, ``NaN``, a negative time), wrong types and bad text with the store's own client
into the job of its own namespace, then reads history: the good runs read as written,
every hostile record is reported once at WARNING naming where it is, and claims go on.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aio_pika
import pytest
import redis

from anarchon_core.backend import Backend, new_token
from anarchon_core.backends.nats import NatsBackend
from anarchon_core.backends.rabbitmq import RabbitMQBackend
from anarchon_core.backends.redis import RedisBackend
from anarchon_core.backends.redis.keys import redis_key
from anarchon_core.backends.redis.lease import run_score
from anarchon_core.models import RUN_STATUSES, ClaimOutcome, ClaimRequest, HistoryQuery, RunRef

from ..stores import StoreHandle, StoreSpec

pytestmark = pytest.mark.timeout(60)

JOB = "job"


def req(slot: int, job: str = JOB) -> ClaimRequest:
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner="good",
                        max_late_ms=60_000)


def _claim(slot: object, at: object, **fields: object) -> dict[str, object]:
    return {"v": "1", "kind": "claim", "job": JOB, "slot": slot, "manual": "0",
            "token": "hostile", "runner": "r", "at": at, **fields}


def hostile_bodies(slot: int, tag: str) -> list[bytes]:
    """Message bodies (RabbitMQ, NATS) that are no record anarchon can read."""
    old, at = str(slot - 5_000), str(slot - 5_000)
    records: list[dict[str, object]] = [
        _claim("1e400", at), _claim(str(10**30), at), _claim("NaN", at),
        _claim(old, "-5"), _claim(old, "1e400"), _claim(old, at, manual="yes"),
        _claim(old, at, runner=["r"]), _claim(int(old), at),
        _claim(old, at, kind="result", status="zombie", started=at),
        _claim(old, at, kind="result", status="success", started="NaN"),
        _claim(old, at, kind="result", status="success", started=at, error=5),
    ]
    bodies = [json.dumps({**r, "tag": tag}).encode() for r in records]
    return [*bodies, b"[" * 5_000 + b"]" * 5_000, b"\xff\xfe" + tag.encode()]


async def write_messages(backend: Backend, slot: int, tag: str) -> int:
    """Write the hostile messages into ``JOB``'s history; how many records were written."""
    bodies = hostile_bodies(slot, tag)
    if isinstance(backend, NatsBackend):
        js = (await backend._client()).jetstream()
        for i, body in enumerate(bodies):
            subject = backend.claim_subject(JOB, slot - 5_000 - i) if i % 2 else \
                backend.result_subject(JOB, slot - 5_000 - i)
            await js.publish(subject, body, stream=backend.stream)
    else:
        assert isinstance(backend, RabbitMQBackend)
        conn = await backend._connection()
        channel = await conn.channel()
        try:
            for body in bodies:
                await channel.default_exchange.publish(
                    aio_pika.Message(body), routing_key=backend.history_stream(JOB))
        finally:
            await channel.close()
    return len(bodies)


def write_redis(backend: RedisBackend, url: str, slot: int, tag: str) -> tuple[int, int]:
    """Hostile claim entries and results in ``JOB``'s Redis keys (before any claim).

    Returns how many records are hostile, and the slot of a claim whose result is one of
    them (that run reads ``running``).
    """
    runs = redis_key(backend.prefix, "runs", JOB)
    results = redis_key(backend.prefix, "results", JOB)
    base = slot - 60_000
    entries: list[dict[str, Any]] = [
        {"slot": "1e400", "token": tag, "runner": "r"},
        {"slot": str(10**30), "token": tag, "runner": "r"},
        {"slot": "NaN", "token": tag, "runner": "r"},
        {"slot": str(base), "token": tag, "runner": "r", "at": "-5"},
        {"slot": str(base), "token": tag, "runner": "r", "at": "1e400"},
        {"slot": " 7", "token": tag, "runner": "r"},
        {"slot": str(base), "token": tag, "runner": b"\xff\xfe"},
    ]
    kept = base + 1_000  # a readable claim whose result is hostile
    with redis.Redis.from_url(url) as client:
        for i, fields in enumerate(entries):
            client.xadd(runs, fields, id=f"{base + i}-0")
        client.xadd(runs, {"slot": str(kept), "token": tag, "runner": "r",
                           "at": str(kept)}, id=f"{kept}-0")
        client.zadd(results, {json.dumps({"t": tag, "s": "zombie", "f": str(kept)}):
                              run_score(kept, False)})
    return len(entries) + 1, kept


def corrupt_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "corrupt record" in r.getMessage()]


async def test_hostile_history_records_are_reported_once_and_skipped(
        claim_store: tuple[StoreSpec, StoreHandle], claim_backend: Backend,
        namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    slot = await claim_backend.clock_ms()
    expected: set[tuple[int, str]] = set()
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        if isinstance(claim_backend, RedisBackend):
            count, kept = write_redis(claim_backend, claim_store[1].extra, slot, namespace)
            expected.add((kept, "running"))
            where = claim_backend.prefix
        else:
            where = namespace
        good = req(slot)
        assert (await claim_backend.claim(good)).won
        if not isinstance(claim_backend, RedisBackend):
            count = await write_messages(claim_backend, slot, namespace)
        assert await claim_backend.finish(RunRef(JOB, slot, good.token), "success")
        expected.add((slot, "success"))
        first = await claim_backend.history(JOB)
        again = await claim_backend.history(JOB)
        page = await claim_backend.runs(HistoryQuery(limit=50))
    for runs in (first, again, page):
        assert {(r.slot, r.status) for r in runs} == expected
        for run in runs:
            assert run.status in RUN_STATUSES
            assert run.started_at is not None
            assert run.started_at.year >= 2020
            assert run.error is None or isinstance(run.error, str)
    warnings = corrupt_warnings(caplog)
    assert len(warnings) == count, "\n".join(warnings)
    assert all(where in w for w in warnings), warnings
    # The job and another one go on claiming.
    for job in (JOB, "other"):
        later = req(slot + 1_000, job)
        assert (await claim_backend.claim(later)).won
        assert (await claim_backend.claim(req(slot + 1_000, job))).outcome is \
            ClaimOutcome.TAKEN
