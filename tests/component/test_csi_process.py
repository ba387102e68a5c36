"""The bridge as a process: `resident bridge` flags, stale socket, /metrics on 127.0.0.1,
kubelet plugin registration served by the bridge, and a Probe that reports not-ready."""

from __future__ import annotations

import json
import os
from pathlib import Path
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request

import grpc
import pytest

from csi_bridge import mountinfo
from csi_bridge.proto import csi_pb2, pluginregistration_pb2 as reg_pb, pluginregistration_pb2_grpc as reg_grpc
from csi_bridge.server import Bridge, BridgeConfig
from csi_bridge.sockets import Sockets, remove_stale_socket
from localcluster.processes import free_port
from polling import wait_for
from testkit.bridge import REPO_ROOT, BridgeProcess, CsiClient, cleanup_mounts, make_bundle, publish_request
from testkit.thread_signals import other_threads, signal_thread


def test_help_explains_and_missing_node_id_is_a_clear_error():
    out = subprocess.run([sys.executable, "-m", "resident_cli", "bridge", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for flag in ("--endpoint", "--node-id", "--root", "--metrics-port", "--healthz-port", "--registration-dir",
                 "--authorize", "--deliveries"):
        assert flag in out
    r = subprocess.run([sys.executable, "-m", "csi_bridge", "--endpoint", "unix:///tmp/x.sock"],
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
                       cwd=str(REPO_ROOT))
    assert r.returncode == 2 and "--node-id" in r.stderr


def test_stale_socket_is_replaced_but_other_files_are_not(tmp_path):
    stale = tmp_path / "csi.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # a socket file nobody listens on, as a killed bridge leaves it
    bridge = BridgeProcess(tmp_path).start()
    try:
        with CsiClient(bridge.socket) as c:
            assert c.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest()).name == "bundles.resident.dev"
    finally:
        bridge.stop()
    regular = tmp_path / "not-a-socket"
    regular.write_text("keep me")
    with pytest.raises(ValueError):
        remove_stale_socket(regular)
    assert regular.read_text() == "keep me"




def test_socket_paths_over_the_unix_limit_are_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="longer than 107"):
        Bridge(BridgeConfig(endpoint="unix:///tmp/" + "x" * 120 + "/csi.sock", node_id="n",
                            root=tmp_path / "data", authorize="deny", private_metrics=True))


def test_metrics_logs_and_registration(short_tmp):
    tmp_path = short_tmp
    digest = make_bundle(tmp_path / "src", {"graph.onnx": b"g" * 1000, "w.safetensors": b"w" * 5000})
    port = free_port()
    reg_dir = tmp_path / "plugins_registry"
    # sockets a power cut left behind: an earlier run's, the one name of older releases,
    # and another plugin's, which is not the bridge's to remove
    reg_dir.mkdir()
    earlier = [reg_dir / "bundles.resident.dev-0ld0run0-reg.sock", reg_dir / "bundles.resident.dev-reg.sock"]
    other = reg_dir / "other.example.com-reg.sock"
    for path in (*earlier, other):
        with socket.socket(socket.AF_UNIX) as dead:
            dead.bind(str(path))
    bridge = BridgeProcess(tmp_path / "b", extra_args=(
        "--registration-dir", str(reg_dir), "--kubelet-endpoint", "/var/lib/kubelet/plugins/x/csi.sock"))
    bridge.args[bridge.args.index("--metrics-port") + 1] = str(port)
    bridge.start()
    target = tmp_path / "kubelet" / "pod" / "mount"
    target.parent.mkdir(parents=True)
    try:
        # this run's socket has a name of its own (kubelet registers a new name at once; a
        # dead run's name it would keep dialling), and the earlier runs' are gone
        wait_for(lambda: list(reg_dir.glob("bundles.resident.dev-*-reg.sock")), timeout=10,
                 what="the registration socket", every=0.05)
        ours = list(reg_dir.glob("bundles.resident.dev-*reg.sock"))
        assert len(ours) == 1 and ours[0] not in earlier and other.exists(), sorted(reg_dir.iterdir())
        # kubelet's side of plugin registration, over the real socket.
        with grpc.insecure_channel(f"unix://{ours[0]}") as ch:
            stub = reg_grpc.RegistrationStub(ch)
            info = stub.GetInfo(reg_pb.InfoRequest(), timeout=5)
            assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
                "CSIPlugin", "bundles.resident.dev", "/var/lib/kubelet/plugins/x/csi.sock", ["1.0.0"])
            stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=True), timeout=5)
        with CsiClient(bridge.socket) as c:
            c.node.NodePublishVolume(publish_request("csi-1", target, digest, f"file://{tmp_path}/src"))
            with pytest.raises(grpc.RpcError):
                c.node.NodePublishVolume(publish_request("", target, digest, "file:///x"))
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'resident_publish_duration_seconds_count{result="published"} 1.0' in text
        assert 'resident_publish_duration_seconds_count{result="invalid_argument"} 1.0' in text
        assert 'resident_csi_requests_total{code="INVALID_ARGUMENT",method="NodePublishVolume"} 1.0' in text
        assert "resident_store_leases 1.0" in text
        assert "resident_published_volumes 1.0" in text
        written = [l for l in text.splitlines() if l.startswith('resident_delivery_bytes_total{kind="written"}')]
        assert written and float(written[0].split()[-1]) >= 6000
        store = [l for l in text.splitlines() if l.startswith("resident_store_bytes ")]
        assert store and float(store[0].split()[-1]) >= 6000
        # /metrics listens on loopback only: read the kernel's table of listening sockets
        # (no traffic is sent to any other address).
        listening = [line.split()[1] for line in open("/proc/net/tcp").read().splitlines()[1:]
                     if line.split()[3] == "0A"]
        assert f"0100007F:{port:04X}" in listening
        assert not [a for a in listening if a.endswith(f":{port:04X}") and a != f"0100007F:{port:04X}"]
    finally:
        bridge.stop()
        cleanup_mounts(tmp_path)
    # a bridge that stops takes its socket away (kubelet unregisters the driver)
    assert sorted(reg_dir.iterdir()) == [other]
    lines = [json.loads(l) for l in bridge.log.read_text().splitlines() if l.startswith("{")]
    calls = [l for l in lines if l.get("msg") == "csi call" and l["method"] == "NodePublishVolume"]
    assert {(l["code"], l["volume"]) for l in calls} == {("OK", "csi-1"), ("INVALID_ARGUMENT", None)}
    assert all("duration_seconds" in l for l in calls)
    assert any(l.get("msg") == "kubelet registered the plugin" for l in lines)
    assert "secret" not in bridge.log.read_text()


