"""kubelet's liveness probe restarts a frozen bridge, on the local node.

The chart's default (registration mode builtin) has the bridge serve ``/healthz`` itself,
answered by a CSI Probe of its own socket. The test freezes the bridge container's
process with SIGSTOP from the host: from inside the container it could not, since the
bridge is PID 1 of its PID namespace and the kernel drops SIGSTOP sent to it from there.
A frozen process answers no probe; kubelet must then kill the container and start it
again. Afterwards the Pod is Ready, kubelet's CSINode still lists the driver, and a new
model's volume is published by the restarted bridge.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from kubernetes import client

from polling import wait_for

DRIVER = "bundles.resident.dev"
BRIDGE_SELECTOR = "app.kubernetes.io/component=bridge"
# kubelet's probe: 10 s initial delay, 5 failures 10 s apart; then the kill waits the
# probe's 5 s grace period (the Pod's 30 s is for a normal stop), as a stopped process never
# acts on SIGTERM; then the restart
RESTART_TIMEOUT = 240.0


def bridge_pod(core: client.CoreV1Api, namespace: str) -> client.V1Pod:
    pods = core.list_namespaced_pod(namespace, label_selector=BRIDGE_SELECTOR).items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def bridge_status(pod: client.V1Pod) -> client.V1ContainerStatus:
    status, = (s for s in pod.status.container_statuses or () if s.name == "bridge")
    return status


def pod_ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())


def container_pid(container_id: str) -> int:
    """The host PID of the container's ``resident bridge`` process: the process whose
    cgroup names the container and whose command line is ``resident bridge ...``."""
    cid = container_id.split("://", 1)[-1]
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if cid not in (proc / "cgroup").read_text():
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if any(a.endswith(b"resident") for a in argv) and b"bridge" in argv:
            found.append(int(proc.name))
    assert len(found) == 1, f"processes of container {cid} running `resident bridge`: {found}"
    return found[0]


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def driver_registered(storage: client.StorageV1Api, node: str) -> bool:
    # raw JSON: the client's model refuses a CSINode whose drivers list is null, which it is
    # while the restarted bridge has not registered again
    raw = storage.read_csi_node(node, _preload_content=False)
    drivers = (json.loads(raw.data).get("spec") or {}).get("drivers") or []
    return any(d.get("name") == DRIVER for d in drivers)


def liveness_failures(core: client.CoreV1Api, pod: client.V1Pod) -> list[str]:
    events = core.list_namespaced_event(
        pod.metadata.namespace, field_selector=f"involvedObject.uid={pod.metadata.uid}").items
    return [e.message for e in events if e.reason == "Unhealthy" and "Liveness probe failed" in (e.message or "")]


def test_kubelet_restarts_a_frozen_bridge_and_the_driver_stays_registered(world):
    api = world.cluster.api_client()
    core, storage = client.CoreV1Api(api), client.StorageV1Api(api)
    namespace = world.installation.namespace
    pod = bridge_pod(core, namespace)
    node, uid = pod.spec.node_name, pod.metadata.uid
    before = bridge_status(pod)
    assert pod_ready(pod) and before.ready and driver_registered(storage, node)
    probe = next(c for c in pod.spec.containers if c.name == "bridge").liveness_probe
    assert probe.http_get.path == "/healthz"   # the bridge's own, not a sidecar's
    assert probe.termination_grace_period_seconds == 5   # a hung bridge is killed soon, not after 30 s
    pid = container_pid(before.container_id)

    os.kill(pid, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        # a stop reaches every thread of the process a moment after the signal
        wait_for(lambda: process_state(pid) == "T", timeout=10, every=0.1, what=f"bridge pid {pid} stopped")
        def restarted():
            status = bridge_status(bridge_pod(core, namespace))
            return status if status.restart_count > before.restart_count else None

        after = wait_for(restarted, timeout=RESTART_TIMEOUT, every=2,
                         what="kubelet to restart the frozen bridge container")
        restarted_after = time.monotonic() - frozen
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGCONT)  # the test failed before kubelet acted: leave no stopped process
    pod = bridge_pod(core, namespace)
    assert pod.metadata.uid == uid  # the same Pod: kubelet restarted its container
    assert after.restart_count == before.restart_count + 1
    assert after.last_state.terminated is not None and after.last_state.terminated.container_id == before.container_id
    assert not Path(f"/proc/{pid}").exists()          # the frozen process was killed
    assert liveness_failures(core, pod), "no Unhealthy event for the bridge's liveness probe"

    def ready_again():
        current = bridge_pod(core, namespace)
        return current if pod_ready(current) else None

    pod = wait_for(ready_again, timeout=120, every=1, what="the bridge Pod to be Ready again")
    new_pid = container_pid(bridge_status(pod).container_id)
    assert new_pid != pid and process_state(new_pid) != "T"
    wait_for(lambda: driver_registered(storage, node), timeout=60, every=1,
             what=f"{DRIVER} on the CSINode of {node}")
    # the restarted bridge serves kubelet: a new model's owner gets its volume
    story = world.ready("e2e-bridge-liveness", world.revs.a)
    print(f"\nfrozen bridge restarted after {restarted_after:.0f} s; then model {story.name} Ready in "
          f"{story.namespace}")
    story.delete_and_wait_gone()     # the tests after this one count the node's leases on A
