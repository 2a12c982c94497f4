"""One demo/test instance process: a Scheduler with jobs described in JSON, and a ledger.

Used by ``anarchon demo``, the multi-process tests and the chaos harness::

    python -m anarchon_core.cli.instance --backend URL --jobs '[{"name": "tick",
        "every": "1s", "sleep_s": 0.1}]' --ledger DIR [--lease-ms N] [--heartbeat-ms N]

Every handler appends what it did to ``DIR/<pid>.jsonl`` (flushed and fsynced, so a
SIGKILL loses nothing written): a ``start`` line when it begins and an ``end`` line right
after confirming its lease (``ctx.check_lease``), i.e. the side effect a real job would
make once. The file ``DIR/<pid>.ready`` appears once the scheduler has started.

Every ledger line also carries ``mono_ns`` (``time.monotonic_ns()``, the machine-wide
monotonic clock, which a faked wall clock leaves alone) so lines of different processes can
be ordered even when their wall clocks are skewed. ``DIR/<pid>.clock`` holds this process's
``time.time()`` and ``time.monotonic_ns()`` read together at start (to verify a skew).

Every claim answer of a scheduled slot is appended to ``DIR/<pid>.claims`` (one JSON line
of job, slot and outcome; not fsynced: a count for the report, not evidence), so a harness
can count the claims made per slot.

Every handler also writes an ``exit`` line when its code returns, whatever the outcome, so
tests can tell when two attempts' code ran at the same time. With ``"stubborn": true`` a
handler ignores its cancellation and writes no ``end`` (it only sleeps).

A job spec may make some slots slow: ``"slow_ratio": 0.3, "slow_sleep_s": 5`` sleeps
``slow_sleep_s`` instead of ``sleep_s`` in about 30 % of the slots (chosen by a hash of
``slow_seed``, the job and the slot, so every attempt of a slot agrees), e.g. to hit
``timeout_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

from ..context import JobContext
from ..events import Event, EventKind
from ..lifecycle import serve as run_until_stopped
from ..scheduler import Scheduler

log = logging.getLogger("anarchon.instance")


class Ledger:
    """An append-only JSON-lines file, fsynced after every line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, event: str, ctx: JobContext, **extra: Any) -> None:
        """Append one event of the run ``ctx``."""
        line = json.dumps({
            "event": event, "job": ctx.job, "slot": ctx.slot, "attempt": ctx.attempt,
            "token": ctx.token, "manual": ctx.manual, "instance": ctx.instance_id,
            "pid": os.getpid(), "time_ms": round(time.time() * 1000),
            "mono_ns": time.monotonic_ns(), **extra,
        })
        os.write(self._fd, (line + "\n").encode())
        os.fsync(self._fd)


#: The events that are a claim's answer (one per claim sent for a slot).
CLAIM_ANSWERS = frozenset({EventKind.CLAIM_WON, EventKind.CLAIM_TAKEN,
                           EventKind.CLAIM_SKIPPED, EventKind.TAKEOVER, EventKind.LATE})


class ClaimLog:
    """A listener appending each claim answer of a scheduled slot to a JSON-lines file."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", buffering=1)

    def __call__(self, event: Event) -> None:
        """Write one line for a claim's answer (other events are ignored)."""
        if event.kind in CLAIM_ANSWERS and not event.manual and event.slot is not None:
            self._file.write(json.dumps({"job": event.job, "slot": event.slot,
                                         "outcome": event.outcome or event.kind.value}) + "\n")


