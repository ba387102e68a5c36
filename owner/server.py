"""The owner's HTTP/JSON control API (the operator's port), on :mod:`owner.httpbase`.

Routes follow docs/contracts.md. ``GET /v1/transitions/{id}?waitSeconds=N`` blocks until
the transition has a result (or N seconds pass), so a caller needs no polling.
``/healthz``, ``/readyz`` and ``/metrics`` need no token; everything under ``/v1/`` needs
``Authorization: Bearer <token>``, compared in constant time. Bodies are JSON, at most
1 MiB, validated by the pydantic models in :mod:`owner.api`; every refusal is a JSON
``{"error": ...}`` with a 4xx/5xx code. Applications use the inference port
(:mod:`owner.inference`) instead.
"""

from __future__ import annotations

import hmac
import re
from urllib.parse import parse_qs, urlsplit

from pydantic import ValidationError

from . import api
from .httpbase import OwnerHandler, OwnerServer, Route, bind
from .runtime import Owner, Refused

TRANSITION_PATH = re.compile(r"^/v1/transitions/([0-9a-f]{1,64})$")
DECISION_PATH = re.compile(r"^/v1/transitions/([0-9a-f]{1,64})/(commit|abort)$")
MAX_WAIT_SECONDS = 60.0


def read_token(path: str) -> str:
    """The bearer token in ``path`` (surrounding whitespace stripped); refuse an empty one."""
    with open(path) as f:
        token = f.read().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def bearer_matches(header: str, token: str) -> bool:
    """Whether an Authorization header carries ``Bearer <token>`` (constant-time compare)."""
    return header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip().encode(), token.encode())


def explain(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'body'}: {err['msg']}" for err in e.errors())


class ControlHandler(OwnerHandler):
    token: str

    def _error(self, code: int, message: str, retry_after: int | None = None) -> None:
        self.close_connection = True  # an unread body must not leak into the next request
        headers = {"WWW-Authenticate": 'Bearer realm="resident-owner"'} if code == 401 else {}
        if retry_after:
            headers["Retry-After"] = str(retry_after)
        self._send(code, api.dump(api.ErrorResponse(error=message)), headers=headers)

    def _authorized(self) -> bool:
        ok = bearer_matches(self.headers.get("Authorization", ""), self.token)
        if not ok:
            self._error(401, "missing or wrong bearer token")
        return ok

    def _body(self, model: type):
        raw = self._read_body()
        try:
            return model.model_validate_json(raw)
        except ValidationError as e:
            raise Refused(400, f"invalid {model.__name__}: {explain(e)}") from None

    def _pattern_route(self, path: str) -> Route | None:
        match = TRANSITION_PATH.match(path)
        if match and self.command == "GET":
            return lambda: self._get_transition(match.group(1))
        decision = DECISION_PATH.match(path)
        if decision and self.command == "POST":
            return lambda: self._decide(decision.group(1), decision.group(2))
        return None

    # -- routes ------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch({**self._probes(), "/v1/identity": self._identity})

    def do_POST(self) -> None:
        self._dispatch({"/v1/transitions": self._post_transition, "/v1/generate": self._generate,
                        "/v1/preload": self._post_preload})

    def do_DELETE(self) -> None:
        self._dispatch({"/v1/preload": self._delete_preload})

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

    def _decide(self, tid: str, decision: str) -> None:
        """Commit or abort a prepared (Deferred) transition; 409 unless it is prepared."""
        if self._authorized():
            status = self.owner.commit(tid) if decision == "commit" else self.owner.abort(tid)
            self._send(200, api.dump(status))

    def _post_preload(self) -> None:
        """Preload a staged revision beside the live one; 202 with its state (loading, or as it is)."""
        if self._authorized():
            self._send(202, api.dump(self.owner.preload(self._body(api.PreloadRequest))))

    def _delete_preload(self) -> None:
        """Drop the preloaded revision; 200 with what it was, 404 when there was none."""
        if self._authorized():
            was = self.owner.preloads.drop()
            if was is None:
                raise Refused(404, "no revision is preloaded")
            self._send(200, api.dump(was))

    def _generate(self) -> None:
        if self._authorized():
            self._send(200, api.dump(self.owner.generate(self._body(api.GenerateRequest))))


def make_server(owner: Owner, token: str, host: str = "127.0.0.1", port: int = 8080) -> OwnerServer:
    """The control API bound to ``host:port`` (port 0 picks a free one) serving ``owner``."""
    return bind(ControlHandler, host, port, owner=owner, token=token)
