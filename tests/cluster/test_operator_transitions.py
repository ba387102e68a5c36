"""Transitions end to end: real API server, real operator (KopfRunner), real owner runtime.

There is no kubelet or bridge in this cluster yet, so :class:`PlayedNode` (see
conftest_operator.py) plays both on 127.0.0.1: it runs the real owner HTTP server on the
bundle volume it staged, reports Pod readiness from the owner's /readyz, and stages
BundleDeliveries into that volume. Everything the operator sees is real API objects and
real owner answers.
"""

from __future__ import annotations

import base64
import logging
import signal
import time

import pytest
from kubernetes import client

from bundle.cpu_model import make_demo, make_revision
from localcluster.processes import free_port
from owner.backends.cpu import CpuBackend
from resident_operator.metrics import REGISTRY
from bundle.jsonlog import JSONLineFormatter

from conftest_operator import Api, PlayedNode, condition, operator_process, running_operator
from polling import wait_for
from fault_backends import FaultyWriteCpuBackend

SIZE, CHUNK = 256 * 1024, 64 * 1024


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """Demo revisions: base, rows (in-place), graph (graph-only of rows), bad (corrupt)."""
    root = tmp_path_factory.mktemp("bundles")
    d = {"base": make_demo(root / "base", SIZE, seed=3, chunk_size=CHUNK).digest,
         "rows": make_revision(root / "base", root / "rows", "rows", seed=4, fraction=0.05,
                               chunk_size=CHUNK).digest,
         "graph": make_revision(root / "rows", root / "graph", "graph", chunk_size=CHUNK).digest,
         "bad": make_revision(root / "base", root / "bad", "rows", seed=6, fraction=0.05,
                              chunk_size=CHUNK).digest}
    flip_last_byte(root / "bad" / "model.safetensors")   # corrupt after the manifest was written
    return root, d


def flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def transition_samples(strategy, path, phase="total"):
    value = REGISTRY.get_sample_value("resident_transition_duration_seconds_count",
                                      {"strategy": strategy, "path": path, "phase": phase})
    return int(value or 0)


def spec_for(bundles, name, port, **over):
    """A spec on revision ``name``; the revision left at a switch is not kept staged (the
    first test and test_operator_stage.py keep it, the default)."""
    root, d = bundles
    spec = {"bundle": {"source": f"file://{root / name}", "digest": d[name]},
            "runtime": {"port": port}, "transition": {"timeoutSeconds": 60, "keepPrevious": False}}
    spec.update(over)
    return spec


def status(api, name="lm"):
    return (api.model(name) or {}).get("status") or {}


def ready_on(api, digest, name="lm"):
    s = status(api, name)
    return s.get("phase") == "Ready" and (s.get("identity") or {}).get("bundle") == digest and s


def last_result(api, name="lm"):
    return (status(api, name).get("lastTransition") or {}).get("result")


def deliveries(api):
    return [bd for bd in api.deliveries() if not bd["metadata"].get("deletionTimestamp")]


@pytest.fixture
def node(cluster, namespace, tmp_path):
    with PlayedNode(cluster, namespace, tmp_path) as n:
        yield n
    assert not n.errors, n.errors[-1]


