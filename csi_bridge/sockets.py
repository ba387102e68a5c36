"""The unix sockets kubelet dials, CSI and plugin registration, served from the start.

A node back from a power cut starts kubelet, the bridge and the lost Pods together, and
kubelet tries those Pods' mounts before the driver is registered again: each failure
doubles its next wait (docs/chaos.md). So the bridge process serves these sockets first,
with nothing loaded but gRPC and the CSI protos (a tenth of a second of imports on an
idle machine, against half a second for the rest of the bridge and about two more for
the Kubernetes client). They answer at once all that registration asks: the
registration socket's GetInfo, the Identity service, NodeGetInfo and
NodeGetCapabilities. Publish, unpublish and volume stats are held until the bridge
behind them is ready (:meth:`Sockets.attach`), at most ``wait_seconds`` and never past
the call's deadline, and then answered UNAVAILABLE: kubelet tries again. Until then
Probe says not ready, "the bridge is starting".

The CSI socket is mode 0660 (root, which kubelet runs as, and the process's group, for
non-root sidecars); a stale socket file is removed before binding, anything else is not.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from concurrent import futures
from pathlib import Path
from typing import Callable

import grpc

from . import logs
from .identity import DRIVER_NAME, IdentityServicer
from .proto import csi_pb2, csi_pb2_grpc, pluginregistration_pb2_grpc
from .registration import RegistrationServicer, remove_earlier_sockets, socket_name

log = logging.getLogger("resident.bridge")
VERSION = "0.1.0"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with its NUL
SOCKET_MODE = 0o660    # owner (root: kubelet) and the process's group (the non-root sidecars)
RPC = csi_pb2.NodeServiceCapability.RPC


def socket_path(endpoint: str) -> Path:
    if not endpoint.startswith("unix://"):
        raise ValueError(f"endpoint {endpoint!r} must be unix:///absolute/path")
    path = Path(endpoint.removeprefix("unix://"))
    if not path.is_absolute():
        raise ValueError(f"endpoint {endpoint!r} must name an absolute socket path")
    check_socket_length(path)
    return path


def check_socket_length(path: Path) -> None:
    if len(str(path).encode()) > MAX_SOCKET_PATH:
        raise ValueError(f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes, the limit "
                         "of a unix socket address; choose a shorter directory")


def remove_stale_socket(path: Path) -> None:
    """Remove a leftover socket file; refuse to delete anything that is not a socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ValueError(f"{path} exists and is not a socket; refusing to replace it")
    os.unlink(path)


class HeldNode(csi_pb2_grpc.NodeServicer):
    """The Node service as kubelet sees it: what registration asks is answered here, the
    volume calls go to the bridge's servicer once it is attached. Staging is not offered
    (NodeStageVolume, NodeUnstageVolume and NodeExpandVolume answer UNIMPLEMENTED, from
    the generated base class); the one capability is GET_VOLUME_STATS."""

    def __init__(self, node_id: str, wait_seconds: float):
        if not node_id:
            raise ValueError("node id is required (--node-id or NODE_NAME)")
        self.node_id, self.wait_seconds = node_id, wait_seconds
        self._servicer = None
        self._attached = threading.Event()

    def attach(self, servicer) -> None:
        self._servicer = servicer
        self._attached.set()

    def _behind(self, context):
        remaining = context.time_remaining()
        wait = self.wait_seconds if remaining is None else min(self.wait_seconds, max(0.0, remaining - 1.0))
        if not self._attached.wait(wait):
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"the bridge is still starting after {wait:g} s; try again")
        return self._servicer

    def NodeGetCapabilities(self, request, context):
        return csi_pb2.NodeGetCapabilitiesResponse(capabilities=[
            csi_pb2.NodeServiceCapability(rpc=RPC(type=RPC.GET_VOLUME_STATS))])

    def NodeGetInfo(self, request, context):
        return csi_pb2.NodeGetInfoResponse(node_id=self.node_id, max_volumes_per_node=0)

    def NodePublishVolume(self, request, context):
        return self._behind(context).NodePublishVolume(request, context)

    def NodeUnpublishVolume(self, request, context):
        return self._behind(context).NodeUnpublishVolume(request, context)

    def NodeGetVolumeStats(self, request, context):
        return self._behind(context).NodeGetVolumeStats(request, context)


class Sockets:
    """The CSI socket (Identity and Node) and, with ``registration_dir``, kubelet's plugin
    registration socket (``<dir>/<driver>-<run>-reg.sock``, docs/csi-bridge.md)."""

    def __init__(self, endpoint: str, node_id: str, registration_dir: Path | None = None,
                 kubelet_endpoint: str | None = None, workers: int = 8, wait_seconds: float = 30.0):
        self.socket = socket_path(endpoint)
        self.registration_dir = None if registration_dir is None else Path(registration_dir)
        self.kubelet_endpoint, self.workers = kubelet_endpoint, workers
        self.calls = logs.CallLogger()   # counted in metrics once the bridge attaches them
        self.node = HeldNode(node_id, wait_seconds)
        self._health: Callable[[], str | None] = lambda: "the bridge is starting"
        self.identity = IdentityServicer(VERSION, lambda: self._health())
        self.registration: RegistrationServicer | None = None
        self.registration_socket: Path | None = None
        self._servers: list[grpc.Server] = []

    @property
    def serving(self) -> bool:
        return bool(self._servers)

    def _server(self, path: Path) -> grpc.Server:
        check_socket_length(path)
        remove_stale_socket(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.workers), interceptors=[self.calls])
        server.add_insecure_port(f"unix://{path}")
        return server

    def start(self) -> "Sockets":
        server = self._server(self.socket)
        csi_pb2_grpc.add_IdentityServicer_to_server(self.identity, server)
        csi_pb2_grpc.add_NodeServicer_to_server(self.node, server)
        server.start()
        os.chmod(self.socket, SOCKET_MODE)
        self._servers.append(server)
        if self.registration_dir is not None:
            self.registration = RegistrationServicer(DRIVER_NAME, self.kubelet_endpoint or str(self.socket))
            remove_earlier_sockets(self.registration_dir, DRIVER_NAME)   # before ours appears
            reg_socket = self.registration_socket = self.registration_dir / socket_name(DRIVER_NAME)
            reg = self._server(reg_socket)
            pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, reg)
            reg.start()
            os.chmod(reg_socket, SOCKET_MODE)
            self._servers.append(reg)
        log.info("kubelet sockets serving", extra={"target": str(self.socket), "phase": "listening",
                                                   "registration": str(self.registration_socket or "")})
        return self

    def attach(self, node_servicer, health: Callable[[], str | None], metrics) -> None:
        """The bridge is ready: volume calls go to ``node_servicer``, Probe asks ``health``."""
        self.calls.metrics = metrics
        self._health = health
        self.node.attach(node_servicer)

    def stop(self, grace: float = 2.0) -> None:
        if self.registration_socket is not None:   # kubelet unregisters the driver
            self.registration_socket.unlink(missing_ok=True)
            self.registration_socket = None
        for server in reversed(self._servers):
            server.stop(grace).wait()
        self._servers.clear()
