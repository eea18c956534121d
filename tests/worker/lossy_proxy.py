"""A TCP proxy between a worker and PostgreSQL that loses the server's answer to a chosen statement.

The statement reaches the server and runs to its end (the server commits it: its
ReadyForQuery passes through here), but the answer is dropped and the client's
connection closed, as if the network failed on the way back. The client then
sees a broken connection with no way to know whether its statement committed.

Connect through it with sslmode=disable and gssencmode=disable, so that the
stream is plain protocol messages from the start.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class LossyProxy:
    """Listens on 127.0.0.1; forwards to (host, port); loses the answers to `times` statements containing `marker`."""

    def __init__(self, host: str, port: int) -> None:
        self._server = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._marker = b""
        self._times = 0
        self.lost = 0  # answers lost so far
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []  # every connection's two ends, shut when the proxy closes
        self._threads = [threading.Thread(target=self._accept, name="lossy-proxy", daemon=True)]
        self._threads[0].start()

    def lose(self, marker: str, times: int = 1) -> None:
        """Lose the answers to the next `times` statements whose text contains `marker`."""
        with self._lock:
            self._marker, self._times = marker.encode(), times

    def dsn(self, dbname: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}?sslmode=disable&gssencmode=disable"

    def close(self) -> None:
        """Stop accepting, cut every connection, and wait for the proxy's threads to end."""
        self._closed.set()
        _shut(self._listener)  # (shutdown wakes the accept that close alone leaves waiting)
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            _shut(sock)
        for thread in threads:
            thread.join(10)

    def _take_trigger(self, data: bytes) -> bool:
        with self._lock:
            if self._times > 0 and self._marker and self._marker in data:
                self._times -= 1
                return True
            return False

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._server)
            except OSError:
                client.close()
                continue
            doomed = threading.Event()
            pair = [
                threading.Thread(
                    target=self._upstream, args=(client, server, doomed), name="lossy-proxy-up", daemon=True
                ),
                threading.Thread(
                    target=self._downstream, args=(server, client, doomed), name="lossy-proxy-down", daemon=True
                ),
            ]
            with self._lock:
                if self._closed.is_set():
                    _shut(client)
                    _shut(server)
                    return
                self._sockets += [client, server]
                self._threads += pair
                for thread in pair:
                    thread.start()

    def _upstream(self, client: socket.socket, server: socket.socket, doomed: threading.Event) -> None:
        """Client to server, as is; a statement with the marker dooms its answer."""
        try:
            while data := client.recv(65536):
                if self._take_trigger(data):
                    doomed.set()
                server.sendall(data)
        except OSError:
            pass
        finally:
            _shut(server)

    def _downstream(self, server: socket.socket, client: socket.socket, doomed: threading.Event) -> None:
        """Server to client by whole messages; once doomed, swallow up to ReadyForQuery, then cut both ends."""
        buffer = b""
        try:
            while data := server.recv(65536):
                buffer += data
                for kind, message in _messages(buffer):
                    buffer = buffer[len(message) :]
                    if not doomed.is_set():
                        client.sendall(message)
                    elif kind == b"Z":  # the statement's transaction is over: committed, answer never sent
                        with self._lock:
                            self.lost += 1
                        _shut(client)
                        _shut(server)
                        return
        except OSError:
            pass
        finally:
            _shut(client)


def _messages(buffer: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The complete (type, whole message) at the head of `buffer`, in order."""
    offset = 0
    while len(buffer) - offset >= 5:
        (length,) = struct.unpack("!I", buffer[offset + 1 : offset + 5])
        end = offset + 1 + length
        if end > len(buffer):
            return
        yield buffer[offset : offset + 1], buffer[offset:end]
        offset = end


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


@contextmanager
def lossy_proxy(server_url: str) -> Iterator[LossyProxy]:
    """A proxy in front of the server that `server_url` (postgresql://user@host:port/db) names."""
    host_port = server_url.split("@", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    proxy = LossyProxy(host, int(port))
    try:
        yield proxy
    finally:
        proxy.close()
