"""Test cards: a device plugin that advertises accelerator cards for the local cluster, with
no hardware behind them.

A real node learns of its NPUs from the vendor's device plugin, which speaks kubelet's
device-plugin API (v1beta1, gRPC on unix sockets). The local cluster's nodes have no
cards, so this plugin speaks the same API for a resource name such as ``furiosa.ai/rngd``
and advertises ``count`` healthy devices named ``test-card-<node>-<i>``. kubelet then puts
them in the Node's capacity and allocatable itself, the scheduler counts them, and kubelet's
device manager hands each owner container its own device: :meth:`Allocate` answers with
one environment variable, ``RESIDENT_TEST_CARD=<device ID>``, and no device nodes, mounts
or CDI devices. No vendor SDK or driver runs; the name says "test card" everywhere, so
nobody mistakes it for FuriosaAI's plugin.

The conversation with kubelet:

1. Serve ``DevicePlugin`` on ``<dir>/<socket>`` (``dir`` is kubelet's fixed
   ``/var/lib/kubelet/device-plugins/``, whatever its ``--root-dir`` says).
2. Call ``Registration.Register`` on ``<dir>/kubelet.sock`` with version ``v1beta1``, the
   socket's file name as endpoint, and the resource name. kubelet dials the endpoint back
   and asks ``GetDevicePluginOptions`` before it answers, then opens ``ListAndWatch``.
3. When kubelet starts it removes every socket in ``dir`` and creates ``kubelet.sock``
   anew. The plugin looks every ``poll_seconds``: its socket gone (or not its own any
   more) means serve again and register again; a new ``kubelet.sock`` means register
   again, and so does a registration kubelet failed because it could not dial the plugin
   back (it had just removed the socket as it started). A refused registration (bad
   version or resource name) is final: kubelet's API says a plugin then stops, and this
   one raises :class:`RegistrationRefused` (exit code 1 on the command line).
4. SIGTERM stops the server and removes the socket, if it is still this plugin's.

The local cluster starts one plugin per node, in the node's mount namespace (the one
whose ``/var/lib/kubelet/device-plugins`` that node's kubelet sees): :func:`plugin_argv`
gives the command and :func:`socket_path` the socket it serves.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from csi_bridge.sockets import remove_stale_socket

from .proto import deviceplugin_pb2 as pb, deviceplugin_pb2_grpc as pb_grpc

log = logging.getLogger("resident.test_cards")

DEFAULT_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"
DEFAULT_RESOURCE = "furiosa.ai/rngd"
ENV_NAME = "RESIDENT_TEST_CARD"
HEALTHY = "Healthy"
DIAL_BACK_FAILED = "failed to dial device plugin"   # kubelet's words when its dial-back fails
MAX_DEVICE_ID = 63           # kubelet's limit on a device ID
MAX_SOCKET_PATH = 107        # sun_path, less its terminating NUL
_DOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_RESOURCE_RE = re.compile(rf"^(?P<domain>{_DOMAIN})/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class RegistrationRefused(RuntimeError):
    """kubelet answered Register with an error: the plugin must not go on."""


# -- what is advertised (pure) ---------------------------------------------------------------

def check_resource(resource: str) -> str:
    """``resource`` if it is an extended resource name kubelet accepts, else ValueError."""
    m = _RESOURCE_RE.match(resource)
    if not m or len(resource) > 253 + 1 + 63:
        raise ValueError(f"{resource!r} is not an extended resource name (domain/name, e.g. {DEFAULT_RESOURCE})")
    domain = m.group("domain")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise ValueError(f"{resource!r} is in the kubernetes.io domain, which kubelet keeps for native resources")
    return resource


def device_ids(node: str, count: int) -> list[str]:
    """The IDs of a node's test cards: ``test-card-<node>-0`` ... ``-<count-1>``."""
    if count < 1:
        raise ValueError(f"a node has at least one test card, not {count}")
    ids = [f"test-card-{node}-{i}" for i in range(count)]
    if len(ids[-1]) > MAX_DEVICE_ID:
        raise ValueError(f"device ID {ids[-1]!r} is longer than kubelet's {MAX_DEVICE_ID} characters: "
                         "use a shorter node name")
    return ids


