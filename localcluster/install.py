"""Install Resident into a LocalCluster the way a platform team would: the Helm chart.

The project image (operator, bridge and owner in one) is built from Debian packages plus
the wheel and imported into the node's containerd (:mod:`localcluster.images`; the same
image ``scripts/images --out DIR`` hands users for their registry); then
``charts/resident`` is installed with Helm's own library (:mod:`charts.helmenv`) and
the values a single-node cluster without a Pod network needs: hostNetwork everywhere,
endpoints on 127.0.0.1, owners and the API server reached at 127.0.0.1, and the bridge serving kubelet's
plugin-registration socket itself (no node-driver-registrar image is available here).
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
# Owners bind their port on the node (hostNetwork), so the operator's and the bridge's
# own endpoints stay clear of the owners' default 8080.
OPERATOR_HEALTH_PORT, OPERATOR_METRICS_PORT, BRIDGE_METRICS_PORT = 18080, 19090, 19810


def local_values(image: str, api_port: int, bridge_root: Path) -> dict:
    repository, tag = image.rsplit(":", 1)
    ref = {"repository": repository, "tag": tag}
    # No service network here: in-cluster clients reach the API server on the node's loopback.
    api_env = [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
               {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)}]
    return {
        "image": {**ref, "pullPolicy": "Never"},
        "operator": {
            "hostNetwork": True, "bindAddress": "127.0.0.1",
            "healthPort": OPERATOR_HEALTH_PORT, "metricsPort": OPERATOR_METRICS_PORT,
            # no owner image: the chart's default, the project image, as for users
            "owner": {"hostNetwork": True, "host": "127.0.0.1"},
            "extraEnv": api_env,
        },
        "bridge": {
            "hostNetwork": True, "bindAddress": "127.0.0.1", "metricsPort": BRIDGE_METRICS_PORT,
            "storeDir": str(bridge_root),
            "registration": {"mode": "builtin"}, "livenessProbe": {"enabled": False},
            "extraEnv": api_env,
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
            timeout: float = 240.0, bridge_root: Path | None = None) -> Installation:
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
    helm.install(release, values=local_values(image, cluster.port, bridge_root))
    cluster.wait_established(CRDS)
    wait_ready(cluster, namespace, timeout)
    return Installation(image, namespace, release, helm, bridge_root)


def wait_ready(cluster, namespace: str, timeout: float) -> None:
    """Until every Pod in ``namespace`` is Ready and the node lists the CSI driver."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    state = "nothing yet"
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(namespace).items
        ready = [p.metadata.name for p in pods if any(
            c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))]
        # raw JSON: the client's model refuses a CSINode whose drivers list is still null
        csinode = cluster.kubectl("get", "csinode", cluster.node_name, "-o", "json", check=False)
        drivers = [d["name"] for d in (json.loads(csinode.stdout).get("spec", {}).get("drivers") or [])
                   ] if csinode.returncode == 0 else []
        state = f"pods ready {ready} of {[p.metadata.name for p in pods]}; node drivers {drivers}"
        if pods and len(ready) == len(pods) and DRIVER in drivers:
            log.info("resident installed: %s", state)
            return
        time.sleep(1)
    raise TimeoutError(f"Resident not ready after {timeout:.0f}s: {state}")
