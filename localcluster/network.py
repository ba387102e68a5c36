"""The local cluster's network: nodes in network namespaces of their own, on one bridge.

Every address of the cluster lives on this machine, in links and namespaces this module
creates, and every route that carries cluster traffic ends in one of them:

- **node network** ``10.200.0.0/24`` on the bridge ``rsd0`` in the machine's namespace.
  The machine is ``10.200.0.1``; node *i* is ``10.200.0.(10+i)``, in the network namespace
  ``resident-<node>``, joined to the bridge by a veth pair (``rsd-<i>`` on the machine,
  ``eth0`` in the node). kubelet, containerd and kube-proxy of a node run in its
  namespace (``nsenter --net``; they keep the machine's mount namespace, so the bind mounts
  kubelet and the CSI plugin make are seen by both).
- **Pod ranges** ``10.244.<i>.0/24``, one per node, handed out by the controller-manager
  and given to Pods by the CNI ``bridge`` plugin (bridge ``cni0`` inside the node).
  Each range is routed to its node, from the machine and from every other node.
- **Services** ``10.96.0.0/16``. kube-proxy translates ClusterIPs inside each node. The
  machine routes the whole range to the first node, whose kube-proxy translates it, so the
  demo and the tests, which run on the machine, call a model through its Service's ClusterIP
  like an application in the cluster would. While that node is stopped or cut off, the
  machine routes the range to another node (:meth:`ClusterNetwork.route_services`).
- **Servers on the machine** listen on 127.0.0.1 only: the API server, and the bundle
  sources of the demo and the tests (an HTTP server, a registry). :meth:`ClusterNetwork.expose`
  makes one such port reachable from the cluster as ``10.200.0.1:<port>``: a DNAT rule in
  the machine's ``nat`` table, limited to packets that arrive on ``rsd0``, hands those
  connections to the loopback listener (``route_localnet`` on ``rsd0`` allows it). Nothing
  listens on ``10.200.0.1`` itself. The API server advertises that address, so the
  ``kubernetes`` Service points there.

No namespace has a default route, and the machine does not forward (``ip_forward`` stays
as it is; the bridge switches, it does not route), so nothing addressed outside these
ranges can leave the machine: a Pod that asks for any other address gets "network
unreachable". Cluster DNS answers only for ``cluster.local``; it forwards nothing.
"""

from __future__ import annotations

import ipaddress
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

BRIDGE = "rsd0"
NODE_NETWORK = ipaddress.ip_network("10.200.0.0/24")
MACHINE_ADDRESS = "10.200.0.1"
SERVICE_RANGE = "10.96.0.0/16"
NETNS_DIR = Path("/run/netns")


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done


def _sysctl(key: str, value: str, netns: str | None = None) -> None:
    path = f"/proc/sys/{key.replace('.', '/')}"
    argv = ["sh", "-c", f"echo {value} > {path}"]
    if netns:
        argv = ["nsenter", f"--net={NETNS_DIR / netns}", "--", *argv]
    subprocess.run(argv, check=True, capture_output=True)


@dataclass(frozen=True)
class NodeAddress:
    """Where node ``index`` named ``name`` lives on the node network."""

    name: str
    index: int

    @property
    def netns(self) -> str:
        return f"resident-{self.name}"

    @property
    def address(self) -> str:
        return str(NODE_NETWORK.network_address + 10 + self.index)

    @property
    def machine_link(self) -> str:
        return f"rsd-{self.index}"

    def enter(self) -> list[str]:
        """The argv prefix that runs a command in this node's network namespace."""
        return ["nsenter", f"--net={NETNS_DIR / self.netns}", "--"]


