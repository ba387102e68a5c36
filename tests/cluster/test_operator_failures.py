"""Failures the user must see, against a real kube-apiserver with the real operator (kopf).

- First placement reads spec.bundle's manifest from its source before creating anything:
  a missing source, a wrong digest and a source that is down make the model
  ``Degraded`` (SourceUnavailable / DigestMismatch) with the source's own error and a
  Warning Event within 10 s (a server that never answers too), and a source that comes
  back is picked up by itself.
- A mount that fails at first placement (the source holds the manifest, but a file of it
  answers HTTP 404 to the real bridge) makes the model ``Degraded`` (DeliveryFailed) and
  ``Delivered=False`` (MountFailed) with the bridge's message, read from kubelet's
  FailedMount Event on the owner Pod, and the model recovers when the file is back. A node
  store too small for the bundle is reported the same way, with the sizes.
- A transition whose new source is down says so (``Degraded`` SourceUnavailable), starts
  nothing, waits on the source's probe (the same backoff) and starts by itself when the
  source is back.
- A child the API server refuses (a ResourceQuota of zero Services) makes the model
  ``Degraded`` (ReconcileFailed) with the API server's message, until the quota goes.
- Deletion always finishes: with the real bridge stopped, a BundleDelivery it never
  releases loses the bridge's finalizer after the grace period
  (``RESIDENT_DELETE_GRACE_SECONDS``), with a Warning naming the delivery, its revision
  and its node.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from bundle.cpu_model import make_demo
from bundle.loopfs import loop_filesystem
from bundle.sources import push
from bundle.sources.httpserve import BundleServer
from localcluster.processes import free_port
from resident_operator.metrics import REGISTRY

from conftest_operator import LEASE_FINALIZER, Api, PlayedNode, condition, running_operator
from polling import wait_for
from test_operator_transitions import ready_on


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("failures")
    one = make_demo(root / "one", 256 * 1024, seed=11).digest
    two = make_demo(root / "two", 256 * 1024, seed=12).digest
    return root, {"one": one, "two": two}


class Served:
    """A real bundle server (http layout) on 127.0.0.1 that a test can stop and start again."""

    def __init__(self, root, port: int) -> None:
        self.root, self.port, self.server = root, port, None

    def start(self) -> "Served":
        self.server = BundleServer(self.root, "127.0.0.1", self.port)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def degraded(api: Api, name: str, reason: str):
    cond = condition(api.model(name), "Degraded")
    return cond.get("status") == "True" and cond.get("reason") == reason and cond


def nothing_created(api: Api, name: str) -> None:
    assert api.pods(f"resident.dev/model={name}") == []
    assert api.core.list_namespaced_secret(api.ns, label_selector=f"resident.dev/model={name}").items == []
    assert not (api.model(name).get("status") or {}).get("children")


def blocked_passes() -> float:
    return REGISTRY.get_sample_value("resident_operator_reconciles_total", {"result": "blocked"}) or 0.0


def test_missing_source_degrades_at_once_and_creates_nothing(cluster, namespace, bundles, tmp_path):
    root, d = bundles
    api = Api(cluster, namespace)
    missing = tmp_path / "not-here"
    with running_operator(namespace):
        t0 = time.monotonic()
        api.create_model("lm", {"bundle": {"source": f"file://{missing}", "digest": d["one"]}})
        cond = wait_for(lambda: degraded(api, "lm", "SourceUnavailable"), timeout=10,
                        what="Degraded/SourceUnavailable")
        assert time.monotonic() - t0 < 10
        assert str(missing) in cond["message"] and d["one"] in cond["message"]
        assert api.model("lm")["status"]["phase"] == "Degraded"
        event = wait_for(lambda: [e for e in api.events("lm") if e.reason == "SourceUnavailable"],
                         timeout=10, what="a SourceUnavailable Event")[0]
        assert event.type == "Warning" and str(missing) in event.message
        nothing_created(api, "lm")


def test_a_source_that_never_answers_is_reported_within_ten_seconds(cluster, namespace, bundles):
    root, d = bundles
    api = Api(cluster, namespace)
    with socket.socket() as silent:               # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/models/one"
        with running_operator(namespace):
            t0 = time.monotonic()
            api.create_model("lm", {"bundle": {"source": url, "digest": d["one"]}})
            cond = wait_for(lambda: degraded(api, "lm", "SourceUnavailable"), timeout=10,
                            what="Degraded/SourceUnavailable")
            assert time.monotonic() - t0 < 10 and "timed out" in cond["message"].lower()
            nothing_created(api, "lm")


def test_wrong_digest_is_a_digest_mismatch_until_the_spec_is_fixed(cluster, namespace, bundles):
    root, d = bundles
    api = Api(cluster, namespace)
    source = f"file://{root / 'one'}"
    with running_operator(namespace):
        api.create_model("lm", {"bundle": {"source": source, "digest": d["two"]}})
        cond = wait_for(lambda: degraded(api, "lm", "DigestMismatch"), timeout=10,
                        what="Degraded/DigestMismatch")
        assert "integrity mismatch" in cond["message"] and d["two"] in cond["message"]
        event = wait_for(lambda: [e for e in api.events("lm") if e.reason == "DigestMismatch"],
                         timeout=10, what="a DigestMismatch Event")[0]
        assert event.type == "Warning"
        nothing_created(api, "lm")
        api.patch_spec("lm", {"bundle": {"source": source, "digest": d["one"]}})
        wait_for(lambda: api.pods("resident.dev/model=lm"), timeout=10, what="an owner Pod after the fix")
        m = wait_for(lambda: condition(api.model("lm"), "Degraded").get("status") == "False"
                     and api.model("lm"), timeout=10, what="Degraded=False")
        assert m["status"]["bundle"] == {"source": source, "digest": d["one"]}


def test_a_source_that_comes_back_is_picked_up_with_backoff(cluster, namespace, bundles, tmp_path):
    root, d = bundles
    api = Api(cluster, namespace)
    served = Served(tmp_path / "served", free_port()).start()
    url = f"http://127.0.0.1:{served.port}/models/one"
    push(root / "one", url)
    served.stop()                                    # the source is down: connection refused
    try:
        with running_operator(namespace):
            before, probed = blocked_passes(), probes_down()
            api.create_model("lm", {"bundle": {"source": url, "digest": d["one"]}})
            cond = wait_for(lambda: degraded(api, "lm", "SourceUnavailable"), timeout=10,
                            what="Degraded/SourceUnavailable")
            assert f"127.0.0.1:{served.port}" in cond["message"]
            nothing_created(api, "lm")
            time.sleep(12)
            # the model read it once and waits on the source's probe, which backs off (about
            # 2, 6 s after the failure, then 14 s), not in a loop
            assert 1 <= blocked_passes() - before <= 2, blocked_passes() - before
            assert 1 <= probes_down() - probed <= 3, probes_down() - probed
            served.start()
            pod = wait_for(lambda: api.pods("resident.dev/model=lm"), timeout=25,
                           what="the owner Pod once the source is back")[0]
            assert next(v.csi for v in pod.spec.volumes if v.csi).volume_attributes["source"] == url
            wait_for(lambda: condition(api.model("lm"), "Degraded").get("status") == "False",
                     timeout=10, what="Degraded=False")
            wait_for(lambda: "Recovered" in api.reasons("lm"), timeout=10, what="a Recovered Event")
    finally:
        served.stop()


def probes_down() -> float:
    return REGISTRY.get_sample_value("resident_operator_source_probes_total", {"result": "down"}) or 0.0


def passes(result: str) -> float:
    return REGISTRY.get_sample_value("resident_operator_reconciles_total", {"result": result}) or 0.0


def mount_wakes() -> float:
    return REGISTRY.get_sample_value("resident_operator_wakes_total", {"cause": "mount"}) or 0.0


def cached_pod_reads() -> float:
    return REGISTRY.get_sample_value("resident_operator_child_reads_total",
                                     {"kind": "Pod", "source": "cache"}) or 0.0


def test_a_child_the_api_server_refuses_degrades_the_model_with_its_message(cluster, namespace, bundles):
    """A ResourceQuota of zero Services: every pass fails creating the model's Service. The
    model says so with the API server's words, and recovers when the quota goes."""
    root, d = bundles
    api = Api(cluster, namespace)
    api.core.create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "no-services"}, "spec": {"hard": {"services": "0"}}})
    wait_for(lambda: (api.core.read_namespaced_resource_quota("no-services", namespace).status.hard or {}),
             what="the quota controller to fill the quota's status")
    with running_operator(namespace):
        api.create_model("lm", {"bundle": {"source": f"file://{root / 'one'}", "digest": d["one"]}})
        cond = wait_for(lambda: degraded(api, "lm", "ReconcileFailed"), timeout=15,
                        what="Degraded/ReconcileFailed")
        assert "403" in cond["message"] and "exceeded quota: no-services" in cond["message"], cond
        assert api.model("lm")["status"]["phase"] == "Degraded"
        wait_for(lambda: [e for e in api.events("lm") if e.reason == "ReconcileFailed"], timeout=10,
                 what="a ReconcileFailed Event")
        api.core.delete_namespaced_resource_quota("no-services", namespace)
        wait_for(lambda: condition(api.model("lm"), "Degraded").get("status") == "False", timeout=30,
                 what="Degraded=False once the quota is gone")
        assert api.core.read_namespaced_service("lm", namespace).metadata.name == "lm"


