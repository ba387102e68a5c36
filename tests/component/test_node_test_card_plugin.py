"""The test cards' device plugin against a kubelet played by the test: real gRPC on unix
sockets in a temporary device-plugin directory.

The test's Registration server behaves as kubelet's does: on Register it dials the
plugin's endpoint back and asks GetDevicePluginOptions before it answers, and it refuses
with gRPC code Unknown (a Go error) when told to. A kubelet restart is played as kubelet
does it: the old server goes, every socket in the directory is removed, a new
``kubelet.sock`` appears.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from localcluster import test_cards as tc
from localcluster.proto import deviceplugin_pb2 as pb, deviceplugin_pb2_grpc as pb_grpc
from polling import wait_for

pytestmark = pytest.mark.timeout(120)
REPO_ROOT = Path(__file__).resolve().parents[2]
NODE = "node-0"
IDS = ["test-card-node-0-0", "test-card-node-0-1"]


class Kubelet(pb_grpc.RegistrationServicer):
    """kubelet's device-plugin Registration service on ``<dir>/kubelet.sock``."""

    def __init__(self, directory: Path, refuse: str = "", hang: bool = False):
        self.directory, self.refuse, self.hang = directory, refuse, hang
        self.requests: queue.Queue = queue.Queue()   # (RegisterRequest, DevicePluginOptions) accepted
        self.called = threading.Event()
        self.released = threading.Event()
        self.server: grpc.Server | None = None

    lose_first_socket = False   # as a kubelet that starts: removes the plugin's socket before dialing back

    def Register(self, request, context):
        self.called.set()
        if self.lose_first_socket:
            self.lose_first_socket = False
            (self.directory / request.endpoint).unlink()
            context.abort(grpc.StatusCode.UNKNOWN, "failed to dial device plugin: context deadline exceeded")
        if self.hang:                                 # a kubelet that is stopped (SIGSTOP) answers nothing
            self.released.wait(60)
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet went away")
        if self.refuse:
            context.abort(grpc.StatusCode.UNKNOWN, self.refuse)
        # as kubelet: dial the endpoint in its own directory, ask for the options, then answer
        with grpc.insecure_channel(f"unix:{self.directory / request.endpoint}") as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            options = pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=10)
        self.requests.put((request, options))
        return pb.Empty()

    @property
    def socket(self) -> Path:
        return self.directory / "kubelet.sock"

    def start(self) -> "Kubelet":
        from concurrent import futures
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix:{self.socket}")
        self.server.start()
        return self

    def stop(self) -> None:
        self.released.set()
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None

    def restart_as_kubelet_does(self) -> "Kubelet":
        """Stop, remove every socket of the directory (kubelet's CleanupPluginDirectory), start anew."""
        self.stop()
        for entry in self.directory.iterdir():
            if entry.is_socket():
                entry.unlink()
        return Kubelet(self.directory, self.refuse).start()

    def next_registration(self, timeout: float = 15.0):
        try:
            return self.requests.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no Register reached {self.socket} within {timeout}s") from None


class PluginThread:
    """The plugin's run loop in a thread of the test process."""

    def __init__(self, directory: Path, count: int = 2):
        self.cards = tc.Cards(node=NODE, count=count, directory=directory)
        self.plugin = tc.TestCardPlugin(self.cards, poll_seconds=0.1, register_timeout=15)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.plugin.run()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def start(self) -> "PluginThread":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.plugin.stop()
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "the plugin did not stop"


@pytest.fixture
def kubelet(short_tmp):
    k = Kubelet(short_tmp).start()
    yield k
    k.stop()


@pytest.fixture
def plugin(kubelet):
    p = PluginThread(kubelet.directory).start()
    yield p
    p.stop()


def socket_identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_ctime_ns


def plugin_stub(path: Path):
    channel = grpc.insecure_channel(f"unix:{path}")
    return channel, pb_grpc.DevicePluginStub(channel)


def test_registers_with_kubelet_as_v1beta1_with_its_socket_name_and_resource(kubelet, plugin):
    request, options = kubelet.next_registration()
    assert request.version == "v1beta1"
    assert request.resource_name == "furiosa.ai/rngd"
    assert request.endpoint == "resident-test-card-node-0-furiosa.ai_rngd.sock" == plugin.cards.endpoint
    assert "/" not in request.endpoint and (kubelet.directory / request.endpoint).is_socket()
    assert (options.pre_start_required, options.get_preferred_allocation_available) == (False, False)
    wait_for(lambda: plugin.plugin.registrations == 1, timeout=5, what="the plugin to count its registration")


