"""Live staging into a published volume without an API server: the staging step the
BundleDelivery watch runs, driven directly (real store, real mounts, real SQLite)."""

from __future__ import annotations

import os

import pytest

from csi_bridge import mountinfo, staging
from csi_bridge.authorization import StaticPolicy
from csi_bridge.proto import csi_pb2
from csi_bridge.server import Bridge, BridgeConfig
from testkit.bridge import CsiClient, cleanup_mounts, make_bundle, publish_request

CHUNK = 64 * 1024
W1 = os.urandom(8 * CHUNK)
W2 = W1[:6 * CHUNK] + os.urandom(2 * CHUNK)  # last quarter of the weights changed
V1 = {"w.safetensors": W1, "graph.onnx": b"one" * 100, "config.json": b"{}"}
V2 = {"w.safetensors": W2, "graph.onnx": b"two" * 100, "config.json": b"{}"}


@pytest.fixture
def env(tmp_path):
    d1, d2 = make_bundle(tmp_path / "v1", V1, CHUNK), make_bundle(tmp_path / "v2", V2, CHUNK)
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="node-a",
                                 root=tmp_path / "data", authorize="allow-any",
                                 private_metrics=True)).start()
    target = tmp_path / "pod" / "mount"
    target.parent.mkdir()
    env = type("Env", (), dict(tmp=tmp_path, d1=d1, d2=d2, bridge=bridge, target=target))
    try:
        with CsiClient(tmp_path / "csi.sock") as c:
            c.node.NodePublishVolume(publish_request("csi-1", target, d1, f"file://{tmp_path}/v1",
                                                     pod_uid="uid-1", model="m"))
        yield env
    finally:
        env.bridge.stop()   # the one running at the end (a test may restart it)
        cleanup_mounts(tmp_path)


def spec(env, **kw):
    doc = {"nodeName": "node-a", "podName": "owner-0", "podUID": "uid-1", "model": "m",
           "bundle": {"source": f"file://{env.tmp}/v2", "digest": env.d2}, "path": "WholeBundle", **kw}
    return staging.DeliverySpec.model_validate(doc)


def test_whole_bundle_rebases_on_the_current_revision(env):
    st = staging.stage(env.bridge, "uid-d", "team-a", "d", 1, spec(env))
    assert st["phase"] == "Staged" and st["verified"] and st["method"] == "rebase"
    changed = 2 * CHUNK + len(V2["graph.onnx"])
    assert st["bytes"]["fetched"] == changed
    assert st["bytes"]["reused"] == sum(map(len, V2.values())) - changed
    assert (env.target / "current" / "w.safetensors").read_bytes() == W2
    assert mountinfo.mount_at(env.target).read_only
    # Staging the same delivery again is a no-op that still reports Staged.
    again = staging.stage(env.bridge, "uid-d", "team-a", "d", 1, spec(env))
    assert again["phase"] == "Staged" and again["bytes"]["fetched"] == 0


def test_rebase_under_min_reuse_falls_back_to_reconstruct_and_says_so(env):
    st = staging.stage(env.bridge, "uid-d", "team-a", "d", 1, spec(env, minReuse=0.99))
    assert st["phase"] == "Staged" and st["method"] == "reconstruct"
    assert st.get("fallbackReason")
    assert (env.target / "current" / "w.safetensors").read_bytes() == W2


def test_a_delivery_of_another_namespace_is_refused_and_takes_no_lease(env):
    # The volume belongs to a Pod of team-a; a BundleDelivery in team-b names that Pod's UID.
    with pytest.raises(staging.StageFailed) as e:
        staging.stage(env.bridge, "uid-d", "team-b", "d", 1, spec(env))
    assert e.value.reason == "NamespaceMismatch" and "team-a" in e.value.message
    assert_untouched(env, "uid-d")


def test_a_revision_the_namespace_does_not_declare_is_refused(env, tmp_path):
    policy = tmp_path / "policy.json"   # team-a declares only the published revision
    policy.write_text('{"team-a": ["%s"]}' % env.d1)
    env.bridge.authorizer = StaticPolicy(policy)
    with pytest.raises(staging.StageFailed) as e:
        staging.stage(env.bridge, "uid-d", "team-a", "d", 1, spec(env))
    assert e.value.reason == "NotAuthorized" and env.d2 in e.value.message
    assert_untouched(env, "uid-d")
    policy.write_text('{"team-a": ["%s", "%s"]}' % (env.d1, env.d2))
    env.bridge.authorizer = StaticPolicy(policy)  # declared: the same delivery stages
    assert staging.stage(env.bridge, "uid-d", "team-a", "d", 1, spec(env))["phase"] == "Staged"