def test_in_place_then_graph_only_transition_and_cleanup(cluster, namespace, node, bundles, caplog):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    caplog.set_level(logging.DEBUG)
    with running_operator(namespace, "--verbose"):   # DEBUG: the most the operator ever logs
        api.create_model("lm", spec_for(bundles, "base", port, transition={"timeoutSeconds": 60}))
        s = wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")
        assert s["ready"] == "1/1"
        owner, = s["owners"]
        assert (owner["node"], owner["ready"], owner["state"]) == ("node-a", True, "ready")
        assert all(condition({"status": s}, t)["status"] == "True" for t in ("Delivered", "Resident", "Ready"))
        pod_uid = owner["uid"]
        row = cluster.kubectl("get", "rm", "lm", "-n", namespace, "--no-headers").stdout.split()
        assert row[:4] == ["lm", "Ready", d["base"], "1/1"]

        before = transition_samples("InPlace", "WholeBundle")
        api.patch_spec("lm", {"bundle": spec_for(bundles, "rows", port)["bundle"]})
        wait_for(lambda: last_result(api) == "succeeded", what="the rows transition")
        assert transition_samples("InPlace", "WholeBundle") == before + 1   # the operator runs in-process
        s = wait_for(lambda: ready_on(api, d["rows"]), what="Ready on rows")
        lt = s["lastTransition"]
        assert (lt["from"], lt["to"], lt["strategy"], lt["path"]) == (d["base"], d["rows"], "InPlace", "WholeBundle")
        assert lt["predicted"]["bytes"]["fetch"] > 0 and lt["durations"]["totalSeconds"] > 0
        assert s["owners"][0]["uid"] == pod_uid            # same Pod, model updated in place
        assert condition({"status": s}, "Transitioning")["reason"] == "TransitionSucceeded"
        assert len(node.owner_of(pod_uid).transitions) == 1
        # the rows delivery is live; base, the revision left, stays staged beside it (keepPrevious)
        live = lambda: {bd["spec"]["bundle"]["digest"]: bd for bd in deliveries(api)
                        if (bd.get("status") or {}).get("phase") == "Staged"}
        by_digest = wait_for(lambda: len(live()) == 2 and live(), what="the revision left staged")
        bd, kept = by_digest[d["rows"]], by_digest[d["base"]]
        assert bd["spec"]["podUID"] == pod_uid and bd["spec"]["activate"] is True
        assert bd["status"]["phase"] == "Staged" and bd["spec"]["donor"] == d["base"]
        assert kept["spec"]["podUID"] == pod_uid and kept["spec"]["activate"] is False
        assert api.model("lm")["status"]["previousBundle"]["digest"] == d["base"]

        api.patch_spec("lm", {"bundle": spec_for(bundles, "graph", port)["bundle"]})
        s = wait_for(lambda: ready_on(api, d["graph"]), what="Ready on graph")
        lt = s["lastTransition"]
        assert (lt["path"], lt["method"], lt["strategy"], lt["result"]) == ("GraphOnly", "reconstruct", "Reload", "succeeded") \
            or (lt["path"], lt["strategy"]) == ("GraphOnly", "Reload")
        # base was released once the owner verified the graph revision, and rows is kept now
        by_digest = wait_for(lambda: set(live()) == {d["graph"], d["rows"]} and len(api.deliveries()) == 2
                             and live(), what="base released, rows kept")
        assert by_digest[d["graph"]]["spec"]["activate"] is True
        assert by_digest[d["rows"]]["spec"]["activate"] is False   # the live delivery, turned pre-staged
        reasons = api.reasons("lm")
        for r in ("OwnerPodCreated", "ModelReady", "TransitionPlanned", "DeliveryCreated", "DeliveryStaged",
                  "OwnerTransitionStarted", "OwnerTransitionApplied", "IdentityVerified",
                  "OldRevisionReleased", "TransitionSucceeded"):
            assert r in reasons, (r, reasons)
        described = cluster.kubectl("describe", "rm", "lm", "-n", namespace).stdout
        assert "TransitionSucceeded" in described and "DeliveryStaged" in described

        token = base64.b64decode(api.core.read_namespaced_secret("lm-owner-token", namespace).data["token"]).decode()
        api.delete_model("lm")
        wait_for(lambda: api.model("lm") is None, what="the model to go (finalizer removed)")
        assert api.deliveries() == [] and api.pods("resident.dev/model=lm") == []
    # The owners' token never reaches a log line (the operator's and the owner's, with every
    # extra field, at DEBUG) or an Event.
    logged = "\n".join(JSONLineFormatter().format(r) for r in caplog.records)
    assert any(r.levelno == logging.DEBUG for r in caplog.records)
    assert len(token) >= 32 and "TransitionSucceeded" in logged and token not in logged
    assert [e for e in api.all_events() if token in (e[3] or "")] == []


