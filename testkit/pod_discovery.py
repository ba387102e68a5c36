"""Kubernetes Pod discovery for a Prometheus built without it, as an HTTP SD endpoint.

Debian's ``prometheus`` package (2.42 in bookworm) is built without Kubernetes service
discovery: ``kubernetes_sd_configs`` is not a field its configuration knows (docs/metrics.md
says so). :class:`PodDiscovery` stands in for ``kubernetes_sd_configs: [{role: pod}]``: an
HTTP server on 127.0.0.1 whose answer to ``GET /`` is the Pods of every namespace, listed
from the API server with the credentials it is given (the kubeconfig of Prometheus'
ServiceAccount, verified against the cluster's CA: :func:`pods_of`), as ``http_sd_configs`` target groups
labelled the way Prometheus' Kubernetes discovery labels role ``pod``: one target per
declared container port at ``<pod IP>:<port>`` (one at the bare Pod IP for a container
that declares none; none for a Pod without an IP), with the ``__meta_kubernetes_namespace``
and ``__meta_kubernetes_pod_*`` labels, label and annotation names sanitized to
``[a-zA-Z0-9_]``. The relabelling that a user copies then runs unchanged on them, in the
real Prometheus.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from kubernetes import client, config

from localcluster.processes import free_port

META = "__meta_kubernetes_"


def sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _ready(pod: client.V1Pod) -> str:
    for c in pod.status.conditions or ():
        if c.type == "Ready":
            return c.status.lower()
    return "unknown"


def pod_target_groups(pod: client.V1Pod) -> list[dict]:
    """The target groups of one Pod, labelled as Kubernetes discovery (role pod) labels them."""
    if not pod.status.pod_ip:
        return []
    meta = pod.metadata
    common = {
        f"{META}namespace": meta.namespace,
        f"{META}pod_name": meta.name,
        f"{META}pod_ip": pod.status.pod_ip,
        f"{META}pod_ready": _ready(pod),
        f"{META}pod_phase": pod.status.phase or "",
        f"{META}pod_node_name": pod.spec.node_name or "",
        f"{META}pod_host_ip": pod.status.host_ip or "",
        f"{META}pod_uid": meta.uid,
    }
    for owner in meta.owner_references or ():
        if owner.controller:
            common[f"{META}pod_controller_kind"] = owner.kind
            common[f"{META}pod_controller_name"] = owner.name
    for kind, values in (("label", meta.labels), ("annotation", meta.annotations)):
        for name, value in (values or {}).items():
            common[f"{META}pod_{kind}_{sanitize(name)}"] = value
            common[f"{META}pod_{kind}present_{sanitize(name)}"] = "true"
    groups = []
    for container in pod.spec.containers:
        each = {f"{META}pod_container_name": container.name,
                f"{META}pod_container_image": container.image or "",
                f"{META}pod_container_init": "false"}
        if not container.ports:
            groups.append({"targets": [pod.status.pod_ip], "labels": {**common, **each}})
        for port in container.ports or ():
            groups.append({"targets": [f"{pod.status.pod_ip}:{port.container_port}"], "labels": {
                **common, **each,
                f"{META}pod_container_port_name": port.name or "",
                f"{META}pod_container_port_number": str(port.container_port),
                f"{META}pod_container_port_protocol": port.protocol or "TCP"}})
    return groups


def pods_of(kubeconfig: str) -> Callable[[], list[client.V1Pod]]:
    """Every Pod of the cluster, listed with the credentials of ``kubeconfig``."""
    core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    return lambda: core.list_pod_for_all_namespaces(_request_timeout=5).items


class PodDiscovery:
    """``with PodDiscovery(pods_of(kubeconfig)) as sd:`` serves the target groups of the
    Pods ``list_pods()`` returns at :attr:`url`, listed again on every request."""

    def __init__(self, list_pods: Callable[[], list[client.V1Pod]]):
        self.list_pods = list_pods
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def target_groups(self) -> list[dict]:
        return [g for pod in self.list_pods() for g in pod_target_groups(pod)]

    def __enter__(self) -> "PodDiscovery":
        discovery = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                try:
                    body, code = json.dumps(discovery.target_groups()).encode(), 200
                except Exception as e:  # the API server's refusal: Prometheus keeps its last targets
                    body, code = str(e).encode(), 502
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="pod-discovery", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