def assert_untouched(env, uid):
    assert os.readlink(env.target / "current") == "revisions/" + env.d1.replace(":", "-")
    assert sorted(os.listdir(env.target / "revisions")) == [env.d1.replace(":", "-")]
    assert not any(l.holder == f"delivery:{uid}" for l in env.bridge.store.leases())
    assert not env.bridge.store.has_revision(env.d2) and env.bridge.state.delivery(uid) is None


def test_staging_for_an_unknown_pod_is_not_yet(env):
    with pytest.raises(staging.NotYet):
        staging.stage(env.bridge, "uid-d", "team-a", "d", 1, spec(env, podUID="someone-else"))
    assert not any(l.holder == "delivery:uid-d" for l in env.bridge.store.leases())


def test_corrupt_source_fails_and_keeps_the_volume_as_it_was(env):
    bad = env.tmp / "bad"
    d3 = make_bundle(bad, {**V1, "graph.onnx": b"three" * 100}, CHUNK)
    (bad / "graph.onnx").write_bytes(b"tampered" * 10)
    s = spec(env, bundle={"source": f"file://{bad}", "digest": d3})
    with pytest.raises(staging.StageFailed) as e:
        staging.stage(env.bridge, "uid-d", "team-a", "d", 1, s)
    assert e.value.reason == "IntegrityMismatch"
    assert os.readlink(env.target / "current") == "revisions/" + env.d1.replace(":", "-")
    assert sorted(os.listdir(env.target / "revisions")) == [env.d1.replace(":", "-")]
    # The delivery's lease is kept until its object is deleted, never dropped on error.
    assert any(l.holder == "delivery:uid-d" for l in env.bridge.store.leases())
    assert staging.release(env.bridge, "uid-d") is True


def test_unpublish_while_staged_keeps_the_delivery_lease(env):
    staging.stage(env.bridge, "uid-d", "team-a", "d", 1, spec(env))
    with CsiClient(env.tmp / "csi.sock") as c:
        c.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
            volume_id="csi-1", target_path=str(env.target)))
    holders = {l.holder: l.digest for l in env.bridge.store.leases()}
    assert holders == {"delivery:uid-d": env.d2}  # exactly the volume's lease was released


def test_kubelets_republish_while_a_delivery_stages_is_confirmed_not_aborted(env):
    # requiresRepublish: kubelet publishes a mounted volume again about once a minute; one
    # that meets a staging (which holds the target) must not answer ABORTED, which kubelet
    # would report as a FailedMount Warning on the running Pod
    import grpc
    again = publish_request("csi-1", env.target, env.d1, f"file://{env.tmp}/v1", pod_uid="uid-1", model="m")
    with env.bridge.locks.hold(f"target {env.target}"), CsiClient(env.tmp / "csi.sock") as c:
        c.node.NodePublishVolume(again)
        other = publish_request("csi-2", env.target, env.d2, f"file://{env.tmp}/v2", pod_uid="uid-1")
        with pytest.raises(grpc.RpcError) as e:   # anything else still waits its turn
            c.node.NodePublishVolume(other)
        assert e.value.code() == grpc.StatusCode.ABORTED
    assert mountinfo.mount_at(env.target).read_only


def test_a_pre_staged_revision_leaves_current_alone_until_activated(env):
    rev = lambda d: "revisions/" + d.replace(":", "-")
    st = staging.stage(env.bridge, "uid-s", "team-a", "s", 1, spec(env, activate=False))
    assert st["phase"] == "Staged" and st["verified"] and st["bytes"]["fetched"] > 0
    assert "pre-staged" in st["message"]
    assert os.readlink(env.target / "current") == rev(env.d1)          # the live revision serves on
    assert (env.target / rev(env.d2) / "w.safetensors").read_bytes() == W2   # beside it, whole
    assert {l.holder: l.digest for l in env.bridge.store.leases()}["delivery:uid-s"] == env.d2
    # the switch: the same delivery, activated (a new generation), moves only `current`
    again = staging.stage(env.bridge, "uid-s", "team-a", "s", 2, spec(env))
    assert again["phase"] == "Staged" and again["bytes"]["fetched"] == 0
    assert os.readlink(env.target / "current") == rev(env.d2)


