"""The bridge against a real kube-apiserver: namespace authorization from ResidentModels,
and BundleDeliveries staged into a live, read-only published volume.

There is no kubelet here, so the test plays the node's kubelet itself: it calls the
bridge's CSI socket the way kubelet would for an inline volume of a real Pod object
(created in the API, never scheduled: its UID is what matters to the bridge). The bridge
authenticates as the chart's bridge ServiceAccount (tests/cluster/chart_accounts.py), so
it has exactly the chart's RBAC; the test acts as admin.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import pytest
from kubernetes import client
from kubernetes.config import new_client_from_config

from bundle.manifest import MANIFEST_NAME
from bundle.scan import read_manifest
from csi_bridge import mountinfo
from csi_bridge.deliveries import FINALIZER
from csi_bridge.server import Bridge, BridgeConfig
from testkit import crash_points
from testkit.bridge import BridgeProcess, CsiClient, cleanup_mounts, make_bundle, publish_request
from polling import wait_for

G, V = "resident.dev", "v1alpha1"
WEIGHTS = os.urandom(512 * 1024)
V1 = {"w.safetensors": WEIGHTS, "graph.onnx": b"graph-one" * 200, "config.json": b'{"v": 1}'}
V2 = {"w.safetensors": WEIGHTS, "graph.onnx": b"graph-two" * 300, "config.json": b'{"v": 1}'}


@pytest.fixture
def world(cluster, namespace, chart_accounts):
    tmp = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))  # short: unix socket paths
    api = cluster.api_client()
    bridge_kubeconfig = chart_accounts.bridge
    bridge_api = new_client_from_config(config_file=bridge_kubeconfig)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    d1, d2 = make_bundle(tmp / "v1", V1), make_bundle(tmp / "v2", V2)
    custom.create_namespaced_custom_object(G, V, namespace, "residentmodels", {
        "apiVersion": f"{G}/{V}", "kind": "ResidentModel", "metadata": {"name": "m"},
        "spec": {"bundle": {"source": f"file://{tmp}/v1", "digest": d1}}})
    pod = core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="owner-0"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")])))
    target = tmp / "kubelet" / "pods" / pod.metadata.uid / "mount"
    target.parent.mkdir(parents=True)
    try:
        yield type("World", (), dict(tmp=tmp, api=api, custom=custom, core=core, ns=namespace,
                                     d1=d1, d2=d2, pod=pod, target=target, cluster=cluster,
                                     bridge_api=bridge_api, bridge_kubeconfig=bridge_kubeconfig))
    finally:
        cleanup_mounts(tmp)
        assert mountinfo.mounts_under(tmp) == []
        shutil.rmtree(tmp, ignore_errors=True)


def in_process_bridge(w, **config) -> Bridge:
    """The bridge in this process, authenticated as the chart's bridge ServiceAccount."""
    return Bridge(BridgeConfig(endpoint=f"unix://{w.tmp}/csi.sock", node_id="node-a",
                               root=w.tmp / "data", authorize="api", api_client=w.bridge_api,
                               private_metrics=True, **config)).start()


def publish_req(w, ns=None, volume="csi-1", target=None):
    return publish_request(volume, target or w.target, w.d1, f"file://{w.tmp}/v1",
                           namespace=ns or w.ns, pod="owner-0", pod_uid=w.pod.metadata.uid, model="m")


def delivery(w, name="d1", path="GraphOnly", source=None, digest=None, **spec):
    """A BundleDelivery of v2 (or ``digest`` from ``source``), after the model moved to it as
    the operator does it: spec.bundle is the target, status.identity.bundle still the
    published revision."""
    source, digest = source or f"file://{w.tmp}/v2", digest or w.d2
    w.custom.patch_namespaced_custom_object(G, V, w.ns, "residentmodels", "m", {
        "spec": {"bundle": {"source": source, "digest": digest}}})
    w.custom.patch_namespaced_custom_object_status(G, V, w.ns, "residentmodels", "m", {
        "status": {"identity": {"bundle": w.d1}}})
    return w.custom.create_namespaced_custom_object(G, V, w.ns, "bundledeliveries", {
        "apiVersion": f"{G}/{V}", "kind": "BundleDelivery", "metadata": {"name": name},
        "spec": {"nodeName": "node-a", "podName": "owner-0", "podUID": w.pod.metadata.uid,
                 "model": "m", "bundle": {"source": source, "digest": digest},
                 "path": path, **spec}})


