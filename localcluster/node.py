"""A real Kubernetes cluster on this machine: the local control plane plus one or more
nodes (:mod:`localcluster.cluster_node`: containerd, kubelet, kube-proxy, test cards) in
network namespaces of their own, with a Pod network and cluster DNS; used by the
end-to-end tests and the demo.

``with LocalCluster(nodes=N) as c:`` takes the machine-wide node lock, restores the machine
if an earlier run died before its teardown, records the host state
(:mod:`localcluster.teardown`), starts the control plane (:class:`ControlPlane` with
Node authorization), lays the cluster network (:mod:`localcluster.network`: each node's
namespace on a bridge, Pod and Service ranges routed to them), prepares each further
node's mount namespace and cgroup root, starts every node's containerd
(:mod:`localcluster.containerd`) with our pause image and its kubelet
(:mod:`localcluster.kubelet`), gives each node's Pods their network once the
controller-manager has handed it a Pod range, starts kube-proxy
(:mod:`localcluster.kube_proxy`), and waits until every node is Ready; then it runs
cluster DNS (:mod:`localcluster.cluster_dns`) and waits until it answers and the
``default`` ServiceAccount exists.

Pods get their own addresses; Services work through their ClusterIPs, from Pods, from
every node, and from this machine (the demo and the tests call models that way). Pods may
still ask for ``hostNetwork: true``: they then share their node's network namespace.

:meth:`LocalCluster.stop` (also on exit, on SIGTERM and after a failed start) undoes it
all, in an order that lets every component clean up after itself: Pods are deleted first
and awaited, so kubelet unpublishes CSI volumes while the plugin still runs; then every
kube-proxy and kubelet stops; each node's containerd tasks are killed and its containers
removed before containerd stops; leftover shims are ended by PID; the control plane stops;
the network goes; finally the host record is restored: mounts under the nodes' kubelet
directories unmounted deepest first, namespace files unmounted, sysctls written back,
added iptables rules and Pod cgroups removed.

One cluster per machine: the first node's kubelet directory is the machine's
``/var/lib/kubelet`` (CSI plugins need that path), so a second LocalCluster waits for
the lock (``lock_timeout``) and then fails with :class:`LocalClusterBusy`.
"""

from __future__ import annotations

import atexit
import fcntl
import ipaddress
import json
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from .binaries import CONTROL_PLANE, NODE, apt_install, ensure_binaries
from .cluster_dns import NAME as DNS_NAME, NAMESPACE as DNS_NAMESPACE, coredns_image, dns_manifests
from .cluster_node import ClusterNode
from .containerd import PACKAGES, ROOT as CONTAINERD_ROOT, STATE as CONTAINERD_STATE, Containerd, containerd_build
from .gobuild import ensure_built
from .controlplane import ControlPlane
from .images import cached_image_names, pause_image, project_image
from .kubelet import ROOT_DIR as KUBELET_ROOT
from .network import MACHINE_ADDRESS, ClusterNetwork, NodeAddress, names as network_names
from .node_mounts import NODES_DIR
from .processes import ProcessGroup
from .drain import drain_pods
from .teardown import NODE_LOCK, RECORD, HostRecord, restore, take_record

log = logging.getLogger(__name__)

LOCK = NODE_LOCK
MANAGED_PREFIXES = [str(KUBELET_ROOT), str(CONTAINERD_ROOT), str(CONTAINERD_STATE.parent), "/run/netns",
                    str(NODES_DIR)]
NODE_PACKAGES = (*PACKAGES, "conntrack")
DEMO_SOURCE_PORT = 8700


class LocalClusterBusy(RuntimeError):
    """Another LocalCluster holds this machine's node lock."""


class TeardownIncomplete(RuntimeError):
    """The machine could not be restored; the message lists what is left."""