def make_handler(spec: dict[str, Any], ledger: Ledger | None) -> Any:
    """A handler that sleeps ``sleep_s`` (async or, with ``"sync": true``, in a thread)."""
    base_sleep_s = float(spec.get("sleep_s", 0.05))
    fail = bool(spec.get("fail", False))
    slow_ratio = float(spec.get("slow_ratio", 0.0))
    slow_sleep_s = float(spec.get("slow_sleep_s", 0.0))
    slow_seed = spec.get("slow_seed", 0)

    def sleep_for(ctx: JobContext) -> float:
        if slow_ratio > 0:
            draw = random.Random(f"{slow_seed}:{ctx.job}:{ctx.slot}").random()
            if draw < slow_ratio:
                return slow_sleep_s
        return base_sleep_s

    def done(ctx: JobContext) -> None:
        if fail:
            raise RuntimeError("this job fails on purpose")
        if ledger:
            ledger.write("end", ctx)

    stubborn = bool(spec.get("stubborn", False))

    def exited(ctx: JobContext) -> None:
        if ledger:
            ledger.write("exit", ctx, cancelled=ctx.cancel_reason)

    if spec.get("sync"):
        def sync_handler(ctx: JobContext) -> None:
            if ledger:
                ledger.write("start", ctx)
            try:
                deadline = time.monotonic() + sleep_for(ctx)
                while time.monotonic() < deadline:
                    if not stubborn:
                        ctx.raise_if_cancelled()
                    time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                if not stubborn:
                    ctx.check_lease()
                    done(ctx)
            finally:
                exited(ctx)
        return sync_handler

    async def async_handler(ctx: JobContext) -> None:
        if ledger:
            ledger.write("start", ctx)
        try:
            deadline = time.monotonic() + sleep_for(ctx)
            while (left := deadline - time.monotonic()) > 0:
                try:
                    await asyncio.sleep(left)
                except asyncio.CancelledError:
                    if not stubborn:
                        raise
            if not stubborn:
                await ctx.acheck_lease()
                done(ctx)
        finally:
            exited(ctx)
    return async_handler


def build(args: argparse.Namespace) -> Scheduler:
    """The scheduler of this instance."""
    kwargs: dict[str, Any] = {}
    if args.lease_ms:
        kwargs["lease_ms"] = args.lease_ms
    if args.heartbeat_ms:
        kwargs["heartbeat_ms"] = args.heartbeat_ms
    if args.instance_id:
        kwargs["instance_id"] = args.instance_id
    if args.history_size:
        kwargs["history_size"] = args.history_size
    if args.no_contenders:
        kwargs["contenders"] = False
    scheduler = Scheduler(args.backend, **kwargs)
    ledger = None
    if args.ledger:
        ledger = Ledger(Path(args.ledger) / f"{os.getpid()}.jsonl")
        scheduler.add_listener(ClaimLog(Path(args.ledger) / f"{os.getpid()}.claims"),
                               kinds=CLAIM_ANSWERS)
    for spec in json.loads(args.jobs):
        handler = make_handler(spec, ledger)
        options = spec.get("options", {})
        if "cron" in spec:
            scheduler.cron(spec["name"], spec["cron"], handler, tz=spec.get("tz", "UTC"),
                           **options)
        else:
            scheduler.every(spec["name"], spec["every"], handler, **options)
    return scheduler


async def serve(args: argparse.Namespace) -> None:
    """Run until SIGTERM/SIGINT (or ``--seconds``), then stop gracefully."""
    scheduler = build(args)

    def running() -> None:
        wall, mono = time.time(), time.monotonic_ns()
        log.info("instance %s clock: time.time()=%.3f monotonic_ns=%d",
                 scheduler.instance_id, wall, mono)
        if args.ledger:
            (Path(args.ledger) / f"{os.getpid()}.clock").write_text(
                json.dumps({"wall_ms": wall * 1000, "mono_ns": mono}))
            (Path(args.ledger) / f"{os.getpid()}.ready").write_text(scheduler.instance_id)

    await run_until_stopped(scheduler, seconds=args.seconds, grace_ms=args.grace_ms,
                            on_running=running)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m anarchon_core.cli.instance``."""
    parser = argparse.ArgumentParser(prog="python -m anarchon_core.cli.instance")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--jobs", required=True, help="JSON list of job specs")
    parser.add_argument("--ledger", help="directory for the ledger files")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--lease-ms", type=int, default=None)
    parser.add_argument("--heartbeat-ms", type=int, default=None)
    parser.add_argument("--grace-ms", type=int, default=2_000)
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--history-size", type=int, default=None)
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--no-contenders", action="store_true",
                        help="claim every slot here (Scheduler(contenders=False))")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format=f"%(asctime)s [{os.getpid()}] %(name)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