def socket_name(node: str, resource: str = DEFAULT_RESOURCE) -> str:
    """The plugin's socket file name (its Register endpoint), e.g.
    ``resident-test-card-node-0-furiosa.ai_rngd.sock``."""
    return f"resident-test-card-{node}-{resource.replace('/', '_')}.sock"


def socket_path(node: str, resource: str = DEFAULT_RESOURCE, directory: Path = DEFAULT_DIR) -> Path:
    return Path(directory) / socket_name(node, resource)


def plugin_argv(node: str, *, count: int = 2, resource: str = DEFAULT_RESOURCE,
                directory: Path = DEFAULT_DIR, python: str = sys.executable) -> list[str]:
    """The command that runs a node's test cards (its working directory or PYTHONPATH must
    reach this package); checked here, so a bad node name fails before anything starts."""
    check_resource(resource)
    device_ids(node, count)
    _check_socket_path(socket_path(node, resource, directory))
    return [python, "-m", "localcluster.test_cards", "--node", node, "--count", str(count),
            "--resource", resource, "--dir", str(directory)]


def allocation(requested: list[str], known: list[str]) -> dict[str, str]:
    """The environment one container gets for the devices kubelet chose for it. LookupError
    names the first device that is not one of ``known``; ValueError means no device."""
    if not requested:
        raise ValueError("the container request names no device")
    for device in requested:
        if device not in known:
            raise LookupError(f"unknown device ID {device!r}: this plugin has {', '.join(known)}")
    return {ENV_NAME: ",".join(requested)}


def _check_socket_path(path: Path) -> None:
    # the plugin binds ".<name>~<pid>" first (pids have at most 7 digits), then renames it
    if len(os.fsencode(path)) + len(".~1234567") > MAX_SOCKET_PATH:
        raise ValueError(f"socket path {path} is longer than a unix socket allows ({MAX_SOCKET_PATH} bytes)")


# -- the DevicePlugin service ------------------------------------------------------------------

@dataclass(frozen=True)
class Cards:
    """One node's test cards: what the plugin advertises and where it serves."""

    node: str
    count: int = 2
    resource: str = DEFAULT_RESOURCE
    directory: Path = DEFAULT_DIR

    def __post_init__(self) -> None:
        check_resource(self.resource)
        object.__setattr__(self, "directory", Path(self.directory))
        device_ids(self.node, self.count)
        _check_socket_path(self.socket_path)

    @property
    def ids(self) -> list[str]:
        return device_ids(self.node, self.count)

    @property
    def endpoint(self) -> str:
        return socket_name(self.node, self.resource)

    @property
    def socket_path(self) -> Path:
        return self.directory / self.endpoint

    @property
    def kubelet_socket(self) -> Path:
        return self.directory / KUBELET_SOCKET


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    """kubelet's calls, answered for a fixed set of always-healthy test cards."""

    def __init__(self, cards: Cards, stopping: threading.Event):
        self.cards, self.stopping = cards, stopping

    def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def ListAndWatch(self, request, context):
        # The cards never change: one list, then the stream stays open until kubelet goes
        # (its connection closes) or the plugin stops. kubelet reads a closed stream as the
        # plugin gone and marks the devices unhealthy.
        ended = threading.Event()
        context.add_callback(ended.set)
        log.info("kubelet is watching the test cards",
                 extra={"method": "ListAndWatch", "resource": self.cards.resource, "devices": self.cards.ids})
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=HEALTHY) for i in self.cards.ids])
        while context.is_active() and not self.stopping.is_set():
            ended.wait(5.0)

    def Allocate(self, request, context):
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            try:
                env = allocation(ids, self.cards.ids)
            except LookupError as e:
                log.error("refused an allocation", extra={"method": "Allocate", "devices": ids, "error": str(e)})
                context.abort(grpc.StatusCode.NOT_FOUND, f"{self.cards.resource} on {self.cards.node}: {e}")
            except ValueError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.cards.resource} on {self.cards.node}: {e}")
            responses.append(pb.ContainerAllocateResponse(envs=env))
            log.info("allocated test cards", extra={"method": "Allocate", "devices": ids})
        return pb.AllocateResponse(container_responses=responses)

    def GetPreferredAllocation(self, request, context):
        # Not advertised (get_preferred_allocation_available is false); answered anyway:
        # the devices that must be included, then the first available ones.
        answers = []
        for req in request.container_requests:
            chosen = list(req.must_include_deviceIDs)
            chosen += [d for d in req.available_deviceIDs if d not in chosen][:max(0, req.allocation_size - len(chosen))]
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=answers)

    def PreStartContainer(self, request, context):
        return pb.PreStartContainerResponse()   # nothing to reset on a test card


