"""Orphaned half-publishes: release what a vanished Pod can no longer ask to release.

A publish interrupted by a crash is rolled back to ``publishing`` with its lease kept, so
kubelet's retry can finish it. If the Pod was deleted meanwhile, kubelet never calls
again (a volume whose set-up never succeeded is not unpublished), and the lease would pin
content forever. With API access the bridge checks such records once they are older than
``grace_seconds``: if the Pod they name is gone (404, or the name now belongs to a Pod
with another UID) the record is unpublished, which releases its lease. A Pod that still
exists, an API error, or a record without Pod information leaves everything as it is:
nothing is released because something failed. An API error is not read as "the Pod
exists": it is logged at error level, with a hint when it is a 403 (the bridge's
ServiceAccount needs ``get`` on pods, which the chart's ClusterRole grants).
"""

from __future__ import annotations

import logging
import threading
import time

from .locks import VolumeLocks

log = logging.getLogger("resident.bridge.sweep")


class PodUnknown(Exception):
    """The API did not say whether the Pod exists (not a 404): nothing may be released."""


def pod_is_gone(core_api, namespace: str, name: str, uid: str) -> bool:
    from kubernetes.client.exceptions import ApiException
    try:
        pod = core_api.read_namespaced_pod(name, namespace, _request_timeout=10)
    except ApiException as e:
        if e.status == 404:
            return True
        hint = ("; the bridge's ServiceAccount needs 'get' on pods (the chart's bridge "
                "ClusterRole grants it)") if e.status == 403 else ""
        raise PodUnknown(f"cannot tell whether Pod {namespace}/{name} is gone: HTTP {e.status} "
                         f"{e.reason}{hint}") from None
    return pod.metadata.uid != uid


class OrphanSweeper:
    def __init__(self, publisher, state, locks: VolumeLocks, api_client,
                 grace_seconds: float = 600.0, interval_seconds: float = 60.0):
        from kubernetes import client
        self.publisher, self.state, self.locks = publisher, state, locks
        self.core = client.CoreV1Api(api_client)
        self.grace, self.interval = grace_seconds, interval_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="orphan-sweep", daemon=True)

    def sweep(self) -> list[str]:
        """One pass; returns the target paths whose half-publish was released."""
        released = []
        cutoff = time.time() - self.grace
        for rec in self.state.publications("state='publishing' AND updated < ?", (cutoff,)):
            if not (rec.pod_namespace and rec.pod_name and rec.pod_uid):
                continue
            try:
                if not pod_is_gone(self.core, rec.pod_namespace, rec.pod_name, rec.pod_uid):
                    continue
                with self.locks.hold(f"volume {rec.volume_id}", f"target {rec.target_path}"):
                    current = self.state.publication(rec.target_path)
                    if current is None or current.state != "publishing":
                        continue
                    self.state.set_publication_state(rec.target_path, "unpublishing")
                    self.publisher.finish_unpublish(current)
                released.append(rec.target_path)
                log.info("released the half-publish of a deleted Pod",
                         extra={"volume": rec.volume_id, "pod": rec.pod_name,
                                "namespace": rec.pod_namespace})
            except Exception as e:  # kept, and tried again at the next pass
                log.error("orphan sweep kept a half-publish it could not check",
                          extra={"target": rec.target_path, "pod": rec.pod_name,
                                 "namespace": rec.pod_namespace, "error": str(e)})
        return released

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        self.sweep()
        while not self._stop.wait(self.interval):
            self.sweep()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
