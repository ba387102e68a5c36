"""A first install on a fresh control plane, run the way the chart runs it.

The module starts its own control plane (no CRDs, nothing else running against it), so
the chart installs the CRDs itself and the operator may watch every namespace, exactly as
the Deployment does, without touching other tests' objects. There is no kubelet: the
operator's and the bridge's command lines and environment are read back from the
installed Deployment and DaemonSet and run here as real processes that authenticate with
their ServiceAccounts' own tokens. The RBAC rules are thus what the API server enforces
on them: a missing verb would leave the first ResidentModel without its owner Pod, its
status or its clean deletion, or a BundleDelivery without its lease. The tests run in
file order; the last one uninstalls.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import requests
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from localcluster.processes import free_port, free_ports

pytestmark = pytest.mark.oldest   # run again on the oldest declared Kubernetes (scripts/test)

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # charts/ is a folder of scripts, not an installed package
    sys.path.insert(0, str(REPO))

from chart_accounts import container_env, service_account_token  # noqa: E402
from charts.helmenv import CHART_DIR, Helm  # noqa: E402
from polling import wait_for  # noqa: E402

GROUP, VERSION = "resident.dev", "v1alpha1"
RELEASE, NAMESPACE = "resident", "resident-system"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
CRDS = ["bundledeliveries.resident.dev", "residentmodels.resident.dev"]
SERVICE_MONITOR_CRD = {  # the shape of prometheus-operator's CRD, reduced to what is needed
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "ServiceMonitor", "plural": "servicemonitors",
                       "singular": "servicemonitor", "listKind": "ServiceMonitorList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                 "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def alive(proc, check):
    """``check``, failing at once when ``proc`` (the operator or the bridge) has exited."""
    def probe():
        if proc.poll() is not None:
            pytest.fail(f"the process exited ({proc.returncode}) while the test waited")
        return check()
    return probe


def get(cp, *args) -> dict:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def labelled(cp, kinds: str, namespace: str | None = None) -> list[dict]:
    scope = ["-n", namespace] if namespace else []
    return get(cp, kinds, *scope, "-l", INSTANCE)["items"]


def established(cp, name: str) -> bool:
    conditions = get(cp, "crd", name).get("status", {}).get("conditions", [])
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


class Fresh:
    """The module's control plane and release; ports chosen for this run."""

    def __init__(self, cp, helm, ports: dict[str, int]):
        self.cp, self.helm, self.ports = cp, helm, ports
        api = cp.api_client()
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.apps = client.AppsV1Api(api)
        self.installed = False


@pytest.fixture(scope="module")
def fresh():
    """A control plane of its own with the chart installed as a platform team would."""
    from localcluster.controlplane import ControlPlane

    with ControlPlane() as cp:
        assert get(cp, "crd")["items"] == []
        cp.kubectl("apply", "-f", "-", input=json.dumps(SERVICE_MONITOR_CRD))
        cp.kubectl("create", "namespace", NAMESPACE)
        cp.kubectl("create", "namespace", "models")
        wait_for(lambda: cp.kubectl("get", "servicemonitors", check=False).returncode == 0, timeout=45, what="the ServiceMonitor CRD", every=0.3)
        ports = dict(zip(("health", "metrics", "bridge"), free_ports(3)))   # three different ports
        f = Fresh(cp, Helm(cp.kubeconfig, NAMESPACE), ports)
        f.helm.install(RELEASE, {
            "crds": {"keep": False},
            "operator": {"healthPort": ports["health"], "metricsPort": ports["metrics"]},
            "bridge": {"metricsPort": ports["bridge"]},
            "metrics": {"monitors": {"labels": {"team": "ml"}}}})   # discovery auto: the CRD is served
        f.installed = True
        try:
            yield f
        finally:
            if f.installed:
                f.helm.uninstall(RELEASE)