def test_failed_delivery_keeps_the_old_identity_and_degrades(cluster, namespace, node, bundles):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "base", port))
        pod_uid = wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")["owners"][0]["uid"]
        api.patch_spec("lm", {"bundle": spec_for(bundles, "bad", port)["bundle"]})
        wait_for(lambda: last_result(api) == "failed", what="the transition to fail")
        s = wait_for(lambda: condition(api.model("lm"), "Degraded").get("status") == "True" and status(api),
                     what="Degraded")
        deg = condition({"status": s}, "Degraded")
        assert deg["reason"] == "DeliveryFailed" and "integrity mismatch" in deg["message"]
        assert s["phase"] == "Degraded" and s["identity"]["bundle"] == d["base"]
        assert s["lastTransition"]["failedOwner"].startswith("lm-owner-0")
        assert node.owner_of(pod_uid).transitions == {}       # the owner was never asked
        wait_for(lambda: deliveries(api) == [], what="the failed delivery to be released")
        assert {"DeliveryFailed", "TransitionFailed"} <= set(api.reasons("lm"))
        # not retried for the same generation; an edit of the spec retries it (source repaired)
        assert status(api)["bundle"]["digest"] == d["base"]
        flip_last_byte(root / "bad" / "model.safetensors")
        api.patch_spec("lm", {"transition": {"timeoutSeconds": 61}})
        s = wait_for(lambda: ready_on(api, d["bad"]), what="Ready on the repaired revision")
        assert s["lastTransition"]["result"] == "succeeded" and s["owners"][0]["uid"] == pod_uid
        assert condition({"status": s}, "Degraded")["status"] == "False"
        wait_for(lambda: "Recovered" in api.reasons("lm"), what="the Recovered Event")


def test_a_delivery_the_bridge_retries_degrades_the_model_with_its_cause_until_it_stages(
        cluster, namespace, node, bundles):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "base", port))
        wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")
        node.stage_deliveries.clear()
        api.patch_spec("lm", {"bundle": spec_for(bundles, "rows", port)["bundle"]})
        bd = wait_for(lambda: next(iter(deliveries(api)), None), what="the delivery")
        name = bd["metadata"]["name"]
        failure = {"phase": "Failed", "verified": False, "reason": "StoreFull", "attempts": 1,
                   "message": "no space in the node store for the revision (attempt 1; retrying at soon)",
                   "nextAttemptTime": "2030-01-01T00:00:00.000000Z"}
        api.custom.patch_namespaced_custom_object_status(  # as the bridge reports a retried failure
            "resident.dev", "v1alpha1", namespace, "bundledeliveries", name, {"status": failure})
        s = wait_for(lambda: condition(api.model("lm"), "Degraded").get("reason") == "DeliveryFailed"
                     and status(api), what="Degraded DeliveryFailed")
        deg = condition({"status": s}, "Degraded")
        assert deg["status"] == "True" and "StoreFull" in deg["message"] and "no space" in deg["message"]
        assert s["phase"] == "Transitioning" and "transition" in s      # still waiting on the retry
        node.stage_deliveries.set()                                     # the retry succeeds
        api.custom.patch_namespaced_custom_object_status(
            "resident.dev", "v1alpha1", namespace, "bundledeliveries", name,
            {"status": {**failure, "attempts": 2}})
        s = wait_for(lambda: ready_on(api, d["rows"]), what="Ready on rows after the retry")
        assert condition({"status": s}, "Degraded")["status"] == "False"
        assert s["lastTransition"]["result"] == "succeeded"


def test_in_place_refused_for_a_graph_change_touches_nothing(cluster, namespace, node, bundles):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "rows", port, transition={"strategy": "InPlace"}))
        wait_for(lambda: ready_on(api, d["rows"]), what="Ready on rows")
        api.patch_spec("lm", {"bundle": spec_for(bundles, "graph", port)["bundle"]})
        s = wait_for(lambda: condition(api.model("lm"), "Degraded").get("reason") == "InPlaceNotPossible"
                     and status(api), what="InPlaceNotPossible")
        assert "graph changed" in condition({"status": s}, "Degraded")["message"]
        assert api.deliveries() == [] and s["identity"]["bundle"] == d["rows"]
        assert "transition" not in s


def test_transition_times_out_when_the_delivery_never_stages(cluster, namespace, node, bundles):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "base", port, transition={"timeoutSeconds": 3}))
        wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")
        node.stage_deliveries.clear()
        api.patch_spec("lm", {"bundle": spec_for(bundles, "rows", port)["bundle"]})
        wait_for(lambda: last_result(api) == "failed", what="the timeout")
        s = wait_for(lambda: condition(api.model("lm"), "Degraded").get("reason") == "Timeout" and status(api),
                     what="Degraded Timeout")
        assert s["lastTransition"]["reason"] == "Timeout" and "within 3s" in s["lastTransition"]["message"]
        assert s["identity"]["bundle"] == d["base"]
        wait_for(lambda: deliveries(api) == [], what="the stuck delivery to be released")


