"""Publish and unpublish through real gRPC on a unix socket, with real read-only bind mounts."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import grpc
import pytest

from bundle.manifest import MANIFEST_NAME
from csi_bridge import mountinfo
from csi_bridge.proto import csi_pb2
from csi_bridge.server import Bridge, BridgeConfig
from testkit.bridge import CsiClient, cleanup_mounts, make_bundle, publish_request

WEIGHTS = bytes(range(256)) * 1024 + b"tail"      # 256 KiB + 4: several 64 KiB chunks
FILES = {"model.safetensors": WEIGHTS, "graph.onnx": b"graph-v1" * 100,
         "config.json": b'{"layers": 2}', "tokenizer/vocab.txt": b"a\nb\nc\n"}


@pytest.fixture
def env(tmp_path):
    """A bundle on disk (file:// source), a running in-process bridge and a CSI client."""
    digest = make_bundle(tmp_path / "src", FILES)
    policy = tmp_path / "policy.json"
    policy.write_text('{"team-a": ["%s"], "team-b": []}' % digest)
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="node-a",
                                 root=tmp_path / "data", authorize="static",
                                 authorize_file=policy, private_metrics=True)).start()
    client = CsiClient(tmp_path / "csi.sock")
    try:
        yield type("Env", (), dict(tmp=tmp_path, digest=digest, source=f"file://{tmp_path}/src",
                                   bridge=bridge, node=client.node, identity=client.identity))
    finally:
        client.close()
        bridge.stop()
        cleanup_mounts(tmp_path)
        assert mountinfo.mounts_under(tmp_path) == []


def target(env, pod: str) -> Path:
    t = env.tmp / "kubelet" / "pods" / pod / "volumes" / "kubernetes.io~csi" / "bundle" / "mount"
    t.parent.mkdir(parents=True, exist_ok=True)
    return t


def unpublish(env, volume_id, t):
    return env.node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(t)))


def test_round_trip_content_byte_for_byte_and_read_only(env):
    t = target(env, "p1")
    env.node.NodePublishVolume(publish_request("csi-1", t, env.digest, env.source))
    m = mountinfo.mount_at(t)
    assert m is not None and m.read_only
    current = t / "current"
    assert os.readlink(current) == "revisions/" + env.digest.replace(":", "-")
    for rel, data in FILES.items():
        assert (current / rel).read_bytes() == data
    assert (current / MANIFEST_NAME).is_file()
    with pytest.raises(OSError) as e:
        (current / "config.json").write_bytes(b"x")
    assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        (t / "new-file").write_bytes(b"x")
    assert e.value.errno == errno.EROFS

    unpublish(env, "csi-1", t)
    assert not t.exists()
    assert mountinfo.mount_at(t) is None
    assert os.listdir(env.tmp / "data" / "volumes") == []
    assert env.bridge.store.leases() == []
    assert env.bridge.store.has_revision(env.digest)  # content stays cached, unleased


def test_publish_is_idempotent_and_conflicts_are_already_exists(env):
    t = target(env, "p1")
    req = publish_request("csi-1", t, env.digest, env.source)
    env.node.NodePublishVolume(req)
    env.node.NodePublishVolume(req)  # same arguments: OK
    assert len([m for m in mountinfo.read() if m.mount_point == str(t)]) == 1

    other = make_bundle(env.tmp / "src2", {"graph.onnx": b"other"})
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodePublishVolume(publish_request("csi-1", t, other, f"file://{env.tmp}/src2"))
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodePublishVolume(publish_request("csi-other", t, env.digest, env.source))
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert (t / "current" / "graph.onnx").read_bytes() == FILES["graph.onnx"]  # untouched
    assert len(env.bridge.store.leases()) == 1


def test_publish_repairs_a_mount_removed_behind_its_back(env):
    t = target(env, "p1")
    req = publish_request("csi-1", t, env.digest, env.source)
    env.node.NodePublishVolume(req)
    cleanup_mounts(t)
    assert mountinfo.mount_at(t) is None
    env.node.NodePublishVolume(req)
    assert mountinfo.mount_at(t).read_only
    assert (t / "current" / "config.json").read_bytes() == FILES["config.json"]
    count = env.bridge.metrics.registry.get_sample_value
    assert count("resident_publish_duration_seconds_count", {"result": "repaired"}) == 1
    assert count("resident_publish_duration_seconds_count", {"result": "published"}) == 1
    assert len(env.bridge.store.leases()) == 1