@pytest.fixture
def processes():
    """Start processes with .start(argv, env, log, group); each stopped (TERM, then KILL) at the end."""
    class Processes:
        started: list = []

        def start(self, argv, env, log: Path, group: int | None = None, stdout=None):
            def drop_group():  # what the container's runAsGroup does
                if group is not None:
                    os.setgid(group)
            with log.open("w") as out:
                proc = subprocess.Popen(argv, env=env, stdout=stdout or out,
                                        stderr=subprocess.STDOUT if stdout is None else out,
                                        preexec_fn=drop_group, text=stdout is not None)
            self.started.append(proc)
            return proc

    runner = Processes()
    runner.started = []
    try:
        yield runner
    finally:
        for proc in runner.started:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def sa_kubeconfig(f: Fresh, component: str, path: Path) -> str:
    token = service_account_token(f.core, NAMESPACE, f"{RELEASE}-{component}")
    f.cp.write_kubeconfig(str(path), token, f"resident-{component}")
    return str(path)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESIDENT_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(extra)
    return env


def test_chart_crds_are_served_and_service_monitors_select_metrics_services(fresh):
    cp = fresh.cp
    for name in CRDS:
        wait_for(lambda: established(cp, name), timeout=45, what=f"{name} Established", every=0.3)
        assert "helm.sh/resource-policy" not in get(cp, "crd", name)["metadata"].get("annotations", {})
    services = {s["metadata"]["name"]: s for s in labelled(cp, "services", NAMESPACE)}
    monitors = labelled(cp, "servicemonitors", NAMESPACE)
    assert len(monitors) == 2 and all(m["metadata"]["labels"]["team"] == "ml" for m in monitors)
    assert {m["spec"]["endpoints"][0]["relabelings"][0]["replacement"] for m in monitors} == {
        "resident-operator", "resident-bridge"}   # the job names the alert rules select
    deploy = get(cp, "deployment", "-n", NAMESPACE, f"{RELEASE}-operator")
    assert not any(k.startswith("prometheus.io/")   # found by its ServiceMonitor instead
                   for k in deploy["spec"]["template"]["metadata"].get("annotations") or {})
    for monitor in monitors:
        wanted = monitor["spec"]["selector"]["matchLabels"]
        matched = [n for n, svc in services.items() if wanted.items() <= svc["metadata"]["labels"].items()]
        assert len(matched) == 1 and monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_operator_as_its_service_account_serves_a_first_model(fresh, processes, tmp_path):
    core, custom = fresh.core, fresh.custom
    deploy = fresh.apps.read_namespaced_deployment(f"{RELEASE}-operator", NAMESPACE)
    c = deploy.spec.template.spec.containers[0]
    args = [a.replace("$(POD_IP)", "127.0.0.1") for a in c.args]
    env = container_env(c, NAMESPACE)   # RESIDENT_OPERATOR_NAMESPACE from the downward API
    assert args[:2] == ["operator", "--all-namespaces"]
    kubeconfig = sa_kubeconfig(fresh, "operator", tmp_path / "operator.kubeconfig")
    proc = processes.start(["resident", *args], clean_env(**env, KUBECONFIG=kubeconfig),
                           tmp_path / "operator.log")
    # kopf's liveness endpoint, as the chart's liveness probe calls it
    wait_for(alive(proc, lambda: _ok(f"http://127.0.0.1:{fresh.ports['health']}/healthz")), timeout=45, what="kopf's /healthz", every=0.3)

    # a first ResidentModel: the README's example, served by `resident bundle serve-demo`
    # (on a free port here, named at 127.0.0.1: this control plane has no node network)
    port = free_port()
    serve = processes.start(["resident", "bundle", "serve-demo", "--port", str(port),
                             "--url", f"http://127.0.0.1:{port}"], clean_env(),
                            tmp_path / "serve-demo.log", stdout=subprocess.PIPE)
    model = yaml.safe_load("".join(iter(lambda: serve.stdout.readline().strip("\n") + "\n", "\n")))
    example = yaml.safe_load((REPO / "examples" / "residentmodel.yaml").read_text())
    assert model["spec"]["bundle"]["digest"] == example["spec"]["bundle"]["digest"]
    name = model["metadata"]["name"]
    custom.create_namespaced_custom_object(GROUP, VERSION, "models", "residentmodels", model)

    def recorded():
        m = custom.get_namespaced_custom_object(GROUP, VERSION, "models", "residentmodels", name)
        kinds = sorted(c["kind"] for c in (m.get("status") or {}).get("children") or [])
        return kinds == ["NetworkPolicy", "Pod", "Secret", "Service"] and m   # one owner: no budget
    m = wait_for(alive(proc, recorded), timeout=45, what="the owner Pod, token Secret, Service and policy in status.children", every=0.3)
    assert "resident.dev/cleanup" in m["metadata"]["finalizers"]
    assert core.read_namespaced_secret(f"{name}-owner-token", "models").data["token"]
    pod = core.read_namespaced_pod(f"{name}-owner-0", "models")
    assert pod.spec.containers[0].image == env["RESIDENT_OWNER_IMAGE"]
    # the owners' control port, in the tenant's namespace, only from the operator's Pods
    policy = client.NetworkingV1Api(core.api_client).read_namespaced_network_policy(
        f"{name}-owner-control", "models")
    peer, = policy.spec.ingress[0]._from
    assert peer.namespace_selector.match_labels == {"kubernetes.io/metadata.name": NAMESPACE}
    assert peer.pod_selector.match_labels == deploy.spec.selector.match_labels
    assert policy.spec.pod_selector.match_labels.items() <= pod.metadata.labels.items()
    assert "resident_operator_reconciles_total" in requests.get(
        f"http://127.0.0.1:{fresh.ports['metrics']}/metrics", timeout=5).text

    # deletion: the operator deletes the children by UID and releases its finalizer
    custom.delete_namespaced_custom_object(GROUP, VERSION, "models", "residentmodels", name)
    wait_for(alive(proc, lambda: _gone(custom, "models", "residentmodels", name)), timeout=45, what="the model to be gone", every=0.3)
    assert core.list_namespaced_pod("models", label_selector=f"resident.dev/model={name}").items == []
    assert core.list_namespaced_secret("models", label_selector=f"resident.dev/model={name}").items == []
    assert core.list_namespaced_service("models", label_selector=f"resident.dev/model={name}").items == []
    assert client.NetworkingV1Api(core.api_client).list_namespaced_network_policy(
        "models", label_selector=f"resident.dev/model={name}").items == []


