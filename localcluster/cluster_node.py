"""One node of the local cluster: its containerd, kubelet, kube-proxy and test cards.

A node lives in a network namespace of its own on the cluster network
(:mod:`localcluster.network`); every node but the first also has a mount namespace of its
own (:mod:`localcluster.node_mounts`) and a cgroup root of its own, so that several
kubelets share the machine without meeting:

=================  ==============================  =========================================
                   first node (``node-0``)         further nodes (``node-<i>``)
=================  ==============================  =========================================
kubelet directory  ``/var/lib/kubelet``            ``/var/lib/resident/nodes/<node>/kubelet``
                                                   (seen by the node as ``/var/lib/kubelet``)
cgroup root        ``/`` (``/kubepods``)           ``/resident-nodes/<node>`` in every hierarchy
containerd         ``/var/lib/resident/containerd``  ``/var/lib/resident/containerd-<node>``
=================  ==============================  =========================================

Each node has its own containerd: a kubelet removes containers it did not create, so two
kubelets on one runtime would kill each other's Pods. Each has its own serving certificate
and its own identity, ``system:node:<node>``.

The harness can stop a node (:meth:`ClusterNode.power_off`: every process of the node
killed, its containers with them, as when a machine loses power), start it again
(:meth:`ClusterNode.power_on`, same directories, as after a reboot), and cut it off the
network and reconnect it (:meth:`localcluster.network.ClusterNetwork.cut`).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import yaml

from .containerd import ROOT as FIRST_ROOT, STATE as FIRST_STATE, Containerd
from .controlplane import POD_RANGE
from .kube_proxy import kube_proxy_argv, kube_proxy_config
from .kubelet import ROOT_DIR as KUBELET_ROOT, kubelet_argv, kubelet_config
from .network import NodeAddress
from .node_mounts import NodeMounts
from .processes import ProcessGroup
from .teardown import NODE_CGROUPS
from .test_cards import plugin_argv

REPO = Path(__file__).resolve().parent.parent
CGROUP_V1 = Path("/sys/fs/cgroup")


class ClusterNode:
    """One node: where it lives and the processes that make it (see the module doc)."""

    def __init__(self, address: NodeAddress, runtime_processes: ProcessGroup, kubelet_processes: ProcessGroup,
                 cards: int = 0):
        self.address = address
        self.name = address.name
        self.first = address.index == 0
        self.mounts = None if self.first else NodeMounts(self.name)
        self.cards = cards
        # the runtime outlives kubelet at teardown: kubelet goes first, then the containers
        self.runtime_processes, self.kubelet_processes = runtime_processes, kubelet_processes
        root = FIRST_ROOT if self.first else FIRST_ROOT.with_name(f"containerd-{self.name}")
        state = FIRST_STATE if self.first else FIRST_STATE.with_name(f"containerd-{self.name}")
        self.containerd_paths = (root, state)
        self.containerd: Containerd | None = None
        self.pod_range: str | None = None
        self.argv: dict[str, list[str] | None] = {}

    # -- where things are ----------------------------------------------------------------
    @property
    def kubelet_dir(self) -> Path:
        """The node's kubelet directory as the machine sees it."""
        return self.host_path(KUBELET_ROOT)

    @property
    def cgroup_root(self) -> str:
        return "/" if self.first else f"/{NODE_CGROUPS}/{self.name}"

    def enter(self) -> list[str]:
        """The argv prefix that runs a command on this node (its network and mounts)."""
        prefix = self.address.enter()
        if self.mounts is not None:
            prefix[1:1] = self.mounts.enter()
        return prefix

    def host_path(self, path: Path | str) -> Path:
        """Where the machine sees the node's ``path``."""
        return Path(path) if self.first else self.mounts.host_path(path)

    def make_private(self, path: Path | str) -> Path:
        """Give this node its own ``path`` (not the first node: it keeps the machine's);
        return where the machine sees it."""
        return Path(path) if self.first else self.mounts.make_private(path)

    # -- starting ------------------------------------------------------------------------
    def prepare(self) -> None:
        """The node's mount namespace and cgroup root (further nodes only)."""
        if self.first:
            return
        self.mounts.create()
        make_cgroup_root(self.cgroup_root)

    def start_runtime(self, sandbox_image: str) -> Containerd:
        root, state = self.containerd_paths
        self.containerd = Containerd(self.runtime_processes, sandbox_image, root=root, state=state,
                                     enter=self.enter())
        self.containerd.start()
        return self.containerd

    def configure(self, state_dir: Path, authority, ca_cert: Path, kubeconfigs: dict[str, str],
                  bin_dir: Path, extra_kubelet_flags: list[str]) -> None:
        """Write the node's kubelet and kube-proxy configuration (once per cluster)."""
        serving = authority.issue(f"kubelet-{self.name}", f"system:node:{self.name}",
                                  hosts=[self.address.address, self.name], server=True)
        kubelet = state_dir / f"kubelet-{self.name}.yaml"
        kubelet.write_text(yaml.safe_dump(kubelet_config(
            self.address.address, ca_cert, serving.cert, serving.key, self.containerd.socket,
            cgroup_root=self.cgroup_root)))
        proxy = state_dir / f"kube-proxy-{self.name}.yaml"
        proxy.write_text(yaml.safe_dump(kube_proxy_config(kubeconfigs["kube-proxy"], self.name, POD_RANGE)))
        self.argv = {
            "kubelet": [*self.enter(), *kubelet_argv(bin_dir / "kubelet", kubelet, kubeconfigs["kubelet"],
                                                     self.name, self.address.address, extra=extra_kubelet_flags)],
            "kube-proxy": [*self.enter(), *kube_proxy_argv(bin_dir / "kube-proxy", proxy)],
            "test-cards": None,
        }
        if self.cards:
            self.argv["test-cards"] = [*self.enter(), *plugin_argv(self.name, count=self.cards)]

    def start_kubelet(self) -> None:
        KUBELET_ROOT.mkdir(parents=True, exist_ok=True)   # the first node's; a mount point for the others
        self._start("kubelet")
        if self.argv["test-cards"]:
            self._start("test-cards")

    def start_kube_proxy(self) -> None:
        self._start("kube-proxy")

    def processes_alive(self) -> None:
        for group in (self.runtime_processes, self.kubelet_processes):
            group.check_alive()

    def restart_kubelet(self, down_seconds: float = 0.0) -> None:
        """Kill kubelet (SIGKILL, as a crash would), wait ``down_seconds``, start it again:
        what a service manager does. The node's containers run on meanwhile."""
        self.kubelet_processes.restart("kubelet", down_seconds, signal.SIGKILL)

    # -- stopping ------------------------------------------------------------------------
    def stop_kubelet(self) -> None:
        self.kubelet_processes.stop()

    def stop_runtime(self) -> None:
        """Kill the node's containers, then containerd and its shims."""
        if self.containerd is not None:
            self.containerd.remove_workloads()
            self.runtime_processes.stop()
            self.containerd.stop_shims()

    def power_off(self) -> None:
        """Stop the node as a power cut would: kubelet, kube-proxy, the cards, every
        container and containerd go, and nothing tells the API server."""
        for name, proc in self.kubelet_processes.children:
            _kill(proc)
        self.kubelet_processes.stop()
        self.stop_runtime()

    def power_on(self, sandbox_image: str) -> None:
        """Start a powered-off node again: containerd, kubelet (which re-registers and
        finds its Pods' state in its directory), kube-proxy and the cards."""
        self.start_runtime(sandbox_image)
        if self.pod_range:
            self.containerd.write_pod_network(self.pod_range)
        self.start_kubelet()
        self.start_kube_proxy()

    # -- pieces --------------------------------------------------------------------------
    def _start(self, name: str) -> None:
        # the test cards are this repository's Python, run from wherever the caller is
        env = dict(os.environ, PYTHONPATH=str(REPO)) if name == "test-cards" else None
        self.kubelet_processes.start(name, self.argv[name], env=env)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass


def make_cgroup_root(root: str) -> None:
    """Create ``root`` in every cgroup v1 hierarchy (kubelet refuses a missing cgroupRoot);
    a new cpuset starts without CPUs or memory nodes, so those are copied from its parent."""
    for hierarchy in _hierarchies():
        path = hierarchy
        for part in Path(root).relative_to("/").parts:
            parent, path = path, path / part
            if not path.is_dir():
                path.mkdir()
                for key in ("cpuset.cpus", "cpuset.mems"):
                    if (parent / key).exists():
                        (path / key).write_text((parent / key).read_text())


def _hierarchies() -> list[Path]:
    if not CGROUP_V1.is_dir():
        return []
    return [h for h in sorted(CGROUP_V1.iterdir()) if h.is_dir() and not h.is_symlink()
            and (h / "cgroup.procs").exists()]