def get_delivery(w, name="d1"):
    try:
        return w.custom.get_namespaced_custom_object(G, V, w.ns, "bundledeliveries", name)
    except client.exceptions.ApiException as e:
        if e.status == 404:
            return None
        raise


def staged(w, name="d1"):
    obj = get_delivery(w, name)
    return obj if obj and (obj.get("status") or {}).get("phase") in ("Staged", "Failed") else None


def expected_bytes(old: dict, new: dict) -> tuple[int, int]:
    """(fetched, reused) for a graph-only delivery: unchanged files reused, the rest fetched."""
    fetched = sum(len(v) for k, v in new.items() if old.get(k) != v)
    return fetched, sum(len(v) for v in new.values()) - fetched


def test_namespace_authorization_reads_resident_models(world):
    w = world
    other = f"t-{uuid.uuid4().hex[:10]}"
    w.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    bridge = in_process_bridge(w)
    try:
        with CsiClient(w.tmp / "csi.sock") as c:
            # Same digest, same model name, but from another namespace: refused.
            t2 = w.tmp / "kubelet" / "other" / "mount"
            t2.parent.mkdir(parents=True)
            with pytest.raises(grpc.RpcError) as e:
                c.node.NodePublishVolume(publish_req(w, ns=other, volume="csi-x", target=t2))
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert other in e.value.details()
            assert not t2.exists()
            # A digest the model does not declare: refused, even in the right namespace.
            req = publish_req(w)
            req.volume_context["digest"] = w.d2
            with pytest.raises(grpc.RpcError) as e:
                c.node.NodePublishVolume(req)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            # The declared bundle in the model's own namespace: published.
            c.node.NodePublishVolume(publish_req(w))
            assert (w.target / "current" / "graph.onnx").read_bytes() == V1["graph.onnx"]
    finally:
        bridge.stop()
        w.core.delete_namespace(other)


def test_bundle_delivery_is_staged_with_correct_bytes_and_released_on_delete(world):
    w = world
    bridge = in_process_bridge(w, deliveries=True)
    try:
        with CsiClient(w.tmp / "csi.sock") as c:
            c.node.NodePublishVolume(publish_req(w))
        created = delivery(w)
        obj = wait_for(lambda: staged(w), what="Staged")
        st = obj["status"]
        assert st["phase"] == "Staged", st
        assert st["verified"] is True and st["observedGeneration"] == created["metadata"]["generation"]
        assert st["method"] == "graph-only"
        fetched, reused = expected_bytes(V1, V2)
        assert (st["bytes"]["fetched"], st["bytes"]["reused"]) == (fetched, reused), st["bytes"]
        assert st["bytes"]["written"] == fetched
        assert st["revisionPath"] == "revisions/" + w.d2.replace(":", "-")
        assert st["durationSeconds"] > 0
        assert FINALIZER in obj["metadata"]["finalizers"]
        # The new revision is live in the Pod's read-only mount, the old one still there.
        assert os.readlink(w.target / "current") == st["revisionPath"]
        for rel, data in V2.items():
            assert (w.target / "current" / rel).read_bytes() == data
        assert (w.target / "revisions" / w.d1.replace(":", "-") / "graph.onnx").read_bytes() == V1["graph.onnx"]
        assert read_manifest(w.target / "current").digest == w.d2
        assert mountinfo.mount_at(w.target).read_only
        holders = {l.holder: l.digest for l in bridge.store.leases()}
        assert holders[f"delivery:{created['metadata']['uid']}"] == w.d2
        # The Event is posted after the status write, so it may trail it a little.
        wait_for(lambda: any(e.reason == "DeliveryStaged" and e.involved_object.uid == created["metadata"]["uid"]
                             and e.source.component == "resident-bridge"
                             for e in w.core.list_namespaced_event(w.ns).items),
                 what="a DeliveryStaged Event from resident-bridge")

        # A spec change (new generation) is staged again and moves the delivery's lease.
        w.custom.patch_namespaced_custom_object(G, V, w.ns, "bundledeliveries", "d1", {"spec": {
            "bundle": {"source": f"file://{w.tmp}/v1", "digest": w.d1}, "path": "WholeBundle"}})
        obj = wait_for(lambda: (lambda o: o if o["status"].get("observedGeneration") == 2
                                and o["status"]["phase"] == "Staged" else None)(get_delivery(w)),
                       what="generation 2 Staged")
        assert obj["status"]["bytes"]["fetched"] == 0  # v1 is already on the node
        assert os.readlink(w.target / "current") == "revisions/" + w.d1.replace(":", "-")
        holders = {l.holder: l.digest for l in bridge.store.leases()}
        assert holders[f"delivery:{created['metadata']['uid']}"] == w.d1

        w.custom.delete_namespaced_custom_object(G, V, w.ns, "bundledeliveries", "d1")
        wait_for(lambda: get_delivery(w) is None, what="delivery deleted after finalizer removal")
        holders = {l.holder for l in bridge.store.leases()}
        assert f"delivery:{created['metadata']['uid']}" not in holders and len(holders) == 1
        assert bridge.state.delivery(created["metadata"]["uid"]) is None
        wait_for(lambda: any(e.reason == "LeaseReleased" for e in w.core.list_namespaced_event(w.ns).items),
                 what="a LeaseReleased Event")
    finally:
        bridge.stop()


