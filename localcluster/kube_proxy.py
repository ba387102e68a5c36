"""kube-proxy for a local node: Service ClusterIPs translated inside the node's namespace.

kube-proxy runs as a process in its node's network namespace, next to kubelet, in
``iptables`` mode: it watches Services and EndpointSlices and writes the node's ``nat``
rules, so a connection to a ClusterIP from a Pod, from the node, or from the machine (which
routes the Service range to the first node, :mod:`localcluster.network`) reaches a ready
endpoint. It authenticates as ``system:kube-proxy``, the user Kubernetes' bootstrap RBAC
binds to ``system:node-proxier``.

Settings that matter here: its health and metrics listeners stay on the node's loopback;
``conntrack.maxPerCore: 0`` and zero timeouts leave the machine-wide conntrack sysctls
alone (a node is a namespace, not a machine).
"""

from __future__ import annotations

from pathlib import Path


def kube_proxy_config(kubeconfig: str, node_name: str, cluster_cidr: str) -> dict:
    """A ``KubeProxyConfiguration`` (kubeproxy.config.k8s.io/v1alpha1); pure."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "hostnameOverride": node_name,
        "mode": "iptables",
        "clusterCIDR": cluster_cidr,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def kube_proxy_argv(binary: Path, config: Path) -> list[str]:
    return [str(binary), f"--config={config}", "--v=1"]
