"""A first install on a fresh control plane, run the way the chart runs it.

This test starts its own control plane (no CRDs, nothing else running against it), so the
chart installs the CRDs itself and the operator may watch every namespace, exactly as
the Deployment does, without touching other tests' objects. There is no kubelet: the
operator's command line and environment are read back from the installed Deployment and
run here as a real ``resident operator`` process that authenticates with the operator
ServiceAccount's own token. The RBAC rules are thus what the API server enforces on the
operator: a missing verb would leave the first ResidentModel without its owner Pod, its
status or its clean deletion. The owner Pod stays Pending (no node).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # charts/ is a folder of scripts, not an installed package
    sys.path.insert(0, str(REPO))

from charts.helmenv import Helm  # noqa: E402

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout=45.0, proc=None):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the operator exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.3)


def get(cp, *args) -> dict:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def labelled(cp, kinds: str, namespace: str | None = None) -> list[dict]:
    scope = ["-n", namespace] if namespace else []
    return get(cp, kinds, *scope, "-l", INSTANCE)["items"]


def established(cp, name: str) -> bool:
    conditions = get(cp, "crd", name).get("status", {}).get("conditions", [])
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def service_account_token(core: client.CoreV1Api, namespace: str, name: str) -> str:
    """The token the 1.20 token controller minted for the ServiceAccount."""
    def secret_name():
        sa = core.read_namespaced_service_account(name, namespace)
        return sa.secrets and sa.secrets[0].name
    secret = core.read_namespaced_secret(wait_for("the ServiceAccount token", secret_name), namespace)
    return base64.b64decode(secret.data["token"]).decode()


def operator_command(deploy) -> tuple[list[str], dict[str, str]]:
    """The operator container's args and plain env, with the Pod IP replaced by 127.0.0.1."""
    c = deploy.spec.template.spec.containers[0]
    args = [a.replace("$(POD_IP)", "127.0.0.1") for a in c.args]
    env = {e.name: e.value or "" for e in c.env if e.value_from is None}
    return args, env


@pytest.fixture
def control_plane():
    from localcluster.controlplane import ControlPlane

    with ControlPlane() as cp:
        yield cp


@pytest.fixture
def operator_process(tmp_path):
    """Start a process with .start(argv, env); stopped (TERM, then KILL) at the end."""
    class Runner:
        proc = None

        def start(self, argv, env):
            self.log = tmp_path / "operator.log"
            with self.log.open("w") as out:
                self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
            return self.proc

    runner = Runner()
    try:
        yield runner
    finally:
        if runner.proc is not None:
            runner.proc.terminate()
            try:
                runner.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                runner.proc.kill()
                runner.proc.wait()


