"""Shared test fixtures: test layers by folder, one real control plane per session.

Layers (select one with ``-m``): ``unit`` (pure), ``component`` (real gRPC, mounts,
SQLite, HTTP on 127.0.0.1), ``cluster`` (a real kube-apiserver started here). The marker
comes from the folder a test lives in.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

LAYERS = ("unit", "component", "cluster", "e2e")
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

    cp = ControlPlane()
    with cp:
        cp.install_crds()
        previous = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = cp.kubeconfig
        version = cp.kubectl("version", "-o", "json", check=False).stdout
        _started["apiserver"] = (cp.processes.children[1][1].pid, str(cp.bin_dir / "kube-apiserver"),
                                 cp.server, '"gitVersion": "v1.20.2"' in version)
        try:
            yield cp
        finally:
            if previous is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = previous


@pytest.fixture
def namespace(cluster):
    """A fresh namespace for one test, deleted afterwards."""
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    _wait_for_default_token(core, name)
    try:
        yield name
    finally:
        core.delete_namespace(name)


def _wait_for_default_token(core, namespace: str, timeout: float = 30.0) -> None:
    """1.20 refuses Pods until the default ServiceAccount has its token Secret."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        accounts = core.list_namespaced_service_account(namespace).items
        if any(sa.metadata.name == "default" and sa.secrets for sa in accounts):
            return
        time.sleep(0.2)
    raise TimeoutError(f"namespace {namespace}: no token for the default ServiceAccount after {timeout}s")


def pytest_terminal_summary(terminalreporter):
    if "apiserver" in _started:
        pid, binary, server, is_120 = _started["apiserver"]
        terminalreporter.write_line(
            f"cluster tests ran against a real kube-apiserver: pid {pid}, {binary}, {server}"
            f" (server reports v1.20.2: {is_120}); all control-plane processes stopped")
