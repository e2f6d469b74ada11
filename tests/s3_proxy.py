"""A TCP proxy in front of the tests' S3 server that can stop as a server does: every
connection cut and new ones refused, while the server behind it keeps its objects, so a test
can stop "the server" mid-upload, start it again and look at what it holds.

``stop_on``: a byte string that, once seen in a request, stops the proxy after forwarding the
bytes before it (the request's first part: an upload cut midway).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class StoppableProxy:
    def __init__(self, upstream: tuple[str, int], stop_on: bytes | None = None):
        self.upstream = upstream
        self.stop_on = stop_on
        self.stopped = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._serve()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self._listener.listen(64)
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            server = socket.create_connection(self.upstream)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, request: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                at = data.find(self.stop_on) if request and self.stop_on else -1
                if at >= 0:
                    target.sendall(data[: at + len(self.stop_on or b"") + 4096])
                    self.stop()
                    return
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        """Cut every connection and refuse new ones (the server behind keeps its state)."""
        self.stopped.set()
        with self._lock:
            for sock in [self._listener, *self._sockets]:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def start(self) -> None:
        """Listen again on the same port."""
        self.stop_on = None
        self.stopped.clear()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._serve()


@contextlib.contextmanager
def proxy(endpoint: str, stop_on: bytes | None = None) -> Iterator[StoppableProxy]:
    host, port = endpoint.removeprefix("http://").split(":")
    running = StoppableProxy((host, int(port)), stop_on)
    try:
        yield running
    finally:
        running.stop()
