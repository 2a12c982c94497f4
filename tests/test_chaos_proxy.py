"""The freezable TCP proxy of the partition fault (chaos/proxy.py), against an echo server."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from chaos.proxy import FreezableProxy

from .support.helpers import free_port

pytestmark = pytest.mark.timeout(60)


class EchoServer:
    """Echoes every byte back; counts what it received (to see a frozen proxy hold it)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = 0
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)
            t = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data = conn.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                conn.close()
                return
            self.received += len(data)
            conn.sendall(data)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.close()
        for t in self._threads:
            t.join(2)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


def _recv_exactly(sock: socket.socket, n: int, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def test_forwards_both_ways(echo: EchoServer) -> None:
    with FreezableProxy(("127.0.0.1", echo.port)) as proxy:
        assert proxy.host == "127.0.0.1"
        assert proxy.port != echo.port
        with socket.create_connection(proxy.address, timeout=5) as c:
            payload = bytes(range(256)) * 1000  # larger than one read
            c.sendall(payload)
            assert _recv_exactly(c, len(payload)) == payload
        assert proxy.stats.bytes_up == len(payload) == proxy.stats.bytes_down


def test_freeze_stops_bytes_keeps_socket_open_and_thaw_resumes(echo: EchoServer) -> None:
    with FreezableProxy(("127.0.0.1", echo.port)) as proxy, \
            socket.create_connection(proxy.address, timeout=5) as c:
        c.sendall(b"ping")
        assert _recv_exactly(c, 4) == b"ping"
        proxy.freeze()
        assert proxy.frozen
        time.sleep(0.1)
        c.sendall(b"held back")  # the client can still write: the socket is open
        c.settimeout(1.0)
        with pytest.raises(TimeoutError):  # no reply, no EOF, no reset: a silent network
            c.recv(100)
        assert echo.received == 4, "bytes reached the store through a frozen proxy"
        assert proxy.open_connections == 1
        # A new connection made during the partition is not served either.
        late = socket.create_connection(proxy.address, timeout=5)
        late.sendall(b"late")
        late.settimeout(0.5)
        with pytest.raises(TimeoutError):
            late.recv(10)
        proxy.thaw()
        assert _recv_exactly(c, 9) == b"held back"
        assert _recv_exactly(late, 4) == b"late"
        late.close()
        c.sendall(b"again")
        assert _recv_exactly(c, 5) == b"again"
        assert proxy.stats.freezes == 1


def test_upstream_down_closes_the_client() -> None:
    port = free_port()  # nobody listens on it
    with FreezableProxy(("127.0.0.1", port)) as proxy, \
            socket.create_connection(proxy.address, timeout=5) as c:
        c.settimeout(5)
        assert c.recv(10) == b""
        assert proxy.stats.upstream_failures == 1


def test_stop_closes_every_socket_and_the_thread(echo: EchoServer) -> None:
    proxy = FreezableProxy(("127.0.0.1", echo.port)).start()
    c = socket.create_connection(proxy.address, timeout=5)
    c.sendall(b"x")
    assert _recv_exactly(c, 1) == b"x"
    proxy.freeze()
    thread = proxy._thread
    proxy.stop()
    assert thread is not None
    assert not thread.is_alive()
    c.settimeout(5)
    with contextlib.suppress(ConnectionResetError):
        assert c.recv(10) == b""
    c.close()
    with pytest.raises(OSError):
        socket.create_connection(proxy.address, timeout=1).close()


def test_connection_limit(echo: EchoServer) -> None:
    with FreezableProxy(("127.0.0.1", echo.port), max_connections=1) as proxy, \
            socket.create_connection(proxy.address, timeout=5) as first:
        first.sendall(b"a")
        assert _recv_exactly(first, 1) == b"a"
        with socket.create_connection(proxy.address, timeout=5) as second:
            second.settimeout(5)
            assert second.recv(10) == b""
        assert proxy.stats.refused == 1
