"""The checked-in CSI stubs are exactly what grpcio-tools makes from the protos."""

from csi_bridge import codegen
from csi_bridge.proto import csi_pb2, csi_pb2_grpc, pluginregistration_pb2


def test_checked_in_stubs_match_a_fresh_generation():
    assert codegen.stale_files() == []


def test_wire_names_and_numbers_follow_csi_v1():
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"
    req = csi_pb2.NodePublishVolumeRequest.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in req.items()} == {
        "volume_id": 1, "publish_context": 2, "staging_target_path": 3, "target_path": 4,
        "volume_capability": 5, "readonly": 6, "secrets": 7, "volume_context": 8}
    node = csi_pb2.DESCRIPTOR.services_by_name["Node"]
    assert node.methods_by_name["NodePublishVolume"].full_name == "csi.v1.Node.NodePublishVolume"
    assert csi_pb2.ProbeResponse.DESCRIPTOR.fields_by_name["ready"].message_type.full_name \
        == "google.protobuf.BoolValue"
    assert hasattr(csi_pb2_grpc, "add_NodeServicer_to_server")
    info = pluginregistration_pb2.PluginInfo.DESCRIPTOR.fields_by_name
    assert [info[n].number for n in ("type", "name", "endpoint", "supported_versions")] == [1, 2, 3, 4]


def test_a_changed_proto_is_detected(tmp_path):
    # Point the comparison at a copy whose generated file was altered: it must be reported.
    import shutil
    fake_dir = tmp_path / "proto"
    shutil.copytree(codegen.PROTO_DIR, fake_dir)
    (fake_dir / "csi_pb2.py").write_text("# edited by hand\n")
    assert codegen.stale_files(against=fake_dir) == ["csi_pb2.py"]
