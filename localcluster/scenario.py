"""The end-to-end story, step by step, shared by the demo (which prints) and the e2e tests (which assert).

A demo model is generated in four revisions: A (base), B (graph file changed), C (0.5% of
the rows of the projection and LM-head tensors changed) and D (rows changed again). They
are pushed to a real HTTP bundle server on 127.0.0.1 (``bundle.sources.httpserve``), which
the operator and the bridge reach from their Pods at the machine's address on the cluster
network (:meth:`localcluster.node.LocalCluster.expose`). A ResidentModel on A is
applied; then three transitions run: A->B graph-only, B->C in place, and C->D as a whole
bundle rebased on C with a reload. Every figure shown comes from the ResidentModel's
status; the node-side checks read the bridge's SQLite databases (read-only) and
``/proc/self/mountinfo``.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from base64 import b64decode
from dataclasses import dataclass
from pathlib import Path

import requests
from kubernetes import client
from kubernetes.client.rest import ApiException

from .processes import ProcessGroup, free_port

GROUP, VERSION = "resident.dev", "v1alpha1"
CHUNK = 256 * 1024  # small chunks: a row change touches little of a small demo model


@dataclass
class Revisions:
    a: str
    b: str
    c: str
    d: str


def make_base(work: Path, size_bytes: int) -> tuple[str, Path]:
    """Revision A alone (digest, folder): for benchmarks that derive every other revision
    from the live one."""
    from bundle.cpu_model import make_demo

    folder = work / "rev-a"
    return make_demo(folder, size_bytes, seed=7, chunk_size=CHUNK).digest, folder


def make_bundles(work: Path, size_bytes: int) -> tuple[Revisions, dict[str, Path]]:
    from bundle.cpu_model import make_revision

    dirs = {k: work / f"rev-{k}" for k in "abcd"}
    digests = {}
    if not (dirs["d"] / "resident-manifest.json").exists():
        make_base(work, size_bytes)
        make_revision(dirs["a"], dirs["b"], "graph", seed=1, chunk_size=CHUNK)
        make_revision(dirs["b"], dirs["c"], "rows", fraction=0.005, seed=2, chunk_size=CHUNK)
        make_revision(dirs["c"], dirs["d"], "rows", fraction=0.005, seed=3, chunk_size=CHUNK)
    from bundle.scan import read_manifest
    for k, d in dirs.items():
        digests[k] = read_manifest(d).digest
    return Revisions(**digests), dirs


def make_hf_bundles(work: Path, size_bytes: int, fraction: float = 0.05) -> tuple[dict[str, str], dict[str, Path]]:
    """For the torch backend: a tiny Llama-style Hugging Face checkpoint A, B with ``fraction``
    of A's rows changed (in place), C with B's config.json changed (a new module: reload).
    Returns (digests, dirs) by letter."""
    from bundle.hf_demo import make_hf_demo, make_hf_revision
    from bundle.scan import read_manifest

    dirs = {k: work / f"hf-{k}" for k in "abc"}
    if not (dirs["c"] / "resident-manifest.json").exists():
        make_hf_demo(dirs["a"], size_bytes, seed=5, chunk_size=CHUNK)
        make_hf_revision(dirs["a"], dirs["b"], "rows", fraction=fraction, seed=8, chunk_size=CHUNK)
        make_hf_revision(dirs["b"], dirs["c"], "graph", chunk_size=CHUNK)
    return {k: read_manifest(d).digest for k, d in dirs.items()}, dirs


class BundleServer:
    """``python -m bundle.sources.httpserve`` on 127.0.0.1, stopped by PID. With ``rate``
    (bytes per second) it is a slow source: the fault tests use one so that a transition
    lasts long enough to be interrupted. With a ``cluster``, :attr:`url` is the address the
    cluster reaches it by (models name it as their source); :attr:`local_url` is this
    machine's."""

    def __init__(self, root: Path, log_dir: Path, rate: float | None = None, cluster=None):
        self.root, self.port, self.rate = root, free_port(), rate
        self.cluster = cluster
        self.processes = ProcessGroup(log_dir)

    @property
    def local_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.cluster.expose(self.port)}" if self.cluster else self.local_url

    def __enter__(self) -> "BundleServer":
        rate = ["--rate", str(self.rate)] if self.rate else []
        self.processes.start(f"bundle-server-{self.port}", [
            sys.executable, "-m", "bundle.sources.httpserve", "--root", str(self.root),
            "--port", str(self.port), *rate])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            self.processes.check_alive()
            try:
                requests.get(self.local_url + "/", timeout=1)
                return self
            except requests.ConnectionError:
                time.sleep(0.1)
        raise TimeoutError("bundle server did not answer")

    def __exit__(self, *exc) -> None:
        self.processes.stop()

    def outage(self, seconds: float) -> None:
        """Stop the server for ``seconds`` (its port refuses), then start it again."""
        self.processes.restart(f"bundle-server-{self.port}", down_seconds=seconds)

    def push(self, bundle_dir: Path) -> str:
        from bundle.sources import push
        return push(bundle_dir, self.local_url)