def test_probe_reports_not_ready_when_the_store_is_unusable(tmp_path):
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="n",
                                 root=tmp_path / "data", authorize="deny", private_metrics=True)).start()
    try:
        with CsiClient(tmp_path / "csi.sock") as c:
            assert c.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True
            shutil.rmtree(tmp_path / "data" / "store" / "blobs")
            resp, call = c.identity.Probe.with_call(csi_pb2.ProbeRequest())
            assert resp.ready.value is False
            assert "blobs" in dict(call.trailing_metadata())["not-ready-reason"]
    finally:
        bridge.stop()


def test_deny_policy_refuses_every_publish(tmp_path):
    digest = make_bundle(tmp_path / "src", {"graph.onnx": b"g"})
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="n",
                                 root=tmp_path / "data", authorize="api", api_client=None,
                                 private_metrics=True)).start()
    try:
        with CsiClient(tmp_path / "csi.sock") as c:
            with pytest.raises(grpc.RpcError) as e:
                c.node.NodePublishVolume(publish_request("v", tmp_path / "t", digest, f"file://{tmp_path}/src"))
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        bridge.stop()
    assert not (tmp_path / "t").exists() and mountinfo.mounts_under(tmp_path) == []


def test_kubelets_sockets_answer_registration_before_the_bridge_exists_and_hold_volume_calls(short_tmp):
    """What kubelet's plugin registration asks is answered with only gRPC loaded; a volume
    call waits for the bridge (within its deadline) and then gets the bridge's answer."""
    tmp_path = short_tmp
    digest = make_bundle(tmp_path / "src", {"graph.onnx": b"g"})
    sockets = Sockets(f"unix://{tmp_path}/csi.sock", "node-a", registration_dir=tmp_path / "reg",
                      wait_seconds=30).start()
    bridge = None
    try:
        (reg_socket,) = (tmp_path / "reg").glob("bundles.resident.dev-*-reg.sock")
        with grpc.insecure_channel(f"unix://{reg_socket}") as ch:
            assert reg_grpc.RegistrationStub(ch).GetInfo(reg_pb.InfoRequest(), timeout=5).endpoint == \
                str(tmp_path / "csi.sock")
        with CsiClient(tmp_path / "csi.sock") as c:
            assert c.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=5).node_id == "node-a"
            assert c.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(), timeout=5).capabilities
            resp, call = c.identity.Probe.with_call(csi_pb2.ProbeRequest(), timeout=5)
            assert resp.ready.value is False
            assert "starting" in dict(call.trailing_metadata())["not-ready-reason"]
            request = publish_request("v", tmp_path / "t", digest, f"file://{tmp_path}/src")
            with pytest.raises(grpc.RpcError) as e:     # no bridge yet: held, then refused in time
                c.node.NodePublishVolume(request, timeout=2)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "starting" in e.value.details()
            bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="node-a",
                                         root=tmp_path / "data", authorize="allow-any", private_metrics=True),
                            sockets=sockets).start()
            assert c.identity.Probe(csi_pb2.ProbeRequest(), timeout=5).ready.value is True
            c.node.NodePublishVolume(request, timeout=30)
            assert (tmp_path / "t" / "current" / "graph.onnx").read_bytes() == b"g"
            c.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id="v", target_path=str(tmp_path / "t")),
                                       timeout=30)
    finally:
        if bridge is not None:
            bridge.stop()
        else:
            sockets.stop()
    assert not list((tmp_path / "reg").glob("*.sock")) and mountinfo.mounts_under(tmp_path) == []


