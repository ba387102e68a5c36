"""Draining the local node: every Pod deleted, and kubelet given the time to clean up after it.

Stopping kubelet with Pods still on the node would leave their volumes published: CSI
volumes mounted, leases held by the bridge, tmpfs Secrets mounted. So teardown first
deletes the workload controllers (with orphan propagation, so nothing recreates Pods),
then the Pods, in two waves: workload Pods, then DaemonSet Pods, because a CSI plugin
run as a DaemonSet must still be there when kubelet unpublishes the workloads' volumes.

A deleted Pod is done when kubelet has stopped its containers and torn down each volume
(kubelet removes a volume's directory only after TearDown, for CSI NodeUnpublishVolume,
succeeded). kubelet would then delete the Pod object itself, but only at its next status
sync; the drain deletes it as soon as the node shows the work is done. After ``timeout``
seconds a Pod is deleted forcibly and the host record's unmounts take over.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from .teardown import mounts_under

log = logging.getLogger(__name__)


def drain_pods(api, timeout: float, kubelet_dir: Callable[[str], Path]) -> None:
    """Delete every Pod and wait until kubelet has finished with it (volumes unpublished);
    ``kubelet_dir(node)`` is where this machine sees that node's kubelet directory."""
    from kubernetes import client

    core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
    orphan = client.V1DeleteOptions(propagation_policy="Orphan")
    # controllers first, so nothing recreates what we delete (their Pods stay, orphaned)
    for lister, deleter in ((apps.list_deployment_for_all_namespaces, apps.delete_namespaced_deployment),
                            (apps.list_replica_set_for_all_namespaces, apps.delete_namespaced_replica_set),
                            (apps.list_stateful_set_for_all_namespaces, apps.delete_namespaced_stateful_set),
                            (batch.list_job_for_all_namespaces, batch.delete_namespaced_job)):
        for item in lister().items:
            _ignore_missing(deleter, item.metadata.name, item.metadata.namespace, body=orphan)

    def is_daemon(pod) -> bool:
        return any(ref.kind == "DaemonSet" for ref in (pod.metadata.owner_references or []))

    # workload Pods before DaemonSet Pods: a CSI plugin run as a DaemonSet must still
    # be there when kubelet unpublishes the workloads' volumes
    for wave in ("workloads", "daemons"):
        if wave == "daemons":
            for ds in apps.list_daemon_set_for_all_namespaces().items:
                _ignore_missing(apps.delete_namespaced_daemon_set, ds.metadata.name, ds.metadata.namespace,
                                body=orphan)
        pods = [p for p in core.list_pod_for_all_namespaces().items if is_daemon(p) == (wave == "daemons")]
        for pod in pods:
            _ignore_missing(core.delete_namespaced_pod, pod.metadata.name, pod.metadata.namespace,
                            grace_period_seconds=2)
        deadline = time.monotonic() + timeout
        names = {(p.metadata.namespace, p.metadata.name) for p in pods}
        while names and time.monotonic() < deadline:
            present = {(p.metadata.namespace, p.metadata.name): p
                       for p in core.list_pod_for_all_namespaces().items}
            names &= set(present)
            for key in list(names):
                if released_by_kubelet(present[key], kubelet_dir):
                    # kubelet would delete the object itself, but only at its next
                    # status sync (up to 10 s later); its work on the node is done
                    _ignore_missing(core.delete_namespaced_pod, key[1], key[0], grace_period_seconds=0)
                    names.discard(key)
            time.sleep(0.5)
        for namespace, name in names:
            log.warning("pod %s/%s did not terminate in %.0fs; deleting it forcibly",
                        namespace, name, timeout)
            _ignore_missing(core.delete_namespaced_pod, name, namespace, grace_period_seconds=0)


def released_by_kubelet(pod, kubelet_dir: Callable[[str], Path]) -> bool:
    """A deleted Pod whose containers have all stopped and whose volumes are all torn down."""
    if pod.metadata.deletion_timestamp is None:
        return False
    statuses = list(pod.status.container_statuses or []) + list(pod.status.init_container_statuses or [])
    if any(s.state is None or s.state.terminated is None for s in statuses):
        return False
    if not pod.spec.node_name:
        return True   # never scheduled: nothing on a node to wait for
    pod_dir = kubelet_dir(pod.spec.node_name) / "pods" / pod.metadata.uid
    if mounts_under([str(pod_dir)]):
        return False
    # kubelet removes a volume's directory only after its TearDown (CSI: NodeUnpublishVolume) succeeded
    volumes = pod_dir / "volumes"
    try:
        return not any(any(kind.iterdir()) for kind in volumes.iterdir() if kind.is_dir())
    except FileNotFoundError:
        return True


def _ignore_missing(call, *args, **kwargs) -> None:
    from kubernetes.client.rest import ApiException

    try:
        call(*args, **kwargs)
    except ApiException as e:
        if e.status != 404:
            raise