@dataclass
class _RecordingGroup(ProcessGroup):
    """A ProcessGroup that reports each started process (to the host record)."""

    on_start: Callable | None = None

    def start(self, name, argv, env=None):
        proc = super().start(name, argv, env)
        if self.on_start:
            self.on_start(name, proc)
        return proc


class LocalCluster(ControlPlane):
    def __init__(self, state_dir: Path | None = None, nodes: int = 1, cards: int = 2,
                 node_ready_timeout: float = 120.0, lock_timeout: float = 900.0,
                 extra_kubelet_flags: list[str] = (), drain_timeout: float = 60.0, version: str | None = None):
        names = [f"node-{i}" for i in range(nodes)]
        super().__init__(state_dir=state_dir, node_names=names, version=version,
                         advertise_address=MACHINE_ADDRESS)
        logs = self.state_dir / "logs"
        self.processes = _RecordingGroup(logs, on_start=self._record_process)
        # each node's processes log under logs/<node>/
        self.nodes = [ClusterNode(NodeAddress(name, i), _RecordingGroup(logs / name, on_start=self._record_process),
                                  _RecordingGroup(logs / name, on_start=self._record_process), cards=cards)
                      for i, name in enumerate(names)]
        self.node_ready_timeout, self.lock_timeout = node_ready_timeout, lock_timeout
        self.drain_timeout = drain_timeout
        self.extra_kubelet_flags = list(extra_kubelet_flags)
        self.sandbox_image: str | None = None
        self.down: set[str] = set()    # nodes powered off or cut off by the harness
        self.network: ClusterNetwork | None = None
        self.record: HostRecord | None = None
        self.leftovers: list[str] = []
        self.timings: dict[str, float] = {}
        self.started: list[tuple[str, int]] = []   # every process ever started, (name, pid)
        self._lock_file = None
        self._stopped = True
        atexit.register(self.stop)

    # the first node, for callers that need one
    @property
    def node(self) -> NodeAddress:
        return self.nodes[0].address

    @property
    def node_name(self) -> str:
        return self.nodes[0].name

    @property
    def containerd(self) -> Containerd | None:
        return self.nodes[0].containerd

    # -- lifecycle -------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> "LocalCluster":
        began = time.monotonic()
        self._stopped = False
        self._take_lock()
        self.timings["lock_wait_seconds"] = round(time.monotonic() - began, 2)
        began = time.monotonic()
        self._install_sigterm()
        apt_install(NODE_PACKAGES)
        ensure_binaries(CONTROL_PLANE + NODE, self.version)
        ensure_built(containerd_build())
        dns_image = coredns_image()
        self._recover_earlier_run()
        self.record = take_record(MANAGED_PREFIXES)
        self.record.runtime_addresses = [str(n.containerd_paths[1] / "containerd.sock") for n in self.nodes]
        self.record.scratch_dirs = [str(self.state_dir)] + [str(NODES_DIR / n.name) for n in self.nodes[1:]]
        self.record.network = network_names([n.address for n in self.nodes])   # before they exist: a crash still cleans
        self.record.save(RECORD)
        self.sandbox_image, sandbox_tar = pause_image()
        super().start(timeout)
        self.timings["control_plane_seconds"] = round(time.monotonic() - began, 2)
        self.network = ClusterNetwork()
        self.network.up()
        self.network.expose(self.port)
        self.network.expose(DEMO_SOURCE_PORT)   # `resident bundle serve-demo`, the README's first model
        proxy_kubeconfig = self._node_kubeconfig("system:kube-proxy", "kube-proxy.kubeconfig")   # one for all nodes
        cached = cached_image_names()
        for node in self.nodes:
            self.network.add_node(node.address)
            node.prepare()
            containerd = node.start_runtime(self.sandbox_image)
            containerd.remove_workloads()   # containers an earlier, crashed run left behind
            # the image store follows the image cache: what the cache pruned goes here too
            containerd.prune_images("resident.local/", keep=cached)
            kubeconfigs = {"kubelet": self._node_kubeconfig(f"system:node:{node.name}", f"kubelet-{node.name}.kubeconfig"),
                           "kube-proxy": proxy_kubeconfig}
            node.configure(self.state_dir, self.authority, self.ca_cert, kubeconfigs, self.bin_dir,
                           self.extra_kubelet_flags)
        self.import_image(sandbox_tar)
        kubelet_began = time.monotonic()
        for node in self.nodes:
            node.start_kubelet()
        for node in self.nodes:
            node.pod_range = self._wait_pod_range(node, self.node_ready_timeout)
            node.containerd.write_pod_network(node.pod_range)
            self.network.route_pods(node.address, node.pod_range)
            node.start_kube_proxy()
        for node in self.nodes:
            self._wait_node_ready(node.name, self.node_ready_timeout)
        self.timings["kubelet_to_ready_seconds"] = round(time.monotonic() - kubelet_began, 2)
        dns_began = time.monotonic()
        self._start_cluster_dns(dns_image)
        self.timings["dns_seconds"] = round(time.monotonic() - dns_began, 2)
        self.wait_for_service_account("default")
        self.timings["start_seconds"] = round(time.monotonic() - began, 2)
        log.info("local cluster ready", extra={"nodes": [n.name for n in self.nodes], "server": self.server,
                                               **self.timings})
        return self

    def stop(self) -> None:
        """Tear everything down; idempotent. Raises TeardownIncomplete if the host is not restored."""
        if self._stopped:
            return
        self._stopped = True
        began = last = time.monotonic()

        def lap(step: str) -> None:
            nonlocal last
            now = time.monotonic()
            self.timings[f"teardown_{step}_seconds"] = round(now - last, 2)
            last = now

        errors: list[str] = []

        def attempt(step: str, action) -> None:
            # every step runs even if an earlier one failed; the host record is restored last
            try:
                action()
            except Exception as e:
                log.error("teardown step %s failed: %s", step, e)
                errors.append(f"{step}: {e}")

        try:
            if self.port and any(n.kubelet_processes.children for n in self.nodes):
                attempt("delete pods", lambda: drain_pods(self.api_client(), self.drain_timeout, self.kubelet_dir))
            lap("drain")
            for node in self.nodes:
                attempt(f"stop kubelet and kube-proxy of {node.name}", node.stop_kubelet)
            for node in self.nodes:
                attempt(f"stop the runtime of {node.name}", node.stop_runtime)
            lap("node")
            attempt("stop control plane", super().stop)
            lap("control_plane")
            if self.network is not None:
                network, self.network = self.network, None
                attempt("remove network", lambda: self.leftovers.extend(network.down()))
            if self.record is not None:
                record, self.record = self.record, None
                attempt("restore host", lambda: self.leftovers.extend(restore(record)))
            lap("restore")
        finally:
            self._release_lock()
            self.timings["teardown_seconds"] = round(time.monotonic() - began, 2)
        if self.leftovers:
            raise TeardownIncomplete(f"the machine was not fully restored: {self.leftovers}")
        if errors and not self.leftovers:
            log.warning("teardown had errors but the machine is restored: %s", errors)

    # -- what tests and the demo call ---------------------------------------------------
    def cluster_node(self, name: str | None = None) -> ClusterNode:
        """The node called ``name`` (the first when None)."""
        if name is None:
            return self.nodes[0]
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r} in this cluster ({[n.name for n in self.nodes]})")

    def import_image(self, tarball: Path | str) -> list[str]:
        """Import an OCI image-layout tarball into every node's containerd, side by side;
        return its names."""
        if not all(n.containerd is not None and n.containerd.running for n in self.nodes):
            raise RuntimeError("the local cluster is not running; start it before importing images")
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            return list(pool.map(lambda n: n.containerd.import_image(Path(tarball)), self.nodes))[0]

    def make_private(self, path: Path | str) -> dict[str, Path]:
        """Give every node its own empty ``path`` (a hostPath the chart names on every node,
        like the bridge's store); return where the machine sees each node's."""
        return {n.name: n.make_private(path) for n in self.nodes}

    def kubelet_dir(self, node_name: str) -> Path:
        """The kubelet directory of ``node_name`` as this machine sees it."""
        return self.cluster_node(node_name).kubelet_dir

    def power_off(self, name: str) -> None:
        """Stop node ``name`` as a power cut would (see :class:`ClusterNode`)."""
        self._going_down(name)
        self.cluster_node(name).power_off()

    def power_on(self, name: str) -> None:
        """Start a powered-off node again and wait until it is Ready."""
        node = self.cluster_node(name)
        node.power_on(self.sandbox_image)
        self.down.discard(name)
        self._wait_node_ready(name, self.node_ready_timeout)

    def cut(self, name: str) -> None:
        """Cut node ``name`` off the network; its processes run on, unreachable."""
        self._going_down(name)
        self.network.cut(self.cluster_node(name).address)

    def reconnect(self, name: str) -> None:
        self.network.reconnect(self.cluster_node(name).address)
        self.down.discard(name)

    def _going_down(self, name: str) -> None:
        """The machine's Service traffic leaves a node that goes down for one that is up."""
        self.down.add(name)
        if self.network.service_gateway == self.cluster_node(name).address:
            up = [n for n in self.nodes if n.name not in self.down]
            if up:
                self.network.route_services(up[0].address)

    def operator_env(self, owner_image: str | None = None) -> dict[str, str]:
        """Environment for an operator run on this machine against this cluster. Owners are
        reached at their Pod IPs, which this machine routes to the node."""
        env = {"KUBECONFIG": self.kubeconfig}
        if owner_image:
            env["RESIDENT_OWNER_IMAGE"] = owner_image
        return env

    def wait_for_service_account(self, namespace: str, name: str = "default", timeout: float = 60.0) -> None:
        """Wait until the ServiceAccount exists (Pods that name it are refused before)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.api_client())
        deadline = time.monotonic() + timeout
        while True:
            try:
                core.read_namespaced_service_account(name, namespace)
                return
            except ApiException as e:
                if e.status != 404:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"ServiceAccount {namespace}/{name} does not exist after {timeout}s")
            time.sleep(0.3)

    def expose(self, port: int) -> str:
        """Make a server on this machine's ``127.0.0.1:<port>`` reachable from the cluster
        (the bridge, Pods); return the ``host:port`` the cluster calls it by."""
        return self.network.expose(port)

    def node_exec(self, argv: list[str], node: str | None = None, **run) -> subprocess.CompletedProcess:
        """Run ``argv`` on a node (the first when None): in its network namespace, and its
        mount namespace if it has one."""
        return subprocess.run([*self.cluster_node(node).enter(), *argv], **run)

    # -- pieces ----------------------------------------------------------------------
    def _record_process(self, name: str, proc) -> None:
        self.started.append((name, proc.pid))
        if self.record is not None:
            self.record.add_process(name, proc)

    def _take_lock(self) -> None:
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(LOCK, "a+")
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self._lock_file.seek(0)
                    holder = self._lock_file.read().strip() or "unknown"
                    self._lock_file.close()
                    self._lock_file = None
                    raise LocalClusterBusy(
                        f"another LocalCluster runs on this machine (pid {holder}, lock {LOCK}); "
                        f"waited {self.lock_timeout:.0f}s") from None
                time.sleep(0.5)
        self._lock_file.truncate(0)
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.truncate(0)
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame):
            try:
                self.stop()
            finally:
                if callable(previous):
                    previous(signum, frame)
                os._exit(143)

        signal.signal(signal.SIGTERM, on_sigterm)

    def _recover_earlier_run(self) -> None:
        earlier = HostRecord.load(RECORD)
        if earlier is None:
            return
        log.warning("an earlier local cluster (pid %d) did not finish its teardown; restoring the machine",
                    earlier.taken_by_pid)
        remaining = restore(earlier)
        if remaining:
            raise TeardownIncomplete(f"cannot restore what an earlier run left: {remaining}")

    def _node_kubeconfig(self, user: str, file: str) -> str:
        """A kubeconfig for a process in the node's namespace, which reaches the API server
        at the machine's address on the node network."""
        path = str(self.state_dir / file)
        self.write_kubeconfig(path, self.user_tokens[user][0], user,
                              server=f"https://{MACHINE_ADDRESS}:{self.port}")
        return path

    def _wait_pod_range(self, node: ClusterNode, timeout: float) -> str:
        """Wait until the node is registered and the controller-manager gave it a Pod range."""
        def pod_range(node) -> tuple[str | None, str]:
            found = node.spec.pod_cidr
            if found:
                ipaddress.ip_network(found)
            return found, "registered, no range yet"
        return self._wait_for_node(node.name, "has no Pod range", pod_range, timeout, every=0.3)

    def _start_cluster_dns(self, image: tuple[str, Path], timeout: float = 90.0) -> None:
        """Run CoreDNS and wait until its Pod is Ready and its Service has the endpoint."""
        name, tarball = image
        self.import_image(tarball)
        manifests = "\n---\n".join(json.dumps(m) for m in dns_manifests(name))
        self.kubectl("apply", "-f", "-", input=manifests)
        done = self.kubectl("rollout", "status", f"deployment/{DNS_NAME}", "-n", DNS_NAMESPACE,
                            f"--timeout={int(timeout)}s", check=False)
        if done.returncode:
            pods = self.kubectl("get", "pods", "-n", DNS_NAMESPACE, "-o", "wide", check=False).stdout
            raise TimeoutError(f"cluster DNS not ready after {timeout:.0f}s: {done.stderr.strip()}\n{pods}")

    def _wait_node_ready(self, name: str, timeout: float) -> None:
        def ready(node) -> tuple[bool, str]:
            found = {c.type: c for c in (node.status.conditions or [])}.get("Ready")
            if found is None:
                return False, "no Ready condition"
            return found.status == "True", f"Ready={found.status}: {found.message}"
        self._wait_for_node(name, "not Ready", ready, timeout, every=0.5)

    def _wait_for_node(self, name: str, missing: str, probe, timeout: float, every: float):
        """Read the Node every ``every`` s until ``probe(node)`` gives a truthy value (and a
        status that says where it stands); fail at once if a process of the cluster died,
        and after ``timeout`` with the last status and kubelet's log."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.api_client())
        deadline = time.monotonic() + timeout
        status = "not registered"
        while time.monotonic() < deadline:
            self.processes.check_alive()
            for node in self.nodes:
                node.processes_alive()
            try:
                value, status = probe(core.read_node(name))
                if value:
                    return value
            except ApiException as e:
                if e.status != 404:
                    raise
            time.sleep(every)
        raise TimeoutError(f"node {name} {missing} after {timeout}s ({status}); kubelet log:\n"
                           + self.cluster_node(name).kubelet_processes.log_tail("kubelet"))

def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m localcluster.node", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project-image", action="store_true",
                        help="build (or reuse) the project image and import it into the node")
    parser.add_argument("--nodes", type=int, default=1, metavar="N", help="how many nodes (default 1)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the cluster until Ctrl-C or SIGTERM (prints its KUBECONFIG), then tear it down")
    args = parser.parse_args(argv)
    from bundle.jsonlog import configure

    configure(logging.INFO)
    with LocalCluster(nodes=args.nodes) as cluster:
        if args.project_image:
            name, tarball = project_image()
            print(f"imported {cluster.import_image(tarball)}")
        print(cluster.kubectl("get", "nodes", "-o", "wide").stdout)
        print(f"KUBECONFIG={cluster.kubeconfig}  timings={cluster.timings}", flush=True)
        if args.keep:
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
    print(f"torn down in {cluster.timings['teardown_seconds']}s; the machine is restored", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
