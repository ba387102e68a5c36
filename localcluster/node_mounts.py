"""A node's own view of the paths every node uses: its mount namespace.

Every kubelet expects ``/var/lib/kubelet``: CSI plugins register under
``/var/lib/kubelet/plugins_registry``, the device-plugin socket is
``/var/lib/kubelet/device-plugins/kubelet.sock`` whatever ``--root-dir`` says, and the
bridge DaemonSet names the same host paths on every node (its kubelet directory and its
store). Several nodes on one machine would collide there. So the first node uses the
machine's own paths, and every further node runs in a mount namespace of its own in which
each such path is a bind mount of that node's directory on the machine::

    node-1 sees /var/lib/kubelet      = the machine's /var/lib/resident/nodes/node-1/kubelet
    node-1 sees /var/lib/resident-... = the machine's /var/lib/resident/nodes/node-1/paths/<path>
    node-1 sees /var/log/pods         = the machine's /var/lib/resident/nodes/node-1/logs/pods

The container logs too (``/var/log/pods``, ``/var/log/containers``): kubelet's container
GC removes every Pod log directory there of a Pod it does not run, so on shared
directories each kubelet took the others' logs away within a minute and ``kubectl logs``
of a Pod on another node failed (found by the CI run of stop 50, whose failure message
could not show two bridges' logs).

The namespace is kept by a bind mount of its namespace file
(``/run/resident/nodes/<node>/mnt``), so processes started later (containerd, kubelet,
kube-proxy, the test cards, anything the tests run with :meth:`NodeMounts.enter`) join it.
The node's directory on the machine is made a shared mount before the namespace is made,
and its parts are bound into the namespace from there, so each pair is peers: what the node mounts below its
``/var/lib/kubelet`` (Pod volumes, CSI publishes) appears below the node directory on the
machine, where the harness and the tests look and the host record's unmounts find it, and
nothing the node mounts elsewhere (containerd's root filesystems) reaches the machine.
Unmounting the namespace file (the host record does, as it is a mount under
``/run/resident/nodes``) frees the namespace once its last process is gone.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .kubelet import LOG_DIRS, ROOT_DIR as KUBELET_ROOT

NODES_DIR = Path("/var/lib/resident/nodes")      # node directories, seen from the machine
NAMESPACES_DIR = Path("/run/resident/nodes")     # namespace files and runtime state


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


class NodeMounts:
    """The mount namespace of one node (not the first; see the module doc)."""

    def __init__(self, node: str):
        self.node = node
        self.root = NODES_DIR / node
        self.file = NAMESPACES_DIR / node / "mnt"
        self.bound: dict[Path, Path] = {}   # path the node sees -> the machine's directory

    def host_path(self, path: Path | str) -> Path:
        """Where the machine sees what this node sees at ``path`` (a path below one of its
        private directories, or any other path, which both see alike)."""
        path = Path(path)
        for inside, outside in self.bound.items():
            if path == inside or inside in path.parents:
                return outside / path.relative_to(inside)
        return path

    def create(self) -> None:
        """Make the namespace, with the node's own ``/var/lib/kubelet`` and container log
        directories (emptied first)."""
        shutil.rmtree(self.root, ignore_errors=True)   # a run's node state never outlives it
        kubelet = self.root / "kubelet"
        kubelet.mkdir(parents=True)
        _run(["mount", "--bind", str(self.root), str(self.root)])
        _run(["mount", "--make-shared", str(self.root)])
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.file.touch()
        _run(["unshare", f"--mount={self.file}", "--propagation", "unchanged", "true"])
        self._bind(kubelet, KUBELET_ROOT)
        for inside in LOG_DIRS:
            outside = self.root / "logs" / inside.name
            outside.mkdir(parents=True)
            self._bind(outside, inside)

    def make_private(self, path: Path | str) -> Path:
        """Give the node its own empty directory at ``path``; return the machine's side."""
        path = Path(path)
        outside = self.root / "paths" / str(path).strip("/").replace("/", "_")
        outside.mkdir(parents=True)
        self._bind(outside, path)
        return outside

    def enter(self) -> list[str]:
        """The argv prefix that runs a command in this node's mount namespace."""
        return [f"--mount={self.file}"]

    def _bind(self, outside: Path, inside: Path) -> None:
        inside.mkdir(parents=True, exist_ok=True)   # the mount point, on the machine's disk
        _run(["nsenter", *self.enter(), "--", "mount", "--bind", str(outside), str(inside)])
        self.bound[inside] = outside
