"""A TCP relay for tests, between a client and a real server on 127.0.0.1: it passes
bytes both ways, keeps what clients sent, counts what servers sent (``delivered``), and cuts the first ``cuts`` server-to-client
streams after ``after`` bytes (the network dropping a download). ``cuts`` may be raised
later; it counts down as streams are cut."""

from __future__ import annotations

import socket
import threading


class CuttingRelay:
    def __init__(self, upstream: tuple[str, int], after: int, cuts: int = 1) -> None:
        self.upstream, self.after, self.cuts = upstream, after, cuts
        self.requests: list[bytes] = []
        self.delivered = 0   # bytes passed from the server to clients, headers included
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            for src, dst, down in ((client, server, False), (server, client, True)):
                t = threading.Thread(target=self._pipe, args=(src, dst, down), daemon=True)
                self.threads.append(t)
                t.start()

    def _take_cut(self) -> bool:
        with self._lock:
            if self.cuts <= 0:
                return False
            self.cuts -= 1
            return True

    def _pipe(self, src: socket.socket, dst: socket.socket, down: bool) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if not down:
                    self.requests.append(data)
                elif sent + len(data) > self.after and self._take_cut():
                    dst.sendall(data[:self.after - sent])
                    break
                dst.sendall(data)
                sent += len(data)
                if down:
                    with self._lock:
                        self.delivered += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked in accept/recv
            except OSError:
                pass
            s.close()
        for t in self.threads:
            t.join(5)
