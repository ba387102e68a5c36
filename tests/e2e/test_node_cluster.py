"""The local single-node cluster, end to end: a real kubelet + containerd + runc node Ready on
loopback, the project image (built from Debian packages and the project's wheel, no
registry) running ``resident --help`` in a hostNetwork Pod, and a teardown that leaves the
machine as it was. The module shares one LocalCluster; its last test stops it and checks the
machine (test_node_teardown.py covers failed starts, SIGKILL and SIGTERM).
"""

from __future__ import annotations

import http.client
import io
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from localcluster.containerd import ROOT as CONTAINERD_ROOT
from localcluster.images import cached_image_names, pause_image, project_image
from localcluster.node import LocalCluster, LocalClusterBusy
from localcluster.oci_layout import OciLayoutError
from localcluster.processes import free_port
from localcluster.teardown import RECORD

from machine_state import alive, iptables_state, mounts_below, sysctls

TIMINGS: dict[str, float] = {}


def started_pids(cluster: LocalCluster) -> dict[str, int]:
    return dict(cluster.started)


# -- fixtures ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def host_before():
    return {"sysctls": sysctls(), "mounts": mounts_below("/var/lib/kubelet", "/run/resident", "/run/netns"),
            "iptables": iptables_state()}


@pytest.fixture(scope="module")
def node(host_before):
    began = time.monotonic()
    image, tarball = project_image()
    TIMINGS["project_image_seconds"] = round(time.monotonic() - began, 2)
    cluster = LocalCluster()
    with cluster:
        TIMINGS.update(cluster.timings)
        began = time.monotonic()
        assert cluster.import_image(tarball) == [image]
        TIMINGS["project_image_import_seconds"] = round(time.monotonic() - began, 2)
        cluster.project_image_name = image
        yield cluster
    print(f"\nlocal cluster timings: {TIMINGS}")


@pytest.fixture
def namespace(node):
    core = client.CoreV1Api(node.api_client())
    name = f"node-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    node.wait_for_service_account(name)
    try:
        yield name
    finally:
        if not node._stopped:
            core.delete_namespace(name)


def host_network_pod(name: str, image: str, command: list[str], restart: str = "Never") -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            host_network=True, restart_policy=restart, termination_grace_period_seconds=1,
            containers=[client.V1Container(name="main", image=image, image_pull_policy="Never", command=command)]))


def wait_phase(core, namespace: str, name: str, phases: set[str], timeout: float = 90) -> client.V1Pod:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase in phases:
            return pod
        time.sleep(0.5)
    raise AssertionError(f"pod {namespace}/{name} not in {phases} after {timeout}s: {pod.status}")


# -- tests ------------------------------------------------------------------------------
def test_node_is_ready_and_reached_on_loopback(node):
    core = client.CoreV1Api(node.api_client())
    found = core.read_node(node.node_name)
    ready = {c.type: c.status for c in found.status.conditions}["Ready"]
    assert ready == "True"
    assert found.status.node_info.container_runtime_version.startswith("containerd://")
    assert found.status.node_info.kubelet_version == "v1.20.2"
    # the API server talks to the kubelet by Hostname, which must be a loopback name
    hostnames = [a.address for a in found.status.addresses if a.type == "Hostname"]
    assert hostnames == [node.node_name]
    assert all(info[4][0].startswith("127.") or info[4][0] == "::1"
               for info in __import__("socket").getaddrinfo(node.node_name, None))
    assert found.status.daemon_endpoints.kubelet_endpoint.port > 0
    env = node.operator_env(owner_image=node.project_image_name)
    assert env["RESIDENT_OWNER_HOST"] == "127.0.0.1" and env["RESIDENT_OWNER_HOST_NETWORK"] == "true"
    from resident_operator.settings import settings_from_env

    settings = settings_from_env(env)          # the operator accepts the single-node setting
    assert settings.owner_host == "127.0.0.1" and settings.owner_host_network
    assert settings.owner_image == node.project_image_name


def test_project_image_runs_resident_help_in_a_host_network_pod(node, namespace):
    """As the chart runs it: the non-root resident user (10001), read-only root file system;
    every component and its native dependencies (grpcio needs libstdc++) import."""
    core = client.CoreV1Api(node.api_client())
    imports = "import grpc, numpy, safetensors, kopf, kubernetes, pydantic, bundle, csi_bridge, owner, resident_operator"
    pod = host_network_pod("help", node.project_image_name, [
        "sh", "-c", f"id -u && python3 -c '{imports}' && exec resident --help"])
    pod.spec.containers[0].security_context = client.V1SecurityContext(
        run_as_user=10001, run_as_group=10001, run_as_non_root=True, read_only_root_filesystem=True,
        allow_privilege_escalation=False, capabilities=client.V1Capabilities(drop=["ALL"]))
    core.create_namespaced_pod(namespace, pod)
    pod = wait_phase(core, namespace, "help", {"Succeeded", "Failed"})
    logs = core.read_namespaced_pod_log("help", namespace)   # API server -> kubelet, over loopback
    assert pod.status.phase == "Succeeded", logs
    uid, _, usage = logs.partition("\n")
    assert uid == "10001"
    assert usage.startswith("usage: resident <command>")
    for command in ("bundle", "bridge", "owner", "operator"):
        assert f"  {command}" in usage


