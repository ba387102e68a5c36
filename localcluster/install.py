"""Install Resident into a LocalCluster the way a platform team would: the Helm chart.

The project image (operator, bridge and owner in one) is built from Debian packages plus
the wheel and imported into the node's containerd (:mod:`localcluster.images`; the same
image ``scripts/images --out DIR`` hands users for their registry); then
``charts/resident`` is installed with Helm's own library (:mod:`charts.helmenv`) and
the chart's defaults: the local cluster has a Pod network, Services and cluster DNS, so
only the image (imported, never pulled) and the bridge's store directory are set.
:func:`install` returns when the operator runs and kubelet has registered the driver.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from .images import project_image

log = logging.getLogger(__name__)
DRIVER = "bundles.resident.dev"
NAMESPACE = "resident-system"
RELEASE = "resident"
CRDS = ["residentmodels.resident.dev", "bundledeliveries.resident.dev"]


def local_values(image: str, bridge_root: Path) -> dict:
    """The chart values for the local cluster: the chart's defaults (Pod network, owners at
    their Pod IPs, in-cluster API access through the ``kubernetes`` Service), with the image
    imported by hand and the bridge's store where this cluster keeps it."""
    repository, tag = image.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "bridge": {
            "storeDir": str(bridge_root),
            "registration": {"mode": "builtin"},  # the bridge registers and serves /healthz itself
        },
    }


@dataclass
class Installation:
    image: str
    namespace: str
    release: str
    helm: object
    bridge_root: Path

    def uninstall(self) -> None:
        self.helm.uninstall(self.release)


def install(cluster, namespace: str = NAMESPACE, release: str = RELEASE,
            timeout: float = 240.0, bridge_root: Path | None = None,
            bridge_values: dict | None = None, operator_values: dict | None = None) -> Installation:
    """Install the chart with :func:`local_values`; ``bridge_values`` and
    ``operator_values`` are added to its ``bridge`` and ``operator`` sections (e.g.
    ``{"peers": {"enabled": True}}``, ``{"replicas": 2}``)."""
    from charts.helmenv import Helm

    image, tarball = project_image()
    cluster.import_image(tarball)
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except ApiException as e:
        if e.status != 409:
            raise
    helm = Helm(kubeconfig=cluster.kubeconfig, namespace=namespace, timeout=timeout)
    # a store of this cluster's own, so every run delivers from scratch; it goes with the
    # cluster (a caller may give another directory, e.g. an XFS mount for reflink)
    bridge_root = bridge_root or cluster.state_dir / "bridge"
    # the chart names one store path for every node; each node gets its own behind it
    cluster.make_private(bridge_root)
    values = local_values(image, bridge_root)
    values["bridge"].update(bridge_values or {})
    values.setdefault("operator", {}).update(operator_values or {})
    helm.install(release, values=values)
    cluster.wait_established(CRDS)
    wait_ready(cluster, namespace, timeout)
    return Installation(image, namespace, release, helm, bridge_root)


def wait_ready(cluster, namespace: str, timeout: float) -> None:
    """Until every Pod in ``namespace`` is Ready and every node lists the CSI driver."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    state = "nothing yet"
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(namespace).items
        ready = [p.metadata.name for p in pods if any(
            c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))]
        drivers = {n.name: node_drivers(cluster, n.name) for n in cluster.nodes}
        state = f"pods ready {ready} of {[p.metadata.name for p in pods]}; node drivers {drivers}"
        if pods and len(ready) == len(pods) and all(DRIVER in d for d in drivers.values()):
            log.info("resident installed: %s", state)
            return
        time.sleep(1)
    raise TimeoutError(f"Resident not ready after {timeout:.0f}s: {state}")


def node_drivers(cluster, node: str) -> list[str]:
    """The CSI drivers kubelet registered on ``node`` (its CSINode)."""
    # raw JSON: the client's model refuses a CSINode whose drivers list is still null
    csinode = cluster.kubectl("get", "csinode", node, "-o", "json", check=False)
    if csinode.returncode:
        return []
    return [d["name"] for d in (json.loads(csinode.stdout).get("spec", {}).get("drivers") or [])]
