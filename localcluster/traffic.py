"""Application traffic on a model's Service, for the e2e tests and experiments/11.

Clients call the Service's ClusterIP, as an application in the cluster would; kube-proxy
picks a ready owner for each connection. :class:`ClosedLoop` keeps ``clients`` requests in
flight (each client sends its next request when the last one is answered, on a new
connection, so each request is balanced on its own) and records every request: when it
started and ended, its HTTP status (0 for a connection error), ``Retry-After`` and the
revision that answered (``Resident-Revision``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import requests


def service_address(core, namespace: str, service: str, port_name: str = "http") -> str:
    """``clusterIP:port`` of a Service's port ``port_name``."""
    svc = core.read_namespaced_service(service, namespace)
    port = next(p.port for p in svc.spec.ports if p.name == port_name)
    return f"{svc.spec.cluster_ip}:{port}"


def wait_routed(address: str, what: str, timeout: float = 60.0) -> None:
    """Wait until the inference API answers at ``address`` (a Service's ClusterIP:port):
    kube-proxy programs a node's rules for a Service's endpoints a moment after the owner
    Pods are ready (and so after the model's status says Ready), and until then a
    connection fails with 'No route to host'."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if requests.get(f"http://{address}/v1/models", timeout=2.0).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: its Service does not answer {timeout:.0f} s after the model is ready")
        time.sleep(0.2)


@dataclass(frozen=True)
class Answer:
    start: float
    end: float
    status: int            # HTTP status; 0 connection error
    revision: str = ""
    retry_after: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


class ClosedLoop:
    """``clients`` threads, each sending a completion as soon as its last one is answered."""

    def __init__(self, address: str, model: str, clients: int = 4, max_tokens: int = 8,
                 prompt: str = "Resident keeps models", api_key: str | None = None, pause: float = 0.0):
        self.address = address        # "ip:port", the Service's ClusterIP
        self.body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
        self.pause = pause            # seconds a client waits after an answer before its next request
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.answers: list[Answer] = []
        self.backoff = 0.05     # after a 503 or a reset (Retry-After, only sooner)
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
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                resp = requests.post(f"http://{self.address}/v1/completions", json=self.body,
                                     headers=self.headers, timeout=60)
                self._record(Answer(start, time.monotonic(), resp.status_code,
                                    resp.headers.get("Resident-Revision", ""),
                                    resp.headers.get("Retry-After", ""),
                                    "" if resp.ok else resp.text[:200]))
                if resp.status_code == 503:
                    time.sleep(self.backoff)
                elif self.pause:
                    self._stop.wait(self.pause)
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
