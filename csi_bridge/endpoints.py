"""The bridge's HTTP endpoints: ``/metrics`` for Prometheus, ``/healthz`` for kubelet.

Each endpoint is a WSGI app at a path, on a port. Every port gets one listener, made the
same way: the standard library's WSGI server with a thread per request, bound to one
address (IPv4 or IPv6, as the address resolves), answering 404 for any other path and
writing no access log (the bridge logs JSON lines, :mod:`bundle.jsonlog`). Endpoints
given the same port share its listener; the chart gives them two, so the liveness port
is the same in both of its registration modes (docs/csi-bridge.md, "Liveness").
"""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

App = Callable[..., Iterable[bytes]]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow request never holds up stop()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


def _route(apps: dict[str, App]) -> App:
    def app(environ, start_response):
        handler = apps.get(environ.get("PATH_INFO") or "/")
        if handler is None:
            body = ("not found; served here: " + " ".join(sorted(apps)) + "\n").encode()
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8"),
                                             ("Content-Length", str(len(body)))])
            return [body]
        return handler(environ, start_response)
    return app


class Listener:
    """One port: a server thread serving ``apps`` (path → WSGI app) until :meth:`close`."""

    def __init__(self, address: str, port: int, apps: dict[str, App]):
        family, _, _, _, sockaddr = socket.getaddrinfo(
            address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        server_class = type("Server", (_ThreadingServer,), {"address_family": family})
        self.server = make_server(sockaddr[0], port, _route(apps), server_class,
                                  handler_class=_QuietHandler)
        self.address, self.port, self.paths = address, self.server.server_port, sorted(apps)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       name=f"http-{self.port}", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(address: str, endpoints: dict[str, tuple[int, App]]) -> dict[str, Listener]:
    """Start one listener per port for ``endpoints`` (path → (port, app)); return each
    path's listener. Port 0 is a free port, one for all the paths given 0."""
    by_port: dict[int, dict[str, App]] = {}
    for path, (port, app) in endpoints.items():
        by_port.setdefault(port, {})[path] = app
    listeners: dict[str, Listener] = {}
    try:
        for port, apps in by_port.items():
            listener = Listener(address, port, apps)
            listeners.update((path, listener) for path in apps)
    except BaseException:
        for listener in set(listeners.values()):
            listener.close()
        raise
    return listeners