class ClusterNetwork:
    """The bridge, the nodes' namespaces and the routes between them (see the module doc)."""

    def __init__(self):
        self.nodes: list[NodeAddress] = []
        self.exposed: list[int] = []
        self.service_gateway: NodeAddress | None = None

    def up(self) -> None:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{MACHINE_ADDRESS}/{NODE_NETWORK.prefixlen}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        _sysctl(f"net.ipv4.conf.{BRIDGE}.route_localnet", "1")

    def expose(self, port: int) -> str:
        """Let the cluster reach the machine's ``127.0.0.1:<port>``; return the address it
        uses for it (``10.200.0.1:<port>``)."""
        if port not in self.exposed:
            subprocess.run(["iptables", "-w", "5", "-t", "nat", "-A", *dnat_rule(port)], check=True,
                           capture_output=True)
            self.exposed.append(port)
        return f"{MACHINE_ADDRESS}:{port}"

    def add_node(self, node: NodeAddress) -> None:
        """Make the node's namespace, join it to the bridge and route Services through the first node."""
        _ip("netns", "add", node.netns)
        _ip("link", "add", node.machine_link, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
        _ip("link", "set", node.machine_link, "master", BRIDGE, "up")
        _ip("link", "set", "lo", "up", netns=node.netns)
        _ip("addr", "add", f"{node.address}/{NODE_NETWORK.prefixlen}", "dev", "eth0", netns=node.netns)
        _ip("link", "set", "eth0", "up", netns=node.netns)
        # locally made connections to a ClusterIP need a route before kube-proxy rewrites them
        _ip("route", "add", SERVICE_RANGE, "dev", "eth0", netns=node.netns)
        _sysctl("net.ipv4.ip_forward", "1", node.netns)
        # Pod-to-Service-to-Pod on one node crosses the cni0 bridge: kube-proxy's rules must see it
        _sysctl("net.bridge.bridge-nf-call-iptables", "1", node.netns)
        if not self.nodes:
            self.route_services(node)
        self.nodes.append(node)

    def route_services(self, node: NodeAddress) -> None:
        """Send the machine's Service traffic to ``node``, whose kube-proxy translates it
        (the first node, or another one while the first is down)."""
        _ip("route", "replace", SERVICE_RANGE, "via", node.address)
        self.service_gateway = node

    def route_pods(self, node: NodeAddress, pod_range: str) -> None:
        """Route ``pod_range`` to ``node`` from the machine and from every other node."""
        _ip("route", "replace", pod_range, "via", node.address)
        for other in self.nodes:
            if other != node:
                _ip("route", "replace", pod_range, "via", node.address, netns=other.netns)

    def cut(self, node: NodeAddress) -> None:
        """Cut the node off: its link to the bridge goes down, so nothing reaches it and
        it reaches nothing (not the API server, not the other nodes); its processes run on."""
        _ip("link", "set", node.machine_link, "down")

    def reconnect(self, node: NodeAddress) -> None:
        _ip("link", "set", node.machine_link, "up")

    def down(self) -> list[str]:
        """Remove everything :meth:`up`, :meth:`add_node` and :meth:`expose` made; return
        what could not be."""
        for port in self.exposed:
            subprocess.run(["iptables", "-w", "5", "-t", "nat", "-D", *dnat_rule(port)], capture_output=True)
        self.exposed.clear()
        return remove(names(self.nodes))


def names(nodes: list[NodeAddress]) -> list[str]:
    """What the network of ``nodes`` consists of, in the order it is removed: each node's
    veth (deleted at once, rather than whenever the kernel frees its namespace), the bridge,
    the namespaces (``netns:<name>``)."""
    return [n.machine_link for n in nodes] + [BRIDGE] + [f"netns:{n.netns}" for n in nodes]


def dnat_rule(port: int) -> list[str]:
    return ["PREROUTING", "-i", BRIDGE, "-d", MACHINE_ADDRESS, "-p", "tcp", "--dport", str(port),
            "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}"]


def remove(names: list[str]) -> list[str]:
    """Delete the links and namespaces in ``names`` (``netns:`` marks a namespace); routes
    go with their links. Return what is still there."""
    for name in names:
        if name.startswith("netns:"):
            _ip("netns", "delete", name.split(":", 1)[1], check=False)
        else:
            _ip("link", "delete", name, check=False)
    return leftovers(names)


def leftovers(names: list[str]) -> list[str]:
    left = []
    for name in names:
        if name.startswith("netns:"):
            if (NETNS_DIR / name.split(":", 1)[1]).exists():
                left.append(f"network namespace {name.split(':', 1)[1]}")
        elif _ip("link", "show", name, check=False).returncode == 0:
            left.append(f"link {name}")
    return left


def pod_namespace_files() -> list[Path]:
    """``/run/netns/cni-*``: the files containerd binds each Pod's network namespace to."""
    return sorted(NETNS_DIR.glob("cni-*")) if NETNS_DIR.is_dir() else []


def remove_pod_namespace_files() -> None:
    """After an unclean stop (containerd killed), the Pods' namespace files stay behind,
    unmounted but present; remove those that are no longer mount points."""
    mounted = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    for f in pod_namespace_files():
        if str(f) not in mounted:
            f.unlink(missing_ok=True)