def model_body(name: str, source: str, digest: str, port: int = 8080, image: str | None = None) -> dict:
    """A ResidentModel on ``digest``: the cpu backend, or the torch backend in ``image``."""
    runtime = {"backend": "torch", "image": image} if image else {"backend": "cpu"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResidentModel",
        "metadata": {"name": name},
        "spec": {"accelerator": "cpu", "replicas": 1,
                 "bundle": {"source": source, "digest": digest},
                 "runtime": {**runtime, "port": port},
                 "transition": {"timeoutSeconds": 300}},
    }


def whole_bundle_reload(source: str, digest: str) -> dict:
    """A spec change to ``digest`` delivered as a whole bundle (rebased on the live
    revision when enough is reused) and applied by a reload."""
    return {"bundle": {"source": source, "digest": digest},
            "delivery": {"mode": "WholeBundle"}, "transition": {"strategy": "Reload"}}


class Story:
    """One ResidentModel in one namespace of a running LocalCluster with Resident installed."""

    def __init__(self, cluster, namespace: str, name: str, bridge_root: Path):
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.bridge_root = bridge_root
        api = cluster.api_client()
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    # -- the model -------------------------------------------------------------------
    def apply(self, body: dict) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "residentmodels", body)

    def get(self) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                        "residentmodels", self.name)

    def patch_spec(self, spec: dict) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, "residentmodels",
                                                   self.name, {"spec": spec})

    def wait(self, what: str, predicate, timeout: float = 300.0) -> dict:
        deadline = time.monotonic() + timeout
        rm: dict = {}
        while time.monotonic() < deadline:
            rm = self.get()
            if predicate(rm):
                return rm
            time.sleep(0.5)
        status = rm.get("status", {})
        raise TimeoutError(f"{self.name}: not {what} after {timeout:.0f}s; phase={status.get('phase')} "
                           f"conditions={json.dumps(status.get('conditions'))[:1500]}")

    def wait_ready(self, digest: str, timeout: float = 300.0) -> dict:
        return self.wait(f"Ready on {digest[:19]}", lambda rm: (
            rm.get("status", {}).get("phase") == "Ready"
            and rm["status"].get("identity", {}).get("bundle") == digest
            and rm["status"].get("observedGeneration") == rm["metadata"]["generation"]), timeout)

    def transition(self, spec: dict, timeout: float = 300.0) -> dict:
        """Patch the spec and wait for the model to be Ready on the new digest; return lastTransition."""
        self.patch_spec(spec)
        rm = self.wait_ready(spec["bundle"]["digest"], timeout)
        last = rm["status"].get("lastTransition") or {}
        if last.get("to") != spec["bundle"]["digest"]:
            raise AssertionError(f"lastTransition is not to the new digest: {last}")
        return last

    # -- the owner -------------------------------------------------------------------
    def owner_pods(self) -> list[client.V1Pod]:
        """The model's owner Pods, by the label the operator gives them."""
        return self.core.list_namespaced_pod(self.namespace,
                                             label_selector=f"resident.dev/model={self.name}").items

    def token(self) -> str:
        secret = self.core.read_namespaced_secret(f"{self.name}-owner-token", self.namespace)
        return b64decode(secret.data["token"]).decode()

    def owner_address(self, port: int = 8080) -> str:
        """``ip:port`` of the model's (first) running owner, at its Pod IP."""
        running = [p for p in self.owner_pods() if p.status.pod_ip and p.status.phase == "Running"]
        if not running:
            raise AssertionError(f"{self.namespace}/{self.name} has no running owner Pod")
        return f"{running[0].status.pod_ip}:{port}"

    def service_address(self) -> str:
        """``clusterIP:port`` of the model's Service (port ``http``): what applications call."""
        from .traffic import service_address
        return service_address(self.core, self.namespace, self.name)

    def wait_routed(self, timeout: float = 60.0) -> None:
        """Wait until the model's Service answers (kube-proxy lags its status a moment)."""
        from .traffic import wait_routed
        wait_routed(self.service_address(), f"{self.namespace}/{self.name}", timeout)

    def generate(self, prompt: str, max_tokens: int = 12, port: int = 8080) -> dict:
        """The owner's own smoke test, on its control port (with the model's token)."""
        answer = requests.post(f"http://{self.owner_address(port)}/v1/generate", timeout=60,
                               headers={"Authorization": f"Bearer {self.token()}"},
                               json={"prompt": prompt, "maxTokens": max_tokens})
        answer.raise_for_status()
        return answer.json()

    def complete(self, prompt: str, max_tokens: int = 12) -> tuple[str, dict]:
        """An OpenAI completion through the model's Service, at its ClusterIP (kube-proxy
        picks the owner). Returns (address, answer)."""
        address = self.service_address()
        answer = requests.post(f"http://{address}/v1/completions", timeout=60,
                               json={"model": self.name, "prompt": prompt, "max_tokens": max_tokens})
        answer.raise_for_status()
        return address, answer.json()

    # -- what kubelet says -----------------------------------------------------------
    def failed_mounts(self, pod: str | None = None) -> list[client.CoreV1Event]:
        """kubelet's FailedMount Events on Pods of the model's namespace (on ``pod`` if named):
        each message carries the bridge's answer (CSI code and text); ``count`` says how often."""
        return [e for e in self.core.list_namespaced_event(self.namespace).items
                if e.reason == "FailedMount" and e.involved_object.kind == "Pod"
                and pod in (None, e.involved_object.name)]

    def probe_failures(self) -> list[str]:
        """kubelet's probe failures (``Unhealthy`` Events) on Pods of the model's namespace, as
        ``pod: message (xN)``: an owner whose readiness failed has left its Service."""
        return [f"{e.involved_object.name}: {e.message} (x{e.count or 1})"
                for e in self.core.list_namespaced_event(self.namespace).items if e.reason == "Unhealthy"]

    # -- cleanup ---------------------------------------------------------------------
    def delete_and_wait_gone(self, timeout: float = 180.0) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, "residentmodels", self.name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.get()
            except ApiException as e:
                if e.status == 404:
                    return
                raise
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} still exists after {timeout:.0f}s (finalizer not removed)")

    def leftovers(self) -> dict[str, list]:
        """What is left of the model anywhere: API objects, leases, publications, mounts."""
        selector = f"resident.dev/model={self.name}"
        pods = [p.metadata.name for p in self.core.list_namespaced_pod(
            self.namespace, label_selector=selector).items]
        deliveries = [d["metadata"]["name"] for d in self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "bundledeliveries")["items"]]
        services = [s.metadata.name for s in self.core.list_namespaced_service(
            self.namespace, label_selector=selector).items]
        found = {"pods": pods, "bundleDeliveries": deliveries, "services": services}
        for node in self.cluster.nodes:    # every node's bridge has a store of its own
            for what, items in node_state(node.host_path(self.bridge_root)).items():
                found.setdefault(what, [])
                found[what] += [i for i in items if i not in found[what]]
        return found