class QuarantiningCpuBackend(CpuBackend):
    """Test-only: an in-place update applies, then releasing its staged buffer fails, so the
    owner quarantines itself (the owner's own rule); fresh loads work normally."""

    def release_staged(self, update):
        raise RuntimeError("injected: staged buffer still pinned")


def test_quarantined_owner_is_replaced_on_the_target(cluster, namespace, tmp_path, bundles):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with PlayedNode(cluster, namespace, tmp_path, backend=QuarantiningCpuBackend) as node, \
            running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "base", port))
        old_uid = wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")["owners"][0]["uid"]
        api.patch_spec("lm", {"bundle": spec_for(bundles, "rows", port)["bundle"]})
        s = wait_for(lambda: ready_on(api, d["rows"]), timeout=60, what="Ready on rows via a new Pod")
        assert s["lastTransition"]["result"] == "succeeded" and s["lastTransition"]["replaced"] == 1
        new, = s["owners"]
        assert new["uid"] != old_uid and new["pod"] == "lm-owner-0-r1"
        pod, = [p for p in api.pods("resident.dev/model=lm") if not p.metadata.deletion_timestamp]
        csi = next(v.csi for v in pod.spec.volumes if v.csi)
        assert csi.volume_attributes["digest"] == d["rows"]
        wait_for(lambda: "OwnerReplaced" in api.reasons("lm"), what="the OwnerReplaced Event")
        children = {c["uid"] for c in status(api)["children"]}
        assert old_uid not in children and pod.metadata.uid in children


def test_failed_in_place_update_rolls_back_and_degrades(cluster, namespace, tmp_path, bundles):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with PlayedNode(cluster, namespace, tmp_path, backend=FaultyWriteCpuBackend) as node, \
            running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "base", port))
        pod_uid = wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")["owners"][0]["uid"]
        api.patch_spec("lm", {"bundle": spec_for(bundles, "rows", port)["bundle"]})
        wait_for(lambda: last_result(api) == "failed", what="the transition to fail")
        s = wait_for(lambda: condition(api.model("lm"), "Degraded").get("reason") == "OwnerTransitionFailed"
                     and status(api), what="Degraded OwnerTransitionFailed")
        assert s["owners"][0]["uid"] == pod_uid and s["owners"][0]["state"] == "ready"
        assert s["identity"]["bundle"] == d["base"]                  # rolled back by the owner
        assert node.owner_of(pod_uid).identity().identity.bundle == d["base"]
        assert s["ready"] == "1/1"
        wait_for(lambda: "OwnerTransitionFailed" in api.reasons("lm"), what="the OwnerTransitionFailed Event")
        wait_for(lambda: deliveries(api) == [], what="the target delivery to be released")


def test_operator_killed_mid_transition_resumes_without_duplicates(cluster, namespace, node, bundles, tmp_path):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with operator_process(namespace, tmp_path / "operator.log") as proc:
        api.create_model("lm", spec_for(bundles, "base", port))
        pod_uid = wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")["owners"][0]["uid"]
        node.stage_deliveries.clear()
        api.patch_spec("lm", {"bundle": spec_for(bundles, "rows", port)["bundle"]})
        wait_for(lambda: (status(api).get("transition") or {}).get("owners", [{}])[0].get("step") == "Delivering",
                 what="the owner step Delivering to be recorded")
        proc.send_signal(signal.SIGKILL)          # no chance to clean up or save anything
        proc.wait(10)
    assert len(deliveries(api)) == 1
    node.stage_deliveries.set()                   # the bridge stages while no operator runs
    wait_for(lambda: (deliveries(api)[0].get("status") or {}).get("phase") == "Staged", what="staged")
    with running_operator(namespace):
        s = wait_for(lambda: ready_on(api, d["rows"]), what="Ready on rows after the restart")
    assert s["lastTransition"]["result"] == "succeeded" and s["owners"][0]["uid"] == pod_uid
    assert len(api.deliveries()) == 1
    assert len(node.owner_of(pod_uid).transitions) == 1
    assert api.reasons("lm").count("TransitionPlanned") == 1
    assert api.reasons("lm").count("DeliveryCreated") == 1
    assert len(api.pods("resident.dev/model=lm")) == 1