def test_unpublish_of_unknown_volume_or_missing_target_is_ok(env):
    unpublish(env, "never-published", env.tmp / "nowhere" / "mount")
    t = target(env, "p1")
    env.node.NodePublishVolume(publish_request("csi-1", t, env.digest, env.source))
    unpublish(env, "csi-1", t)
    unpublish(env, "csi-1", t)  # again: target gone, volume unknown -> OK
    # A different volume id on a published target leaves that publication alone.
    env.node.NodePublishVolume(publish_request("csi-1", t, env.digest, env.source))
    unpublish(env, "csi-2", t)
    assert mountinfo.mount_at(t) is not None and len(env.bridge.store.leases()) == 1
    unpublish(env, "csi-1", t)


def test_two_pods_share_one_copy_and_unpublish_keeps_the_other(env):
    t1, t2 = target(env, "p1"), target(env, "p2")
    env.node.NodePublishVolume(publish_request("csi-1", t1, env.digest, env.source, pod="a", pod_uid="u1"))
    env.node.NodePublishVolume(publish_request("csi-2", t2, env.digest, env.source, pod="b", pod_uid="u2"))
    w1, w2 = t1 / "current" / "model.safetensors", t2 / "current" / "model.safetensors"
    s1, s2 = os.stat(w1), os.stat(w2)
    assert (s1.st_dev, s1.st_ino) == (s2.st_dev, s2.st_ino)  # one inode: one copy on disk
    assert s1.st_nlink >= 3  # the store's blob/tree plus two volumes
    assert len(env.bridge.store.leases()) == 2

    unpublish(env, "csi-1", t1)
    assert not t1.exists()
    assert w2.read_bytes() == WEIGHTS
    leases = env.bridge.store.leases()
    assert len(leases) == 1 and leases[0].digest == env.digest
    unpublish(env, "csi-2", t2)
    assert env.bridge.store.leases() == []


def test_cross_namespace_mount_is_refused_and_nothing_is_made(env):
    t = target(env, "p1")
    for ns in ("team-b", "team-c", ""):
        with pytest.raises(grpc.RpcError) as e:
            env.node.NodePublishVolume(publish_request("csi-1", t, env.digest, env.source, namespace=ns))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "namespace" in e.value.details() or "podInfoOnMount" in e.value.details()
    assert not t.exists()
    assert env.bridge.store.leases() == [] and not env.bridge.store.has_revision(env.digest)


def test_a_long_fetch_answers_aborted_with_progress_and_the_retry_finishes(env):
    env.bridge.node.publish_wait_seconds = 0.0  # every fetch "outlasts" the call
    t = target(env, "p1")
    req = publish_request("csi-1", t, env.digest, env.source)
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodePublishVolume(req)
    assert e.value.code() == grpc.StatusCode.ABORTED
    assert "fetching " + env.digest in e.value.details() and "bytes" in e.value.details()
    assert mountinfo.mount_at(t) is None
    for _ in range(200):  # kubelet's retries
        try:
            env.node.NodePublishVolume(req)
            break
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.ABORTED
            import time
            time.sleep(0.02)
    assert (t / "current" / "model.safetensors").read_bytes() == WEIGHTS


def test_corrupt_source_gives_data_loss_and_publishes_nothing(env):
    bad = env.tmp / "bad"
    digest = make_bundle(bad, {"model.safetensors": WEIGHTS, "graph.onnx": b"g"})
    data = bytearray(WEIGHTS)
    data[70000] ^= 0xFF
    (bad / "model.safetensors").write_bytes(bytes(data))
    env.bridge.authorizer.allowed["team-a"].add(digest)
    t = target(env, "p1")
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodePublishVolume(publish_request("csi-1", t, digest, f"file://{bad}"))
    assert e.value.code() == grpc.StatusCode.DATA_LOSS
    assert "integrity" in e.value.details()
    assert not t.exists() and not env.bridge.store.has_revision(digest)
    assert env.bridge.state.publications() == []