def can_connect_as(path: str, uid: int, gid: int) -> bool:
    """Whether a process with this uid and (only) this gid may connect to a unix socket."""
    pid = os.fork()
    if pid == 0:  # the child only drops privileges, connects and exits
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
            code = 0
        except PermissionError:
            code = 13
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 13), f"connect check failed oddly (exit {code})"
    return code == 0


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).ok
    except requests.ConnectionError:
        return False


def test_bridge_as_its_service_account_serves_deliveries(fresh, processes):
    """The DaemonSet's plugin command and args, with its paths under a scratch
    directory, its runAsGroup, and the bridge ServiceAccount's token."""
    ds = fresh.apps.read_namespaced_daemon_set(f"{RELEASE}-bridge", NAMESPACE)
    c = next(c for c in ds.spec.template.spec.containers if c.name == "bridge")
    group = c.security_context.run_as_group
    scratch = Path(tempfile.mkdtemp(prefix="resident-chart-bridge-"))
    scratch.chmod(0o755)  # the sidecar's user must be able to reach the socket, as under /var/lib/kubelet
    try:
        paths = {"unix:///csi/": f"unix://{scratch}/csi/", "=/var/lib/resident-bridge": f"={scratch}/store",
                 "=/registration": f"={scratch}/registration", "$(NODE_NAME)": "node-a",
                 "$(POD_IP)": "127.0.0.1"}
        args = list(c.args)
        for old, new in paths.items():
            args = [a.replace(old, new) for a in args]
        kubeconfig = sa_kubeconfig(fresh, "bridge", scratch / "bridge.kubeconfig")
        proc = processes.start([*c.command, *args], clean_env(KUBECONFIG=kubeconfig),
                               scratch / "bridge.log", group=group)
        socket_path = scratch / "csi" / "csi.sock"
        wait_for(alive(proc, socket_path.exists), timeout=45, what="the CSI socket", every=0.3)
        wait_for(alive(proc, lambda: any((scratch / "registration").glob("*-reg.sock"))), timeout=45, what="the registration socket", every=0.3)
        # a non-root user in the socket group (a sidecar's, in the chart's sidecar mode) may
        # connect; the same user outside it may not
        assert socket_path.stat().st_mode & 0o777 == 0o660 and socket_path.stat().st_gid == group
        assert can_connect_as(str(socket_path), 65532, group)
        assert not can_connect_as(str(socket_path), 65532, 65532)
        # kubelet's sockets serve first, /metrics once the rest of the bridge has started
        metrics = f"http://127.0.0.1:{fresh.ports['bridge']}/metrics"
        wait_for(alive(proc, lambda: _answers(metrics)), timeout=45, what="/metrics", every=0.3)
        assert "resident_" in requests.get(metrics, timeout=5).text
        # kubelet's liveness probe, as the chart's builtin registration mode sets it: the bridge's
        # own /healthz, which makes a CSI Probe call on its socket
        healthz = next(a for a in args if a.startswith("--healthz-port=")).split("=", 1)[1]
        assert requests.get(f"http://127.0.0.1:{healthz}/healthz", timeout=5).status_code == 200

        # a BundleDelivery for this node: lease finalizer, status, release on deletion
        custom = fresh.custom
        custom.create_namespaced_custom_object(GROUP, VERSION, "models", "bundledeliveries", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "BundleDelivery", "metadata": {"name": "d1"},
            "spec": {"nodeName": "node-a", "podName": "p", "podUID": "uid-1", "path": "GraphOnly",
                     "bundle": {"source": "file:///srv/none", "digest": "sha256:" + "ef" * 32}}})

        def answered():
            d = custom.get_namespaced_custom_object(GROUP, VERSION, "models", "bundledeliveries", "d1")
            return (d.get("status") or {}).get("phase") and d
        d = wait_for(alive(proc, answered), timeout=45, what="the bridge to answer the delivery", every=0.3)
        assert "bundles.resident.dev/lease" in d["metadata"]["finalizers"]
        assert d["status"]["phase"] in ("Pending", "Failed")  # no volume of that Pod on this node
        custom.delete_namespaced_custom_object(GROUP, VERSION, "models", "bundledeliveries", "d1")
        wait_for(alive(proc, lambda: _gone(custom, "models", "bundledeliveries", "d1")), timeout=45, what="the bridge to release the delivery", every=0.3)
    finally:
        for p in processes.started:
            p.terminate()
            p.wait(timeout=15)
        shutil.rmtree(scratch, ignore_errors=True)


