"""The chart's own ServiceAccounts, for running components in cluster tests.

:func:`install` installs the Helm chart once into a namespace of its own with values that
run no workload (no CRDs, no CSIDriver, no Services, the operator and bridge Pods
selecting a node label no node carries): what remains are the chart's ServiceAccounts,
ClusterRoles and bindings. It returns a kubeconfig per component that authenticates with
the token the token controller minted for that ServiceAccount. A component run with one
has exactly the chart's RBAC, so a verb the chart lacks fails the test that needs it.
"""

from __future__ import annotations

import base64
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


@dataclass(frozen=True)
class ChartAccounts:
    operator: str   # kubeconfig of <release>-resident-operator
    bridge: str     # kubeconfig of <release>-resident-bridge
    namespace: str


def service_account_token(core, namespace: str, name: str, timeout: float = 30.0) -> str:
    """The token the 1.20 token controller minted for the ServiceAccount."""
    deadline = time.monotonic() + timeout
    while True:
        sa = core.read_namespaced_service_account(name, namespace)
        if sa.secrets:
            secret = core.read_namespaced_secret(sa.secrets[0].name, namespace)
            if secret.data and secret.data.get("token"):
                return base64.b64decode(secret.data["token"]).decode()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no token for ServiceAccount {namespace}/{name} after {timeout}s")
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
        "bridge": {"nodeSelector": NO_NODE}})
    paths = {}
    for component in ("operator", "bridge"):
        token = service_account_token(core, NAMESPACE, f"{RELEASE}-resident-{component}")
        paths[component] = str(Path(cluster.state_dir) / f"chart-{component}.kubeconfig")
        cluster.write_kubeconfig(paths[component], token, f"chart-{component}")
    return ChartAccounts(operator=paths["operator"], bridge=paths["bridge"], namespace=NAMESPACE)