def test_list_and_watch_sends_the_healthy_cards_and_keeps_the_stream_open(kubelet, plugin):
    kubelet.next_registration()
    channel, stub = plugin_stub(plugin.cards.socket_path)
    with channel:
        stream = stub.ListAndWatch(pb.Empty())
        first = next(stream)
        assert [(d.ID, d.health) for d in first.devices] == [(i, "Healthy") for i in IDS]
        time.sleep(0.5)
        assert not stream.done(), "kubelet reads a closed ListAndWatch stream as the plugin gone"
        stream.cancel()


def test_allocate_gives_each_container_its_device_id_and_nothing_else(kubelet, plugin):
    kubelet.next_registration()
    channel, stub = plugin_stub(plugin.cards.socket_path)
    with channel:
        answer = stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[IDS[1]]),
            pb.ContainerAllocateRequest(devices_ids=[IDS[0]])]), timeout=5)
        assert [dict(c.envs) for c in answer.container_responses] == [
            {"RESIDENT_TEST_CARD": IDS[1]}, {"RESIDENT_TEST_CARD": IDS[0]}]
        for c in answer.container_responses:
            assert (list(c.devices), list(c.mounts), list(c.cdi_devices), dict(c.annotations)) == ([], [], [], {})
        assert stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=[IDS[0]]), timeout=5) \
            == pb.PreStartContainerResponse()
        preferred = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=IDS, must_include_deviceIDs=[IDS[1]],
                                                   allocation_size=2)]), timeout=5)
        assert list(preferred.container_responses[0].deviceIDs) == [IDS[1], IDS[0]]


def test_an_unknown_device_or_an_empty_request_is_a_clear_grpc_error(kubelet, plugin):
    kubelet.next_registration()
    channel, stub = plugin_stub(plugin.cards.socket_path)
    with channel:
        with pytest.raises(grpc.RpcError) as err:
            stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[IDS[0]]),
                pb.ContainerAllocateRequest(devices_ids=["test-card-node-1-0"])]), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "test-card-node-1-0" in err.value.details() and IDS[0] in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest()]), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def registered_once(kubelet: Kubelet, plugin: PluginThread) -> None:
    """The first registration, answered: kubelet queues the request before its answer
    reaches the plugin, and stopping kubelet in between cancels the answer."""
    kubelet.next_registration()
    wait_for(lambda: plugin.plugin.registrations == 1, timeout=5, what="the plugin to count its registration")


def test_after_a_kubelet_restart_the_plugin_serves_and_registers_again(kubelet, plugin):
    registered_once(kubelet, plugin)
    first_socket = socket_identity(plugin.cards.socket_path)
    fresh = kubelet.restart_as_kubelet_does()
    try:
        request, _ = fresh.next_registration()       # the new kubelet dialed the plugin back
        assert (request.resource_name, request.endpoint) == ("furiosa.ai/rngd", plugin.cards.endpoint)
        assert socket_identity(plugin.cards.socket_path) != first_socket   # a new socket (inodes are reused)
        channel, stub = plugin_stub(plugin.cards.socket_path)
        with channel:
            assert [d.ID for d in next(stub.ListAndWatch(pb.Empty())).devices] == IDS
        wait_for(lambda: plugin.plugin.registrations == 2, timeout=5, what="a second registration")
    finally:
        fresh.stop()


def test_a_new_kubelet_sock_alone_is_enough_to_register_again(kubelet, plugin):
    registered_once(kubelet, plugin)
    kubelet.stop()
    kubelet.socket.unlink(missing_ok=True)
    fresh = Kubelet(kubelet.directory).start()     # the plugin's socket is left in place
    try:
        fresh.next_registration()
        wait_for(lambda: plugin.plugin.registrations == 2, timeout=5, what="a second registration")
    finally:
        fresh.stop()


def test_a_plugin_started_before_kubelet_registers_when_kubelet_comes(short_tmp):
    p = PluginThread(short_tmp).start()
    try:
        wait_for(lambda: p.cards.socket_path.is_socket(), timeout=10, what="the plugin's socket")
        time.sleep(0.3)
        assert p.plugin.registrations == 0 and p.error is None
        k = Kubelet(short_tmp).start()
        try:
            assert k.next_registration()[0].resource_name == "furiosa.ai/rngd"
        finally:
            k.stop()
    finally:
        p.stop()


def test_a_refused_registration_stops_the_plugin_and_removes_its_socket(short_tmp):
    k = Kubelet(short_tmp, refuse="device plugin resource furiosa.ai/rngd is already registered").start()
    try:
        p = PluginThread(short_tmp).start()
        p.thread.join(timeout=15)
        assert not p.thread.is_alive()
        assert isinstance(p.error, tc.RegistrationRefused)
        assert "already registered" in str(p.error)
        assert not p.cards.socket_path.exists()
    finally:
        k.stop()


