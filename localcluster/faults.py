"""Faults made to a Pod's container on the local cluster, from this machine.

A container's processes are this machine's processes whose cgroup names the container, so
a fault is a signal to them: SIGKILL (the process dies; kubelet starts the container
again), or SIGSTOP then SIGCONT (it hangs: it keeps its sockets and answers nothing). Used
by the e2e tests of probes and alerts and by the chaos soak (:mod:`localcluster.chaos`).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from kubernetes import client


def container_id(pod: client.V1Pod, name: str) -> str:
    """The runtime's ID of the Pod's container ``name`` (``containerd://...``)."""
    return next(s.container_id for s in pod.status.container_statuses or [] if s.name == name)


def restarts(pod: client.V1Pod, name: str) -> int:
    return next(s.restart_count for s in pod.status.container_statuses or [] if s.name == name)


def container_pids(container_id: str) -> list[int]:
    """Host PIDs of every process of the container (its cgroup names the container); raises
    LookupError when it has none (not started, or gone)."""
    cid = container_id.split("://", 1)[-1]
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if cid in (proc / "cgroup").read_text():
                    pids.append(int(proc.name))
            except OSError:
                continue   # gone meanwhile
    if not pids:
        raise LookupError(f"no process of container {cid}")
    return pids


def kill(container_id: str) -> list[int]:
    """SIGKILL every process of the container, as a crash would; returns their PIDs."""
    pids = container_pids(container_id)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


@contextlib.contextmanager
def frozen(container_id: str):
    """Every process of the container stopped (SIGSTOP) inside the block, and continued after
    it, whatever happens: it keeps its connections and answers nothing, as a hung process."""
    pids = container_pids(container_id)
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