def test_a_demoted_revision_is_not_authorized_again_but_a_new_one_is(env, tmp_path):
    """After a switch the operator demotes the delivery of the revision it left (``activate:
    false``, kept for a rollback) before its status names it ``previousBundle``. The
    chaos soak (seed 31) saw the bridge refuse that demotion as NotAuthorized; the
    delivery stayed Failed, and the next switch back to the revision failed on it."""
    staging.stage(env.bridge, "uid-d", "team-a", "d", 1, spec(env))      # the switch to v2
    policy = tmp_path / "policy.json"   # the model declares neither revision at this moment
    policy.write_text('{"team-a": []}')
    env.bridge.authorizer = StaticPolicy(policy)
    st = staging.stage(env.bridge, "uid-d", "team-a", "d", 2, spec(env, activate=False))
    assert st["phase"] == "Staged" and st["bytes"]["fetched"] == 0
    # a revision the delivery does not hold yet is authorized as before, even not activated
    with pytest.raises(staging.StageFailed) as e:
        staging.stage(env.bridge, "uid-s", "team-a", "s", 1, spec(env, activate=False))
    assert e.value.reason == "NotAuthorized"
    # and so is activating one (a switch back to it)
    with pytest.raises(staging.StageFailed):
        staging.stage(env.bridge, "uid-d", "team-a", "d", 3, spec(env))


def test_releasing_a_pre_staged_revision_takes_it_out_of_the_volume(env):
    rev = env.d2.replace(":", "-")
    staging.stage(env.bridge, "uid-s", "team-a", "s", 1, spec(env, activate=False))
    assert staging.release(env.bridge, "uid-s") is True
    assert sorted(os.listdir(env.target / "revisions")) == [env.d1.replace(":", "-")]
    assert not any(l.holder == "delivery:uid-s" for l in env.bridge.store.leases())
    # a transition's revision that `current` points at stays in the volume
    staging.stage(env.bridge, "uid-d", "team-a", "d", 1, spec(env))
    assert staging.release(env.bridge, "uid-d") is True
    assert rev in os.listdir(env.target / "revisions")
    # and a pre-staged revision that became current is never taken out
    staging.stage(env.bridge, "uid-t", "team-a", "t", 1, spec(env, activate=False))
    assert staging.release(env.bridge, "uid-t") is True
    assert os.readlink(env.target / "current") == "revisions/" + rev
    assert (env.target / "current" / "w.safetensors").read_bytes() == W2


def test_the_revision_a_switch_left_leaves_the_volume_when_its_delivery_goes(env):
    """Each switch of a long-lived owner put a whole revision into its volume, and only a
    pre-staged one ever left it again: after the switch away from it, the revision's
    hardlinks held its bytes on the node's disk until the Pod went, whatever the store
    collected."""
    v1 = {"source": f"file://{env.tmp}/v1", "digest": env.d1}
    staging.stage(env.bridge, "uid-a", "team-a", "a", 1, spec(env))              # a switch to V2
    staging.stage(env.bridge, "uid-b", "team-a", "b", 1, spec(env, bundle=v1))   # and back to V1
    v2 = env.target / "revisions" / env.d2.replace(":", "-")
    with open(v2 / "w.safetensors", "rb") as still_open:                         # an owner reading it
        assert staging.release(env.bridge, "uid-a") is True                      # V2's delivery goes
        assert not v2.exists()
        assert still_open.read() == W2
    assert os.readlink(env.target / "current") == "revisions/" + env.d1.replace(":", "-")
    assert sorted(os.listdir(env.target / "revisions")) == [env.d1.replace(":", "-")]
    assert env.d2 not in {l.digest for l in env.bridge.store.leases()}          # the store may collect it
    # a revision another delivery of the volume still holds stays
    staging.stage(env.bridge, "uid-c", "team-a", "c", 1, spec(env, activate=False))
    staging.stage(env.bridge, "uid-e", "team-a", "e", 1, spec(env, activate=False))
    assert staging.release(env.bridge, "uid-c") is True and v2.is_dir()


