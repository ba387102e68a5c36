"""The local control plane is real, answers quickly from cached binaries and stops completely."""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request

import pytest

from localcluster.binaries import kubernetes_version
from localcluster.controlplane import ControlPlane

pytestmark = pytest.mark.oldest   # run again on the oldest declared Kubernetes (scripts/test)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_second_control_plane_starts_fast_and_stops_every_process(cluster):
    # `cluster` guarantees the binaries are built; this one measures the cached path.
    began = time.monotonic()
    cp = ControlPlane()
    try:
        cp.start()
        ready_after = time.monotonic() - began
        pids = [p.pid for _, p in cp.processes.children]
        names = [n for n, _ in cp.processes.children]
        assert names == ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
        exe = os.readlink(f"/proc/{pids[1]}/exe")
        assert exe.endswith("/kube-apiserver")
        version = json.loads(cp.kubectl("get", "--raw", "/version").stdout)
        assert version["gitVersion"] == f"v{cp.version}" == f"v{kubernetes_version()}"
        assert ready_after < 30, f"control plane took {ready_after:.1f}s"
    finally:
        stopping = time.monotonic()
        cp.stop()
        stopped_after = time.monotonic() - stopping
    assert not any(_alive(pid) for pid in pids)
    # one at a time, last started first: the API server leaves while etcd still answers
    assert stopped_after < 8, f"stopping took {stopped_after:.1f}s"
    assert not os.path.exists(cp.state_dir)


def test_the_api_server_is_verified_against_the_cluster_ca_and_nothing_else(cluster):
    """The kubeconfig carries the cluster's CA; a client that trusts only the system's
    roots refuses the API server's certificate."""
    import yaml

    config = yaml.safe_load(open(cluster.kubeconfig))
    server = config["clusters"][0]["cluster"]
    assert "certificate-authority-data" in server and "insecure-skip-tls-verify" not in server
    with urllib.request.urlopen(f"{cluster.server}/readyz", context=cluster.ssl_context(), timeout=5) as resp:
        assert resp.status == 200
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"{cluster.server}/readyz", context=ssl.create_default_context(), timeout=5)
