"""A loopback TCP proxy in front of a server (the moto S3 server of tests/e2e/test_object_storage.py)
that a test can take down and bring back: ``down()`` closes the listening socket (new connections
are refused, as by a stopped endpoint) and cuts every open connection (pooled keep-alive ones too);
``up()`` listens again on the same port. Clients keep one endpoint URL throughout."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self.port))
            self.port = sock.getsockname()[1]
            sock.listen(64)
            self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        if listener is not None:
            _close(listener)  # shutdown first: a close alone leaves a thread blocked in accept() holding the port
        for c in conns:
            _close(c)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._listener is not listener:
                    _close(client)
                    _close(server)
                    return
                self._conns.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