def test_delivery_for_an_unpublished_pod_stays_pending(world):
    w = world
    bridge = in_process_bridge(w, deliveries=True)
    try:
        delivery(w)
        obj = wait_for(lambda: (lambda o: o if (o.get("status") or {}).get("phase") else None)(get_delivery(w)),
                       what="a phase")
        assert obj["status"]["phase"] == "Pending" and obj["status"]["reason"] == "VolumeNotReady"
        with CsiClient(w.tmp / "csi.sock") as c:  # the volume appears: the resync stages it
            c.node.NodePublishVolume(publish_req(w))
        assert wait_for(lambda: staged(w), what="Staged")["status"]["phase"] == "Staged"
        w.custom.delete_namespaced_custom_object(G, V, w.ns, "bundledeliveries", "d1")
        wait_for(lambda: get_delivery(w) is None, what="delivery deleted")
    finally:
        bridge.stop()


def test_kill_mid_stage_then_restart_finishes_without_partial_tree(world):
    w = world
    bridge = BridgeProcess(w.tmp / "b", authorize="api",
                           extra_args=("--deliveries", "--kubeconfig", w.bridge_kubeconfig))
    try:
        bridge.start(crash_at="stage:after-link")
        with CsiClient(bridge.socket) as c:
            c.node.NodePublishVolume(publish_req(w))
        created = delivery(w)
        assert bridge.wait_exit(60) == crash_points.EXIT_CODE
        vol = w.target
        assert os.readlink(vol / "current") == "revisions/" + w.d1.replace(":", "-")  # not moved
        staged_dir = vol / "revisions" / w.d2.replace(":", "-")
        assert sorted(p.name for p in staged_dir.iterdir()) == sorted([MANIFEST_NAME, *V2])  # whole
        db = sqlite3.connect(bridge.root / "data" / "store" / "store.db")
        holders = dict(db.execute("SELECT holder, digest FROM leases"))
        db.close()
        assert holders[f"delivery:{created['metadata']['uid']}"] == w.d2  # lease kept

        bridge.start()
        obj = wait_for(lambda: staged(w), what="Staged after restart")
        assert obj["status"]["phase"] == "Staged" and obj["status"]["verified"] is True
        assert os.readlink(vol / "current") == "revisions/" + w.d2.replace(":", "-")
        assert (vol / "current" / "graph.onnx").read_bytes() == V2["graph.onnx"]
        assert len(mountinfo.mounts_under(w.target)) == 1
        w.custom.delete_namespaced_custom_object(G, V, w.ns, "bundledeliveries", "d1")
        wait_for(lambda: get_delivery(w) is None, what="delivery deleted")
    finally:
        bridge.stop()