def test_a_remount_keeps_the_revision_the_volume_switched_to(env):
    """A node reboot takes the bind mount away while the volume directory stays. The
    kubelet publishes again (and a restarted bridge's reconcile remounts): the volume must
    come back on the revision it had switched to, not on the one it was first published
    with, or the owner would load a revision the model's status does not say."""
    staging.stage(env.bridge, "uid-d", "team-a", "d", 1, spec(env))
    assert os.readlink(env.target / "current") == "revisions/" + env.d2.replace(":", "-")
    cleanup_mounts(env.target)                        # the reboot: the mount is gone
    with CsiClient(env.tmp / "csi.sock") as c:        # the kubelet publishes the Pod's volume again
        c.node.NodePublishVolume(publish_request("csi-1", env.target, env.d1, f"file://{env.tmp}/v1",
                                                 pod_uid="uid-1", model="m"))
    assert mountinfo.mount_at(env.target).read_only
    assert os.readlink(env.target / "current") == "revisions/" + env.d2.replace(":", "-")
    assert (env.target / "current" / "w.safetensors").read_bytes() == W2

    cleanup_mounts(env.target)                        # again, and this time the bridge restarts
    env.bridge.stop()
    env.bridge = Bridge(env.bridge.config).start()
    assert mountinfo.mount_at(env.target).read_only   # its reconcile remounted the volume
    assert (env.target / "current" / "w.safetensors").read_bytes() == W2


def test_an_api_server_that_does_not_answer_refuses_for_a_while_not_for_good(env, tmp_path):
    """The chaos soak's hour: a delivery failed for good (NotAuthorized, "not retried until
    the spec changes") on a connection refused by the API server's Service. A check that
    could not be made still refuses (closed), but as a passing failure: the delivery is
    retried with backoff, and a publish answers UNAVAILABLE, which kubelet retries."""
    import grpc
    from kubernetes import client

    from csi_bridge import retries
    from csi_bridge.authorization import ApiPolicy
    config = client.Configuration()
    config.host, config.verify_ssl = "https://127.0.0.1:1", False   # nothing listens there
    env.bridge.authorizer = env.bridge.publisher.authorizer = ApiPolicy(client.ApiClient(config))
    with pytest.raises(staging.StageFailed) as e:
        staging.stage(env.bridge, "uid-d", "team-a", "d", 1, spec(env))
    assert e.value.reason == "AuthorizationUnavailable" and "cannot read ResidentModels" in e.value.message
    assert retries.next_attempt(e.value.reason, 1, retries.Backoff(), 0.0) is not None
    assert retries.next_attempt("NotAuthorized", 1, retries.Backoff(), 0.0) is None   # a refusal stays
    assert_untouched(env, "uid-d")
    target = tmp_path / "pod2" / "mount"
    target.parent.mkdir()
    with CsiClient(tmp_path / "csi.sock") as c, pytest.raises(grpc.RpcError) as refused:
        c.node.NodePublishVolume(publish_request("csi-2", target, env.d2, f"file://{tmp_path}/v2",
                                                 pod_uid="uid-2", model="m"))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()


def test_a_revision_left_in_the_volume_and_collected_from_the_store_stages_again(env):
    """The chaos soak's hour: a revision a transition had put into the volume stays there
    after the volume moved on, unleased; the store collected it (a store filled to its
    watermark), and a switch back to it staged it anew in the store while the volume still
    held the old tree, whose inodes are not the store's: VerificationFailed, for good. The
    volume now gets the store's tree in place of the stale one."""
    first = staging.stage(env.bridge, "uid-a", "team-a", "a", 1, spec(env))   # activate: current is V2
    assert first["phase"] == "Staged"
    staging.release(env.bridge, "uid-a")   # released while current: it stays in the volume
    staging.stage(env.bridge, "uid-b", "team-a", "b", 1,
                  spec(env, bundle={"source": f"file://{env.tmp}/v1", "digest": env.d1}))   # back to V1
    stale = os.stat(env.target / "revisions" / env.d2.replace(":", "-") / "w.safetensors").st_ino
    assert env.d2 not in {l.digest for l in env.bridge.store.leases()}
    env.bridge.store.gc(0, 0)                                 # unleased: collected from the store
    assert not env.bridge.store.has_revision(env.d2)
    again = staging.stage(env.bridge, "uid-c", "team-a", "c", 1, spec(env, activate=False))
    assert again["phase"] == "Staged" and again["verified"], again["message"]
    tree = env.target / "revisions" / env.d2.replace(":", "-")
    assert os.stat(tree / "w.safetensors").st_ino != stale and (tree / "w.safetensors").read_bytes() == W2
    assert os.readlink(env.target / "current") == "revisions/" + env.d1.replace(":", "-")
