"""The owner's HTTP/JSON control API on the standard library's threading HTTP server.

Routes follow docs/contracts.md. ``GET /v1/transitions/{id}?waitSeconds=N`` blocks until
the transition has a result (or N seconds pass), so a caller needs no polling.
``/healthz``, ``/readyz`` and ``/metrics`` need no token; everything under ``/v1/`` needs ``Authorization: Bearer <token>``, compared in
constant time. Bodies are JSON, at most 1 MiB, validated by the pydantic models in
:mod:`owner.api`; every refusal is a JSON ``{"error": ...}`` with a 4xx/5xx code.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from . import api
from .runtime import Owner, Refused

log = logging.getLogger("resident.owner.http")
MAX_BODY = 1024 * 1024
TRANSITION_PATH = re.compile(r"^/v1/transitions/([0-9a-f]{1,64})$")
MAX_WAIT_SECONDS = 60.0


def read_token(path: str) -> str:
    """The bearer token in ``path`` (surrounding whitespace stripped); refuse an empty one."""
    with open(path) as f:
        token = f.read().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def _explain(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'body'}: {err['msg']}" for err in e.errors())


class OwnerHandler(BaseHTTPRequestHandler):
    owner: Owner
    token: str
    protocol_version = "HTTP/1.1"
    server_version = "resident-owner"

    # -- plumbing ----------------------------------------------------------------
    def log_message(self, fmt: str, *args) -> None:  # route access logs to structured logging
        log.debug("http", extra={"client": self.client_address[0], "line": fmt % args})

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if code == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="resident-owner"')
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, message: str) -> None:
        self.close_connection = True  # an unread body must not leak into the next request
        self._send(code, api.dump(api.ErrorResponse(error=message)))

    def _authorized(self) -> bool:
        got = self.headers.get("Authorization", "")
        ok = got.startswith("Bearer ") and hmac.compare_digest(got[7:].strip().encode(), self.token.encode())
        if not ok:
            self._error(401, "missing or wrong bearer token")
        return ok

    def _body(self, model: type):
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise Refused(411, "a JSON body with Content-Length is required")
        if int(length) > MAX_BODY:
            raise Refused(413, f"body of {length} bytes is over the limit of {MAX_BODY}")
        raw = self.rfile.read(int(length))
        try:
            return model.model_validate_json(raw)
        except ValidationError as e:
            raise Refused(400, f"invalid {model.__name__}: {_explain(e)}") from None

    def _dispatch(self, routes: dict) -> None:
        t0 = time.perf_counter()
        path = self.path.split("?", 1)[0]
        try:
            handler = routes.get(path)
            match = TRANSITION_PATH.match(path)
            if handler is None and match and self.command == "GET":
                handler = lambda: self._get_transition(match.group(1))  # noqa: E731
            if handler is None:
                self._error(404, f"no route {self.command} {path}")
            else:
                handler()
        except Refused as e:
            self._error(e.status, str(e))
        except Exception as e:  # noqa: BLE001 - a handler bug must not kill the connection silently
            log.exception("request failed", extra={"path": path})
            self._error(500, f"{type(e).__name__}: {e}")
        level = logging.DEBUG if path in ("/healthz", "/readyz", "/metrics") else logging.INFO
        log.log(level, "request", extra={"method": self.command, "path": path,
                                         "seconds": round(time.perf_counter() - t0, 6)})

    # -- routes ------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch({"/healthz": self._healthz, "/readyz": self._readyz, "/metrics": self._metrics,
                        "/v1/identity": self._identity})

    def do_POST(self) -> None:
        self._dispatch({"/v1/transitions": self._post_transition, "/v1/generate": self._generate})

    def _healthz(self) -> None:
        self._send(200, json.dumps({"state": self.owner.state}).encode())

    def _readyz(self) -> None:
        ready = self.owner.state == "ready"
        self._send(200 if ready else 503, json.dumps({"ready": ready, "state": self.owner.state}).encode())

    def _metrics(self) -> None:
        self._send(200, generate_latest(self.owner.metrics.registry), CONTENT_TYPE_LATEST)

    def _identity(self) -> None:
        if self._authorized():
            self._send(200, api.dump(self.owner.identity()))

    def _wait_seconds(self) -> float:
        """``?waitSeconds=N`` (0 to 60): how long a GET of a running transition may block."""
        query = parse_qs(urlsplit(self.path).query)
        raw = (query.get("waitSeconds") or ["0"])[-1]
        try:
            seconds = float(raw)
        except ValueError:
            raise Refused(400, f"waitSeconds={raw!r} is not a number") from None
        if not 0 <= seconds <= MAX_WAIT_SECONDS:
            raise Refused(400, f"waitSeconds={raw} is outside 0..{MAX_WAIT_SECONDS:.0f}")
        return seconds

    def _get_transition(self, tid: str) -> None:
        if not self._authorized():
            return
        status = self.owner.wait_transition(tid, self._wait_seconds())   # 0: as it is now
        if status is None:
            raise Refused(404, f"no transition {tid}")
        self._send(200, api.dump(status))

    def _post_transition(self) -> None:
        if self._authorized():
            status = self.owner.submit(self._body(api.TransitionRequest))
            self._send(202, api.dump(status))

    def _generate(self) -> None:
        if self._authorized():
            self._send(200, api.dump(self.owner.generate(self._body(api.GenerateRequest))))


class OwnerServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_server(owner: Owner, token: str, host: str = "127.0.0.1", port: int = 8080) -> OwnerServer:
    """An HTTP server bound to ``host:port`` (port 0 picks a free one) serving ``owner``."""
    handler = type("BoundOwnerHandler", (OwnerHandler,), {"owner": owner, "token": token})
    return OwnerServer((host, port), handler)
