"""The local control plane is real, answers quickly from cached binaries and stops completely."""

from __future__ import annotations

import os
import time

from localcluster.controlplane import ControlPlane


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
        version = cp.kubectl("get", "--raw", "/version").stdout
        assert '"gitVersion": "v1.20.2"' in version
        assert ready_after < 30, f"control plane took {ready_after:.1f}s"
    finally:
        cp.stop()
    assert not any(_alive(pid) for pid in pids)
    assert not os.path.exists(cp.state_dir)
