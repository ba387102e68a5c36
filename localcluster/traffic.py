"""Application traffic on a model's Service, for the e2e tests and experiments/11.

The local node runs no kube-proxy, so a client here does what kube-proxy would: it
follows the Service's Endpoints (re-read every 20 ms) and sends each request to one of
the ready addresses, round robin. :class:`ClosedLoop` keeps ``clients`` requests in
flight (each client sends its next request when the last one is answered) and records
every request: when it started and ended, its HTTP status (0 for a connection error,
-1 when the Endpoints listed no ready address), ``Retry-After`` and the revision that
answered (``Resident-Revision``).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import requests


class EndpointsFollower:
    """The ready ``ip:port`` addresses of a Service's port ``http``, kept current."""

    def __init__(self, core, namespace: str, service: str, every: float = 0.02):
        self.core, self.namespace, self.service, self.every = core, namespace, service, every
        self.addresses: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"endpoints-{service}", daemon=True)
        self._turn = 0

    def __enter__(self) -> "EndpointsFollower":
        self.addresses = self.read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def read(self) -> list[str]:
        resp = self.core.read_namespaced_endpoints(self.service, self.namespace, _preload_content=False)
        out = []
        for subset in json.loads(resp.data).get("subsets") or []:
            ports = [p["port"] for p in subset.get("ports") or [] if p.get("name") == "http"]
            out += [f"{a['ip']}:{port}" for a in subset.get("addresses") or [] for port in ports]
        return sorted(out)

    def _follow(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.addresses = self.read()
            except Exception:  # noqa: BLE001 - an API hiccup keeps the last known addresses
                pass

    def pick(self) -> str | None:
        addresses = self.addresses
        if not addresses:
            return None
        self._turn += 1
        return addresses[self._turn % len(addresses)]


@dataclass(frozen=True)
class Answer:
    start: float
    end: float
    status: int            # HTTP status; 0 connection error; -1 no ready endpoint
    revision: str = ""
    retry_after: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


class ClosedLoop:
    """``clients`` threads, each sending a completion as soon as its last one is answered."""

    def __init__(self, target, model: str, clients: int = 4, max_tokens: int = 8,
                 prompt: str = "Resident keeps models", api_key: str | None = None):
        self.target = target          # a callable returning "ip:port" or None
        self.body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.answers: list[Answer] = []
        self.backoff = 0.05     # after a 503, a reset or no endpoint (Retry-After, only sooner)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, name=f"client-{i}", daemon=True)
                         for i in range(clients)]

    def __enter__(self) -> "ClosedLoop":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _client(self) -> None:
        session = requests.Session()
        while not self._stop.is_set():
            address, start = self.target(), time.monotonic()
            if address is None:
                self._record(Answer(start, time.monotonic(), -1, error="no ready endpoint"))
                time.sleep(self.backoff)
                continue
            try:
                resp = session.post(f"http://{address}/v1/completions", json=self.body,
                                    headers=self.headers, timeout=60)
                self._record(Answer(start, time.monotonic(), resp.status_code,
                                    resp.headers.get("Resident-Revision", ""),
                                    resp.headers.get("Retry-After", ""),
                                    "" if resp.ok else resp.text[:200]))
                if resp.status_code == 503:
                    time.sleep(self.backoff)
            except requests.RequestException as e:
                self._record(Answer(start, time.monotonic(), 0, error=f"{type(e).__name__}: {e}"))
                time.sleep(self.backoff)

    def _record(self, answer: Answer) -> None:
        with self._lock:
            self.answers.append(answer)

    def between(self, t0: float, t1: float) -> list[Answer]:
        """Answers to requests that were in flight at any time in [t0, t1]."""
        with self._lock:
            return [a for a in self.answers if a.end >= t0 and a.start <= t1]
