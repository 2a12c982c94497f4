"""Store faults: a dedicated PostgreSQL server is restarted (or crashes) under the scheduler.

The server is our own (``initdb`` in a temporary directory, a free loopback port), never the
shared one. ``initdb`` and ``postgres`` refuse to run as root, so as root they run as the
``postgres`` OS user through ``runuser``.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from anarchon_core.backend import new_token
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.errors import StoreUnavailable
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef

from .stores import unavailable
from .support.helpers import free_port
from .support.procs import InstanceJob, grid_slots, now_ms, read_history, start_instances

pytestmark = pytest.mark.timeout(180)


def _bindir() -> Path | None:
    for tool in ("pg_config",):
        path = shutil.which(tool)
        if path:
            out = subprocess.run([path, "--bindir"], capture_output=True, text=True, check=False)
            if out.returncode == 0 and (Path(out.stdout.strip()) / "postgres").exists():
                return Path(out.stdout.strip())
    initdb = shutil.which("initdb")
    if initdb and (Path(initdb).resolve().parent / "postgres").exists():
        return Path(initdb).resolve().parent
    return None


class DedicatedPostgres:
    """A throw-away PostgreSQL server that tests may stop, crash and restart."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="anarchon-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.proc: subprocess.Popen[bytes] | None = None
        self.as_owner: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self.as_owner = ["runuser", "-u", "postgres", "--"]

    def initdb(self) -> None:
        subprocess.run(
            [*self.as_owner, str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust",
             "-U", "postgres", "--no-sync", "-E", "UTF8"],
            check=True, capture_output=True, timeout=120,
        )

    def start(self) -> None:
        log = (self.dir / "server.log").open("ab")
        self.proc = subprocess.Popen(
            [*self.as_owner, str(self.bindir / "postgres"), "-D", str(self.data),
             "-p", str(self.port), "-c", "listen_addresses=127.0.0.1",
             "-c", f"unix_socket_directories={self.dir}", "-c", "fsync=off",
             "-c", "full_page_writes=off", "-c", "max_connections=50"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {self.log()[-2000:]}")
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise TimeoutError(f"postgres did not accept connections: {self.log()[-2000:]}")

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def stop(self, sig: signal.Signals = signal.SIGINT) -> None:
        """SIGINT: fast shutdown (a restart). SIGQUIT: immediate shutdown (a crash)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        pid = self.postmaster_pid()
        if pid is not None and proc.poll() is None:
            os.kill(pid, sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait(10)

    def log(self) -> str:
        path = self.dir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def dedicated() -> Iterator[DedicatedPostgres]:
    bindir = _bindir()
    if bindir is None:
        unavailable("PostgreSQL server binaries (initdb, postgres)", "pg_config/initdb not found")
        return
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        unavailable("runuser", "needed to run initdb/postgres as the postgres user")
    server = DedicatedPostgres(bindir)
    try:
        server.initdb()
        server.start()
        yield server
    finally:
        server.close()


def req(slot: int, runner: str, **kw: object) -> ClaimRequest:
    return ClaimRequest(job="job", slot=slot, token=new_token(), runner=runner,
                        lease_ms=60_000, **kw)  # type: ignore[arg-type]


async def test_backend_rides_over_a_server_restart(
    dedicated: DedicatedPostgres, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = PostgresBackend(dedicated.url, table=namespace)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        r = req(slot, "a")
        assert (await backend.claim(r)).won
        ref = RunRef("job", slot, r.token, 1)
        await asyncio.to_thread(dedicated.stop)
        await asyncio.to_thread(dedicated.start)
        # The old connection is dead: the first call fails as transient (the scheduler's
        # retry policy, not the backend's); the next opens a new one, the lease intact.
        with pytest.raises(StoreUnavailable):
            await backend.heartbeat(ref, 60_000)
        assert await backend.heartbeat(ref, 60_000)
        assert (await backend.claim(req(slot, "b"))).outcome is ClaimOutcome.RUNNING
        assert await backend.finish(ref, "success")
        assert [(x.attempt, x.status) for x in await backend.history("job")] == [(1, "success")]
    finally:
        await backend.stop()


async def test_claim_during_an_outage_waits_for_the_server_or_fails_cleanly(
    dedicated: DedicatedPostgres, namespace: str
) -> None:
    backend = PostgresBackend(dedicated.url, table=namespace)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        await asyncio.to_thread(dedicated.stop, signal.SIGQUIT)  # crash
        claim = req(slot, "a")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            await backend.claim(claim)
        assert time.monotonic() - started < backend.connect_bound_s + 1
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        await asyncio.to_thread(dedicated.start)
        # The caller retries the same claim (same token) once the server is back.
        result = await backend.claim(claim)
        assert (result.outcome, result.attempt) == (ClaimOutcome.WON, 1)

        # During an outage a claim raises, it never reports won.
        impatient = PostgresBackend(dedicated.url, table=namespace)
        await impatient.start()
        await asyncio.to_thread(dedicated.stop)
        with pytest.raises(StoreUnavailable):
            await impatient.claim(req(slot + 1, "b", overlap=True))
        await asyncio.to_thread(dedicated.start)
        assert (await impatient.claim(req(slot + 1, "b", overlap=True))).won
        await impatient.stop()
        # The first backend's connection died with the server: one transient failure,
        # then a new connection.
        with pytest.raises(StoreUnavailable):
            await backend.history("job")
        assert [(x.slot, x.runner) for x in await backend.history("job")] == [
            (slot + 1, "b"), (slot, "a")]
    finally:
        await backend.stop()


@pytest.mark.slow
@pytest.mark.parametrize("fault", [signal.SIGINT, signal.SIGQUIT], ids=["restart", "crash"])
def test_scheduler_recovers_from_a_store_restart_without_double_success(
    dedicated: DedicatedPostgres, namespace: str, tmp_path: Path, fault: signal.Signals
) -> None:
    url = f"{dedicated.url}?table={namespace}"
    jobs = [InstanceJob("tick", every="1s", sleep_s=0.3)]
    with start_instances(url, jobs, 3, tmp_path, lease_ms=3_000, heartbeat_ms=1_000) as cluster:
        cluster.wait_ready()
        time.sleep(4)
        dedicated.stop(fault)
        time.sleep(0.5)
        dedicated.start()
        back_at = now_ms()
        time.sleep(8)
        end = now_ms() - 1_500
        cluster.stop_all()
        entries = cluster.ledger()
        logs = "".join(i.log() for i in cluster.instances)
    history = read_history(url, "tick")
    successes = Counter(r.slot for r in history if r.status == "success" and not r.manual)
    doubled = {slot: n for slot, n in successes.items() if n > 1}
    assert not doubled, f"slots with two successes: {doubled}"
    # One line when the outage starts, one when it ends (not one per failed call).
    assert "unreachable (" in logs, "the outage went unnoticed: the test did not exercise it"
    assert "reachable again after" in logs
    # Recovered: after the server is back, every slot runs, once.
    window = grid_slots(1_000, back_at + 2_000, end)
    assert len(window) >= 4
    missing = [s for s in window if successes[s] != 1]
    assert not missing, f"slots without exactly one success after recovery: {missing}"
    ends = Counter(e.slot for e in entries if e.event == "end" and e.slot >= back_at + 2_000)
    assert all(n == 1 for n in ends.values()), f"handlers ran twice after recovery: {ends}"