def test_a_bridge_registers_before_it_has_an_api_client_and_a_publish_waits_for_it(short_tmp):
    """kubelet registers the driver while the Kubernetes client is still importing; a mount
    it tries meanwhile is held for the API-backed policy, not failed (a failed mount doubles
    kubelet's next wait)."""
    import threading
    tmp_path = short_tmp
    digest = make_bundle(tmp_path / "src", {"graph.onnx": b"g"})
    reg_dir = tmp_path / "reg"
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="n", root=tmp_path / "data",
                                 authorize="api", connect_later=True, registration_dir=reg_dir,
                                 private_metrics=True)).start()
    outcome = []
    try:
        (reg_socket,) = reg_dir.glob("bundles.resident.dev-*-reg.sock")
        with grpc.insecure_channel(f"unix://{reg_socket}") as ch:
            assert reg_grpc.RegistrationStub(ch).GetInfo(reg_pb.InfoRequest(), timeout=5).name == "bundles.resident.dev"
        with CsiClient(tmp_path / "csi.sock") as c:
            assert c.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True

            def publish():
                try:
                    c.node.NodePublishVolume(publish_request("v", tmp_path / "t", digest, f"file://{tmp_path}/src"))
                except grpc.RpcError as e:
                    outcome.append(e)
            call = threading.Thread(target=publish)
            call.start()
            call.join(0.5)
            assert call.is_alive() and not outcome       # held for the policy
            bridge.connect(None)                         # no credentials: the policy fails closed
            call.join(10)
        assert outcome and outcome[0].code() == grpc.StatusCode.PERMISSION_DENIED, outcome
        assert "no API access" in outcome[0].details()
    finally:
        bridge.stop()
    assert not (tmp_path / "t").exists() and mountinfo.mounts_under(tmp_path) == []


@pytest.mark.parametrize("args,words", [
    (["--endpoint", "tcp://127.0.0.1:1"], "unix://"),
    (["--authorize", "static", "--authorize-file", "/nonexistent/policy.json"], "authorization file"),
    (["--authorize", "static"], "--authorize-file"),
])
def test_bad_configuration_exits_2_with_a_clear_message(tmp_path, args, words):
    base = ["--node-id", "n", "--root", str(tmp_path / "data"), "--metrics-port", "-1",
            "--endpoint", f"unix://{tmp_path}/csi.sock"]
    r = subprocess.run([sys.executable, "-m", "csi_bridge", *base, *args], capture_output=True,
                       text=True, cwd=str(REPO_ROOT), timeout=60)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr
    assert not (tmp_path / "csi.sock").exists()


def test_targets_outside_the_pods_directory_are_refused_and_untouched(short_tmp):
    pods = short_tmp / "kubelet" / "pods"
    digest = make_bundle(short_tmp / "src", {"graph.onnx": b"g" * 100})
    source = f"file://{short_tmp}/src"
    (pods / "uid-1" / "volumes").mkdir(parents=True)
    outside = short_tmp / "etc"
    outside.mkdir()
    (outside / "keep").write_text("keep me")
    (pods / "uid-2").symlink_to(outside)          # inside by name, outside once resolved
    bridge = BridgeProcess(short_tmp / "b", pods_dir=pods).start()
    try:
        assert oct(os.stat(bridge.socket).st_mode & 0o777) == oct(0o660)  # root and its group only
        with CsiClient(bridge.socket) as c:
            sibling = short_tmp / "kubelet" / "pods-x" / "mount"   # shares the prefix, not the directory
            for bad in (outside / "mount", pods / "uid-2" / "mount", sibling, pods):
                with pytest.raises(grpc.RpcError) as e:
                    c.node.NodePublishVolume(publish_request("v-bad", str(bad), digest, source))
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (bad, e.value.details())
                assert "outside kubelet's pods directory" in e.value.details()
                with pytest.raises(grpc.RpcError) as e:
                    c.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
                        volume_id="v-bad", target_path=str(bad)))
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert sorted(os.listdir(outside)) == ["keep"] and mountinfo.mounts_under(short_tmp) == []
            assert not sibling.parent.exists()
            good = pods / "uid-1" / "volumes" / "mount"
            c.node.NodePublishVolume(publish_request("v-ok", good, digest, source))
            assert (good / "current" / "graph.onnx").read_bytes() == b"g" * 100
            c.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
                volume_id="v-ok", target_path=str(good)))
    finally:
        bridge.stop()


def test_sigterm_delivered_to_a_server_thread_still_stops_the_bridge(tmp_path):
    """The kernel delivers a process's SIGTERM to any thread that does not block it; CPython
    runs the handler in the main thread only, so an untimed wait there would never wake."""
    bridge = BridgeProcess(tmp_path).start()
    try:
        threads = other_threads(bridge.proc.pid)
        assert threads, "the bridge serves on threads of its own"
        signal_thread(bridge.proc.pid, threads[-1], signal.SIGTERM)
        assert bridge.wait_exit(15) == 0
    finally:
        bridge.kill()