def test_half_publish_of_a_deleted_pod_is_released_and_a_live_pods_is_kept(world):
    w = world
    pod_b = w.core.create_namespaced_pod(w.ns, client.V1Pod(
        metadata=client.V1ObjectMeta(name="owner-1"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")])))
    t_b = w.tmp / "kubelet" / "pods" / pod_b.metadata.uid / "mount"
    t_b.parent.mkdir(parents=True)
    req_b = publish_request("csi-b", t_b, w.d1, f"file://{w.tmp}/v1", namespace=w.ns,
                            pod="owner-1", pod_uid=pod_b.metadata.uid, model="m")
    bridge = BridgeProcess(w.tmp / "b", authorize="api",
                           extra_args=("--kubeconfig", w.bridge_kubeconfig))
    lease_db = bridge.root / "data" / "store" / "store.db"

    def holders():
        db = sqlite3.connect(lease_db)
        try:
            return {h for (h,) in db.execute("SELECT holder FROM leases WHERE holder LIKE 'volume:%'")}
        finally:
            db.close()
    try:
        for req in (publish_req(w), req_b):  # both publishes die after building the volume
            bridge.start(crash_at="publish:after-volume")
            with CsiClient(bridge.socket) as c:
                with pytest.raises(grpc.RpcError):
                    c.node.NodePublishVolume(req)
            assert bridge.wait_exit() == crash_points.EXIT_CODE
        assert len(holders()) == 2
        w.core.delete_namespaced_pod("owner-0", w.ns, grace_period_seconds=0)
        wait_for(lambda: not [p for p in w.core.list_namespaced_pod(w.ns).items
                              if p.metadata.name == "owner-0"], what="pod deleted")
        bridge.args += ["--orphan-grace", "0"]
        bridge.start()
        wait_for(lambda: len(holders()) == 1, what="the deleted Pod's lease released")
        assert not w.target.exists() and mountinfo.mounts_under(w.tmp) == []
        with CsiClient(bridge.socket) as c:  # the live Pod's retry still completes
            c.node.NodePublishVolume(req_b)
        assert (t_b / "current" / "graph.onnx").read_bytes() == V1["graph.onnx"]
        assert len(holders()) == 1
    finally:
        bridge.stop()


def test_a_failed_delivery_is_retried_with_backoff_until_the_source_returns(world):
    import threading

    from bundle.sources import RetryPolicy, open_source, push
    from bundle.sources.httpserve import BundleServer
    from csi_bridge.deliveries import DeliveryWatcher
    from csi_bridge.retries import Backoff
    from localcluster.processes import free_port

    w = world
    port = free_port()
    source = f"http://127.0.0.1:{port}/models/m"

    def serve():
        srv = BundleServer(w.tmp / "srv", port=port)
        thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        return srv, thread

    def stop(srv, thread):
        srv.shutdown()
        srv.server_close()
        thread.join(5)

    srv = serve()
    push(w.tmp / "v2", source)        # the server holds v2, then goes down
    stop(*srv)
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{w.tmp}/csi.sock", node_id="node-a",
                                 root=w.tmp / "data", authorize="api", api_client=w.bridge_api,
                                 private_metrics=True)).start()
    bridge.publisher.open_source = lambda uri, **kw: open_source(uri, RetryPolicy(attempts=2, backoff_seconds=0.01), **kw)
    watcher = DeliveryWatcher(bridge, w.bridge_api, resync_seconds=1.0, backoff=Backoff(1.0, 2.0))
    srv = None
    try:
        with CsiClient(w.tmp / "csi.sock") as c:
            c.node.NodePublishVolume(publish_req(w))
        watcher.start()
        delivery(w, source=source)
        failed = wait_for(lambda: (lambda o: o if (o.get("status") or {}).get("attempts", 0) >= 2
                                   and o["status"]["phase"] == "Failed" else None)(get_delivery(w)),
                          what="a second failed attempt")
        st = failed["status"]
        assert st["reason"] == "SourceUnavailable" and "Connection refused" in st["message"]
        assert st["nextAttemptTime"] and "retrying at" in st["message"]
        assert os.readlink(w.target / "current") == "revisions/" + w.d1.replace(":", "-")  # kept
        srv = serve()                                   # the source returns
        obj = wait_for(lambda: (lambda o: o if o["status"]["phase"] == "Staged" else None)(get_delivery(w)),
                       what="Staged after the source returned")
        assert obj["status"]["attempts"] > st["attempts"] and "nextAttemptTime" not in obj["status"]
        assert obj["status"]["verified"] is True
        assert (w.target / "current" / "graph.onnx").read_bytes() == V2["graph.onnx"]
        def events() -> set[str]:
            return {e.reason for e in w.core.list_namespaced_event(w.ns).items if e.involved_object.name == "d1"}
        wait_for(lambda: {"DeliveryFailed", "DeliveryStaged"} <= events(),
                 what="DeliveryFailed and DeliveryStaged Events")
        w.custom.delete_namespaced_custom_object(G, V, w.ns, "bundledeliveries", "d1")
        wait_for(lambda: get_delivery(w) is None, what="delivery deleted")
    finally:
        watcher.stop()
        bridge.stop()
        if srv is not None:
            stop(*srv)


def test_a_delivery_whose_spec_cannot_be_staged_is_not_retried(world):
    w = world
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{w.tmp}/csi.sock", node_id="node-a",
                                 root=w.tmp / "data", authorize="api", api_client=w.bridge_api,
                                 deliveries=True, private_metrics=True,
                                 delivery_retry_seconds=0.2)).start()
    try:
        with CsiClient(w.tmp / "csi.sock") as c:
            c.node.NodePublishVolume(publish_req(w))
        delivery(w, donor="sha256:" + "0" * 64)           # a donor the node lacks
        st = wait_for(lambda: staged(w), what="Failed")["status"]
        assert (st["phase"], st["reason"], st["attempts"]) == ("Failed", "PlanRefused", 1)
        assert "nextAttemptTime" not in st and "not retried" in st["message"]
        time.sleep(6)                                   # longer than a re-list and the backoff
        assert get_delivery(w)["status"]["attempts"] == 1
    finally:
        bridge.stop()


