"""Leader election: one active operator among replicas, by a coordination.k8s.io Lease.

With ``--leader-elect`` every replica of ``resident operator`` first tries to hold the
Lease ``<id>`` in its namespace, and only the holder runs kopf; the others wait as
standbys. The rules are client-go's:

- The holder renews the Lease every ``retry`` seconds. If it has not renewed for
  ``renew_deadline`` seconds (API server unreachable, lost a race), it exits at once with
  status 1 and kubelet restarts it as a standby: it stops acting before anyone else may
  take over.
- A standby takes the Lease over when its record (holder and renew time) has not changed
  for ``lease_duration`` seconds *as measured on the standby's own clock*, so clock skew
  between nodes does not matter. Writes carry the resourceVersion read, so of two
  standbys racing for it one wins and the other sees a conflict.
- Every call to the API server has a timeout of half the time between the renew deadline
  and the Lease's duration, so an attempt (a read and a write) that started before the
  deadline ends before the Lease expires: a holder whose renewal hangs (an API server
  killed mid-call, a connection that never answers) still stops in time, and a standby
  whose attempt hangs tries again.
- A holder that stops cleanly (SIGTERM) releases the Lease, and a standby takes over at
  its next try instead of waiting for expiry.
- A holder of the same Pod takes the Lease over at once: in a Pod (the chart passes its
  UID as ``POD_UID``) the identity names the Pod, and a container runs one process at a
  time, so that holder is this container's previous run, which kubelet stopped before
  starting this one. A killed or crashed leader is back in seconds, not after
  ``lease_duration``. Processes outside a Pod never take this shortcut.

Every model's durable state is in its status, so the new leader resumes each model,
transitions in flight included, where the old one left it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import kubernetes
import urllib3
from kubernetes.client.rest import ApiException

log = logging.getLogger("resident.operator")

# what a call to the API server raises when it did not get an answer: refused, reset,
# timed out (urllib3's errors are not OSErrors), or an answer that was an error
UNANSWERED = (ApiException, urllib3.exceptions.HTTPError, OSError)


def default_identity() -> str:
    """The Pod's name when it runs in one (a hostname) and its UID when the chart passes it
    (``POD_UID``), made unique per process: ``<name>[@<uid>]_<random>``."""
    pod = os.environ.get("POD_UID")
    return f"{socket.gethostname()}{'@' + pod if pod else ''}_{uuid.uuid4().hex[:8]}"


def same_pod(a: str, b: str) -> bool:
    """Whether two identities are runs of the same Pod (both name its UID)."""
    pod_a, pod_b = a.rpartition("_")[0], b.rpartition("_")[0]
    return "@" in pod_a and pod_a == pod_b


def _micro_time(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Leadership:
    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, name: str,
                 identity: str | None = None, lease_duration: float = 15.0,
                 renew_deadline: float = 10.0, retry: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not retry < renew_deadline < lease_duration:
            raise ValueError("leader election needs retry < renew deadline < lease duration")
        config = copy.copy(api.configuration)
        config.retries = False         # one try per call, bounded by request_timeout (urllib3 would try 4)
        self.api = kubernetes.client.CoordinationV1Api(kubernetes.client.ApiClient(config))
        self.namespace, self.name = namespace, name
        self.identity = identity or default_identity()
        self.lease_duration, self.renew_deadline, self.retry = lease_duration, renew_deadline, retry
        self.clock = clock
        self.request_timeout = (lease_duration - renew_deadline) / 2
        self._observed: tuple[tuple[Any, Any], float] | None = None   # (record, local time seen)
        self.tried_at = clock()   # the last attempt of :meth:`acquire`'s loop

    def waiting_alive(self) -> bool:
        """Is :meth:`acquire`'s loop still trying (an attempt within three retries)?"""
        return self.clock() - self.tried_at <= 3 * self.retry

    # -- one attempt -----------------------------------------------------------------
    def try_hold(self) -> bool:
        """Acquire or renew the Lease once; True if this process holds it now."""
        try:
            lease = self._read()
        except ApiException as e:
            if e.status != 404:
                raise
            return self._write("create", self._fresh_lease())
        spec = lease.setdefault("spec", {})
        record = (spec.get("holderIdentity"), spec.get("renewTime"))
        now = self.clock()
        if self._observed is None or self._observed[0] != record:
            self._observed = (record, now)
        holder = spec.get("holderIdentity")
        if holder and holder != self.identity and not same_pod(holder, self.identity) \
                and now - self._observed[1] < self.lease_duration:
            return False           # held by someone alive
        stamp = _micro_time(datetime.now(timezone.utc))
        if holder != self.identity:
            spec.update(acquireTime=stamp, leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1)
        spec.update(holderIdentity=self.identity, renewTime=stamp,
                    leaseDurationSeconds=int(self.lease_duration))
        return self._write("replace", lease)

    def release(self) -> None:
        """Give the Lease up if this process holds it (a clean stop)."""
        try:
            lease = self._read()
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"].update(holderIdentity=None, leaseDurationSeconds=1)
            self._write("replace", lease)
            log.info("leader election: released", extra={"lease": self.where, "identity": self.identity})
        except ApiException as e:
            log.warning("leader election: could not release", extra={"lease": self.where, "error": str(e)})

    # -- loops -----------------------------------------------------------------------
    def acquire(self, stop: threading.Event) -> bool:
        """Block until this process holds the Lease (True) or ``stop`` is set (False)."""
        log.info("leader election: waiting for the lease", extra={"lease": self.where,
                                                                  "identity": self.identity})
        while not stop.is_set():
            self.tried_at = self.clock()
            try:
                if self.try_hold():
                    log.info("leader election: acquired", extra={"lease": self.where,
                                                                 "identity": self.identity})
                    return True
            except UNANSWERED as e:
                log.warning("leader election: cannot reach the lease", extra={"error": str(e)})
            stop.wait(self.retry)
        return False

    def keep(self, stop: threading.Event, lost: Callable[[], None] | None = None) -> threading.Thread:
        """Renew in a thread until ``stop``; call ``lost`` (default: exit 1 now) if renewal
        failed for ``renew_deadline`` seconds, or at once if it broke in a way it cannot
        try again (the thread never ends while this process acts as the leader)."""
        def renew() -> None:
            held_at = self.clock()
            while not stop.wait(self.retry):
                try:
                    if self.try_hold():
                        held_at = self.clock()
                        continue
                except UNANSWERED as e:
                    log.warning("leader election: renewal failed", extra={"error": str(e)})
                except Exception:   # the loop must not end while kopf acts: stop with it
                    log.exception("leader election: renewal broke; stopping at once",
                                  extra={"lease": self.where, "identity": self.identity})
                    (lost or _exit_now)()
                    return
                if self.clock() - held_at >= self.renew_deadline:
                    log.error("leader election: lost the lease; stopping at once",
                              extra={"lease": self.where, "identity": self.identity})
                    (lost or _exit_now)()
                    return
        thread = threading.Thread(target=renew, name="leader-election", daemon=True)
        thread.start()
        return thread

    # -- the API ---------------------------------------------------------------------
    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _read(self) -> dict[str, Any]:
        return json.loads(self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                         _request_timeout=self.request_timeout).data)

    def _fresh_lease(self) -> dict[str, Any]:
        stamp = _micro_time(datetime.now(timezone.utc))
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration),
                         "acquireTime": stamp, "renewTime": stamp, "leaseTransitions": 0}}

    def _write(self, verb: str, lease: dict[str, Any]) -> bool:
        """Create or replace (with the resourceVersion read); False if another won the race."""
        try:
            if verb == "create":
                self.api.create_namespaced_lease(self.namespace, lease, _preload_content=False,
                                                 _request_timeout=self.request_timeout)
            else:
                self.api.replace_namespaced_lease(self.name, self.namespace, lease, _preload_content=False,
                                                  _request_timeout=self.request_timeout)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise


def _exit_now() -> None:
    logging.shutdown()
    os._exit(1)


@contextlib.contextmanager
def standby_liveness(url: str | None, alive: Callable[[], bool]) -> Iterator[None]:
    """Answer kubelet's liveness probe at ``url`` (kopf's liveness endpoint, which only
    exists once this process leads) while it waits as a standby: 200 while ``alive()``,
    else 503. Without it a standby fails the probe and kubelet kills it every minute or
    so, ever later (its crash-loop back-off), and there is no standby to take over. The
    port is free again when the block ends, for kopf to bind."""
    if not url:
        yield
        return
    where = urlsplit(url)
    path = where.path or "/"

    class Probe(BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802 - http.server's name
            ok = self.path.split("?", 1)[0] == path and alive()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:   # kubelet asks every period: no line each time
            pass

    server = ThreadingHTTPServer((where.hostname or "0.0.0.0", where.port or 80), Probe)
    thread = threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