def test_a_node_store_too_small_for_the_bundle_degrades_the_model_with_the_sizes(cluster, namespace, tmp_path):
    """The real bridge's store is an 8 MiB filesystem and the bundle 12 MiB: the publish
    answers RESOURCE_EXHAUSTED, and the model says so (``Degraded`` DeliveryFailed)."""
    big = make_demo(tmp_path / "big", 12 << 20, seed=13).digest
    api = Api(cluster, namespace)
    with loop_filesystem("ext4", 8 << 20) as mnt, \
            PlayedNode(cluster, namespace, tmp_path, real_bridge=True, store=mnt / "data") as node, \
            running_operator(namespace):
        api.create_model("lm", {"bundle": {"source": f"file://{tmp_path / 'big'}", "digest": big},
                                "runtime": {"port": free_port()}})
        cond = wait_for(lambda: degraded(api, "lm", "DeliveryFailed"), timeout=30,
                        what="Degraded/DeliveryFailed")
        assert f"no space in the node store for {big}" in cond["message"], cond["message"]
        mounts = wait_for(lambda: [m for _, _, reason, m in api.all_events() if reason == "FailedMount"],
                          what="the played kubelet's FailedMount")
        assert "code = ResourceExhausted" in mounts[0]
        assert condition(api.model("lm"), "Delivered")["reason"] == "MountFailed"
        api.delete_model("lm")
        wait_for(lambda: api.model("lm") is None, timeout=45, what="the model gone")
        assert not node.errors, node.errors[-1]


