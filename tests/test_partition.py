"""A network partition of one instance: its runner is told to stop before a backup starts.

One instance reaches the store through a :class:`~chaos.proxy.FreezableProxy`; the proxy
freezes mid-run (sockets stay open, nothing is forwarded: a half-open connection). Its
heartbeat calls never return, yet its handler must see cancellation (``lease lost``)
before the backup's attempt 2 starts — by the ledger's machine-wide monotonic times.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from chaos.proxy import FreezableProxy

from .stores import StoreHandle
from .support.procs import (
    InstanceJob,
    LedgerEntry,
    assert_exactly_once,
    assert_no_concurrent_execution,
    now_ms,
    read_history,
    start_instances,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(params=["redis", "postgres"])
def store_url(request: pytest.FixtureRequest, store_handles: Callable[[str], StoreHandle],
              namespace: str) -> str:
    handle = store_handles(request.param)
    assert handle.url is not None
    return handle.url(namespace)


def through(url: str, proxy: FreezableProxy) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"{proxy.host}:{proxy.port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2
                                     else host))



def entry(entries: list[LedgerEntry], event: str, attempt: int) -> LedgerEntry | None:
    return next((e for e in entries if e.event == event and e.attempt == attempt), None)


def test_a_partitioned_runner_is_cancelled_before_the_backup_starts(store_url: str,
                                                                   tmp_path: Path) -> None:
    parts = urlsplit(store_url)
    assert parts.hostname is not None
    assert parts.port is not None
    # Every instance claims every slot (no contender sets): the jitter alone decides who runs.
    timings: dict[str, Any] = {"lease_ms": 2_000, "heartbeat_ms": 400, "contenders": False}
    with FreezableProxy((parts.hostname, parts.port)) as proxy:
        # The partitioned instance claims at the slot's instant; the others a little later,
        # so it is the runner and they are its backups.
        # The first slot 5 s from now (the instances are up by then), the next ones every
        # 10 s: a backup whose jitter came out near 0 may win a slot now and then.
        offset = f"{(now_ms() + 5_000) % 10_000}ms"
        first_job = [InstanceJob("long", every="10s", sleep_s=6.0,
                             options={"jitter_ms": 0, "offset": offset})]
        backup_jobs = [InstanceJob("long", every="10s", sleep_s=6.0,
                               options={"jitter_ms": 400, "offset": offset})]
        partitioned = start_instances(through(store_url, proxy), first_job, 1,
                                      tmp_path / "partitioned", **timings)
        backups = start_instances(store_url, backup_jobs, 2, tmp_path / "backups", **timings)
        with partitioned, backups:
            partitioned.wait_ready()
            backups.wait_ready()
            try:
                start = wait_for(lambda: entry(partitioned.ledger(), "start", 1), 45,
                                 "the partitioned instance to start a run")
            except AssertionError as exc:
                won = [(e.slot, e.time_ms - e.slot) for e in backups.ledger()
                       if e.event == "start"]
                raise AssertionError(f"{exc}; the backups started (slot, ms late): {won}; "
                                     f"{partitioned.instances[0].log()[-1500:]}") from None
            time.sleep(0.5)
            proxy.freeze()
            takeover = wait_for(lambda: entry(backups.ledger(), "start", 2), 20,
                                "a backup to take over")
            cancelled = wait_for(lambda: entry(partitioned.ledger(), "exit", 1), 10,
                                 "the partitioned handler to return")
            wait_for(lambda: entry(backups.ledger(), "end", 2), 15, "attempt 2 to end")
            proxy.thaw()
            time.sleep(1.0)
            partitioned.stop_all()
            backups.stop_all()
            entries = partitioned.ledger() + backups.ledger()
    assert takeover.slot == start.slot
    assert cancelled.cancelled == "lease lost"
    assert cancelled.mono_ns is not None
    assert takeover.mono_ns is not None
    assert cancelled.mono_ns < takeover.mono_ns, (
        f"the backup started {(cancelled.mono_ns - takeover.mono_ns) / 1e6:.0f} ms before "
        "the partitioned runner was told to stop")
    assert_no_concurrent_execution(entries, "long")
    # A backup may have run an earlier slot before the partitioned instance won one.
    assert not [e for e in entries
                if e.event == "end" and e.attempt == 1 and e.slot == start.slot]
    assert_exactly_once(entries, "long", history=read_history(store_url, "long"))
