"""The test cards' device-plugin API: the vendored proto and its checked-in stubs."""

from __future__ import annotations

from pathlib import Path

import pytest

from csi_bridge import codegen
from localcluster.proto import deviceplugin_pb2 as pb, deviceplugin_pb2_grpc as pb_grpc

FOLDER = "localcluster/proto"
MODULE_CACHE_PROTO = Path("/var/cache/resident/go/pkg/mod/k8s.io/kubelet@v0.37.2/pkg/apis/deviceplugin/v1beta1/api.proto")
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


@pytest.mark.skipif(not MODULE_CACHE_PROTO.is_file(), reason="k8s.io/kubelet v0.37.2 is not in the Go module cache")
def test_the_vendored_proto_is_kubelets_text():
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