def test_a_transition_whose_source_is_down_says_so_and_starts_when_it_is_back(
        cluster, namespace, bundles, tmp_path):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    served = Served(tmp_path / "served", free_port()).start()
    url = f"http://127.0.0.1:{served.port}/models/two"
    push(root / "two", url)
    served.stop()                                   # the new revision's source is down
    try:
        with PlayedNode(cluster, namespace, tmp_path, real_bridge=True) as node, running_operator(namespace):
            api.create_model("lm", {"bundle": {"source": f"file://{root / 'one'}", "digest": d["one"]},
                                    "runtime": {"port": port}})
            wait_for(lambda: ready_on(api, d["one"]), timeout=45, what="Ready on one")
            api.patch_spec("lm", {"bundle": {"source": url, "digest": d["two"]}})
            before, probed = passes("ok"), probes_down()
            cond = wait_for(lambda: degraded(api, "lm", "SourceUnavailable"), timeout=10,
                            what="Degraded/SourceUnavailable")
            assert f"127.0.0.1:{served.port}" in cond["message"] and d["two"] in cond["message"]
            time.sleep(12)
            assert api.deliveries() == []           # the transition did not start
            # the model waits on the source's probe (about 2, 6 s after the failure, then 14 s):
            # neither its passes nor the probes come in a loop
            assert 1 <= passes("ok") - before <= 3, passes("ok") - before
            assert 1 <= probes_down() - probed <= 3, probes_down() - probed
            served.start()
            wait_for(lambda: ready_on(api, d["two"]), timeout=45, what="Ready on two")
            assert condition(api.model("lm"), "Degraded")["status"] == "False"
        assert not node.errors, node.errors[-1]
    finally:
        served.stop()