def test_host_network_pod_serves_on_loopback(node, namespace):
    """The single-node setting: a process on the node reaches a hostNetwork Pod at 127.0.0.1."""
    core = client.CoreV1Api(node.api_client())
    port = free_port()
    core.create_namespaced_pod(namespace, host_network_pod(
        "web", node.project_image_name, ["python3", "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        restart="Always"))
    wait_phase(core, namespace, "web", {"Running"})
    deadline, body = time.monotonic() + 30, None
    while time.monotonic() < deadline and body is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/opt/resident/bin/")
            body = conn.getresponse().read().decode()
        except OSError:
            time.sleep(0.3)
    assert body is not None and "resident" in body   # served from inside the image's file system


def test_import_rejects_missing_and_foreign_tarballs(node, tmp_path):
    before = node.containerd.image_list()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        node.import_image(tmp_path / "absent.tar")
    (tmp_path / "content").mkdir()
    (tmp_path / "content" / "hello.txt").write_text("not an image")
    foreign = tmp_path / "foreign.tar"
    subprocess.run(["tar", "-cf", str(foreign), "-C", str(tmp_path / "content"), "."], check=True)
    with pytest.raises(OciLayoutError, match="not an OCI image layout"):
        node.import_image(foreign)
    not_tar = tmp_path / "not.tar"
    not_tar.write_bytes(b"hello")
    with pytest.raises(OciLayoutError, match="not a tar archive"):
        node.import_image(not_tar)
    assert node.containerd.image_list() == before


def test_image_store_follows_the_image_cache(node, tmp_path):
    """Images the cache no longer holds leave containerd too, with the CRI's sha256 refs."""
    name, tarball = pause_image(cache=tmp_path)       # same recipe, another cache: not kept
    renamed = tmp_path / "renamed.tar"
    layout_name = "resident.local/stale:1"
    with tarfile.open(tarball) as src, tarfile.open(renamed, "w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name == "index.json":
                data = data.replace(name.encode(), layout_name.encode())
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    assert node.import_image(renamed) == [layout_name]
    listed = node.containerd.image_list()
    assert layout_name in listed
    assert not any(n.startswith("import-") for n in listed)
    removed = node.containerd.prune_images("resident.local/", keep=cached_image_names())
    assert removed == [layout_name]
    after = node.containerd.image_list()
    assert layout_name not in after and node.project_image_name in after
    # the sandbox image stays, with its CRI reference
    assert any(n.startswith("sha256:") for n in after)


def test_a_second_cluster_is_refused_while_one_runs(node):
    second = LocalCluster(lock_timeout=0)
    with pytest.raises(LocalClusterBusy, match="another LocalCluster"):
        with second:
            pass
    assert second.started == [] and second.containerd is None
    # the first cluster is untouched
    assert client.CoreV1Api(node.api_client()).read_node(node.node_name).metadata.name == node.node_name


def test_teardown_restores_the_machine(node, host_before):
    # a Pod is still running (the web server above, restartPolicy Always) with mounts under
    # /var/lib/kubelet, and kubelet has changed the sysctls: teardown must undo all of it
    assert mounts_below("/var/lib/kubelet"), "kubelet should have mounted its root dir and pod volumes"
    assert sysctls()["vm/overcommit_memory"] == "1", "kubelet sets vm.overcommit_memory=1"
    pids = started_pids(node)
    assert {"etcd", "kube-apiserver", "containerd", "kubelet"} <= set(pids)
    shims = node.containerd.shim_pids()
    assert shims, "a running Pod has containerd shims"
    node.stop()
    TIMINGS["teardown_seconds"] = node.timings["teardown_seconds"]
    assert [name for name, pid in pids.items() if alive(pid)] == []
    assert [pid for pid in shims if alive(pid)] == []
    assert mounts_below("/var/lib/kubelet", "/run/resident", "/run/netns") == host_before["mounts"]
    assert sysctls() == host_before["sysctls"]
    assert iptables_state() == host_before["iptables"]
    assert list(Path("/sys/fs/cgroup").glob("*/kubepods")) == []
    assert not RECORD.exists()
    assert CONTAINERD_ROOT.is_dir(), "the image store is kept between runs"


def test_pause_image_is_cached(tmp_path):
    name, tarball = pause_image(cache=tmp_path)
    mtime = tarball.stat().st_mtime_ns
    assert pause_image(cache=tmp_path) == (name, tarball)
    assert tarball.stat().st_mtime_ns == mtime
    assert name.startswith("resident.local/pause:")
