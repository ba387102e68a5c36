"""Teardown of the local node when things go wrong: a start that fails half-way, a test
process killed with SIGKILL (restored by ``python -m localcluster.teardown``), and a node
run stopped with SIGTERM. Each test runs a node of its own, so this module needs the
machine's node lock free: it runs after test_node_cluster.py has stopped its node.
"""

from __future__ import annotations

import fcntl
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from localcluster.node import LocalCluster
from localcluster.teardown import NODE_LOCK, RECORD, HostRecord, restore, runtime_helpers

from machine_state import alive, iptables_state, mounts_below, network_state, sysctls

REPO = Path(__file__).resolve().parents[2]
WATCHED = ("/var/lib/kubelet", "/run/resident", "/run/netns", "/var/lib/resident/nodes")
TIMINGS: dict[str, float] = {}


@pytest.fixture(autouse=True)
def node_lock_free():
    """These tests start nodes of their own: fail at once (not after the lock timeout) if one runs."""
    NODE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(NODE_LOCK, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.fail(f"a LocalCluster holds {NODE_LOCK}; stop it before these teardown tests")
        fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def host_before():
    return {"sysctls": sysctls(), "mounts": mounts_below(*WATCHED),
            "iptables": iptables_state(), "network": network_state()}


def test_a_failed_start_leaves_nothing_behind(host_before, tmp_path):
    """kubelet runs but never registers, so start() times out; teardown must still be complete."""
    cluster = LocalCluster(state_dir=tmp_path / "state", node_ready_timeout=8,
                           extra_kubelet_flags=["--register-node=false"])
    with pytest.raises(TimeoutError, match="has no Pod range|not Ready"):
        with cluster:
            pass
    pids = dict(cluster.started)
    assert {"etcd", "kube-apiserver", "containerd", "kubelet"} <= set(pids)
    assert [name for name, pid in pids.items() if alive(pid)] == []
    assert mounts_below(*WATCHED) == host_before["mounts"]
    assert sysctls() == host_before["sysctls"]
    assert iptables_state() == host_before["iptables"]
    assert network_state() == host_before["network"]
    assert not RECORD.exists()
    assert cluster.leftovers == []


KILLED_RUN = """
import time
from kubernetes import client
from localcluster.node import LocalCluster
cluster = LocalCluster(nodes=2)   # the second node has mount namespace, directories and cgroups of its own
cluster.start()
image = next(n for n in cluster.containerd.image_list() if n.startswith("resident.local/pause:"))
core = client.CoreV1Api(cluster.api_client())
core.create_namespaced_pod("default", client.V1Pod(
    metadata=client.V1ObjectMeta(name="left"),
    spec=client.V1PodSpec(host_network=True, containers=[
        client.V1Container(name="main", image=image, image_pull_policy="Never")])))
while core.read_namespaced_pod("left", "default").status.phase != "Running":
    time.sleep(0.3)
print("ready", flush=True)
time.sleep(600)
"""


def test_a_killed_run_is_restored_by_the_teardown_command(host_before, tmp_path):
    """SIGKILL the process that runs two nodes, one with a Pod: the nodes outlive it; then
    ``python -m localcluster.teardown`` restores the machine from the host record."""
    repo = REPO
    child = subprocess.Popen([sys.executable, "-c", KILLED_RUN], cwd=repo, stdout=subprocess.PIPE,
                             stderr=open(tmp_path / "child.log", "wb"), text=True, start_new_session=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 180)
        assert ready and child.stdout.readline().strip() == "ready", (tmp_path / "child.log").read_text()[-3000:]
        record = HostRecord.load(RECORD)
        node_pids = [p.pid for p in record.processes]
        shims = [p.pid for p in runtime_helpers(record.runtime_addresses)]
        assert shims, "the Pod's containerd shims run"
        refused = subprocess.run([sys.executable, "-m", "localcluster.teardown"], cwd=repo, capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode == 2 and "a LocalCluster is running" in refused.stderr
        assert RECORD.exists() and all(alive(pid) for pid in node_pids)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        assert all(alive(pid) for pid in node_pids), "the node outlives the killed process"
        assert sysctls()["vm/overcommit_memory"] == "1"

        result = subprocess.run([sys.executable, "-m", "localcluster.teardown"], cwd=repo, capture_output=True,
                                text=True, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
        assert [pid for pid in node_pids + shims if alive(pid)] == []
        assert mounts_below(*WATCHED) == host_before["mounts"]
        assert sysctls() == host_before["sysctls"]
        assert iptables_state() == host_before["iptables"]
        assert network_state() == host_before["network"]      # the node's namespace and the bridge
        assert list(Path("/sys/fs/cgroup").glob("*/kubepods")) == []
        assert list(Path("/sys/fs/cgroup").glob("*/resident-nodes")) == []   # the second node's cgroup root
        assert not Path("/var/lib/resident/nodes/node-1").exists()          # its kubelet directory
        assert not RECORD.exists()
        assert not Path(record.scratch_dirs[0]).exists()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        leftover = HostRecord.load(RECORD)
        if leftover is not None:      # the test failed half-way: do not leave the node running
            restore(leftover)


def test_sigterm_tears_the_node_down(host_before, tmp_path):
    """A node run stopped with SIGTERM (as CI or a terminal would) restores the machine itself."""
    repo = REPO
    child = subprocess.Popen([sys.executable, "-m", "localcluster.node", "--keep"], cwd=repo,
                             stdout=subprocess.PIPE, stderr=open(tmp_path / "child.log", "wb"), text=True,
                             start_new_session=True)
    try:
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in child.stdout], daemon=True).start()
        deadline, line = time.monotonic() + 180, ""
        while not line.startswith("KUBECONFIG=") and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
        assert line.startswith("KUBECONFIG="), (tmp_path / "child.log").read_text()[-3000:]
        node_pids = [p.pid for p in HostRecord.load(RECORD).processes]
        assert sysctls()["vm/overcommit_memory"] == "1"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=120) == 143
        assert [pid for pid in node_pids if alive(pid)] == []
        assert mounts_below(*WATCHED) == host_before["mounts"]
        assert sysctls() == host_before["sysctls"]
        assert network_state() == host_before["network"]
        assert not RECORD.exists()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        leftover = HostRecord.load(RECORD)
        if leftover is not None:
            restore(leftover)
