"""Registry authentication: the distribution token flow, anonymous or with credentials.

A registry that wants authentication answers 401 with a challenge::

    WWW-Authenticate: Bearer realm="https://auth.example/token",service="registry",scope="repository:m/tiny:pull"

The client then asks the realm for a token for that service and scope (anonymously, or
with HTTP basic credentials when it has some), and repeats the request with
``Authorization: Bearer <token>``. Public registries use this even for anonymous pulls.
A ``Basic`` challenge is answered with the credentials directly.

:class:`RegistryAuth` is a ``requests`` auth hook on the session of an OCI source or push:
it answers each challenge once per request, keeps the token for later requests, and renews
it before ``expires_in`` runs out (so a long upload does not meet a 401 halfway through
a body it cannot send again). Credentials come from the caller or from the environment
(``RESIDENT_OCI_USERNAME``/``RESIDENT_OCI_PASSWORD``); they are sent only to the realm the
registry names, and never logged.
"""

from __future__ import annotations

import base64
import os
import re
import time
from dataclasses import dataclass

import requests
from pydantic import BaseModel, Field, ValidationError
from requests.auth import AuthBase, HTTPBasicAuth

from ..errors import SourceUnavailable

CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
DEFAULT_TOKEN_SECONDS = 60  # the spec's default when a token answer names no lifetime
RENEW_MARGIN_SECONDS = 10


class TokenAnswer(BaseModel):
    """What a token service returns (both names of the token occur in the wild)."""

    token: str | None = None
    access_token: str | None = None
    expires_in: float | None = Field(default=None, gt=0)


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def __repr__(self) -> str:  # never print the password
        return f"Credentials(username={self.username!r})"

    @classmethod
    def from_env(cls) -> "Credentials | None":
        user, password = os.environ.get("RESIDENT_OCI_USERNAME"), os.environ.get("RESIDENT_OCI_PASSWORD")
        return cls(user, password or "") if user else None


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """(scheme, params) of a WWW-Authenticate header, e.g. ("bearer", {"realm": ...})."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(CHALLENGE_PARAM.findall(rest))


class RegistryAuth(AuthBase):
    """Answers registry challenges for one session; see the module docstring."""

    def __init__(self, credentials: Credentials | None, timeout: tuple[float, float]) -> None:
        self.credentials = credentials
        self.timeout = timeout
        self.header: str | None = None   # the Authorization value to send
        self.expires = float("inf")
        self.challenge: dict[str, str] | None = None  # the last bearer challenge, for renewal

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        if self.challenge and time.monotonic() > self.expires:
            self._fetch_token(self.challenge)
        if self.header:
            r.headers["Authorization"] = self.header
        r.register_hook("response", self._on_response)
        return r

    def _on_response(self, resp: requests.Response, **kwargs) -> requests.Response:
        if resp.status_code != 401 or getattr(resp.request, "resident_answered", False):
            return resp
        scheme, params = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
        if scheme == "bearer" and params.get("realm"):
            self._fetch_token(params)
        elif scheme == "basic" and self.credentials:
            pair = f"{self.credentials.username}:{self.credentials.password}".encode()
            self.header = "Basic " + base64.b64encode(pair).decode()
        else:
            return resp
        body = resp.request.body
        if hasattr(body, "read"):  # a streamed body was (partly) sent already: cannot repeat it
            return resp
        resp.content  # drain, so the connection can be reused
        resp.close()
        again = resp.request.copy()
        again.headers["Authorization"] = self.header
        again.resident_answered = True
        answer = resp.connection.send(again, **kwargs)
        answer.history.append(resp)
        answer.request = again
        return answer

    def _fetch_token(self, challenge: dict[str, str]) -> None:
        params = {k: v for k, v in challenge.items() if k in ("service", "scope")}
        auth = HTTPBasicAuth(self.credentials.username, self.credentials.password) \
            if self.credentials else None
        realm = challenge["realm"]
        try:
            resp = requests.get(realm, params=params, auth=auth, timeout=self.timeout)
        except requests.RequestException as e:
            raise SourceUnavailable(f"token service {realm}: {e}") from e
        if resp.status_code != 200:
            who = f"as {self.credentials.username!r}" if self.credentials else "anonymously"
            raise SourceUnavailable(f"token service {realm} refused a token for "
                                    f"{params.get('scope', '?')} {who}: HTTP {resp.status_code}")
        try:
            answer = TokenAnswer.model_validate_json(resp.content)
        except ValidationError:
            answer = None
        if answer is None or not (answer.token or answer.access_token):
            raise SourceUnavailable(f"token service {realm}: answer has no token")
        self.header = f"Bearer {answer.token or answer.access_token}"
        self.challenge = challenge
        lifetime = answer.expires_in or DEFAULT_TOKEN_SECONDS
        self.expires = time.monotonic() + max(1.0, lifetime - RENEW_MARGIN_SECONDS)
