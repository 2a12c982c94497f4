"""A TCP proxy that can freeze: a network partition of one client, sockets left open.

:class:`FreezableProxy` listens on a free port of 127.0.0.1 and forwards every connection
to an upstream address (a store). :meth:`~FreezableProxy.freeze` stops forwarding in both
directions and stops accepting, but closes nothing: the client's connection stays
established and its requests simply get no answer, like a half-open TCP connection or a
partitioned network (the store stays reachable for everyone else).
:meth:`~FreezableProxy.thaw` resumes forwarding; bytes held back meanwhile are delivered
then, in order.

One thread per proxy runs a :mod:`selectors` loop over non-blocking sockets. It is
bounded: at most ``max_connections`` open connections (more are refused by closing them),
at most ``buffer_bytes`` buffered per direction of a connection (reading stops until the
other side drains), and :meth:`~FreezableProxy.stop` closes every socket and joins the
thread. Used by the chaos harness (the ``partition`` fault) and by tests::

    with FreezableProxy(("127.0.0.1", 6379)) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        proxy.freeze(); ...; proxy.thaw()
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import threading
from dataclasses import dataclass, field

__all__ = ["FreezableProxy", "ProxyStats"]

log = logging.getLogger("anarchon.chaos.proxy")

_CHUNK = 64 * 1024


@dataclass
class ProxyStats:
    """Counters of one proxy (read them from any thread; they only grow)."""

    accepted: int = 0
    refused: int = 0
    upstream_failures: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    freezes: int = 0


@dataclass(eq=False)
class _Pair:
    """One proxied connection: the client's socket and ours to the upstream."""

    client: socket.socket
    upstream: socket.socket
    to_up: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    client_eof: bool = False
    upstream_eof: bool = False
    up_shut: bool = False
    client_shut: bool = False
    closed: bool = False

    def peer_of(self, sock: socket.socket) -> socket.socket:
        return self.upstream if sock is self.client else self.client


class FreezableProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream``; :meth:`freeze` / :meth:`thaw`."""

    def __init__(self, upstream: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0,
                 max_connections: int = 256, buffer_bytes: int = 1 << 20,
                 connect_timeout_s: float = 2.0, name: str = "proxy") -> None:
        self.upstream = upstream
        self.name = name
        self.max_connections = max_connections
        self.buffer_bytes = buffer_bytes
        self.connect_timeout_s = connect_timeout_s
        self.stats = ProxyStats()
        self._listener = socket.create_server((host, port), backlog=128)
        self._listener.setblocking(False)
        self.host, self.port = self._listener.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._pairs: dict[socket.socket, _Pair] = {}
        self._interest: dict[socket.socket, int] = {}
        self._frozen = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control

    @property
    def address(self) -> tuple[str, int]:
        """Where clients connect: ``(host, port)``."""
        return self.host, self.port

    @property
    def frozen(self) -> bool:
        """Whether forwarding is stopped."""
        return self._frozen.is_set()

    @property
    def open_connections(self) -> int:
        """Connections currently proxied (open on both sides)."""
        return len({id(p) for p in self._pairs.values() if not p.closed})

    def start(self) -> FreezableProxy:
        """Start the forwarding thread; returns ``self``."""
        if self._thread is None:
            self._sel.register(self._wake_r, selectors.EVENT_READ)
            self._interest[self._listener] = 0
            self._thread = threading.Thread(target=self._loop, name=f"anarchon-{self.name}",
                                            daemon=True)
            self._thread.start()
        return self

    def freeze(self) -> None:
        """Stop forwarding in both directions and stop accepting; close nothing."""
        if not self._frozen.is_set():
            self.stats.freezes += 1
        self._frozen.set()
        self._wake()

    def thaw(self) -> None:
        """Resume forwarding (held-back bytes flow on, in order) and accepting."""
        self._frozen.clear()
        self._wake()

    def stop(self, timeout: float = 5.0) -> None:
        """Close every socket and end the thread (idempotent)."""
        self._stopping.set()
        self._wake()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
        else:
            self._close_all()

    def __enter__(self) -> FreezableProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                self._update_interest()
                for key, events in self._sel.select(timeout=0.5):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    elif sock is self._listener:
                        self._accept()
                    elif sock in self._pairs and not self._frozen.is_set():
                        pair = self._pairs[sock]
                        if events & selectors.EVENT_READ:
                            self._read(pair, sock)
                        if events & selectors.EVENT_WRITE and not pair.closed:
                            self._write(pair, sock)
        except Exception:  # a bug here must not go unnoticed, nor leave sockets open
            log.exception("%s: forwarding loop failed", self.name)
        finally:
            self._close_all()

    def _want(self, sock: socket.socket) -> int:
        if self._frozen.is_set():
            return 0
        if sock is self._listener:
            return selectors.EVENT_READ
        pair = self._pairs[sock]
        if pair.closed:
            return 0
        outgoing = pair.to_client if sock is pair.client else pair.to_up
        incoming = pair.to_up if sock is pair.client else pair.to_client
        eof = pair.client_eof if sock is pair.client else pair.upstream_eof
        mask = 0
        if not eof and len(incoming) < self.buffer_bytes:
            mask |= selectors.EVENT_READ
        if outgoing:
            mask |= selectors.EVENT_WRITE
        return mask

    def _update_interest(self) -> None:
        for sock in list(self._interest):
            want = self._want(sock)
            have = self._interest[sock]
            if want == have:
                continue
            if have and want:
                self._sel.modify(sock, want)
            elif want:
                self._sel.register(sock, want)
            else:
                self._sel.unregister(sock)
            self._interest[sock] = want

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if self.open_connections >= self.max_connections:
            self.stats.refused += 1
            client.close()
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=self.connect_timeout_s)
        except OSError as exc:
            # The store is down: the client sees its connection closed, as it would.
            self.stats.upstream_failures += 1
            log.debug("%s: upstream %s unreachable: %s", self.name, self.upstream, exc)
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = _Pair(client, upstream)
        self._pairs[client] = self._pairs[upstream] = pair
        self._interest[client] = self._interest[upstream] = 0
        self.stats.accepted += 1

    def _read(self, pair: _Pair, sock: socket.socket) -> None:
        try:
            data = sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(pair)
            return
        from_client = sock is pair.client
        if not data:
            if from_client:
                pair.client_eof = True
            else:
                pair.upstream_eof = True
        elif from_client:
            pair.to_up += data
            self.stats.bytes_up += len(data)
        else:
            pair.to_client += data
            self.stats.bytes_down += len(data)
        self._flush(pair)

    def _write(self, pair: _Pair, sock: socket.socket) -> None:
        buffer = pair.to_client if sock is pair.client else pair.to_up
        try:
            sent = sock.send(buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(pair)
            return
        del buffer[:sent]
        self._flush(pair)

    def _flush(self, pair: _Pair) -> None:
        """Pass an end of stream on once its side's bytes are delivered; close when done."""
        try:
            if pair.client_eof and not pair.to_up and not pair.up_shut:
                pair.up_shut = True
                pair.upstream.shutdown(socket.SHUT_WR)
            if pair.upstream_eof and not pair.to_client and not pair.client_shut:
                pair.client_shut = True
                pair.client.shutdown(socket.SHUT_WR)
        except OSError as exc:
            if exc.errno not in (errno.ENOTCONN, errno.EPIPE):
                log.debug("%s: shutdown failed: %s", self.name, exc)
            self._close(pair)
            return
        if pair.up_shut and pair.client_shut:
            self._close(pair)

    def _close(self, pair: _Pair) -> None:
        if pair.closed:
            return
        pair.closed = True
        for s in (pair.client, pair.upstream):
            if self._interest.pop(s, 0):
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(s)
            self._pairs.pop(s, None)
            with contextlib.suppress(OSError):
                s.close()

    def _close_all(self) -> None:
        for pair in {id(p): p for p in self._pairs.values()}.values():
            self._close(pair)
        for s in (self._listener, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()
        with contextlib.suppress(Exception):
            self._sel.close()
