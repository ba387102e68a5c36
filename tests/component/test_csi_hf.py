"""The bridge delivering from hf:// with the token kubelet hands over: the publish ``secrets``
of a real CSI call, against a real Hub-compatible server (olah) on 127.0.0.1, through a
relay that keeps what the bridge sent.

A new commit is a new source URI and a new digest; the volume's credentials read it as
they read the first."""

from __future__ import annotations

import logging
import os

import grpc
import pytest

from bundle.sources.hf import MADE, HfSource
from bundle.sources.metrics import FETCHED_BYTES
from csi_bridge import mountinfo, staging
from csi_bridge.server import Bridge, BridgeConfig
from testkit.bridge import CsiClient, cleanup_mounts, publish_request
from testkit.relay import CuttingRelay

CHUNK = 64 * 1024
W1 = os.urandom(8 * CHUNK + 100)
W2 = W1[:3 * CHUNK] + os.urandom(10) + W1[3 * CHUNK + 10:]     # one chunk changes
TOKEN = "hf_the_models_own_token_0123456789"


@pytest.fixture
def world(tmp_path, hub, hub_repo):
    a = hub_repo.commit({"model.safetensors": W1, "config.json": b'{"v": 1}'})
    b = hub_repo.commit({"model.safetensors": W2})
    relay = CuttingRelay(("127.0.0.1", int(hub[0].rsplit(":", 1)[1])), after=1 << 40, cuts=0)
    source = {c: f"hf://{hub_repo.repo_id}@{c}?endpoint=http://127.0.0.1:{relay.port}&chunk={CHUNK}"
              for c in (a, b)}
    digest = {c: HfSource(source[c]).manifest().digest for c in (a, b)}
    MADE.clear()   # the bridge makes them itself
    relay.requests.clear()
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="node-a",
                                 root=tmp_path / "data", authorize="allow-any",
                                 private_metrics=True)).start()
    w = type("World", (), dict(tmp=tmp_path, a=a, b=b, source=source, digest=digest, relay=relay,
                               bridge=bridge))

    def publish(target, secrets):
        target.parent.mkdir(parents=True, exist_ok=True)
        with CsiClient(tmp_path / "csi.sock") as c:
            c.node.NodePublishVolume(publish_request("csi-1", target, digest[a], source[a],
                                                     pod_uid="uid-1", secrets=secrets))

    w.publish = publish
    try:
        yield w
    finally:
        bridge.stop()
        relay.close()
        cleanup_mounts(tmp_path)
        MADE.clear()


def test_a_volume_is_published_from_hf_with_its_token_and_a_new_commit_staged_with_it(world, caplog):
    caplog.set_level(logging.DEBUG)
    target = world.tmp / "pod" / "mount"
    world.publish(target, {"HF_TOKEN": TOKEN})
    assert (target / "current" / "model.safetensors").read_bytes() == W1
    assert mountinfo.mount_at(target).read_only
    before = FETCHED_BYTES.labels("hf")._value.get()
    st = staging.stage(world.bridge, "uid-d", "team-a", "d", 1, staging.DeliverySpec.model_validate({
        "nodeName": "node-a", "podName": "owner-0", "podUID": "uid-1", "model": "m",
        "bundle": {"source": world.source[world.b], "digest": world.digest[world.b]},
        "path": "WholeBundle"}))
    assert st["phase"] == "Staged" and st["method"] == "rebase"
    assert st["bytes"]["fetched"] == CHUNK            # the changed chunk; config.json is the same
    # making the new commit's manifest on the node read its changed file whole first (the Hub
    # keeps no finer digest); config.json, unchanged and outside LFS, is read again (it is small)
    assert FETCHED_BYTES.labels("hf")._value.get() - before == len(W2) + len(b'{"v": 1}') + CHUNK
    assert (target / "current" / "model.safetensors").read_bytes() == W2
    sent = b"".join(world.relay.requests)
    assert f"bytes={3 * CHUNK}-{4 * CHUNK - 1}".encode() in sent   # the delivery asked for that chunk only
    assert sent.count(f"Bearer {TOKEN}".encode()) >= 4   # both trees, both files' reads
    # the token was never written down: not in the database, not in a log line
    for f in (world.tmp / "data").glob("bridge.db*"):
        assert TOKEN.encode() not in f.read_bytes()
    assert TOKEN not in caplog.text


def test_a_secret_without_hf_token_is_permission_denied_and_mounts_nothing(world):
    target = world.tmp / "pod" / "mount"
    with pytest.raises(grpc.RpcError) as e:
        world.publish(target, {"token": TOKEN})
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "lack HF_TOKEN" in e.value.details() and TOKEN not in e.value.details()
    assert mountinfo.mount_at(target) is None
    world.publish(target, {"HF_TOKEN": TOKEN})           # kubelet retries with the Secret fixed
    assert (target / "current" / "model.safetensors").read_bytes() == W1