def test_a_standby_takes_over_a_killed_leader_and_finishes_its_transition(
        cluster, namespace, node, bundles, tmp_path, chart_accounts):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    # the Lease the chart's Role grants: <release>-resident-operator in the release namespace
    lease_ns, lease_name = chart_accounts.namespace, "accounts-resident-operator"
    elect = ("--leader-elect", "--leader-election-namespace", lease_ns, "--leader-election-id", lease_name)
    leases = client.CoordinationV1Api(cluster.api_client())

    def holder():
        try:
            lease = leases.read_namespaced_lease(lease_name, lease_ns)
        except Exception:  # noqa: BLE001 - not created yet
            return None
        return lease.spec.holder_identity

    with operator_process(namespace, tmp_path / "a.log", elect) as a:
        first = wait_for(holder, what="a leader")
        with operator_process(namespace, tmp_path / "b.log", elect) as b:
            api.create_model("lm", spec_for(bundles, "base", port))
            wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")
            assert holder() == first and b"acquired" not in (tmp_path / "b.log").read_bytes()
            node.stage_deliveries.clear()
            api.patch_spec("lm", {"bundle": spec_for(bundles, "rows", port)["bundle"]})
            wait_for(lambda: deliveries(api), what="the transition's delivery")
            leader = a if b"acquired" in (tmp_path / "a.log").read_bytes() else b
            leader.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            wait_for(lambda: holder() not in (None, first), timeout=30, what="the standby to take over")
            assert time.monotonic() - killed < 30
            node.stage_deliveries.set()
            s = wait_for(lambda: ready_on(api, d["rows"]), timeout=60, what="the transition finished")
    assert s["lastTransition"]["result"] == "succeeded"
    assert api.reasons("lm").count("TransitionPlanned") == 1


def test_spec_change_during_a_transition_is_queued(cluster, namespace, node, bundles):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "base", port))
        wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")
        node.stage_deliveries.clear()
        api.patch_spec("lm", {"bundle": spec_for(bundles, "rows", port)["bundle"]})
        wait_for(lambda: deliveries(api), what="the first delivery")
        api.patch_spec("lm", {"bundle": spec_for(bundles, "graph", port)["bundle"]})
        s = wait_for(lambda: (status(api).get("pendingTransition") or {}).get("to") == d["graph"] and status(api),
                     what="the queued transition")
        assert s["transition"]["to"] == d["rows"]
        assert [bd["spec"]["bundle"]["digest"] for bd in deliveries(api)] == [d["rows"]]
        node.stage_deliveries.set()
        s = wait_for(lambda: ready_on(api, d["graph"]), timeout=45, what="Ready on graph after rows")
        assert s["lastTransition"]["from"] == d["rows"] and not s.get("pendingTransition")
        wait_for(lambda: "TransitionQueued" in api.reasons("lm"), what="the TransitionQueued Event")


def test_quarantined_owner_outside_a_transition_is_replaced(cluster, namespace, node, bundles):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "base", port))
        old_uid = wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")["owners"][0]["uid"]
        # fault injection: the real owner reports itself quarantined (as after a failed release)
        node.owner_of(old_uid).set_state("quarantined", "injected by the test")
        s = wait_for(lambda: (ready_on(api, d["base"]) or {}).get("owners", [{}])[0].get("uid") not in (None, old_uid)
                     and ready_on(api, d["base"]), what="a replacement owner on base")
        assert s["owners"][0]["pod"] == "lm-owner-0-r1"
        replaced = [m for kind, name, reason, m in api.all_events() if reason == "OwnerReplaced"]
        assert len(replaced) == 1 and "is quarantined" in replaced[0]