def test_unreachable_source_is_unavailable(env):
    t = target(env, "p1")
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodePublishVolume(publish_request("csi-1", t, env.digest, f"file://{env.tmp}/missing"))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not t.exists()


def test_volume_stats(env):
    t = target(env, "p1")
    env.node.NodePublishVolume(publish_request("csi-1", t, env.digest, env.source))
    stats = env.node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(volume_id="csi-1", volume_path=str(t)))
    by_unit = {u.unit: u for u in stats.usage}
    assert by_unit[csi_pb2.VolumeUsage.BYTES].used >= sum(len(v) for v in FILES.values())
    assert stats.volume_condition.abnormal is False
    cleanup_mounts(t)  # the mount vanishes behind the bridge's back: reported abnormal
    stats = env.node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(volume_id="csi-1", volume_path=str(t)))
    assert stats.volume_condition.abnormal is True and "read-only mount" in stats.volume_condition.message
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(volume_id="nope", volume_path=str(t)))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        env.node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(volume_id="csi-1", volume_path="/nonexistent/x"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_gc_after_unpublish_removes_only_unleased_revisions(tmp_path):
    d1 = make_bundle(tmp_path / "v1", {"graph.onnx": b"1" * 50_000})
    d2 = make_bundle(tmp_path / "v2", {"graph.onnx": b"2" * 50_000})
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="n",
                                 root=tmp_path / "data", authorize="allow-any", private_metrics=True,
                                 gc_high_water_bytes=60_000, gc_low_water_bytes=0)).start()
    try:
        with CsiClient(tmp_path / "csi.sock") as c:
            t1, t2 = tmp_path / "p1" / "mount", tmp_path / "p2" / "mount"
            c.node.NodePublishVolume(publish_request("v1", t1, d1, f"file://{tmp_path}/v1"))
            c.node.NodePublishVolume(publish_request("v2", t2, d2, f"file://{tmp_path}/v2"))
            assert bridge.store.has_revision(d1) and bridge.store.has_revision(d2)
            c.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id="v1", target_path=str(t1)))
            assert not bridge.store.has_revision(d1)      # unleased, over the watermark: collected
            assert bridge.store.has_revision(d2)          # leased by the published volume: kept
            assert (t2 / "current" / "graph.onnx").read_bytes() == b"2" * 50_000
            c.node.NodePublishVolume(publish_request("v1", t1, d1, f"file://{tmp_path}/v1"))
            assert (t1 / "current" / "graph.onnx").read_bytes() == b"1" * 50_000  # fetched again
    finally:
        bridge.stop()
        cleanup_mounts(tmp_path)


def test_source_holding_another_bundle_is_refused_and_publishes_nothing(env):
    other = make_bundle(env.tmp / "other", {"graph.onnx": b"not the same bundle"})
    env.bridge.authorizer.allowed["team-a"].add(other)
    t = target(env, "p1")
    with pytest.raises(grpc.RpcError) as e:  # the digest names `other`, the source holds FILES
        env.node.NodePublishVolume(publish_request("csi-1", t, other, env.source))
    assert e.value.code() == grpc.StatusCode.DATA_LOSS  # the manifest does not hash to the digest
    assert other in e.value.details() and not t.exists()
    assert not env.bridge.store.has_revision(other) and env.bridge.store.leases() == []


def test_two_pods_starting_at_once_fetch_once_and_both_publish(env):
    from concurrent.futures import ThreadPoolExecutor
    targets = [target(env, f"p{i}") for i in range(4)]
    reqs = [publish_request(f"csi-{i}", t, env.digest, env.source, pod_uid=f"u{i}")
            for i, t in enumerate(targets)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(env.node.NodePublishVolume, reqs))
    inodes = {os.stat(t / "current" / "model.safetensors").st_ino for t in targets}
    assert len(inodes) == 1
    assert len(env.bridge.store.leases()) == 4
    for t in targets:
        assert (t / "current" / "model.safetensors").read_bytes() == WEIGHTS
