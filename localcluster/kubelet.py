"""The kubelet of a local node: its configuration file and command line, as pure builders.

Choices that matter (the reasons are in docs/local-cluster.md):

- root dir ``/var/lib/kubelet``: CSI plugins (the bridge) register under
  ``/var/lib/kubelet/plugins_registry`` and kubelet publishes volumes below
  ``/var/lib/kubelet/pods``; both paths are what real nodes use.
- the kubelet runs in its node's network namespace (:mod:`localcluster.network`) and
  listens on the node's address; the read-only port is off. It serves with a certificate
  from the cluster's CA (the API server verifies it), refuses anonymous requests and lets
  in only clients with a certificate from that CA (the API server).
- cluster DNS at the ``kube-dns`` Service's address; no host ``resolv.conf`` is handed to
  Pods (``resolvConf: ""``), so no Pod is ever told of a name server off this machine.
- cgroup v1 (what these machines have) is allowed explicitly: ``failCgroupV1: false``.
- image garbage collection effectively off (100/99 %): the images are imported by hand
  and there is no registry to pull them back from.
- eviction thresholds low enough that a busy shared disk does not evict test Pods.
"""

from __future__ import annotations

from pathlib import Path

ROOT_DIR = Path("/var/lib/kubelet")
# where kubelet keeps container logs (fixed in kubelet); its container GC removes every Pod
# log directory here of a Pod it does not run, so each node needs its own
LOG_DIRS = (Path("/var/log/pods"), Path("/var/log/containers"))
CLUSTER_DOMAIN = "cluster.local"
DNS_SERVICE_IP = "10.96.0.10"


def kubelet_config(address: str, client_ca: Path, serving_cert: Path, serving_key: Path,
                   runtime_socket: Path, healthz_port: int = 10248, root_dir: Path = ROOT_DIR,
                   cgroup_root: str = "/") -> dict:
    """A ``KubeletConfiguration`` (kubelet.config.k8s.io/v1beta1)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                         "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
        "volumePluginDir": str(root_dir / "volume-plugins"),
        "nodeStatusUpdateFrequency": "1s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
    }


def kubelet_argv(binary: Path, config: Path, kubeconfig: str, node_name: str, node_ip: str,
                 root_dir: Path = ROOT_DIR, extra: list[str] = ()) -> list[str]:
    """The kubelet command line (what is still taken only as flags)."""
    return [
        str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node_name}", f"--node-ip={node_ip}", f"--root-dir={root_dir}",
        "--v=1", *extra,
    ]
