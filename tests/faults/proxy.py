"""A TCP proxy in front of the kube-apiserver for one client: a network partition of a single
replica (its connections go silent while the other replica's stay up).

    proxy = TcpProxy("127.0.0.1", apiserver_port).start()
    proxy.url            # https://127.0.0.1:<port> (the serving certificate names 127.0.0.1)
    proxy.partition()    # stop forwarding in both directions; connections stay open and silent
    proxy.heal()         # forward again (what was sent meanwhile is delivered late)
    proxy.partition(drop=True)  # the open connections become half-open for good: whatever is
                                # sent on them is discarded, no FIN, no RST; after heal() only
                                # new connections work
    proxy.cut()          # close every open connection now (both ends see it end); new ones work
    proxy.stop()

TLS passes through untouched (no termination): the client still verifies the apiserver.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

BUFFER = 65536
ACCEPT_TIMEOUT = 0.2  # seconds between checks of stop()


class TcpProxy:
    """Forwards every connection on a free loopback port to ``(host, port)``."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self._flowing = threading.Event()
        self._flowing.set()
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(ACCEPT_TIMEOUT)
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._generation = 0  # connections accepted before a drop-partition are dead for good
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def partition(self, drop: bool = False) -> None:
        """Stop forwarding: nothing passes either way; sockets stay open (no FIN, no RST).

        ``drop``: the connections open now never carry data again (half-open), even after
        :meth:`heal`."""
        if drop:
            self._generation += 1
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def cut(self) -> int:
        """Close every open connection at once, mid-stream (a watch ends without its last chunk);
        new connections are forwarded as before. Returns the number of connections cut."""
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            for close in (lambda: s.shutdown(socket.SHUT_RDWR), s.close):
                try:
                    close()
                except OSError:
                    pass
        return len(socks) // 2

    def stop(self) -> None:
        self._stop.set()
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._flowing.wait()  # a partition also holds new connections
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            gen = self._generation
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, gen), name="tcp-proxy-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: Any, gen: int) -> None:
        try:
            while not self._stop.is_set():
                if gen == self._generation:
                    self._flowing.wait()
                data = src.recv(BUFFER)
                if not data:
                    if gen != self._generation:
                        self._stop.wait()  # half-open: never pass the FIN on
                    break
                if gen == self._generation:
                    self._flowing.wait()  # data read just before a partition is held back too
                if gen == self._generation:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
