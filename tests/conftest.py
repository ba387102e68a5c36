"""Shared test fixtures: test layers by folder, one real control plane per session.

Layers (select one with ``-m``): ``unit`` (pure), ``component`` (real gRPC, mounts,
SQLite, HTTP on 127.0.0.1), ``cluster`` (a real kube-apiserver started here). The marker
comes from the folder a test lives in. A real S3-compatible server (``s3_endpoint``) is
started once for every layer that asks for it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

LAYERS = ("unit", "component", "cluster", "e2e")
# The session's API server logs every write of a workload's ServiceAccount (the chart's
# operator and bridge in the cluster tests; not the control plane's own controllers), so
# a test can count what a component wrote (``ControlPlane.audit_entries``); a model's
# status writes and Events keep their bodies, so a count that grew says what was written.
# Its GETs of models are logged too (passes start from the watch's copy).
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: None
    userGroups: ["system:serviceaccounts:kube-system"]
  - level: Request
    userGroups: ["system:serviceaccounts"]
    verbs: ["patch", "update"]
    resources: [{group: "resident.dev", resources: ["residentmodels/status"]},
                {group: "", resources: ["events"]}]
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
    verbs: ["get"]
    resources: [{group: "resident.dev", resources: ["residentmodels"]}]
  - level: None
"""
_started: dict = {}


def pytest_collection_modifyitems(config, items):
    for item in items:
        layer = Path(str(item.fspath)).parent.name
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))


@pytest.fixture(scope="session")
def cluster():
    """A real control plane (etcd, kube-apiserver, controller-manager, scheduler) with our CRDs."""
    from localcluster.controlplane import ControlPlane

    cp = ControlPlane(audit_policy=AUDIT_POLICY)
    with cp:
        cp.install_crds()
        previous = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = cp.kubeconfig
        served = json.loads(cp.kubectl("get", "--raw", "/version").stdout)["gitVersion"]
        _started["apiserver"] = (cp.processes.children[1][1].pid, str(cp.bin_dir / "kube-apiserver"),
                                 cp.server, served)
        try:
            yield cp
        finally:
            if previous is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = previous


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """One real S3-compatible server (SeaweedFS, testkit.s3_server) for the whole session:
    ``http://127.0.0.1:PORT``, shared by the component and cluster tests."""
    from testkit.s3_server import running_s3
    with running_s3(tmp_path_factory.mktemp("s3")) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def s3_bucket(s3_endpoint):
    """The session's bucket on that server (SeaweedFS gives every bucket volumes of its own,
    so tests share one and keep apart by key prefix: :func:`s3_prefix`)."""
    from testkit.s3_server import admin_client, make_bucket
    make_bucket(admin_client(s3_endpoint), "resident-tests")
    return "resident-tests"


@pytest.fixture
def s3_prefix(request):
    """A key prefix of this test's own: ``<test name>-<random>``."""
    import re
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:60].strip("-")
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    """One real Hub-compatible server (olah, testkit.hf_server) for the whole session:
    ``(endpoint, mirrors)``; each test makes repositories of its own under ``mirrors``."""
    from testkit.hf_server import running_hub
    with running_hub(tmp_path_factory.mktemp("hub")) as served:
        yield served


@pytest.fixture
def hub_online(monkeypatch):
    """huggingface_hub allowed to make requests in this test: the torch backend sets
    HF_HUB_OFFLINE in its process (a revision is local), and the tests run both in one."""
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub_repo(hub, hub_online, request):
    """A model repository of this test's own on that server: ``acme/<test name>-<random>``."""
    import re
    from testkit.hf_server import HubRepo
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:60].strip("-")
    return HubRepo(hub[1], f"acme/{name}-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def namespace(cluster):
    """A fresh namespace for one test, deleted afterwards."""
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    _wait_for_default_account(core, name)
    try:
        yield name
    finally:
        core.delete_namespace(name)


def _wait_for_default_account(core, namespace: str, timeout: float = 30.0) -> None:
    """Pods that name no ServiceAccount are refused until ``default`` exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        accounts = core.list_namespaced_service_account(namespace).items
        if any(sa.metadata.name == "default" for sa in accounts):
            return
        time.sleep(0.2)
    raise TimeoutError(f"namespace {namespace}: no default ServiceAccount after {timeout}s")


def pytest_terminal_summary(terminalreporter):
    if "apiserver" in _started:
        pid, binary, server, served = _started["apiserver"]
        terminalreporter.write_line(
            f"cluster tests ran against a real kube-apiserver: pid {pid}, {binary}, {server}"
            f" (it reports {served}); all control-plane processes stopped")