def test_a_delivery_the_store_has_no_room_for_fails_with_the_cause_and_keeps_the_volume(world):
    from bundle.loopfs import loop_filesystem

    w = world
    big = make_bundle(w.tmp / "big", {"w.safetensors": os.urandom(12 << 20), "graph.onnx": b"big"})
    with loop_filesystem("ext4", 8 << 20) as mnt:
        bridge = Bridge(BridgeConfig(endpoint=f"unix://{w.tmp}/csi.sock", node_id="node-a",
                                     root=mnt / "data", authorize="api", api_client=w.bridge_api,
                                     deliveries=True, private_metrics=True)).start()
        try:
            with CsiClient(w.tmp / "csi.sock") as c:
                c.node.NodePublishVolume(publish_req(w))
            delivery(w, path="WholeBundle", source=f"file://{w.tmp}/big", digest=big)
            st = wait_for(lambda: staged(w), what="Failed")["status"]
            assert (st["phase"], st["reason"]) == ("Failed", "StoreFull")
            assert f"no space in the node store for {big} ({(12 << 20) + 3} bytes)" in st["message"]
            assert st["nextAttemptTime"]                       # GC or a larger disk may help later
            assert bridge.store.revisions() == [w.d1]          # nothing lost, nothing partial
            assert os.readlink(w.target / "current") == "revisions/" + w.d1.replace(":", "-")
            assert (w.target / "current" / "graph.onnx").read_bytes() == V1["graph.onnx"]
            w.custom.delete_namespaced_custom_object(G, V, w.ns, "bundledeliveries", "d1")
            wait_for(lambda: get_delivery(w) is None, what="delivery deleted")
        finally:
            bridge.stop()
            cleanup_mounts(w.tmp)


def other_namespace(w) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    w.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def create_model(w, ns: str, digest: str, source: str, name: str = "m") -> None:
    w.custom.create_namespaced_custom_object(G, V, ns, "residentmodels", {
        "apiVersion": f"{G}/{V}", "kind": "ResidentModel", "metadata": {"name": name},
        "spec": {"bundle": {"source": source, "digest": digest}}})


def test_a_copied_digest_with_a_bogus_source_is_refused(world):
    """Tenant B declares tenant A's digest in its own ResidentModel: authorization passes,
    but B's source does not serve the bundle, so the node's copy is not B's to mount."""
    w = world
    other = other_namespace(w)
    bridge = in_process_bridge(w)
    try:
        with CsiClient(w.tmp / "csi.sock") as c:
            c.node.NodePublishVolume(publish_req(w))   # A's model, A's source: the store holds d1
            bogus = f"file://{w.tmp}/nothing-here"
            create_model(w, other, w.d1, bogus)
            t2 = w.tmp / "kubelet" / "other" / "mount"
            t2.parent.mkdir(parents=True)
            req = publish_request("csi-x", t2, w.d1, bogus, namespace=other, pod="owner-0",
                                  pod_uid="uid-x", model="m")
            with pytest.raises(grpc.RpcError) as e:
                c.node.NodePublishVolume(req)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert other in e.value.details() and "did not serve" in e.value.details()
            assert not t2.exists() and len(bridge.store.leases()) == 1
    finally:
        bridge.stop()
        w.core.delete_namespace(other)


