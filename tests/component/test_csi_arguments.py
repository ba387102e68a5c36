"""Every refused argument over real gRPC: the right code, a readable message, no details,
and no filesystem work done (the target is never created)."""

from __future__ import annotations

import grpc
import pytest

from csi_bridge import mountinfo
from csi_bridge.proto import csi_pb2
from csi_bridge.server import Bridge, BridgeConfig
from testkit.bridge import CsiClient, cleanup_mounts, make_bundle, mount_capability, publish_request

Mode = csi_pb2.VolumeCapability.AccessMode.Mode
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("csi-args")
    digest = make_bundle(tmp / "src", {"graph.onnx": b"g" * 10})
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp}/csi.sock", node_id="node-a",
                                 root=tmp / "data", authorize="allow-any",
                                 private_metrics=True)).start()
    client = CsiClient(tmp / "csi.sock")
    try:
        yield type("Env", (), dict(tmp=tmp, digest=digest, source=f"file://{tmp}/src",
                                   bridge=bridge, node=client.node, identity=client.identity))
    finally:
        client.close()
        bridge.stop()
        cleanup_mounts(tmp)


def good(env, **changes) -> csi_pb2.NodePublishVolumeRequest:
    req = publish_request("csi-1", env.tmp / "t" / "mount", env.digest, env.source)
    for k, v in changes.items():
        if k == "context":
            req.volume_context.clear()
            req.volume_context.update(v)
        elif k == "clear":
            req.ClearField(v)
        else:
            setattr(req, k, v)
    return req


def ctx(env, **kv):
    return {"digest": env.digest, "source": env.source, **kv}


CASES = {
    "no volume_id": (lambda e: good(e, volume_id=""), "volume_id is required"),
    "no target_path": (lambda e: good(e, target_path=""), "target_path is required"),
    "no volume_capability": (lambda e: good(e, clear="volume_capability"), "volume_capability is required"),
    "relative target": (lambda e: good(e, target_path="rel/mount"), "absolute"),
    "unnormalized target": (lambda e: good(e, target_path="/a/../b"), "normalized"),
    "NUL in volume_id": (lambda e: good(e, volume_id="a\x00b"), "volume_id"),
    "writable": (lambda e: good(e, readonly=False), "read-only"),
    "no digest": (lambda e: good(e, context={"source": e.source}), "digest is required"),
    "bad digest": (lambda e: good(e, context=ctx(e, digest="sha256:XYZ")), "not sha256"),
    "no source": (lambda e: good(e, context={"digest": e.digest}), "source is required"),
    "bad source": (lambda e: good(e, context=ctx(e, source="ftp://x/y")), "source"),
    "persistent volume": (lambda e: good(e, context=ctx(e, **{"csi.storage.k8s.io/ephemeral": "false"})),
                          "ephemeral"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_publish_argument_errors(env, case):
    make, words = CASES[case]
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodePublishVolume(make(env))
    assert e.value.code() == INVALID, e.value.details()
    assert words in e.value.details()
    assert not dict(e.value.trailing_metadata()).get("grpc-status-details-bin")
    assert not (env.tmp / "t").exists()


def test_block_and_unknown_access_mode_are_refused(env):
    req = good(env)
    req.volume_capability.CopyFrom(csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=Mode.SINGLE_NODE_READER_ONLY)))
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodePublishVolume(req)
    assert e.value.code() == INVALID and "block" in e.value.details()
    req.volume_capability.CopyFrom(mount_capability(Mode.UNKNOWN))
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodePublishVolume(req)
    assert e.value.code() == INVALID and "access_mode" in e.value.details()
    assert not (env.tmp / "t").exists()


def test_required_fields_are_checked_before_anything_else(env):
    # Everything is wrong at once: the first required field is what is reported.
    req = csi_pb2.NodePublishVolumeRequest(readonly=False, volume_context={"digest": "bad"})
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodePublishVolume(req)
    assert e.value.code() == INVALID and "volume_id is required" in e.value.details()


@pytest.mark.parametrize("field,req", [
    ("volume_id", csi_pb2.NodeUnpublishVolumeRequest(target_path="/tmp/x")),
    ("target_path", csi_pb2.NodeUnpublishVolumeRequest(volume_id="v")),
])
def test_unpublish_argument_errors(env, field, req):
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodeUnpublishVolume(req)
    assert e.value.code() == INVALID and f"{field} is required" in e.value.details()


@pytest.mark.parametrize("field,req", [
    ("volume_id", csi_pb2.NodeGetVolumeStatsRequest(volume_path="/tmp/x")),
    ("volume_path", csi_pb2.NodeGetVolumeStatsRequest(volume_id="v")),
])
def test_stats_argument_errors(env, field, req):
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodeGetVolumeStats(req)
    assert e.value.code() == INVALID and f"{field} is required" in e.value.details()


def test_stats_of_an_unknown_volume_or_relative_path_is_not_found(env):
    for vid, path in (("id", "some/path"), ("id", "/nowhere")):
        with pytest.raises(grpc.RpcError) as e:
            env.node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=path))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_unoffered_rpcs_are_unimplemented(env):
    for call, req in ((env.node.NodeStageVolume, csi_pb2.NodeStageVolumeRequest(volume_id="v")),
                      (env.node.NodeUnstageVolume, csi_pb2.NodeUnstageVolumeRequest(volume_id="v")),
                      (env.node.NodeExpandVolume, csi_pb2.NodeExpandVolumeRequest(volume_id="v"))):
        with pytest.raises(grpc.RpcError) as e:
            call(req)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_identity_and_node_info(env):
    info = env.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert info.name == "bundles.resident.dev" and info.vendor_version
    caps = env.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    assert list(caps.capabilities) == []  # node-only: no CONTROLLER_SERVICE
    assert env.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True
    assert env.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest()).node_id == "node-a"
    ncaps = env.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest()).capabilities
    assert [c.rpc.type for c in ncaps] == [csi_pb2.NodeServiceCapability.RPC.GET_VOLUME_STATS]


def test_concurrent_operation_on_the_same_volume_is_aborted(env):
    with env.bridge.locks.hold("volume csi-1"):
        with pytest.raises(grpc.RpcError) as e:
            env.node.NodePublishVolume(good(env))
        assert e.value.code() == grpc.StatusCode.ABORTED
        with pytest.raises(grpc.RpcError) as e:
            env.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
                volume_id="csi-1", target_path=str(env.tmp / "t" / "mount")))
        assert e.value.code() == grpc.StatusCode.ABORTED
    assert mountinfo.mount_at(env.tmp / "t" / "mount") is None
