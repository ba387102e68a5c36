"""The bridge delivering from s3:// with the credentials kubelet hands over: the publish
``secrets`` of a real CSI call, against a real S3 server (SeaweedFS) on 127.0.0.1.

kubelet sends the data of the Secret a volume's ``nodePublishSecretRef`` names; the
bridge reads the source with exactly those, for the publish and for every revision
staged into that volume later, and keeps them nowhere but in memory."""

from __future__ import annotations

import logging
import os

import grpc
import pytest

from bundle.sources import push
from csi_bridge import mountinfo, staging
from csi_bridge.server import Bridge, BridgeConfig
from testkit.bridge import CsiClient, cleanup_mounts, make_bundle, publish_request

from testkit.s3_server import CREDENTIALS

CHUNK = 64 * 1024
W1 = os.urandom(8 * CHUNK)
W2 = W1[:7 * CHUNK] + os.urandom(CHUNK)
V1 = {"w.safetensors": W1, "config.json": b'{"v": 1}'}
V2 = {"w.safetensors": W2, "config.json": b'{"v": 2}'}
SECRETS = dict(CREDENTIALS)
WRONG = {**SECRETS, "AWS_SECRET_ACCESS_KEY": "wrong-secret-value-0000"}


@pytest.fixture
def world(tmp_path, s3_endpoint, s3_bucket, s3_prefix):
    source = f"s3://{s3_bucket}/{s3_prefix}?endpoint={s3_endpoint}"
    d1, d2 = make_bundle(tmp_path / "v1", V1, CHUNK), make_bundle(tmp_path / "v2", V2, CHUNK)
    for d in ("v1", "v2"):
        push(tmp_path / d, source, credentials=CREDENTIALS)
    w = type("World", (), dict(tmp=tmp_path, source=source, d1=d1, d2=d2, bucket=s3_bucket,
                               bridge=None))

    def start():
        w.bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="node-a",
                                       root=tmp_path / "data", authorize="allow-any",
                                       private_metrics=True)).start()

    def publish(target, secrets, volume="csi-1", uid="uid-1", namespace="team-a"):
        target.parent.mkdir(parents=True, exist_ok=True)
        with CsiClient(tmp_path / "csi.sock") as c:
            c.node.NodePublishVolume(publish_request(volume, target, d1, source, pod_uid=uid,
                                                     namespace=namespace, secrets=secrets))

    w.start, w.publish = start, publish
    start()
    try:
        yield w
    finally:
        w.bridge.stop()
        cleanup_mounts(tmp_path)


def stage_spec(w, **kw):
    return staging.DeliverySpec.model_validate({
        "nodeName": "node-a", "podName": "owner-0", "podUID": "uid-1", "model": "m",
        "bundle": {"source": w.source, "digest": w.d2}, "path": "WholeBundle", **kw})


def test_a_volume_is_published_from_s3_with_its_secrets_and_staged_with_them_too(world, caplog):
    caplog.set_level(logging.DEBUG)
    target = world.tmp / "pod" / "mount"
    world.publish(target, SECRETS)
    assert (target / "current" / "w.safetensors").read_bytes() == W1
    assert mountinfo.mount_at(target).read_only
    st = staging.stage(world.bridge, "uid-d", "team-a", "d", 1, stage_spec(world))
    assert st["phase"] == "Staged" and st["method"] == "rebase"
    assert st["bytes"]["fetched"] == CHUNK + len(V2["config.json"])   # only what changed
    assert (target / "current" / "w.safetensors").read_bytes() == W2
    # the secret was never written down: not in the database, not in a log line
    secret = SECRETS["AWS_SECRET_ACCESS_KEY"].encode()
    for f in (world.tmp / "data").glob("bridge.db*"):
        assert secret not in f.read_bytes()
    assert secret.decode() not in caplog.text


@pytest.mark.parametrize("secrets", [WRONG, {}, {"AWS_ACCESS_KEY_ID": SECRETS["AWS_ACCESS_KEY_ID"]}],
                         ids=["wrong-secret", "no-secret", "lacking-a-key"])
def test_a_publish_whose_credentials_are_refused_is_permission_denied_naming_the_bucket(world, secrets):
    target = world.tmp / "pod" / "mount"
    with pytest.raises(grpc.RpcError) as e:
        world.publish(target, secrets)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "AccessDenied" in e.value.details() and repr(world.bucket) in e.value.details()
    assert WRONG["AWS_SECRET_ACCESS_KEY"] not in e.value.details()
    assert mountinfo.mount_at(target) is None and not world.bridge.store.has_revision(world.d1)
    # the same volume with the right Secret (kubelet retries with the Secret fixed) mounts
    world.publish(target, SECRETS)
    assert (target / "current" / "w.safetensors").read_bytes() == W1


def test_another_namespace_proves_possession_with_its_own_credentials(world):
    world.publish(world.tmp / "a" / "mount", SECRETS)        # team-a: the store now holds d1
    with pytest.raises(grpc.RpcError) as e:                  # team-b names the same source and
        world.publish(world.tmp / "b" / "mount", WRONG,      # digest with a Secret the store refuses
                      volume="csi-2", uid="uid-2", namespace="team-b")
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may not mount" in e.value.details() and "AccessDenied" in e.value.details()
    assert mountinfo.mount_at(world.tmp / "b" / "mount") is None
    world.publish(world.tmp / "b" / "mount", SECRETS, volume="csi-2", uid="uid-2", namespace="team-b")


def test_after_a_restart_a_delivery_waits_for_kubelet_to_republish_the_volume(world):
    target = world.tmp / "pod" / "mount"
    world.publish(target, SECRETS)
    world.bridge.stop()
    world.start()   # the credentials were in memory only
    with pytest.raises(staging.NotYet, match="publish it again"):
        staging.stage(world.bridge, "uid-d", "team-a", "d", 1, stage_spec(world))
    world.publish(target, SECRETS)   # kubelet's republish: confirmed, and the credentials are back
    assert staging.stage(world.bridge, "uid-d", "team-a", "d", 1, stage_spec(world))["phase"] == "Staged"


def test_a_delivery_read_with_credentials_the_store_refuses_fails_as_access_denied(world):
    target = world.tmp / "pod" / "mount"
    world.publish(target, SECRETS)
    world.publish(target, WRONG)   # a republish after the Secret changed: confirmed (nothing to fetch)
    with pytest.raises(staging.StageFailed) as e:
        staging.stage(world.bridge, "uid-d", "team-a", "d", 1, stage_spec(world))
    assert e.value.reason == "AccessDenied" and repr(world.bucket) in e.value.message
    assert os.readlink(target / "current") == "revisions/" + world.d1.replace(":", "-")
