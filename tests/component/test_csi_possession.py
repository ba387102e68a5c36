"""Possession, not knowledge: a namespace mounts a digest the node already holds only once
its own source has served that digest's manifest. Real gRPC on a unix socket, real bind
mounts, real HTTP bundle servers on 127.0.0.1, the bridge's real SQLite state."""

from __future__ import annotations

import threading

import grpc
import pytest

from bundle.sources import push
from bundle.sources.httpserve import BundleServer
from csi_bridge import mountinfo
from csi_bridge.server import Bridge, BridgeConfig
from csi_bridge.publisher import lease_holder, volume_dirname
from testkit.bridge import CsiClient, cleanup_mounts, make_bundle, publish_request

FILES = {"w.safetensors": bytes(range(256)) * 512, "graph.onnx": b"tenant-a graph" * 50}


class Served:
    """A real bundle server on 127.0.0.1, in a thread; stopped by the fixture."""

    def __init__(self, root):
        self.server = BundleServer(root)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = self.server.url + "/models"
        self.root = root

    def stop(self):
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(5)


@pytest.fixture
def world(tmp_path):
    digest = make_bundle(tmp_path / "bundle", FILES)
    servers = {name: Served(tmp_path / f"srv-{name}") for name in ("a", "b-real", "b-bogus")}
    push(tmp_path / "bundle", servers["a"].url)
    push(tmp_path / "bundle", servers["b-real"].url)   # B's own copy of the same bundle
    # B's bogus server answers D's manifest name with other bytes (and holds no blobs).
    fake = servers["b-bogus"].root / "models" / "manifests" / f"{digest.replace(':', '-')}.json"
    fake.parent.mkdir(parents=True)
    fake.write_bytes(b'{"files": []}')
    policy = tmp_path / "policy.json"  # both namespaces declare D: a copied digest
    policy.write_text('{"team-a": ["%s"], "team-b": ["%s"]}' % (digest, digest))
    w = type("World", (), dict(tmp=tmp_path, digest=digest, servers=servers, bridge=None))

    def start():
        w.bridge = Bridge(BridgeConfig(endpoint=f"unix://{tmp_path}/csi.sock", node_id="node-a",
                                       root=tmp_path / "data", authorize="static",
                                       authorize_file=policy, private_metrics=True,
                                       pods_dir=tmp_path / "kubelet" / "pods")).start()
    w.start = start
    start()
    try:
        yield w
    finally:
        w.bridge.stop()
        for s in servers.values():
            s.stop()
        cleanup_mounts(tmp_path)
        assert mountinfo.mounts_under(tmp_path) == []


def publish(w, ns, source, pod):
    t = w.tmp / "kubelet" / "pods" / pod / "mount"
    t.parent.mkdir(parents=True, exist_ok=True)
    with CsiClient(w.tmp / "csi.sock") as c:
        c.node.NodePublishVolume(publish_request(f"csi-{pod}", t, w.digest, source,
                                                 namespace=ns, pod=pod, pod_uid=pod))
    return t


def refused(w, ns, source, pod) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        publish(w, ns, source, pod)
    t = w.tmp / "kubelet" / "pods" / pod / "mount"
    assert not t.exists() and mountinfo.mount_at(t) is None
    holder = lease_holder(volume_dirname(f"csi-{pod}", str(t)))   # this publish's lease, had it taken one
    assert holder not in {l.holder for l in w.bridge.store.leases()}
    return e.value


def test_a_copied_digest_needs_a_source_that_really_serves_it(world):
    w = world
    a = publish(w, "team-a", w.servers["a"].url, "a1")
    assert (a / "current" / "graph.onnx").read_bytes() == FILES["graph.onnx"]
    assert w.bridge.store.has_revision(w.digest)
    assert lease_holder(volume_dirname("csi-a1", str(a))) in {l.holder for l in w.bridge.store.leases()}

    # B copies the digest. A source that answers D's name with other bytes: refused.
    e = refused(w, "team-b", w.servers["b-bogus"].url, "b1")
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e.details()
    assert "team-b" in e.details() and w.servers["b-bogus"].url in e.details()
    assert "integrity mismatch" in e.details()
    # A source that does not hold D at all: refused.
    empty = w.servers["b-real"].server.url + "/nothing-here"
    e = refused(w, "team-b", empty, "b2")
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "did not serve" in e.details()
    # B's own source that really serves D: mounted, from the shared store (one inode).
    b = publish(w, "team-b", w.servers["b-real"].url, "b3")
    assert (b / "current" / "graph.onnx").read_bytes() == FILES["graph.onnx"]
    assert (b / "current" / "w.safetensors").stat().st_ino == (a / "current" / "w.safetensors").stat().st_ino
    # A namespace the policy does not let mount D at all: refused before any proof.
    e = refused(w, "team-c", w.servers["a"].url, "c1")
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e.details()
    # each refusal is counted by why (the alert ResidentUnauthorizedMount reads this)
    count = w.bridge.metrics.registry.get_sample_value
    assert count("resident_unauthorized_mounts_total", {"reason": "possession"}) == 2
    assert count("resident_unauthorized_mounts_total", {"reason": "namespace"}) == 1


def test_proofs_survive_a_restart_and_are_no_bypass(world):
    w = world
    publish(w, "team-a", w.servers["a"].url, "a1")
    w.bridge.stop()
    w.servers["a"].stop()           # A's source goes away while the bridge is down
    w.start()
    assert w.bridge.state.proven("team-a", w.servers["a"].url, w.digest)
    # A's proof is remembered: a new Pod of A mounts from the store without the source.
    a2 = publish(w, "team-a", w.servers["a"].url, "a2")
    assert (a2 / "current" / "graph.onnx").read_bytes() == FILES["graph.onnx"]
    # It proves nothing for B, even naming the very same source: refused, said why.
    e = refused(w, "team-b", w.servers["a"].url, "b1")
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "did not serve" in e.details() and "team-b" in e.details()
    assert not w.bridge.state.proven("team-b", w.servers["a"].url, w.digest)


def test_a_source_that_does_not_serve_an_uncached_digest_fails_as_a_fetch(world):
    """With nothing in the store the proof is the fetch's first step and fails like one."""
    w = world
    e = refused(w, "team-b", w.servers["b-bogus"].url, "b1")
    assert e.code() == grpc.StatusCode.DATA_LOSS and "integrity mismatch" in e.details()
    assert not w.bridge.store.has_revision(w.digest)


def test_node_copies_of_the_bundle_are_no_source(world):
    """file:// names a node path as the bridge sees it: its own store and other Pods'
    volumes hold the manifest of every bundle on the node, so they prove nothing."""
    w = world
    a = publish(w, "team-a", w.servers["a"].url, "a1")
    for node_copy in (w.bridge.store.revision_path(w.digest), a / "current"):
        e = refused(w, "team-b", f"file://{node_copy}", "b1")
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e.details()
        assert "holds every namespace's bundles" in e.details()
    assert not w.bridge.state.proven("team-b", f"file://{a / 'current'}", w.digest)
