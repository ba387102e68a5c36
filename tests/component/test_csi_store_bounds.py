"""The node store stays within bounds under the chart's default GC watermarks, and a store
too small for a revision says so and loses nothing (real loop filesystems, real gRPC)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest
import yaml
from prometheus_client import REGISTRY

from bundle.loopfs import loop_filesystem
from csi_bridge import mountinfo
from csi_bridge.proto import csi_pb2
from csi_bridge.server import Bridge, BridgeConfig
from testkit.bridge import CsiClient, cleanup_mounts, make_bundle, publish_request

CHART_GC = yaml.safe_load((Path(__file__).resolve().parents[2] / "charts" / "resident"
                           / "values.yaml").read_text())["bridge"]["gc"]
MiB = 1 << 20


def start_bridge(tmp_path: Path, root: Path, **gc) -> Bridge:
    return Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="node-a", root=root,
                               authorize="allow-any", private_metrics=True, **gc)).start()


def publish(c: CsiClient, volume: str, target: Path, digest: str, src: Path, uid: str):
    return c.node.NodePublishVolume(publish_request(volume, target, digest, f"file://{src}",
                                                    pod_uid=uid))


def unpublish(c: CsiClient, volume: str, target: Path):
    c.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume,
                                                                  target_path=str(target)))


def metric(bridge: Bridge, name: str) -> float:
    return bridge.metrics.registry.get_sample_value(name)


def test_many_revisions_under_the_chart_default_watermarks_stay_under_the_high_one(tmp_path):
    assert CHART_GC["enabled"] and not CHART_GC["highWaterBytes"]  # the chart's default is a share
    n, size = 12, 4 * MiB                     # 48 MiB delivered onto a 40 MiB filesystem
    with loop_filesystem("ext4", 40 * MiB) as mnt:
        bridge = start_bridge(tmp_path, mnt / "data",
                              gc_high_water_percent=CHART_GC["highWaterPercent"],
                              gc_low_water_percent=CHART_GC["lowWaterPercent"])
        try:
            fs = bridge.store.filesystem_bytes()
            fs_size, usable = fs.size, fs.used + fs.available
            high_fill = usable * CHART_GC["highWaterPercent"] / 100

            def fill() -> int:
                return bridge.store.filesystem_bytes().used

            high = bridge.collector.watermarks()[0]   # in store bytes: the share less what else is there
            assert 0 < high <= high_fill and high > high_fill - 4 * MiB
            assert metric(bridge, "resident_store_gc_high_water_bytes") == high
            assert metric(bridge, "resident_store_capacity_bytes") == fs_size
            assert metric(bridge, "resident_store_available_bytes") > 0
            with CsiClient(tmp_path / "csi.sock") as c:
                previous = None
                for i in range(n):  # a transition each time: the new Pod up, then the old one gone
                    src = tmp_path / f"v{i}"
                    digest = make_bundle(src, {"w.safetensors": os.urandom(size)})
                    target = tmp_path / f"pod{i}" / "mount"
                    publish(c, f"vol-{i}", target, digest, src, f"uid-{i}")
                    assert fill() <= high_fill
                    if previous is not None:
                        unpublish(c, *previous)
                        assert fill() <= high_fill
                        assert bridge.store.usage_bytes() <= bridge.collector.watermarks()[0]
                    assert (target / "current" / "w.safetensors").stat().st_size == size
                    previous = (f"vol-{i}", target)
                    os.remove(src / "w.safetensors")   # the source is not on the loop fs; keep /tmp small
                assert n * size > fs_size                    # without GC this could not fit
                assert len(bridge.store.revisions()) < n     # so older revisions were reclaimed
                assert bridge.store.has_revision(digest)     # the published one never is
                assert metric(bridge, "resident_store_reclaimable_bytes") == \
                    bridge.store.usage_bytes() - size
                unpublish(c, *previous)
                assert metric(bridge, "resident_store_reclaimable_bytes") == bridge.store.usage_bytes()
        finally:
            bridge.stop()
            cleanup_mounts(tmp_path)


def test_a_store_too_small_for_a_revision_says_so_and_keeps_what_it_holds(tmp_path):
    small = make_bundle(tmp_path / "small", {"w.safetensors": os.urandom(256 * 1024)})
    big = make_bundle(tmp_path / "big", {"w.safetensors": os.urandom(12 * MiB)})
    with loop_filesystem("ext4", 8 * MiB) as mnt:
        bridge = start_bridge(tmp_path, mnt / "data")
        try:
            with CsiClient(tmp_path / "csi.sock") as c:
                t1, t2 = tmp_path / "p1" / "mount", tmp_path / "p2" / "mount"
                publish(c, "vol-1", t1, small, tmp_path / "small", "uid-1")
                with pytest.raises(grpc.RpcError) as e:
                    publish(c, "vol-2", t2, big, tmp_path / "big", "uid-2")
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                msg = e.value.details()
                assert f"no space in the node store for {big}" in msg
                assert str(12 * MiB) in msg and "No space left on device" in msg
                # nothing lost: the stored revision, its lease and its mount are intact
                assert bridge.store.revisions() == [small]
                assert [l.digest for l in bridge.store.leases()] == [small]
                assert (t1 / "current" / "w.safetensors").stat().st_size == 256 * 1024
                assert mountinfo.mount_at(t2) is None
                assert bridge.state.publication(str(t2)) is None
                failure = bridge.state.fetch_failure(big)   # kept for the retries' answers
                assert failure.code == "RESOURCE_EXHAUSTED" and "no space" in failure.message
        finally:
            bridge.stop()
            cleanup_mounts(tmp_path)
    assert REGISTRY.get_sample_value("resident_store_bytes") is not None
