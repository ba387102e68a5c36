"""The kubelet of the local node: its configuration file and command line, as pure builders.

Choices that matter (the reasons are in docs/local-cluster.md):

- root dir ``/var/lib/kubelet``: CSI plugins (the bridge) register under
  ``/var/lib/kubelet/plugins_registry`` and kubelet publishes volumes below
  ``/var/lib/kubelet/pods``; both paths are what real nodes use.
- every listener on 127.0.0.1 (server, healthz), the read-only port off; anonymous
  requests refused, and only clients with a certificate from the control plane's kubelet
  client CA (the API server) are let in.
- ``makeIPTablesUtilChains: false``: the local node has no Service proxy and needs no
  KUBE-* chains.
- image garbage collection effectively off (100/99 %): the images are imported by hand
  and there is no registry to pull them back from.
- eviction thresholds low enough that a busy shared disk does not evict test Pods.
- no ``--node-ip``: kubelet rejects a loopback node IP. The API server reaches the kubelet
  by the node's Hostname address, which the node name resolves to on loopback.
"""

from __future__ import annotations

import socket
from pathlib import Path

ROOT_DIR = Path("/var/lib/kubelet")


def kubelet_config(port: int, healthz_port: int, client_ca: Path, root_dir: Path = ROOT_DIR) -> dict:
    """A ``KubeletConfiguration`` (kubelet.config.k8s.io/v1beta1, as 1.20 reads it)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                         "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
        "volumePluginDir": str(root_dir / "volume-plugins"),
        "resolvConf": "/etc/resolv.conf",
        "nodeStatusUpdateFrequency": "1s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
    }


def kubelet_argv(binary: Path, config: Path, kubeconfig: str, node_name: str, runtime_socket: Path,
                 pause_image: str, root_dir: Path = ROOT_DIR, extra: list[str] = ()) -> list[str]:
    """The kubelet command line (what 1.20 still takes only as flags)."""
    return [
        str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node_name}", f"--root-dir={root_dir}",
        "--container-runtime=remote", f"--container-runtime-endpoint=unix://{runtime_socket}",
        f"--pod-infra-container-image={pause_image}", "--v=1", *extra,
    ]


def resolves_to_loopback(name: str) -> bool:
    try:
        infos = socket.getaddrinfo(name, None)
    except socket.gaierror:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(a.startswith("127.") or a == "::1" for a in addresses)


def default_node_name() -> str:
    """The machine's host name when it resolves only to loopback, else ``localhost``."""
    name = socket.gethostname().lower()
    return name if resolves_to_loopback(name) else "localhost"