def test_first_install_serves_a_first_model_and_uninstall_removes_everything(
        control_plane, operator_process, tmp_path):
    cp = control_plane
    assert get(cp, "crd")["items"] == []
    cp.kubectl("apply", "-f", "-", input=json.dumps(SERVICE_MONITOR_CRD))
    cp.kubectl("create", "namespace", NAMESPACE)
    wait_for("the ServiceMonitor CRD", lambda: cp.kubectl("get", "servicemonitors", check=False).returncode == 0)
    health, metrics = free_port(), free_port()
    helm = Helm(cp.kubeconfig, NAMESPACE)
    helm.install(RELEASE, {
        "crds": {"keep": False},
        "operator": {"healthPort": health, "metricsPort": metrics},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"team": "ml"}}}})
    uninstalled = False
    try:
        # -- the chart's CRDs are served; the ServiceMonitors select the metrics Services --
        for name in CRDS:
            wait_for(f"{name} Established", lambda: established(cp, name))
            assert "helm.sh/resource-policy" not in get(cp, "crd", name)["metadata"].get("annotations", {})
        services = {s["metadata"]["name"]: s for s in labelled(cp, "services", NAMESPACE)}
        monitors = labelled(cp, "servicemonitors", NAMESPACE)
        assert len(monitors) == 2 and all(m["metadata"]["labels"]["team"] == "ml" for m in monitors)
        for monitor in monitors:
            wanted = monitor["spec"]["selector"]["matchLabels"]
            matched = [n for n, svc in services.items() if wanted.items() <= svc["metadata"]["labels"].items()]
            assert len(matched) == 1 and monitor["spec"]["endpoints"][0]["port"] == "metrics"

        # -- the operator container, run here as its ServiceAccount -----------------------
        api = cp.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        deploy = client.AppsV1Api(api).read_namespaced_deployment(f"{RELEASE}-operator", NAMESPACE)
        args, env = operator_command(deploy)
        assert args[:2] == ["operator", "--all-namespaces"]
        kubeconfig = tmp_path / "operator.kubeconfig"
        cp.write_kubeconfig(str(kubeconfig), service_account_token(core, NAMESPACE, f"{RELEASE}-operator"),
                            "resident-operator")
        run_env = {k: v for k, v in os.environ.items() if not k.startswith("RESIDENT_")}
        run_env.update(env, KUBECONFIG=str(kubeconfig))
        proc = operator_process.start([str(Path(sys.executable).with_name("resident")), *args], run_env)
        # kopf's liveness endpoint, as the chart's liveness probe calls it
        wait_for("kopf's /healthz", lambda: _ok(f"http://127.0.0.1:{health}/healthz"), proc=proc)

        # -- a first ResidentModel (the README's example) ----------------------------------
        model = yaml.safe_load((REPO / "examples" / "residentmodel.yaml").read_text())
        name = model["metadata"]["name"]
        cp.kubectl("create", "namespace", "models")
        custom.create_namespaced_custom_object(GROUP, VERSION, "models", "residentmodels", model)

        def recorded():
            m = custom.get_namespaced_custom_object(GROUP, VERSION, "models", "residentmodels", name)
            kinds = sorted(c["kind"] for c in (m.get("status") or {}).get("children") or [])
            return kinds == ["Pod", "Secret"] and m
        m = wait_for("the owner Pod and token Secret in status.children", recorded, proc=proc)
        assert "resident.dev/cleanup" in m["metadata"]["finalizers"]
        assert core.read_namespaced_secret(f"{name}-owner-token", "models").data["token"]
        pod = core.read_namespaced_pod(f"{name}-owner-0", "models")
        assert pod.spec.containers[0].image == env["RESIDENT_OWNER_IMAGE"]
        assert "resident_operator_reconciles_total" in requests.get(
            f"http://127.0.0.1:{metrics}/metrics", timeout=5).text

        # deletion: the operator deletes the children by UID and releases its finalizer
        custom.delete_namespaced_custom_object(GROUP, VERSION, "models", "residentmodels", name)
        wait_for("the model to be gone", lambda: _gone(custom, "models", name), proc=proc)
        assert core.list_namespaced_pod("models").items == []
        assert core.list_namespaced_secret("models", label_selector=f"resident.dev/model={name}").items == []

        # -- uninstall: with crds.keep=false nothing of the release is left ----------------
        helm.uninstall(RELEASE)
        uninstalled = True
        wait_for("the chart's CRDs to be deleted", lambda: [
            c["metadata"]["name"] for c in get(cp, "crd")["items"]] == [SERVICE_MONITOR_CRD["metadata"]["name"]])
        assert labelled(cp, "clusterroles,clusterrolebindings,csidrivers") == []
        wait_for("the release's namespaced objects to be gone", lambda: labelled(
            cp, "deployments,daemonsets,replicasets,pods,services,serviceaccounts,servicemonitors",
            NAMESPACE) == [])
        assert get(cp, "secrets", "-n", NAMESPACE, "-l", f"owner=helm,name={RELEASE}")["items"] == []
    finally:
        if not uninstalled:
            helm.uninstall(RELEASE)


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _gone(custom, namespace: str, name: str) -> bool:
    try:
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "residentmodels", name)
        return False
    except ApiException as e:
        return e.status == 404