def test_upgrade_carries_crd_changes(fresh, tmp_path):
    """Unlike Helm's crds/ folder, the chart's CRD templates are upgraded with the release."""
    chart = tmp_path / "resident"
    shutil.copytree(CHART_DIR, chart)
    crd = chart / "templates" / "crds" / "bundledeliveries.resident.dev.yaml"
    text = crd.read_text()
    assert text.count("    - name: Node\n") == 1
    crd.write_text(text.replace("    - name: Node\n", "    - name: Age\n      type: date\n"
                                "      jsonPath: .metadata.creationTimestamp\n    - name: Node\n"))
    before = fresh.helm.status(RELEASE)["version"]
    assert fresh.helm.upgrade(RELEASE, chart=chart, reuse_values=True)["version"] == before + 1
    columns = get(fresh.cp, "crd", "bundledeliveries.resident.dev")["spec"]["versions"][0][
        "additionalPrinterColumns"]
    assert [c["name"] for c in columns][:2] == ["Age", "Node"]


def test_uninstall_leaves_nothing_when_crds_are_not_kept(fresh):
    cp = fresh.cp
    fresh.helm.uninstall(RELEASE)
    fresh.installed = False
    wait_for(lambda: [
        c["metadata"]["name"] for c in get(cp, "crd")["items"]] == [SERVICE_MONITOR_CRD["metadata"]["name"]], timeout=45, what="the chart's CRDs to be deleted", every=0.3)
    assert labelled(cp, "clusterroles,clusterrolebindings,csidrivers") == []
    wait_for(lambda: labelled(
        cp, "deployments,daemonsets,replicasets,pods,services,serviceaccounts,servicemonitors",
        NAMESPACE) == [], timeout=45, what="the release's namespaced objects to be gone", every=0.3)
    assert get(cp, "secrets", "-n", NAMESPACE, "-l", f"owner=helm,name={RELEASE}")["items"] == []


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _gone(custom, namespace: str, plural: str, name: str) -> bool:
    try:
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
        return False
    except ApiException as e:
        return e.status == 404
