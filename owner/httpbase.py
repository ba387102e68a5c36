"""HTTP plumbing both owner ports share: sending, bounded bodies, routing with timing
logs, the probes (``/healthz``, ``/readyz``, ``/metrics``) and a threading server.

A port's handler subclasses :class:`OwnerHandler` and says how an error looks on it
(:meth:`OwnerHandler._error`): the control port answers ``{"error": "..."}``, the
inference port OpenAI's error object. Routes raise :class:`~owner.runtime.Refused`;
anything else a route raises is logged and answered 500.
"""

from __future__ import annotations

import json
import logging
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .runtime import Owner, Refused

log = logging.getLogger("resident.owner.http")
MAX_BODY = 1024 * 1024
PROBES = ("/healthz", "/readyz", "/metrics")
Route = Callable[[], None]


class OwnerHandler(BaseHTTPRequestHandler):
    owner: Owner
    protocol_version = "HTTP/1.1"
    server_version = "resident-owner"
    code = 0  # the status code sent on this request, 0 before
    client_facing = False  # the port the model's Service sends applications to

    def log_message(self, fmt: str, *args) -> None:  # route access logs to structured logging
        log.debug("http", extra={"client": self.client_address[0], "line": fmt % args})

    def send_response(self, code: int, message: str | None = None) -> None:
        self.code = code
        super().send_response(code, message)

    def _send(self, code: int, body: bytes, ctype: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, message: str, retry_after: int | None = None) -> None:
        raise NotImplementedError

    def _refuse(self, e: Refused) -> None:
        self._error(e.status, str(e), e.retry_after)

    def _read_body(self) -> bytes:
        """The request body, at most MAX_BODY bytes, as its Content-Length says."""
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True  # whatever follows cannot be framed
            raise Refused(411, "a JSON body with Content-Length is required")
        if int(length) > MAX_BODY:
            self.close_connection = True  # the unread body must not leak into the next request
            raise Refused(413, f"body of {length} bytes is over the limit of {MAX_BODY}")
        return self.rfile.read(int(length))

    # -- routing -------------------------------------------------------------------
    def _admit(self, path: str) -> None:
        """Checks before any route runs (raise Refused); none by default."""

    def _pattern_route(self, path: str) -> Route | None:
        """A route for a path with parameters; none by default."""
        return None

    def _dispatch(self, routes: dict[str, Route]) -> None:
        t0 = time.perf_counter()
        path = self.path.split("?", 1)[0]
        if self.client_facing and path not in PROBES:
            self.owner.arrivals.note()   # the drains wait until clients stop coming
        self.code = 0  # one handler serves every request of a kept-alive connection
        try:
            self._admit(path)
            handler = routes.get(path) or self._pattern_route(path)
            if handler is None:
                raise Refused(404, f"no route {self.command} {path}")
            handler()
        except Refused as e:
            self._refuse(e)
        except Exception as e:  # noqa: BLE001 - a handler bug must not kill the connection silently
            log.exception("request failed", extra={"path": path})
            if self.code:  # the answer had begun: the connection is all we can end
                self.close_connection = True
            else:
                self._error(500, f"{type(e).__name__}: {e}")
        level = logging.DEBUG if path in PROBES else logging.INFO
        log.log(level, "request", extra={"method": self.command, "path": path, "code": self.code,
                                         "seconds": round(time.perf_counter() - t0, 6)})

    # -- probes --------------------------------------------------------------------
    def _probes(self) -> dict[str, Route]:
        return {"/healthz": self._healthz, "/readyz": self._readyz, "/metrics": self._metrics}

    def _healthz(self) -> None:
        self._send(200, json.dumps({"state": self.owner.state}).encode())

    def _readyz(self) -> None:
        ready = self.owner.ready
        self._send(200 if ready else 503, json.dumps({"ready": ready, "state": self.owner.state}).encode())

    def _metrics(self) -> None:
        self._send(200, generate_latest(self.owner.metrics.registry), CONTENT_TYPE_LATEST)


class OwnerServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def bind(handler: type[OwnerHandler], host: str, port: int, **attributes) -> OwnerServer:
    """A server on ``host:port`` (port 0 picks a free one) whose handlers carry ``attributes``."""
    bound = type(f"Bound{handler.__name__}", (handler,), attributes)
    return OwnerServer((host, port), bound)
