"""Calls from the operator to an owner's control API (docs/contracts.md).

An owner listens on ``podIP:spec.runtime.port`` (or on ``RESIDENT_OWNER_HOST`` when the
installation says so, e.g. 127.0.0.1 on a single-node local cluster) and requires the
model's bearer token. Every call has a timeout; a connection failure or a non-2xx answer
raises :class:`OwnerUnreachable` with the address and what went wrong, never the token.
"""

from __future__ import annotations

from typing import Any

import requests

from .context import OwnerWait


class OwnerUnreachable(RuntimeError):
    """The owner did not answer, or answered with an error status."""


class OwnerClient:
    def __init__(self, host: str, port: int, token: str, timeout: float = 5.0) -> None:
        host = f"[{host}]" if ":" in host else host
        self.base = f"http://{host}:{port}"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              allow: tuple[int, ...] = ()) -> tuple[int, dict[str, Any]]:
        url = self.base + path
        try:
            resp = requests.request(method, url, json=body, headers=self.headers,
                                    timeout=self.timeout)
        except requests.RequestException as e:
            raise OwnerUnreachable(f"{method} {url}: {type(e).__name__}: {e}") from None
        if resp.status_code >= 400 and resp.status_code not in allow:
            raise OwnerUnreachable(f"{method} {url}: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            return resp.status_code, resp.json()
        except ValueError:
            raise OwnerUnreachable(f"{method} {url}: answer is not JSON: {resp.text[:200]!r}") from None

    def identity(self) -> dict[str, Any]:
        return self._call("GET", "/v1/identity")[1]

    def start_transition(self, target: str, path: str, strategy: str,
                         drain_seconds: float = 0.0, leave_endpoints: bool = True) -> dict[str, Any]:
        """Start a transition. A reload first keeps serving, not ready, for ``drain_seconds``
        so that the owner leaves its Service's Endpoints before the old revision closes;
        with ``leave_endpoints`` false it stays in them (a model's only replica)."""
        body: dict[str, Any] = {"target": target, "path": path, "strategy": strategy}
        if drain_seconds > 0:   # owners before drains existed accept the request without it
            body["drainSeconds"] = drain_seconds
        if not leave_endpoints:
            body["leaveEndpoints"] = False
        return self._call("POST", "/v1/transitions", body)[1]

    def wait(self, transition_id: str) -> OwnerWait:
        """How to wait for this transition's result (the driver does it, asynchronously)."""
        return OwnerWait(url=f"{self.base}/v1/transitions/{transition_id}",
                         token=self.headers["Authorization"][len("Bearer "):])

    def transition(self, transition_id: str) -> dict[str, Any] | None:
        """The owner's record of a transition, or None if it does not know the id (404)."""
        status, body = self._call("GET", f"/v1/transitions/{transition_id}", allow=(404,))
        return None if status == 404 else body