def test_status_follows_owner_readiness_and_an_invalid_edit_changes_nothing(cluster, namespace, node, bundles):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "base", port))
        s = wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")
        pod_uid = s["owners"][0]["uid"]
        delivered_since = condition({"status": s}, "Delivered")["lastTransitionTime"]
        ready_since = condition({"status": s}, "Ready")["lastTransitionTime"]
        # the real owner stops being ready (as while it reloads); the played kubelet follows /readyz
        node.owner_of(pod_uid).set_state("loading")
        s = wait_for(lambda: status(api).get("phase") == "Loading" and status(api), what="phase Loading")
        assert s["ready"] == "0/1" and condition({"status": s}, "Ready")["status"] == "False"
        assert condition({"status": s}, "Resident")["reason"] == "OwnersLoading"
        node.owner_of(pod_uid).set_state("ready")
        s = wait_for(lambda: ready_on(api, d["base"]), what="Ready again")
        assert condition({"status": s}, "Delivered")["lastTransitionTime"] == delivered_since
        assert condition({"status": s}, "Ready")["lastTransitionTime"] >= ready_since
        assert {"ModelNotReady", "ModelReady"} <= set(api.reasons("lm"))
        # an invalid edit of a running model (one the CRD's rules leave to the operator): a
        # condition, and nothing else is touched
        api.patch_spec("lm", {"affinity": {"nodeAfinity": {}}, "bundle": spec_for(bundles, "rows", port)["bundle"]})
        s = wait_for(lambda: condition(api.model("lm"), "Degraded").get("reason") == "InvalidSpec" and status(api),
                     what="InvalidSpec")
        pods = api.pods("resident.dev/model=lm")
        assert [p.metadata.uid for p in pods] == [pod_uid] and not pods[0].metadata.deletion_timestamp
        assert api.deliveries() == [] and "transition" not in s
        assert node.owner_of(pod_uid).identity().identity.bundle == d["base"]


def test_transition_and_cleanup_through_the_real_bridge(cluster, namespace, tmp_path, bundles):
    """The real CSI bridge publishes the owner's volume (bind mount) and stages the delivery."""
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with PlayedNode(cluster, namespace, tmp_path, real_bridge=True) as node, running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "base", port))
        s = wait_for(lambda: ready_on(api, d["base"]), timeout=45, what="Ready on base")
        pod_uid = s["owners"][0]["uid"]
        vol = node.volume(pod_uid)
        assert any(m.mount_point == str(vol) for m in mountinfo_of(vol))
        api.patch_spec("lm", {"bundle": spec_for(bundles, "rows", port)["bundle"]})
        s = wait_for(lambda: ready_on(api, d["rows"]), timeout=45, what="Ready on rows")
        lt = s["lastTransition"]
        assert lt["result"] == "succeeded" and lt["strategy"] == "InPlace"
        assert lt["bytes"]["written"] > 0 and lt["method"] in ("rebase", "reconstruct")
        bd, = api.deliveries()
        assert bd["status"]["verified"] is True and bd["metadata"]["finalizers"] == ["bundles.resident.dev/lease"]
        assert (vol / "current" / "resident-manifest.json").exists()
        api.delete_model("lm")
        wait_for(lambda: api.model("lm") is None, timeout=45, what="model gone after the bridge released")
        assert api.deliveries() == [] and api.pods("resident.dev/model=lm") == []
        assert not any(m.mount_point == str(vol) for m in mountinfo_of(vol))
    assert not node.errors, node.errors[-1]


def mountinfo_of(path):
    from csi_bridge import mountinfo
    return mountinfo.mounts_under(path.parent)


def test_two_models_transition_side_by_side_and_delete_independently(cluster, namespace, node, bundles):
    root, d = bundles
    api, ports = Api(cluster, namespace), {"a": free_port(), "b": free_port()}
    with running_operator(namespace):
        for m in ("a", "b"):
            api.create_model(m, spec_for(bundles, "base", ports[m]))
        for m in ("a", "b"):
            wait_for(lambda: ready_on(api, d["base"], m), what=f"model {m} Ready")
        api.patch_spec("a", {"bundle": spec_for(bundles, "rows", ports["a"])["bundle"]})
        api.patch_spec("b", {"bundle": spec_for(bundles, "graph", ports["b"])["bundle"]})
        sa = wait_for(lambda: ready_on(api, d["rows"], "a"), what="a on rows")
        sb = wait_for(lambda: ready_on(api, d["graph"], "b"), what="b on graph")
        assert {c["uid"] for c in sa["children"]}.isdisjoint({c["uid"] for c in sb["children"]})
        b_pod = sb["owners"][0]["uid"]
        api.delete_model("a")
        wait_for(lambda: api.model("a") is None, what="a gone")
        assert [p.metadata.uid for p in api.pods("resident.dev/model=b")] == [b_pod]
        assert [bd["spec"]["bundle"]["digest"] for bd in api.deliveries()] == [d["graph"]]
        assert ready_on(api, d["graph"], "b")
