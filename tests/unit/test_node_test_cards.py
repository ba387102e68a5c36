"""The test cards' pure parts: the vendored device-plugin API, its checked-in stubs, the
device IDs, socket names, command line and allocation they make."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from csi_bridge import codegen
from localcluster import test_cards as tc
from localcluster.proto import deviceplugin_pb2 as pb, deviceplugin_pb2_grpc as pb_grpc

FOLDER = "localcluster/proto"
MODULE_CACHE_PROTO = Path("/var/cache/resident/go/mod/k8s.io/kubelet@v0.37.2/pkg/apis/deviceplugin/v1beta1/api.proto")
VENDOR_MARK = "// ---- vendored text ----\n"


def test_checked_in_stubs_match_a_fresh_generation():
    assert codegen.protos_in(FOLDER) == ("deviceplugin.proto",)
    assert codegen.stale_files(FOLDER) == []


def test_an_edited_stub_is_detected(tmp_path):
    import shutil
    copy = tmp_path / "proto"
    shutil.copytree(codegen.REPO_ROOT / FOLDER, copy)
    (copy / "deviceplugin_pb2_grpc.py").write_text("# edited by hand\n")
    assert codegen.stale_files(FOLDER, against=copy) == ["deviceplugin_pb2_grpc.py"]


def test_the_vendored_proto_is_kubelets_text():
    # Looked at when the test runs, not when it is collected: in the whole suite the cluster
    # layer's first build fills the module cache before the unit layer runs.
    if not MODULE_CACHE_PROTO.is_file():
        pytest.skip("k8s.io/kubelet v0.37.2 is not in the Go module cache")
    vendored = (codegen.REPO_ROOT / FOLDER / "deviceplugin.proto").read_text()
    assert vendored.split(VENDOR_MARK, 1)[1] == MODULE_CACHE_PROTO.read_text()


def test_wire_names_and_numbers_are_kubelets():
    assert pb.DESCRIPTOR.package == "v1beta1"
    services = pb.DESCRIPTOR.services_by_name
    assert services["Registration"].methods_by_name["Register"].full_name == "v1beta1.Registration.Register"
    assert sorted(services["DevicePlugin"].methods_by_name) == [
        "Allocate", "GetDevicePluginOptions", "GetPreferredAllocation", "ListAndWatch", "PreStartContainer"]
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming
    reg = pb.RegisterRequest.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in reg.items()} == {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}
    assert {n: f.number for n, f in pb.Device.DESCRIPTOR.fields_by_name.items()} == {"ID": 1, "health": 2, "topology": 3}
    assert pb.ContainerAllocateResponse.DESCRIPTOR.fields_by_name["envs"].number == 1
    assert hasattr(pb_grpc, "add_DevicePluginServicer_to_server") and hasattr(pb_grpc, "RegistrationStub")


def test_device_ids_name_the_node_and_say_test_card():
    assert tc.device_ids("node-0", 2) == ["test-card-node-0-0", "test-card-node-0-1"]
    assert tc.device_ids("node-2", 1) == ["test-card-node-2-0"]
    with pytest.raises(ValueError, match="at least one"):
        tc.device_ids("node-0", 0)
    with pytest.raises(ValueError, match="63"):
        tc.device_ids("n" * 60, 1)


def test_resource_names_kubelet_would_refuse_are_refused_here():
    assert tc.check_resource("furiosa.ai/rngd") == "furiosa.ai/rngd"
    assert tc.check_resource("rebellions.ai/ATOM") == "rebellions.ai/ATOM"
    for bad in ("rngd", "furiosa.ai/", "/rngd", "kubernetes.io/rngd", "x.kubernetes.io/rngd", "Furiosa.AI/rngd",
                "furiosa.ai/rn gd"):
        with pytest.raises(ValueError):
            tc.check_resource(bad)


def test_socket_and_argv_for_a_node():
    assert tc.socket_name("node-1") == "resident-test-card-node-1-furiosa.ai_rngd.sock"
    assert tc.socket_path("node-1") == Path("/var/lib/kubelet/device-plugins/resident-test-card-node-1-furiosa.ai_rngd.sock")
    assert tc.plugin_argv("node-1", count=3) == [
        sys.executable, "-m", "localcluster.test_cards", "--node", "node-1", "--count", "3",
        "--resource", "furiosa.ai/rngd", "--dir", "/var/lib/kubelet/device-plugins"]
    args = tc.parse_args(tc.plugin_argv("node-1", count=3, directory=Path("/tmp/dp"))[3:])
    assert args.cards == tc.Cards(node="node-1", count=3, directory=Path("/tmp/dp"))
    assert args.cards.socket_path == tc.socket_path("node-1", directory=Path("/tmp/dp"))
    assert args.cards.kubelet_socket == Path("/tmp/dp/kubelet.sock")
    with pytest.raises(ValueError, match="unix socket"):
        tc.plugin_argv("node-1", directory=Path("/tmp") / ("d" * 90))


def test_allocation_gives_the_requested_ids_and_refuses_others():
    known = tc.device_ids("node-0", 2)
    assert tc.allocation(["test-card-node-0-1"], known) == {"RESIDENT_TEST_CARD": "test-card-node-0-1"}
    assert tc.allocation(known, known) == {"RESIDENT_TEST_CARD": "test-card-node-0-0,test-card-node-0-1"}
    with pytest.raises(LookupError, match="test-card-node-1-0"):
        tc.allocation(["test-card-node-1-0"], known)
    with pytest.raises(ValueError, match="no device"):
        tc.allocation([], known)