def test_a_failed_dial_back_is_not_a_refusal_the_plugin_serves_and_registers_again(short_tmp):
    """A kubelet that is just starting removes every socket of the directory; a plugin that
    registered at that moment is not dialed back. That is kubelet's race, not a no."""
    k = Kubelet(short_tmp)
    k.lose_first_socket = True
    k.start()
    p = PluginThread(short_tmp).start()
    try:
        request, _ = k.next_registration()
        assert request.resource_name == "furiosa.ai/rngd" and p.error is None and p.thread.is_alive()
        assert p.cards.socket_path.is_socket()
    finally:
        p.stop()
        k.stop()


def plugin_process(directory: Path, *extra: str) -> subprocess.Popen:
    argv = tc.plugin_argv(NODE, count=2, directory=directory) + ["--poll-seconds", "0.1", *extra]
    return subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_the_command_registers_and_sigterm_stops_it_and_removes_its_socket(kubelet):
    proc = plugin_process(kubelet.directory)
    try:
        request, _ = kubelet.next_registration(timeout=30)
        assert request.endpoint == tc.socket_name(NODE)
        sock = kubelet.directory / request.endpoint
        assert sock.is_socket()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert not sock.exists()
    assert kubelet.socket.is_socket()                 # kubelet's socket is not the plugin's to remove
    logs = json_lines(err)
    assert logs and all({"ts", "level", "logger", "msg"} <= set(line) for line in logs)
    assert {line["logger"] for line in logs} == {"resident.test_cards"}


def test_sigterm_stops_the_command_while_kubelet_does_not_answer_register(short_tmp):
    k = Kubelet(short_tmp, hang=True).start()
    try:
        proc = plugin_process(short_tmp)
        assert k.called.wait(30), "the plugin never called Register"
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert time.monotonic() - began < 5, "the plugin waited for Register's deadline before stopping"
    finally:
        k.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert not (short_tmp / tc.socket_name(NODE)).exists()


def test_the_command_exits_1_when_kubelet_refuses(short_tmp):
    k = Kubelet(short_tmp, refuse="invalid resource name").start()
    try:
        proc = plugin_process(short_tmp)
        _, err = proc.communicate(timeout=30)
    finally:
        k.stop()
    assert proc.returncode == 1, err
    assert any(line["level"] == "error" and "invalid resource name" in line.get("error", "")
               for line in json_lines(err))
    assert not (short_tmp / tc.socket_name(NODE)).exists()


def test_help_says_it_is_a_test_card_without_hardware():
    out = subprocess.run([sys.executable, "-m", "localcluster.test_cards", "--help"], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}).stdout
    assert "Test cards for the local cluster" in out and "No hardware" in out
    for flag in ("--node", "--count", "--resource", "--dir"):
        assert flag in out


def test_only_the_plugins_own_socket_is_removed_when_it_stops(short_tmp):
    cards = tc.Cards(node=NODE, directory=short_tmp)
    plugin = tc.TestCardPlugin(cards)
    plugin.serve()
    cards.socket_path.unlink()                    # another instance took the path over
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(cards.socket_path))
    try:
        plugin.close()
        assert cards.socket_path.is_socket(), "the plugin removed a socket that was not its own"
    finally:
        other.close()
    assert sorted(p.name for p in short_tmp.iterdir()) == [cards.endpoint]   # nothing else left behind
    with pytest.raises(ValueError, match="not a socket"):
        cards.socket_path.unlink()
        cards.socket_path.write_text("not mine")
        tc.TestCardPlugin(cards).serve()
    assert cards.socket_path.read_text() == "not mine"


def test_a_removed_plugin_socket_alone_is_served_and_registered_again(kubelet, plugin):
    kubelet.next_registration()
    plugin.cards.socket_path.unlink()
    request, _ = kubelet.next_registration()      # same kubelet.sock: the new server needs a new registration
    assert request.endpoint == plugin.cards.endpoint and plugin.cards.socket_path.is_socket()


def test_a_socket_removed_between_bind_and_rename_is_served_again(kubelet, monkeypatch):
    """kubelet empties the directory as it starts; if that lands between the plugin's bind
    and its rename into place, the plugin does not die: it serves again at its next look."""
    rename, lost = os.rename, []

    def kubelet_empties_the_directory_first(src, dst):
        if not lost:
            lost.append(src)
            os.unlink(src)
        return rename(src, dst)

    monkeypatch.setattr(tc.os, "rename", kubelet_empties_the_directory_first)
    p = PluginThread(kubelet.directory).start()
    try:
        request, _ = kubelet.next_registration()
        assert lost and request.endpoint == p.cards.endpoint and p.error is None
        assert p.cards.socket_path.is_socket() and not Path(lost[0]).exists()
    finally:
        p.stop()
