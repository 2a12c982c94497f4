"""Claim latency and throughput on RabbitMQ and NATS, beside their floor.

    .venv/bin/python -m bench.claims_brokers [--count 2000] [--concurrency 16]
        [--amqp URL | --own-rabbitmq] [--nats URL] [--only rabbitmq|nats] [--smoke]

For each broker: a won claim (a fresh slot: the winner's whole path, history record
included), a lost claim (a slot another backend already holds), and the floor: one plain
confirmed publish over the same connection (RabbitMQ: a persistent message to a durable
classic queue with publisher confirms; NATS: a JetStream publish to the same stream).
The ratio column is each median over the floor's median. Everything the run creates is
deleted at the end (run queues expire by themselves 2 minutes later).

Won claims take due slots (the seconds before this machine's clock, one per call); taken
claims take slots from 1970 that another backend claimed first. ``--own-rabbitmq`` starts
a RabbitMQ node of the run's own on a free port (``chaos.servers.RabbitMQServer``: needs
``rabbitmq-server`` and root) and stops it at the end, so that the figures do not depend on
what else a shared broker carries. ``--smoke`` runs every table with tiny counts (see
``bench/common.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid

import aio_pika

from anarchon_core.backend import new_token
from anarchon_core.backends.nats import NatsBackend
from anarchon_core.backends.rabbitmq import RabbitMQBackend
from anarchon_core.models import ClaimOutcome, ClaimRequest, ClaimResult
from chaos.servers import RabbitMQServer

from .common import (
    SMOKE_CONCURRENCY,
    SMOKE_COUNT,
    Measurement,
    add_smoke_flag,
    measure,
    print_table,
    warmup_for,
)

JOB = "bench"


def request(slot: int, runner: str) -> ClaimRequest:
    return ClaimRequest(job=JOB, slot=slot, token=new_token(), runner=runner)


async def expect(result: ClaimResult, outcome: ClaimOutcome) -> None:
    if result.outcome is not outcome:
        raise AssertionError(f"expected {outcome.value}, got {result}")


def due_base(count: int) -> int:
    """The slot of won claim 0: calls ``-warmup .. 2*count-1`` all claim due slots."""
    return int(time.time() * 1000) - 2 * count


async def prefill(claim: object, count: int, concurrency: int) -> None:
    """Claim slots [0, 2*count) with another backend, so later claims of them lose."""
    slots = iter(range(2 * count))

    async def worker() -> None:
        for slot in slots:
            await claim(request(slot, "other"))  # type: ignore[operator]

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def bench_rabbitmq(url: str, count: int, concurrency: int) -> None:
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    winner = RabbitMQBackend(url, prefix=prefix, run_expires_ms=120_000)
    loser = RabbitMQBackend(url, prefix=prefix, run_expires_ms=120_000)
    await winner.start()
    await loser.start()
    floor_queue = f"{prefix}floor"
    base = due_base(count)
    try:
        channel = await winner._confirm_channel()
        await channel.declare_queue(floor_queue, durable=True,
                                    arguments={"x-queue-type": "classic", "x-max-length": 1})

        async def floor(i: int) -> None:
            message = aio_pika.Message(b'{"floor":"1"}',
                                       delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await channel.default_exchange.publish(message, routing_key=floor_queue,
                                                   mandatory=True)

        async def won(i: int) -> None:
            await expect(await winner.claim(request(base + i, "bench")), ClaimOutcome.WON)

        async def lost(i: int) -> None:
            await expect(await loser.claim(request(i, "bench")), ClaimOutcome.TAKEN)

        rows: list[Measurement] = []
        floor_row = await measure("confirmed publish (floor)", floor, count=count,
                                  concurrency=concurrency)
        rows.append(floor_row)
        rows.append(await measure("claim, won", won, count=count, concurrency=concurrency))
        await prefill(winner.claim, count, concurrency)
        rows.append(await measure("claim, taken", lost, count=count,
                                  concurrency=concurrency, warmup=0))
        where = url.rsplit("@", maxsplit=1)[-1]
        print_table(f"RabbitMQ {where} (aio-pika, one connection)", rows, floor_row)
    finally:
        with contextlib.suppress(Exception):
            cleanup = await (await winner._connection()).channel()
            for name in (floor_queue, winner.history_stream(JOB), winner.format_queue):
                await cleanup.queue_delete(name)
        await winner.stop()
        await loser.stop()


async def bench_nats(url: str, count: int, concurrency: int) -> None:
    name = f"BENCH{uuid.uuid4().hex[:8].upper()}"
    prefix = f"{name.lower()}."
    winner = NatsBackend(url, prefix=prefix, stream=name)
    loser = NatsBackend(url, prefix=prefix, stream=name)
    await winner.start()
    await loser.start()
    base = due_base(count)
    try:
        js = (await winner._client()).jetstream()

        async def floor(i: int) -> None:
            await js.publish(f"{prefix}floor", b'{"floor":"1"}', stream=name)

        async def won(i: int) -> None:
            await expect(await winner.claim(request(base + i, "bench")), ClaimOutcome.WON)

        async def lost(i: int) -> None:
            await expect(await loser.claim(request(i, "bench")), ClaimOutcome.TAKEN)

        rows: list[Measurement] = []
        floor_row = await measure("JetStream publish (floor)", floor, count=count,
                                  concurrency=concurrency)
        rows.append(floor_row)
        rows.append(await measure("claim, won", won, count=count, concurrency=concurrency))
        await prefill(winner.claim, count, concurrency)
        rows.append(await measure("claim, taken", lost, count=count,
                                  concurrency=concurrency, warmup=0))
        print_table(f"NATS JetStream {url} (nats-py, one connection, R1 file stream)", rows,
                    floor_row)
    finally:
        with contextlib.suppress(Exception):
            await (await winner._client()).jetstream().delete_stream(name)
        await winner.stop()
        await loser.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    amqp = parser.add_mutually_exclusive_group()
    amqp.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/")
    amqp.add_argument("--own-rabbitmq", action="store_true",
                      help="measure on a RabbitMQ node started for this run (needs root)")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--only", choices=["rabbitmq", "nats"])
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.count, args.concurrency = SMOKE_COUNT, SMOKE_CONCURRENCY
    print(f"count={args.count} (sequential, for latency, after {warmup_for(args.count)} "
          f"untimed), then {args.count} with {args.concurrency} in flight (for ops/s)")
    if args.only in (None, "rabbitmq"):
        if args.own_rabbitmq:
            with RabbitMQServer() as node:
                asyncio.run(bench_rabbitmq(node.url, args.count, args.concurrency))
        else:
            asyncio.run(bench_rabbitmq(args.amqp, args.count, args.concurrency))
    if args.only in (None, "nats"):
        asyncio.run(bench_nats(args.nats, args.count, args.concurrency))


if __name__ == "__main__":
    main()