# -- serving and registering ---------------------------------------------------------------

def _identity(path: Path) -> tuple[int, int, int] | None:
    """What tells one file at ``path`` from a later one there: device, inode, change time."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class TestCardPlugin:
    """Serves a node's :class:`Cards` and keeps them registered with kubelet until stopped."""

    __test__ = False   # a pytest collector that imports this must not take it for a test class

    def __init__(self, cards: Cards, *, poll_seconds: float = 1.0, register_timeout: float = 30.0):
        self.cards, self.poll_seconds, self.register_timeout = cards, poll_seconds, register_timeout
        self.stopping = threading.Event()
        self.registrations = 0          # successful Register calls, for tests and logs
        self._server: grpc.Server | None = None
        self._served: tuple | None = None       # identity of the socket file this plugin made
        self._registered_with: tuple | None = None  # identity of the kubelet.sock it registered with
        self._noted = ""                # the last wait logged

    # serving
    def serve(self) -> None:
        """(Re)start the gRPC server on the plugin's socket, replacing a stale socket there.

        The server binds a private name and the socket is then renamed into place: gRPC
        unlinks the path it bound when it stops, whatever file is there by then, and the
        plugin's own path must be removed only while it is still this plugin's socket.
        """
        self._stop_server()
        path = self.cards.socket_path
        binding = self.cards.directory / f".{self.cards.endpoint}~{os.getpid()}"
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_socket(path)
        remove_stale_socket(binding)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="test-cards"))
        pb_grpc.add_DevicePluginServicer_to_server(DevicePluginServicer(self.cards, self.stopping), server)
        server.add_insecure_port(f"unix:{binding}")
        server.start()
        self._server = server
        try:
            os.rename(binding, path)
        except FileNotFoundError:
            # a kubelet starting empties the directory: it took the socket before it was in
            # place; the next look (step) finds the plugin's socket missing and serves again
            log.warning("the plugin socket was removed before it was in place (kubelet starting?)",
                        extra={"socket": path})
            self._stop_server()
            self._served = None
            return
        self._served = _identity(path)
        log.info("serving test cards", extra={"socket": path, "resource": self.cards.resource,
                                              "devices": self.cards.ids})

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=1.0).wait(5.0)
            self._server = None

    def _socket_is_ours(self) -> bool:
        return self._served is not None and _identity(self.cards.socket_path) == self._served

    # registering
    def register(self) -> bool:
        """Register with kubelet once: True when it accepted, False when kubelet is not
        there (yet) or the plugin is stopping; RegistrationRefused when kubelet answered no."""
        kubelet_sock = self.cards.kubelet_socket
        before = _identity(kubelet_sock)
        if before is None:
            self._note("waiting for kubelet", extra={"kubelet_socket": kubelet_sock})
            return False
        request = pb.RegisterRequest(version=API_VERSION, endpoint=self.cards.endpoint,
                                     resource_name=self.cards.resource, options=pb.DevicePluginOptions())
        with grpc.insecure_channel(f"unix:{kubelet_sock}") as channel:
            call = pb_grpc.RegistrationStub(channel).Register.future(request, timeout=self.register_timeout)
            while not call.done():              # kubelet dials back first: this may take seconds
                if self.stopping.wait(0.05):
                    call.cancel()
                    return False
            try:
                call.result()
            except grpc.RpcError as e:
                # kubelet could not dial the plugin back: it removed the socket as it started
                # (a race with a plugin that registered with the kubelet.sock of the run before),
                # or was too busy; the next look serves again if the socket is gone
                dial_back = e.code() == grpc.StatusCode.UNKNOWN and DIAL_BACK_FAILED in (e.details() or "")
                if dial_back or e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._note("kubelet did not answer Register; trying again", logging.WARNING,
                               extra={"kubelet_socket": kubelet_sock, "code": e.code().name, "error": e.details()})
                    return False
                raise RegistrationRefused(
                    f"kubelet refused {self.cards.resource} from {self.cards.endpoint}: "
                    f"{e.code().name}: {e.details()}") from None
        self._registered_with, self._noted = before, ""
        self.registrations += 1
        log.info("registered with kubelet", extra={"resource": self.cards.resource, "endpoint": self.cards.endpoint,
                                                   "version": API_VERSION, "registrations": self.registrations})
        return True

    def _note(self, msg: str, level: int = logging.INFO, *, extra: dict) -> None:
        """Log a wait once, not at every look, until something else happens."""
        if msg != self._noted:
            log.log(level, msg, extra=extra)
            self._noted = msg

    # the loop
    def step(self) -> None:
        """One look: serve again if kubelet removed the socket, register if kubelet is new."""
        if not self._socket_is_ours():
            log.warning("the plugin socket was removed (kubelet restarted?): serving and registering again",
                        extra={"socket": self.cards.socket_path})
            self.serve()
            self._registered_with = None
        current = _identity(self.cards.kubelet_socket)
        if self._registered_with is not None and current != self._registered_with:
            log.warning("kubelet.sock changed (kubelet restarted?): registering again",
                        extra={"kubelet_socket": self.cards.kubelet_socket})
            self._registered_with = None
        if self._registered_with is None:
            self.register()

    def run(self) -> None:
        """Serve and stay registered until :meth:`stop` (or SIGTERM on the command line)."""
        try:
            self.serve()
            while not self.stopping.is_set():
                self.step()
                self.stopping.wait(self.poll_seconds)
        finally:
            self.close()

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        """Stop serving and remove the socket, unless another process has put its own there."""
        self.stopping.set()
        ours = self._socket_is_ours()
        self._stop_server()
        if ours:
            self.cards.socket_path.unlink(missing_ok=True)
        log.info("stopped", extra={"socket": self.cards.socket_path, "removed_socket": ours})