def test_deliveries_across_namespaces_or_for_undeclared_revisions_are_refused(world):
    w = world
    other = other_namespace(w)
    create_model(w, other, w.d2, f"file://{w.tmp}/v2")   # B declares d2: only the namespace is wrong
    bridge = in_process_bridge(w, deliveries=True)
    try:
        with CsiClient(w.tmp / "csi.sock") as c:
            c.node.NodePublishVolume(publish_req(w))
        cases = [(other, "NamespaceMismatch"), (w.ns, "NotAuthorized")]  # A's model declares d1 only
        for ns, reason in cases:
            w.custom.create_namespaced_custom_object(G, V, ns, "bundledeliveries", {
                "apiVersion": f"{G}/{V}", "kind": "BundleDelivery", "metadata": {"name": "d1"},
                "spec": {"nodeName": "node-a", "podName": "owner-0", "podUID": w.pod.metadata.uid,
                         "model": "m", "bundle": {"source": f"file://{w.tmp}/v2", "digest": w.d2},
                         "path": "GraphOnly"}})

            def answered():
                obj = w.custom.get_namespaced_custom_object(G, V, ns, "bundledeliveries", "d1")
                return obj if (obj.get("status") or {}).get("phase") == "Failed" else None
            obj = wait_for(answered, what=f"{reason} in {ns}")
            assert obj["status"]["reason"] == reason, obj["status"]
            uid = obj["metadata"]["uid"]
            assert f"delivery:{uid}" not in {l.holder for l in bridge.store.leases()}
            assert os.readlink(w.target / "current") == "revisions/" + w.d1.replace(":", "-")
            assert not bridge.store.has_revision(w.d2)
            wait_for(lambda: any(e.reason == "DeliveryFailed" and e.involved_object.uid == uid
                                 for e in w.core.list_namespaced_event(ns).items),
                     what=f"a DeliveryFailed Event in {ns}")
            w.custom.delete_namespaced_custom_object(G, V, ns, "bundledeliveries", "d1")
            wait_for(lambda: not [d for d in w.custom.list_namespaced_custom_object(
                G, V, ns, "bundledeliveries")["items"]], what="the refused delivery deleted")
    finally:
        bridge.stop()
        w.core.delete_namespace(other)


def test_sweep_needs_get_on_pods_and_a_403_keeps_the_lease(world, caplog):
    """Without the chart's grant the sweep cannot tell a gone Pod from a present one: it
    logs an error and keeps the lease. With the chart's bridge account it releases it."""
    from csi_bridge.sweep import OrphanSweeper
    from chart_accounts import service_account_token

    w = world
    w.core.create_namespaced_service_account(w.ns, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="no-grants")))
    nobody = w.tmp / "nobody.kubeconfig"
    w.cluster.write_kubeconfig(str(nobody), service_account_token(w.core, w.ns, "no-grants"), "nobody")
    bridge = Bridge(BridgeConfig(endpoint=f"unix://{w.tmp}/csi.sock", node_id="node-a",
                                 root=w.tmp / "data", authorize="allow-any", private_metrics=True)).start()
    try:
        with CsiClient(w.tmp / "csi.sock") as c:
            c.node.NodePublishVolume(publish_req(w))
        # As after a crash mid-publish: the record is rolled back to publishing, lease kept.
        bridge.state.set_publication_state(str(w.target), "publishing")
        w.core.delete_namespaced_pod("owner-0", w.ns, grace_period_seconds=0)
        wait_for(lambda: not w.core.list_namespaced_pod(w.ns).items, what="the Pod deleted")
        args = (bridge.publisher, bridge.state, bridge.locks)
        with caplog.at_level("ERROR", logger="resident.bridge.sweep"):
            assert OrphanSweeper(*args, new_client_from_config(config_file=str(nobody)),
                                 grace_seconds=0).sweep() == []
        logged = [r for r in caplog.records if r.levelname == "ERROR"]
        assert logged and "403" in logged[0].error and "'get' on pods" in logged[0].error
        assert len(bridge.store.leases()) == 1 and mountinfo.mount_at(w.target) is not None
        assert OrphanSweeper(*args, w.bridge_api, grace_seconds=0).sweep() == [str(w.target)]
        assert bridge.store.leases() == [] and not w.target.exists()
    finally:
        bridge.stop()
