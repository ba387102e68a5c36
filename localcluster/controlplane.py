"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, controller-manager, scheduler.

Tests and the demo use the same :class:`ControlPlane`. It builds or reuses the binaries
(:mod:`localcluster.binaries`), makes a throw-away state directory (etcd data,
certificates, a service-account key pair, a static admin token), starts the four
processes on free loopback ports, writes a kubeconfig and waits for ``/readyz``.
``stop()`` ends every process it started by PID; it also runs at exit.

With ``node_name`` set, the control plane is ready for one kubelet
(:class:`localcluster.node.LocalCluster`): the API server authorizes with ``Node,RBAC``,
a static token gives the kubelet the identity ``system:node:<name>`` in ``system:nodes``
(so the Node authorizer, not system:masters, decides what it may read), the API server
reaches the kubelet by its Hostname address (which must resolve to loopback), and it
presents a client certificate signed by a small CA that the kubelet trusts, so the
kubelet can refuse anonymous requests.

The API server is the real 1.20 server: schema validation, the status subresource,
watches, RBAC and admission are what a cluster would do.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from .binaries import CONTROL_PLANE, ensure_binaries
from .processes import ProcessGroup, free_port

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
CRD_DIR = REPO / "crds"


class ControlPlane:
    def __init__(self, state_dir: Path | None = None, extra_apiserver_flags: list[str] = (),
                 node_name: str | None = None, extra_users: dict[str, str] | None = None):
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="resident-cp-"))
        self.extra_apiserver_flags = list(extra_apiserver_flags)
        self.token = secrets.token_hex(16)
        self.port = 0
        self.kubeconfig = str(self.state_dir / "kubeconfig")
        self.node_name = node_name
        self.node_token = secrets.token_hex(16)
        self.node_kubeconfig = str(self.state_dir / "node.kubeconfig")
        self.kubelet_client_ca = self.state_dir / "kubelet-client-ca.crt"
        self.processes = ProcessGroup(self.state_dir / "logs")
        # more static-token users ({user: group}), e.g. so an audit log can tell clients apart
        self.user_tokens = {user: (secrets.token_hex(16), group)
                            for user, group in (extra_users or {}).items()}

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # -- lifecycle -------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> "ControlPlane":
        self.bin_dir = bins = ensure_binaries(CONTROL_PLANE)
        self._make_credentials()
        etcd_port, peer_port = free_port(), free_port()
        self.port = free_port()
        self.processes.start("etcd", [
            "etcd", "--data-dir", str(self.state_dir / "etcd"), "--name", "resident",
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"resident=http://127.0.0.1:{peer_port}",
        ])
        d = self.state_dir
        self.processes.start("kube-apiserver", [
            str(bins / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}", "--advertise-address=127.0.0.1",
            f"--cert-dir={d / 'certs'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            f"--token-auth-file={d / 'tokens.csv'}",
            f"--authorization-mode={'Node,RBAC' if self.node_name else 'RBAC'}",
            "--service-cluster-ip-range=10.0.0.0/16",   # a Service per model: room for thousands
            "--allow-privileged=true", "--endpoint-reconciler-type=none",
            *self._kubelet_facing_flags(),
            *self.extra_apiserver_flags,
        ])
        self._write_kubeconfig()
        if self.node_name:
            self.write_kubeconfig(self.node_kubeconfig, self.node_token, f"system:node:{self.node_name}")
        self._wait_ready(timeout)
        common = [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--port=0", "--secure-port=0"]
        self.processes.start("kube-controller-manager", [
            str(bins / "kube-controller-manager"), *common,
            f"--service-account-private-key-file={d / 'sa.key'}",
            f"--root-ca-file={d / 'certs' / 'apiserver.crt'}",
            "--use-service-account-credentials=false", "--controllers=*,-csrsigning",
        ])
        self.processes.start("kube-scheduler", [str(bins / "kube-scheduler"), *common])
        return self

    def stop(self) -> None:
        self.processes.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def restart_apiserver(self, down_seconds: float = 0.0, timeout: float = 60.0) -> None:
        """Stop kube-apiserver (every watch on it breaks), wait ``down_seconds``, start it
        again on the same port and state, and wait until it serves."""
        self.processes.restart("kube-apiserver", down_seconds)
        self._wait_ready(timeout)

    def __enter__(self) -> "ControlPlane":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- set-up pieces ---------------------------------------------------------------
    def _make_credentials(self) -> None:
        d = self.state_dir
        (d / "certs").mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "genrsa", "-out", str(d / "sa.key"), "2048"],
                       check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub")],
                       check=True, capture_output=True)
        tokens = f"{self.token},admin,admin,system:masters\n"
        for user, (token, group) in self.user_tokens.items():
            tokens += f"{token},{user},{user},{group}\n"
        if self.node_name:
            tokens += f"{self.node_token},system:node:{self.node_name},node:{self.node_name},system:nodes\n"
            self._make_kubelet_client_cert()
        (d / "tokens.csv").write_text(tokens)

    def _make_kubelet_client_cert(self) -> None:
        """A CA the kubelet trusts, and the API server's client certificate signed by it."""
        d = self.state_dir

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-keyout", str(d / "kubelet-client-ca.key"), "-out", str(self.kubelet_client_ca),
                "-subj", "/CN=resident-local-kubelet-client-ca")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "apiserver-kubelet-client.key"),
                "-out", str(d / "apiserver-kubelet-client.csr"), "-subj", "/O=system:masters/CN=kube-apiserver")
        openssl("x509", "-req", "-in", str(d / "apiserver-kubelet-client.csr"), "-days", "2",
                "-CA", str(self.kubelet_client_ca), "-CAkey", str(d / "kubelet-client-ca.key"),
                "-CAcreateserial", "-out", str(d / "apiserver-kubelet-client.crt"))

    def _kubelet_facing_flags(self) -> list[str]:
        if not self.node_name:
            return []
        d = self.state_dir
        return ["--kubelet-preferred-address-types=Hostname,InternalIP",
                f"--kubelet-client-certificate={d / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={d / 'apiserver-kubelet-client.key'}"]

    def _write_kubeconfig(self) -> None:
        self.write_kubeconfig(self.kubeconfig, self.token, "admin")

    def write_kubeconfig(self, path: str, token: str, user: str) -> None:
        """A kubeconfig for this server that authenticates with a static ``token``."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "resident-local",
            "clusters": [{"name": "resident-local",
                          "cluster": {"server": self.server, "insecure-skip-tls-verify": True}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "resident-local",
                          "context": {"cluster": "resident-local", "user": user}}],
        }
        Path(path).write_text(yaml.safe_dump(config))

    def _wait_ready(self, timeout: float) -> None:
        ctx = ssl._create_unverified_context()  # self-signed serving cert of a loopback server
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
        """A kubernetes client for this server (its certificate is self-signed, on loopback)."""
        import warnings

        from kubernetes import config
        from urllib3.exceptions import InsecureRequestWarning

        warnings.filterwarnings("ignore", category=InsecureRequestWarning)
        return config.new_client_from_config(config_file=self.kubeconfig)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}",
                               f"--cache-dir={self.state_dir / 'kubectl-cache'}", *args],
                              text=True, capture_output=True, input=input)
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
    logging.basicConfig(level=logging.INFO)
    with ControlPlane() as cp:
        print(cp.install_crds())
        print(cp.kubectl("get", "--raw", "/version").stdout)