def condition(rm: dict, type_: str) -> dict:
    """The model's status condition of ``type_``; empty while it has none."""
    return next((c for c in rm.get("status", {}).get("conditions") or [] if c["type"] == type_), {})


def pod_log(core: client.CoreV1Api, name: str, namespace: str) -> str:
    """The Pod's log as text. Read raw: the client (from version 32) deserializes the body by
    its content, so a line of JSON came back as a dict's repr and plain text as bytes' repr."""
    return core.read_namespaced_pod_log(name, namespace, _preload_content=False).data.decode()


def db_rows(db: Path, query: str) -> list[list]:
    """The rows ``query`` returns from one of the bridge's SQLite databases, read-only; []
    when the database is not there yet."""
    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return [list(r) for r in conn.execute(query)]


def node_state(root: Path) -> dict[str, list]:
    """Leases and publications in the bridge's databases, and CSI mounts on the node."""
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if "kubernetes.io~csi" in line.split()[4]]
    return {"leases": db_rows(root / "store" / "store.db", "SELECT holder, digest FROM leases"),
            "publications": db_rows(root / "bridge.db", "SELECT target_path, state FROM publications"),
            "csiMounts": mounts}


def transition_row(label: str, last: dict) -> list[str]:
    b, d = last.get("bytes") or {}, last.get("durations") or {}
    mib = lambda n: f"{(n or 0) / 2**20:.1f}"
    sec = lambda x: f"{x or 0:.2f}"
    return [label, str(last.get("path")), str(last.get("method")), str(last.get("strategy")),
            mib(b.get("fetched")), mib(b.get("reused")), mib(b.get("written")),
            sec(d.get("deliverSeconds")), sec(d.get("applySeconds")),
            sec(d.get("firstTokenSeconds")), sec(d.get("overheadSeconds")), sec(d.get("totalSeconds")),
            str(last.get("result"))]


TABLE_HEADER = ["transition", "path", "method", "strategy", "fetched MiB", "reused MiB",
                "written MiB", "deliver s", "apply s", "1st token s", "operator s", "total s", "result"]


def format_table(rows: list[list[str]], header: list[str] = TABLE_HEADER) -> str:
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table)