# -- command line -----------------------------------------------------------------------

DESCRIPTION = """\
Test cards for the local cluster: a kubelet device plugin that advertises accelerator
cards that do not exist. No hardware, driver or vendor SDK is involved, and it is not
any vendor's device plugin.

It serves kubelet's device-plugin API (v1beta1) on a unix socket in DIR, registers the
resource with kubelet at DIR/kubelet.sock, and advertises COUNT healthy devices named
test-card-NODE-0, test-card-NODE-1, ... kubelet then lists them in the Node's capacity and
hands each container that asks for one its own device: the container gets the
environment variable RESIDENT_TEST_CARD=<device ID> and nothing else (no device files).
When kubelet restarts (it removes the plugin's socket), the plugin serves and registers
again. SIGTERM stops it and removes its socket. Logs are JSON lines on stderr.
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m localcluster.test_cards", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", required=True, help="the node's name; it is part of every device ID")
    p.add_argument("--count", type=int, default=2, help="how many test cards the node has (default 2)")
    p.add_argument("--resource", default=DEFAULT_RESOURCE,
                   help=f"the extended resource name to advertise (default {DEFAULT_RESOURCE})")
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                   help=f"kubelet's device-plugin directory (default {DEFAULT_DIR}/)")
    p.add_argument("--poll-seconds", type=float, default=1.0,
                   help="how often to look for a restarted kubelet (default 1)")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    try:
        args.cards = Cards(node=args.node, count=args.count, resource=args.resource, directory=args.dir)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    from bundle.jsonlog import configure

    args = parse_args(argv)
    configure(args.log_level)
    plugin = TestCardPlugin(args.cards, poll_seconds=args.poll_seconds)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: (log.info("signal received", extra={"signal": signum}),
                                                   plugin.stop()))
    try:
        plugin.run()
    except RegistrationRefused as e:
        log.error("kubelet refused the test cards; stopping", extra={"error": str(e)})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
