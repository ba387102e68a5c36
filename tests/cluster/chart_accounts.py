"""The chart's own ServiceAccounts, for running components in cluster tests.

:func:`install` installs the Helm chart once into a namespace of its own with values that
run no workload (no CRDs, no CSIDriver, no Services, the operator and bridge Pods
selecting a node label no node carries): what remains are the chart's ServiceAccounts,
ClusterRoles and bindings. It returns a kubeconfig per component that authenticates with
the token the token controller minted for that ServiceAccount. A component run with one
has exactly the chart's RBAC, so a verb the chart lacks fails the test that needs it.

It also returns the operator's identity settings as the chart's Deployment gives them
(:data:`IDENTITY`: the per-model NetworkPolicy switch, the operator's namespace from the
downward API and its Pod labels), so operators in cluster tests create the policies the
installed operator would, naming the chart's operator Pods as their only control peer.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # charts/ is a folder of scripts, not an installed package
    sys.path.insert(0, str(REPO))

from charts.helmenv import Helm  # noqa: E402

RELEASE, NAMESPACE = "accounts", "resident-accounts"
NO_NODE = {"resident.dev/test-accounts-only": "no-such-node"}
IDENTITY = ("RESIDENT_OWNER_NETWORK_POLICY", "RESIDENT_OPERATOR_NAMESPACE",
            "RESIDENT_OPERATOR_NAMESPACE_LABELS", "RESIDENT_OPERATOR_POD_LABELS")


@dataclass(frozen=True)
class ChartAccounts:
    operator: str   # kubeconfig of <release>-resident-operator
    bridge: str     # kubeconfig of <release>-resident-bridge
    namespace: str
    operator_identity: dict[str, str]   # IDENTITY as the chart's operator Deployment sets it


def container_env(container, namespace: str) -> dict[str, str]:
    """A container's environment as kubelet gives it to a Pod in ``namespace``: the values,
    and ``metadata.namespace`` from the downward API; other references (``status.podIP``)
    are left out."""
    env = {}
    for e in container.env or []:
        if e.value_from is None:
            env[e.name] = e.value or ""
        elif e.value_from.field_ref and e.value_from.field_ref.field_path == "metadata.namespace":
            env[e.name] = namespace
    return env


def service_account_token(core, namespace: str, name: str, timeout: float = 30.0) -> str:
    """A token for the ServiceAccount from the TokenRequest API (bound, valid for an hour),
    as kubelet gets one for a Pod; waits until the account exists."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    deadline = time.monotonic() + timeout
    while True:
        try:
            answer = core.create_namespaced_service_account_token(name, namespace, client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)))
            return answer.status.token
        except ApiException as e:
            if e.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def install(cluster) -> ChartAccounts:
    from kubernetes import client

    core = client.CoreV1Api(cluster.api_client())
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    Helm(cluster.kubeconfig, NAMESPACE).install(RELEASE, {
        "crds": {"enabled": False}, "csiDriver": {"create": False},
        "metrics": {"service": False},
        # the tests run the operator on one namespace each (t-<hex>), as watchNamespaces does
        "operator": {"nodeSelector": NO_NODE, "watchNamespaces": ["t-*"]},
        "bridge": {"nodeSelector": NO_NODE, "peers": {"enabled": True}}})
    paths = {}
    for component in ("operator", "bridge"):
        token = service_account_token(core, NAMESPACE, f"{RELEASE}-resident-{component}")
        paths[component] = str(Path(cluster.state_dir) / f"chart-{component}.kubeconfig")
        cluster.write_kubeconfig(paths[component], token, f"chart-{component}")
    deploy = client.AppsV1Api(cluster.api_client()).read_namespaced_deployment(
        f"{RELEASE}-resident-operator", NAMESPACE)
    env = container_env(deploy.spec.template.spec.containers[0], NAMESPACE)
    return ChartAccounts(operator=paths["operator"], bridge=paths["bridge"], namespace=NAMESPACE,
                         operator_identity={k: env[k] for k in IDENTITY})