def test_deletion_finishes_when_the_bridge_is_stopped(cluster, namespace, bundles, tmp_path):
    """The real bridge (under the chart's account) holds its lease finalizer on the model's
    BundleDelivery and is then stopped: neither the delivery nor the owner Pod (whose
    volume kubelet can no longer unpublish) is released, and the model still goes after
    the grace, with a Warning per child naming what may remain on which node."""
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    one, two = (f"file://{root / k}" for k in ("one", "two"))
    with PlayedNode(cluster, namespace, tmp_path, real_bridge=True) as node, \
            running_operator(namespace, RESIDENT_DELETE_GRACE_SECONDS="4"):
        api.create_model("lm", {"bundle": {"source": one, "digest": d["one"]}, "runtime": {"port": port}})
        wait_for(lambda: ready_on(api, d["one"]), timeout=45, what="Ready on one")
        api.patch_spec("lm", {"bundle": {"source": two, "digest": d["two"]}})
        bd = wait_for(lambda: [b for b in api.deliveries()
                               if LEASE_FINALIZER in b["metadata"].get("finalizers", [])],
                      what="a delivery held by the bridge")[0]
        node.bridge.stop()                            # the bridge is gone (uninstalled, node down)
        t0 = time.monotonic()
        api.delete_model("lm")
        time.sleep(2)
        assert api.model("lm") is not None            # within the grace, deletion waits
        wait_for(lambda: api.model("lm") is None, timeout=30, what="the model to go after the grace")
        assert time.monotonic() - t0 >= 3     # the grace, less deletionTimestamp's 1 s resolution
        assert api.deliveries() == []                 # the operator removed the bridge's finalizer
        abandoned = wait_for(lambda: [e.message for e in api.events("lm") if e.reason == "CleanupAbandoned"],
                             timeout=10, what="CleanupAbandoned Events")
        delivery = next(m for m in abandoned if bd["metadata"]["name"] in m)
        assert "node-a" in delivery and bd["spec"]["bundle"]["digest"] in delivery
    # the played kubelet could not unpublish through the stopped bridge, as kubelet could not
    assert any("NodeUnpublishVolume" in e or "StatusCode.UNAVAILABLE" in e for e in node.errors)


def test_a_failing_first_mount_names_the_bridges_error_on_the_model(cluster, namespace, bundles, tmp_path):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    served = Served(tmp_path / "served", free_port()).start()
    url = f"http://127.0.0.1:{served.port}/models/one"
    push(root / "one", url)
    blobs = sorted((tmp_path / "served" / "models" / "one" / "blobs").iterdir(),
                   key=lambda p: p.stat().st_size)
    weights, kept = blobs[-1], blobs[-1].read_bytes()
    weights.unlink()                               # the manifest is there, one file 404s
    try:
        with PlayedNode(cluster, namespace, tmp_path, real_bridge=True) as node, running_operator(namespace):
            woken, cached = mount_wakes(), cached_pod_reads()
            api.create_model("lm", {"bundle": {"source": url, "digest": d["one"]},
                                    "runtime": {"port": port}})
            cond = wait_for(lambda: degraded(api, "lm", "DeliveryFailed"), timeout=30,
                            what="Degraded/DeliveryFailed")
            assert "HTTP 404" in cond["message"] and weights.name in cond["message"]
            # kubelet's FailedMount woke the model through the operator's watch of Events,
            # and its passes read the owner Pod from the watch cache, not by LIST
            assert mount_wakes() > woken and cached_pod_reads() > cached
            assert cond["message"].startswith("1 owner cannot mount the bundle; lm-owner-")
            delivered = condition(api.model("lm"), "Delivered")
            assert (delivered["status"], delivered["reason"]) == ("False", "MountFailed")
            assert "HTTP 404" in delivered["message"]
            event = wait_for(lambda: [e for e in api.events("lm") if e.reason == "DeliveryFailed"],
                             timeout=10, what="a DeliveryFailed Event")[0]
            assert event.type == "Warning" and "HTTP 404" in event.message
            weights.write_bytes(kept)              # the file is back: the next publish mounts it
            wait_for(lambda: ready_on(api, d["one"]), timeout=45, what="Ready once the file is back")
            assert condition(api.model("lm"), "Degraded")["status"] == "False"
            wait_for(lambda: "Recovered" in api.reasons("lm"), timeout=10, what="a Recovered Event")
            api.delete_model("lm")
            wait_for(lambda: api.model("lm") is None, timeout=45, what="the model gone")
        assert not node.errors, node.errors[-1]
    finally:
        served.stop()
