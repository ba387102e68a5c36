"""Kill the bridge process mid-publish and mid-unpublish, start it again, and show that
no mount leaks, no lease is lost and no partial tree is exposed.

The bridge runs as a real child process. Crash points (``RESIDENT_BRIDGE_CRASH_AT``) make
it exit at an exact step, as a SIGKILL would; one test also SIGKILLs it while a
background fetch is running.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import grpc
import pytest

from bundle.manifest import MANIFEST_NAME
from csi_bridge import mountinfo
from csi_bridge.proto import csi_pb2
from testkit import crash_points
from testkit.bridge import BridgeProcess, CsiClient, cleanup_mounts, make_bundle, publish_request

FILES = {"model.safetensors": os.urandom(300_000), "graph.onnx": b"graph" * 50, "config.json": b"{}"}


@pytest.fixture
def env(tmp_path):
    digest = make_bundle(tmp_path / "src", FILES)
    bridge = BridgeProcess(tmp_path / "bridge")
    target = tmp_path / "kubelet" / "pod-1" / "mount"
    target.parent.mkdir(parents=True)
    try:
        yield type("Env", (), dict(tmp=tmp_path, digest=digest, source=f"file://{tmp_path}/src",
                                   bridge=bridge, target=target,
                                   req=publish_request("csi-1", target, digest, f"file://{tmp_path}/src")))
    finally:
        bridge.kill()
        cleanup_mounts(tmp_path)
        assert mountinfo.mounts_under(tmp_path) == []


def leases(env) -> list[tuple[str, str]]:
    db = sqlite3.connect(env.bridge.root / "data" / "store" / "store.db")
    try:
        return sorted(db.execute("SELECT holder, digest FROM leases WHERE holder NOT LIKE 'work:%'"))
    finally:
        db.close()


def publications(env) -> list[tuple[str, str]]:
    db = sqlite3.connect(env.bridge.root / "data" / "bridge.db")
    try:
        return db.execute("SELECT target_path, state FROM publications").fetchall()
    finally:
        db.close()


def mounts_at(path: Path):
    return [m for m in mountinfo.read() if m.mount_point == str(path)]


def assert_no_partial_trees(env):
    """Every revision directory anywhere under the bridge root is whole; no scratch left."""
    data = env.bridge.root / "data"
    for vol in (data / "volumes").iterdir():
        assert not (vol / ".incoming").exists()
        for rev in (vol / "revisions").iterdir():
            assert sorted(p.name for p in rev.iterdir()) == sorted([MANIFEST_NAME, *FILES])
    assert not [p for p in (data / "volumes").rglob("*staging*")]


def publish_until_ok(client, req, tries=100):
    for _ in range(tries):
        try:
            return client.node.NodePublishVolume(req)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.ABORTED, e.details()
            time.sleep(0.05)
    raise AssertionError("publish never completed")


@pytest.mark.parametrize("point", [p for p in crash_points.POINTS if p.startswith("publish:")])
def test_crash_mid_publish_then_restart(env, point):
    env.bridge.start(crash_at=point)
    with CsiClient(env.bridge.socket) as c:
        with pytest.raises(grpc.RpcError):
            c.node.NodePublishVolume(env.req)
    assert env.bridge.wait_exit() == crash_points.EXIT_CODE
    if point == "publish:after-bind":
        # the half-made mount: bound from a read-only staging mount, so never writable
        assert [m.read_only for m in mounts_at(env.target)] == [True]
    assert leases(env) != []  # taken before the crash

    env.bridge.start()
    # Restarted and reconciled: never a read-write mount, never more than one, lease kept.
    ms = mounts_at(env.target)
    assert all(m.read_only for m in ms) and len(ms) <= 1
    assert [d for _, d in leases(env)] == [env.digest]
    assert_no_partial_trees(env)
    with CsiClient(env.bridge.socket) as c:
        publish_until_ok(c, env.req)  # kubelet's retry finishes (or confirms) the publish
        assert len(mounts_at(env.target)) == 1 and mounts_at(env.target)[0].read_only
        for rel, data in FILES.items():
            assert (env.target / "current" / rel).read_bytes() == data
        assert publications(env) == [(str(env.target), "published")]
        c.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
            volume_id="csi-1", target_path=str(env.target)))
    assert mounts_at(env.target) == [] and leases(env) == [] and publications(env) == []
    assert list((env.bridge.root / "data" / "volumes").iterdir()) == []


def test_crash_mid_unpublish_is_finished_on_restart(env):
    env.bridge.start(crash_at="unpublish:after-unmount")
    with CsiClient(env.bridge.socket) as c:
        publish_until_ok(c, env.req)
        with pytest.raises(grpc.RpcError):
            c.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
                volume_id="csi-1", target_path=str(env.target)))
    assert env.bridge.wait_exit() == crash_points.EXIT_CODE
    assert mounts_at(env.target) == [] and len(leases(env)) == 1  # unmounted, lease still held
    env.bridge.start()
    assert leases(env) == [] and publications(env) == [] and not env.target.exists()
    with CsiClient(env.bridge.socket) as c:  # kubelet's retry of the unpublish: OK
        c.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
            volume_id="csi-1", target_path=str(env.target)))


def test_restart_readopts_intact_mounts(env):
    env.bridge.start()
    with CsiClient(env.bridge.socket) as c:
        publish_until_ok(c, env.req)
    before = mounts_at(env.target)
    env.bridge.kill()  # SIGKILL
    env.bridge.start()
    assert [m.mount_id for m in mounts_at(env.target)] == [m.mount_id for m in before]
    assert [d for _, d in leases(env)] == [env.digest]
    with CsiClient(env.bridge.socket) as c:
        c.node.NodePublishVolume(env.req)  # confirmed without remounting
    assert [m.mount_id for m in mounts_at(env.target)] == [m.mount_id for m in before]
    assert (env.target / "current" / "graph.onnx").read_bytes() == FILES["graph.onnx"]


def test_sigkill_during_background_fetch(env):
    big = {"model.safetensors": os.urandom(8 * 1024 * 1024), "graph.onnx": b"g"}
    digest = make_bundle(env.tmp / "big", big, chunk_size=256 * 1024)
    req = publish_request("csi-1", env.target, digest, f"file://{env.tmp}/big")
    env.bridge.args += ["--publish-wait", "0"]
    env.bridge.start()
    with CsiClient(env.bridge.socket) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.node.NodePublishVolume(req)
        assert e.value.code() == grpc.StatusCode.ABORTED and "fetching" in e.value.details()
    env.bridge.kill()  # SIGKILL while the fetch runs in the background
    assert mounts_at(env.target) == []
    env.bridge.start()
    store_revs = env.bridge.root / "data" / "store" / "revisions"
    for rev in store_revs.iterdir():  # a revision in the store is whole or absent
        assert (rev / MANIFEST_NAME).is_file()
        assert (rev / "model.safetensors").stat().st_size == len(big["model.safetensors"])
    with CsiClient(env.bridge.socket) as c:
        publish_until_ok(c, req, tries=400)
    assert (env.target / "current" / "model.safetensors").read_bytes() == big["model.safetensors"]


def test_restart_after_mounts_vanished_remounts_and_drops_orphan_directories(env):
    env.bridge.start()
    with CsiClient(env.bridge.socket) as c:
        publish_until_ok(c, env.req)
    env.bridge.kill()
    cleanup_mounts(env.target)  # as after a node reboot: records survive, mounts do not
    orphan = env.bridge.root / "data" / "volumes" / "0123456789abcdef"
    (orphan / "revisions").mkdir(parents=True)  # no record names it
    assert mounts_at(env.target) == []
    env.bridge.start()
    assert [m.read_only for m in mounts_at(env.target)] == [True]
    assert (env.target / "current" / "config.json").read_bytes() == FILES["config.json"]
    assert not orphan.exists()
    assert [d for _, d in leases(env)] == [env.digest]
