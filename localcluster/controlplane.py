"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, controller-manager, scheduler.

Tests and the demo use the same :class:`ControlPlane`. It builds or reuses the binaries of
one Kubernetes version (:mod:`localcluster.binaries`; ``version``, default
``$RESIDENT_KUBERNETES_VERSION`` or the newest), makes a throw-away state directory (etcd
data, a CA and certificates signed by it (:mod:`localcluster.pki`), a service-account key
pair, static tokens), starts the four processes on free loopback ports, writes a kubeconfig
that verifies the API server against the CA, and waits for ``/readyz``. ``stop()`` ends
every process it started by PID; it also runs at exit.

Nodes (:class:`localcluster.node.LocalCluster`) need more of it, set by
``advertise_address`` and ``node_names``: the API server then advertises that address (the
``kubernetes`` Service's endpoint, which the node network carries to this loopback server),
authorizes with ``Node,RBAC``, gives each kubelet a static token as
``system:node:<name>`` in ``system:nodes`` and kube-proxy one as ``system:kube-proxy``,
reaches kubelets by their InternalIP with a client certificate they trust, and verifies
their serving certificates; the controller-manager hands each Node a Pod range and marks
a Node unreachable after :data:`NODE_MONITOR_GRACE_SECONDS` without a heartbeat.

The API server is the real one: schema and CEL validation, the status subresource,
watches, RBAC and admission (Pod Security included) are what a cluster would do.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

import yaml

from .binaries import CONTROL_PLANE, ensure_binaries, kubernetes_version
from .pki import Authority
from .processes import ProcessGroup, free_ports

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
CRD_DIR = REPO / "crds"
SERVICE_RANGE = "10.96.0.0/16"     # a Service per model: room for thousands
KUBERNETES_SERVICE_IP = "10.96.0.1"
POD_RANGE = "10.244.0.0/16"        # a /24 per node, handed out by the controller-manager
# A node that stops renewing its Lease is marked unreachable after this long (Kubernetes'
# default is 50 s). kubelet renews every 10 s, so 20 s is two missed renewals; it keeps the
# time from a node's loss to its owners' replacements under 60 s (docs/operator.md,
# "When a node is lost": grace + node-monitor period + owner toleration + start).
NODE_MONITOR_GRACE_SECONDS = 20


def audited_request(entry: dict) -> str:
    """An audit entry's request as ``verb resource[/subresource]`` (``patch residentmodels/status``)."""
    ref = entry.get("objectRef") or {}
    return f"{entry.get('verb')} {ref.get('resource', '')}" + (f"/{ref['subresource']}" if ref.get("subresource") else "")


class ControlPlane:
    def __init__(self, state_dir: Path | None = None, extra_apiserver_flags: list[str] = (),
                 node_names: list[str] = (), extra_users: dict[str, str] | None = None,
                 version: str | None = None, advertise_address: str | None = None,
                 audit_policy: str | None = None):
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="resident-cp-"))
        self.audit_policy = audit_policy   # an audit.k8s.io/v1 Policy: the API server logs to audit_log
        self.version = version or kubernetes_version()
        self.extra_apiserver_flags = list(extra_apiserver_flags)
        self.advertise_address = advertise_address
        self.token = secrets.token_hex(16)
        self.port = 0
        self.kubeconfig = str(self.state_dir / "kubeconfig")
        self.pki = self.state_dir / "pki"
        self.ca_cert = self.pki / "ca.crt"
        self.processes = ProcessGroup(self.state_dir / "logs")
        # static-token users: {user: (token, group)}; nodes and kube-proxy are users too
        self.user_tokens = {user: (secrets.token_hex(16), group)
                            for user, group in (extra_users or {}).items()}
        self.node_names = list(node_names)
        for name in self.node_names:
            self.user_tokens[f"system:node:{name}"] = (secrets.token_hex(16), "system:nodes")
        if self.node_names:
            self.user_tokens["system:kube-proxy"] = (secrets.token_hex(16), "system:node-proxier")

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # -- lifecycle -------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> "ControlPlane":
        self.bin_dir = bins = ensure_binaries(CONTROL_PLANE, self.version)
        self.port, etcd_port, peer_port = free_ports(3)
        self._make_credentials()
        self.processes.start("etcd", [
            "etcd", "--data-dir", str(self.state_dir / "etcd"), "--name", "resident",
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"resident=http://127.0.0.1:{peer_port}",
        ])
        d, pki = self.state_dir, self.pki
        self.processes.start("kube-apiserver", [
            str(bins / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}",
            f"--advertise-address={self.advertise_address or '127.0.0.1'}",
            # with nodes, the kubernetes Service's endpoint is the advertised address; without,
            # no Pod runs and a loopback endpoint would be refused, so none is written
            f"--endpoint-reconciler-type={'lease' if self.advertise_address else 'none'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            f"--token-auth-file={d / 'tokens.csv'}",
            f"--authorization-mode={'Node,RBAC' if self.node_names else 'RBAC'}",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--allow-privileged=true",
            *self._kubelet_facing_flags(),
            *self._audit_flags(),
            *self.extra_apiserver_flags,
        ])
        self.write_kubeconfig(self.kubeconfig, self.token, "admin")
        self._wait_ready(timeout)
        common = [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--secure-port=0"]
        nodes = ["--allocate-node-cidrs=true", f"--cluster-cidr={POD_RANGE}", "--node-cidr-mask-size=24",
                 f"--node-monitor-grace-period={NODE_MONITOR_GRACE_SECONDS}s",
                 ] if self.node_names else []
        self.processes.start("kube-controller-manager", [
            str(bins / "kube-controller-manager"), *common, *nodes,
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            f"--service-account-private-key-file={d / 'sa.key'}",
            f"--root-ca-file={self.ca_cert}",
            "--use-service-account-credentials=false", "--controllers=*,-csrsigning",
        ])
        self.processes.start("kube-scheduler", [str(bins / "kube-scheduler"), *common])
        return self

    def stop(self) -> None:
        self.processes.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def restart_apiserver(self, down_seconds: float = 0.0, timeout: float = 60.0,
                          sig: int = signal.SIGTERM) -> None:
        """Stop kube-apiserver (``sig``; every watch on it breaks), wait ``down_seconds``,
        start it again on the same port and state, and wait until it serves."""
        self.processes.restart("kube-apiserver", down_seconds, sig)
        self._wait_ready(timeout)

    def restart_etcd(self, down_seconds: float = 0.0, timeout: float = 60.0, sig: int = signal.SIGKILL) -> None:
        """Stop etcd (``sig``), wait ``down_seconds``, start it again on its data, and wait
        until kube-apiserver is ready again (its readiness includes etcd)."""
        self.processes.restart("etcd", down_seconds, sig)
        self._wait_ready(timeout)

    def __enter__(self) -> "ControlPlane":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the audit log ---------------------------------------------------------------
    @property
    def audit_log(self) -> Path:
        return self.state_dir / "audit.log"

    def _audit_flags(self) -> list[str]:
        if not self.audit_policy:
            return []
        policy = self.state_dir / "audit-policy.yaml"
        policy.write_text(self.audit_policy)
        # maxsize 0: one plain file, never rotated (the default rotates at 100 MB, and a long
        # experiment's counts then missed the entries moved aside; k8s.io/apiserver options/audit.go)
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
                "--audit-log-maxsize=0"]

    def audit_entries(self, since: float = 0.0, until: float = float("inf")) -> list[dict]:
        """The audit log's entries received in [``since``, ``until``) (epoch seconds), each
        once (a request logged at two stages keeps its last)."""
        entries: dict[str, dict] = {}
        if self.audit_log.exists():
            for line in self.audit_log.read_text().splitlines():
                e = json.loads(line)
                received = datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00"))
                if since <= received.timestamp() < until:
                    entries[e["auditID"]] = e
        return list(entries.values())

    # -- set-up pieces ---------------------------------------------------------------
    def _make_credentials(self) -> None:
        d = self.state_dir
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "genrsa", "-out", str(d / "sa.key"), "2048"],
                       check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub")],
                       check=True, capture_output=True)
        self.authority = Authority(self.pki)
        hosts = ["127.0.0.1", KUBERNETES_SERVICE_IP, "localhost", "kubernetes", "kubernetes.default",
                 "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
        if self.advertise_address:
            hosts.append(self.advertise_address)
        self.authority.issue("apiserver", "kube-apiserver", hosts=hosts, server=True)
        if self.node_names:
            self.authority.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                 organization="system:masters", client=True)
        tokens = f"{self.token},admin,admin,system:masters\n"
        for user, (token, group) in self.user_tokens.items():
            tokens += f"{token},{user},{user},{group}\n"
        (d / "tokens.csv").write_text(tokens)

    def _kubelet_facing_flags(self) -> list[str]:
        if not self.node_names:
            return []
        return ["--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={self.pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={self.pki / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={self.ca_cert}"]

    def write_kubeconfig(self, path: str, token: str, user: str, server: str | None = None) -> None:
        """A kubeconfig for this server that authenticates with a static ``token`` and
        verifies the server against the cluster's CA (``server`` defaults to loopback)."""
        ca = base64.b64encode(self.ca_cert.read_bytes()).decode()
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "resident-local",
            "clusters": [{"name": "resident-local",
                          "cluster": {"server": server or self.server, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "resident-local",
                          "context": {"cluster": "resident-local", "user": user}}],
        }
        Path(path).write_text(yaml.safe_dump(config))

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context that trusts this cluster's CA (and nothing else)."""
        return ssl.create_default_context(cafile=str(self.ca_cert))

    def _wait_ready(self, timeout: float) -> None:
        ctx = self.ssl_context()
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self.processes.check_alive()
            req = urllib.request.Request(f"{self.server}/readyz",
                                         headers={"Authorization": f"Bearer {self.token}"})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        log.info("kube-apiserver ready at %s", self.server)
                        return
            except (urllib.error.URLError, ConnectionError, OSError) as e:
                last = str(e)
            time.sleep(0.3)
        raise TimeoutError(f"kube-apiserver not ready after {timeout}s ({last}):\n"
                           + self.processes.log_tail("kube-apiserver"))

    # -- clients ---------------------------------------------------------------------
    def api_client(self):
        """A kubernetes client for this server, verifying it against the cluster's CA."""
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}",
                               f"--cache-dir={self.state_dir / 'kubectl-cache'}", *args],
                              text=True, capture_output=True, input=input, timeout=timeout)
        if check and done.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def install_crds(self, crd_dir: Path = CRD_DIR, timeout: float = 30.0) -> list[str]:
        """Create (or replace) every CRD in ``crd_dir`` and wait until each is Established."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        ext = client.ApiextensionsV1Api(self.api_client())
        names = []
        for path in sorted(crd_dir.glob("*.yaml")):
            body = yaml.safe_load(path.read_text())
            name = body["metadata"]["name"]
            try:
                ext.create_custom_resource_definition(body)
            except ApiException as e:
                if e.status != 409:
                    raise
                current = ext.read_custom_resource_definition(name)
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                ext.replace_custom_resource_definition(name, body)
            names.append(name)
        self.wait_established(names, timeout)
        return names

    def wait_established(self, names: list[str], timeout: float = 30.0) -> None:
        """Wait until each named CRD is Established (served, and so in discovery)."""
        from kubernetes import client

        ext = client.ApiextensionsV1Api(self.api_client())
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                crd = ext.read_custom_resource_definition(name)
                conds = {c.type: c.status for c in (crd.status.conditions or [])}
                if conds.get("Established") == "True":
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not Established: {conds}")
                time.sleep(0.2)


if __name__ == "__main__":
    from bundle.jsonlog import configure
    configure(logging.INFO)
    with ControlPlane() as cp:
        print(cp.install_crds())
        print(cp.kubectl("get", "--raw", "/version").stdout)
