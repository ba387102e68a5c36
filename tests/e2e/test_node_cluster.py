"""The local cluster, end to end: a real kubelet + containerd + runc + kube-proxy node Ready in
its own network namespace, Pods on the Pod network, Services through their ClusterIPs from
Pods and from this machine, cluster DNS, the project image (built from Debian packages and
the project's wheel, no registry) running ``resident --help``, and a teardown that leaves the
machine as it was. The module shares one LocalCluster; its last test stops it and checks the
machine (test_node_teardown.py covers failed starts, SIGKILL and SIGTERM).
"""

from __future__ import annotations

import http.client
import io
import ipaddress
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from localcluster.containerd import CONTAINERD_VERSION, ROOT as CONTAINERD_ROOT
from localcluster.network import BRIDGE
from localcluster.images import cached_image_names, pause_image, project_image
from localcluster.node import LocalCluster, LocalClusterBusy
from localcluster.oci_layout import OciLayoutError
from localcluster.processes import free_port
from localcluster.scenario import pod_log
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


def pod(name: str, image: str, command: list[str], restart: str = "Never", host_network: bool = False,
        labels: dict | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            host_network=host_network, restart_policy=restart, termination_grace_period_seconds=1,
            containers=[client.V1Container(name="main", image=image, image_pull_policy="Never", command=command)]))


def http_get(address: str, path: str, timeout: float = 30) -> str:
    """GET from this machine, retried until it answers (a new Pod or Service takes a moment)."""
    host, port = address.rsplit(":", 1)
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
            conn.request("GET", path)
            return conn.getresponse().read().decode()
        except OSError as e:
            last = e
            time.sleep(0.3)
    raise AssertionError(f"GET http://{address}{path} did not answer in {timeout}s: {last}")


def wait_phase(core, namespace: str, name: str, phases: set[str], timeout: float = 90) -> client.V1Pod:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase in phases:
            return pod
        time.sleep(0.5)
    raise AssertionError(f"pod {namespace}/{name} not in {phases} after {timeout}s: {pod.status}")


# -- tests ------------------------------------------------------------------------------
def test_node_is_ready_in_its_own_network_namespace(node):
    core = client.CoreV1Api(node.api_client())
    found = core.read_node(node.node_name)
    ready = {c.type: c.status for c in found.status.conditions}["Ready"]
    assert ready == "True"
    assert found.status.node_info.container_runtime_version == f"containerd://{CONTAINERD_VERSION}"
    assert found.status.node_info.kubelet_version == f"v{node.version}"
    assert found.status.node_info.kube_proxy_version in ("", f"v{node.version}")
    # the API server reaches the kubelet at the node's own address, not on loopback
    assert [a.address for a in found.status.addresses if a.type == "InternalIP"] == [node.node.address]
    assert Path(f"/run/netns/{node.node.netns}").exists()
    assert found.spec.pod_cidr == "10.244.0.0/24"
    # an operator on this machine needs nothing but the kubeconfig: owners are at their Pod IPs
    assert node.operator_env(owner_image=node.project_image_name) == {
        "KUBECONFIG": node.kubeconfig, "RESIDENT_OWNER_IMAGE": node.project_image_name}


def test_project_image_runs_resident_help_in_a_pod(node, namespace):
    """As the chart runs it: the non-root resident user (10001), read-only root file system;
    every component and its native dependencies (grpcio needs libstdc++) import."""
    core = client.CoreV1Api(node.api_client())
    imports = "import grpc, numpy, safetensors, kopf, kubernetes, pydantic, bundle, csi_bridge, owner, resident_operator"
    pod_ = pod("help", node.project_image_name, [
        "sh", "-c", f"id -u && python3 -c '{imports}' && exec resident --help"])
    pod_.spec.containers[0].security_context = client.V1SecurityContext(
        run_as_user=10001, run_as_group=10001, run_as_non_root=True, read_only_root_filesystem=True,
        allow_privilege_escalation=False, capabilities=client.V1Capabilities(drop=["ALL"]))
    core.create_namespaced_pod(namespace, pod_)
    done = wait_phase(core, namespace, "help", {"Succeeded", "Failed"})
    logs = pod_log(core, "help", namespace)   # API server -> kubelet, verified TLS
    assert done.status.phase == "Succeeded", logs
    uid, _, usage = logs.partition("\n")
    assert uid == "10001"
    assert usage.startswith("usage: resident <command>")
    for command in ("bundle", "bridge", "owner", "operator"):
        assert f"  {command}" in usage


def test_pods_have_their_own_addresses_and_a_service_answers_by_cluster_ip_and_by_name(node, namespace):
    """A web server Pod on the Pod network behind a Service: this machine calls its ClusterIP
    (routed to the node, translated by kube-proxy), and another Pod calls it by its DNS name
    (cluster DNS), as an application would."""
    core = client.CoreV1Api(node.api_client())
    image = node.project_image_name
    core.create_namespaced_pod(namespace, pod(
        "web", image, ["python3", "-m", "http.server", "8080"], restart="Always", labels={"app": "web"}))
    running = wait_phase(core, namespace, "web", {"Running"})
    assert ipaddress.ip_address(running.status.pod_ip) in ipaddress.ip_network("10.244.0.0/24")
    core.create_namespaced_service(namespace, client.V1Service(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1ServiceSpec(selector={"app": "web"}, ports=[client.V1ServicePort(port=80, target_port=8080)])))
    cluster_ip = core.read_namespaced_service("web", namespace).spec.cluster_ip
    assert ipaddress.ip_address(cluster_ip) in ipaddress.ip_network("10.96.0.0/16")
    assert "resident" in http_get(f"{cluster_ip}:80", "/opt/resident/bin/")   # from the image's file system
    url = f"http://web.{namespace}.svc/opt/resident/bin/"
    core.create_namespaced_pod(namespace, pod("client", image, [
        "python3", "-c", f"import urllib.request; print(urllib.request.urlopen('{url}', timeout=10).read().decode())"]))
    done = wait_phase(core, namespace, "client", {"Succeeded", "Failed"})
    logs = pod_log(core, "client", namespace)
    assert done.status.phase == "Succeeded" and "resident" in logs, logs


def test_a_host_network_pod_shares_the_node_namespace_not_the_machine(node, namespace):
    core = client.CoreV1Api(node.api_client())
    port = free_port()
    core.create_namespaced_pod(namespace, pod(
        "host-web", node.project_image_name, ["python3", "-m", "http.server", str(port)],
        restart="Always", host_network=True))
    running = wait_phase(core, namespace, "host-web", {"Running"})
    assert running.status.pod_ip == node.node.address
    assert "resident" in http_get(f"{node.node.address}:{port}", "/opt/resident/bin/")
    assert node.node_exec(["ss", "-ltn", f"sport = :{port}"], capture_output=True, text=True).stdout.count(
        f":{port}") == 1
    assert f":{port} " not in subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout


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
    # Pods are still running (the web servers above, restartPolicy Always) with mounts under
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
    assert not Path(f"/run/netns/{node.node.netns}").exists()
    assert subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0
    assert not RECORD.exists()
    assert CONTAINERD_ROOT.is_dir(), "the image store is kept between runs"


def test_pause_image_is_cached(tmp_path):
    name, tarball = pause_image(cache=tmp_path)
    mtime = tarball.stat().st_mtime_ns
    assert pause_image(cache=tmp_path) == (name, tarball)
    assert tarball.stat().st_mtime_ns == mtime
    assert name.startswith("resident.local/pause:")
