"""Cluster DNS for the local cluster: CoreDNS, built from its Go module, run as a Deployment.

A model's ``status.endpoint`` is ``http://<model>.<namespace>.svc:<port>``; inside a Pod
that name must resolve, as on any cluster. CoreDNS (``github.com/coredns/coredns``, built
once per machine by :mod:`localcluster.gobuild`) runs in ``kube-system`` behind the
``kube-dns`` Service at ``10.96.0.10``, the address every kubelet writes into its Pods'
``resolv.conf``. It answers for ``cluster.local`` (and reverse lookups) from the API
server's Services and EndpointSlices, and forwards nothing: a name outside the cluster
gets an error, never a query to a server off this machine.

It runs like any workload: an image of the one static binary
(:func:`localcluster.images.static_image`), non-root on port 1053 (the Service maps 53),
a read-only root filesystem, no capabilities, its own ServiceAccount with read access to
what it serves.
"""

from __future__ import annotations

from pathlib import Path

from .gobuild import GoBuild, ensure_built
from .images import static_image
from .kubelet import CLUSTER_DOMAIN, DNS_SERVICE_IP

COREDNS_VERSION = "1.14.7"
NAMESPACE = "kube-system"
NAME = "coredns"
PORT = 1053

COREFILE = f""".:{PORT} {{
    errors
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
}}
"""


def coredns_build() -> GoBuild:
    return GoBuild(name=f"coredns-{COREDNS_VERSION}",
                   requires={"github.com/coredns/coredns": f"v{COREDNS_VERSION}"},
                   commands={"coredns": "github.com/coredns/coredns"},
                   log="coredns-build.log",
                   what=f"building CoreDNS {COREDNS_VERSION} from its Go module (first run, about 3 min)")


def coredns_image() -> tuple[str, Path]:
    """(name, layout tarball) of the CoreDNS image, built on first use."""
    binary = ensure_built(coredns_build()) / "coredns"
    return static_image("coredns", {"coredns": binary}, ["/usr/local/bin/coredns", "-conf", "/etc/coredns/Corefile"])


def dns_manifests(image: str) -> list[dict]:
    """Everything cluster DNS is, as API objects; pure."""
    labels = {"k8s-app": "kube-dns"}
    meta = {"name": NAME, "namespace": NAMESPACE}
    restricted = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                  "capabilities": {"drop": ["ALL"]}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "resident:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "resident:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "resident:coredns"},
         "subjects": [{"kind": "ServiceAccount", **meta}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**meta, "labels": labels},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {
                 "serviceAccountName": NAME, "dnsPolicy": "Default", "priorityClassName": "system-cluster-critical",
                 "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                     "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{
                     "name": "coredns", "image": image, "imagePullPolicy": "Never",
                     "ports": [{"name": "dns", "containerPort": PORT, "protocol": "UDP"},
                               {"name": "dns-tcp", "containerPort": PORT, "protocol": "TCP"}],
                     "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                     "securityContext": restricted,
                     "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                     "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                 }],
                 "volumes": [{"name": "config", "configMap": {"name": NAME}}],
             }}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": NAMESPACE, "labels": labels},
         "spec": {"clusterIP": DNS_SERVICE_IP, "selector": labels, "ports": [
             {"name": "dns", "port": 53, "targetPort": PORT, "protocol": "UDP"},
             {"name": "dns-tcp", "port": 53, "targetPort": PORT, "protocol": "TCP"}]}},
    ]
