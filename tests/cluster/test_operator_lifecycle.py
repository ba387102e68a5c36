"""Operator against a real kube-apiserver: placement, invalid specs, cleanup by UID, sweep.

The operator runs in kopf.testing.KopfRunner. These tests need no node: owner Pods stay
unscheduled (Pending), which is all placement, validation and cleanup look at. The bundle
is a real (tiny) demo bundle in a file:// directory: the operator reads its manifest before
it places a model.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import kubernetes
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from bundle.cpu_model import make_demo
from chart_accounts import RELEASE
from conftest_operator import OPERATOR_ENV, Api, condition, running_operator
from localcluster.controlplane import audited_request
from polling import wait_for
from resident_operator.child_cache import ChildCache
from resident_operator.driver import ModelHandle
from resident_operator.kube import Kube
from resident_operator.settings import settings_from_env
from resident_operator.sweep import sweep_once

pytestmark = pytest.mark.oldest   # run again on the oldest declared Kubernetes (scripts/test)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The spec of a model on a real tiny bundle."""
    root = tmp_path_factory.mktemp("tiny")
    digest = make_demo(root / "tiny", 256 * 1024, seed=1).digest
    return {"bundle": {"source": f"file://{root / 'tiny'}", "digest": digest}}


def npu_spec(tiny):
    return {**tiny, "accelerator": "furiosa.ai/rngd", "replicas": 2,
            "runtime": {"backend": "rngd", "port": 9100},
            "nodeSelector": {"resident.dev/pool": "npu"},
            "tolerations": [{"key": "npu", "operator": "Exists", "effect": "NoSchedule"}]}


def owner_pods(api: Api, name: str):
    return sorted((p for p in api.pods(f"resident.dev/model={name}")
                   if not p.metadata.deletion_timestamp), key=lambda p: p.metadata.name)


WRITES = {"create", "update", "patch", "delete", "deletecollection"}


def test_a_new_model_costs_eight_writes_until_it_settles(cluster, namespace, tiny, chart_accounts):
    """Counted by the API server: its audit log holds every write of the chart's operator
    account (tests/conftest.py). Three one-owner models, no node: each is created, gets its
    children and its status, and settles with its owner Pod unscheduled. Without the one
    status write of a pass, the one Event of what it created, kopf's diff-base left out or
    the budget left to models it bounds, this count grows. Its passes start from the
    watch's copy of the model: no GET of it (the audit log has them too)."""
    api = Api(cluster, namespace)
    user = f"system:serviceaccount:{chart_accounts.namespace}:{RELEASE}-resident-operator"
    names = ["w0", "w1", "w2"]
    with running_operator(namespace):
        api.create_model("warm", tiny)
        # settled: the scheduler's answer written too (counted after `since`, that write was
        # taken for one of the three models' in a run of stop 47's CI)
        wait_for(lambda: condition(api.model("warm"), "Delivered").get("reason") == "Unschedulable",
                 what="warm settled")
        since = time.time()
        for name in names:
            api.create_model(name, tiny)

        def settled(name):
            status = (api.model(name) or {}).get("status") or {}
            return (status.get("endpoint") and status.get("ready") == "0/1"
                    and len(status.get("children") or []) == 4)   # token, Pod, Service, policy
        wait_for(lambda: all(settled(n) for n in names), what="every model with its children and status")
        time.sleep(5)   # what the Pods' scheduling wakes comes in too
        audited = [e for e in cluster.audit_entries(since)
                   if e["user"]["username"] == user and e["objectRef"].get("namespace") == namespace]
        accepted = [e for e in audited if e["verb"] in WRITES
                    and e.get("responseStatus", {}).get("code", 0) < 400]   # a refused write (409) changed nothing
        writes = Counter(audited_request(e) for e in accepted)
        model_reads = [(e["objectRef"].get("name"), e["requestReceivedTimestamp"]) for e in audited
                       if audited_request(e) == "get residentmodels" and e["objectRef"].get("name") in names]
        written = json.dumps([(audited_request(e), e["objectRef"].get("name"), e["requestReceivedTimestamp"],
                               e.get("requestObject")) for e in accepted], indent=1)
    per_model = {k: n / len(names) for k, n in sorted(writes.items())}
    print("operator writes per model until settled:", per_model)
    for kind in ("secrets", "pods", "services", "networkpolicies"):
        assert per_model.pop(f"create {kind}") == 1, (kind, written)   # each child once
    # one owner: no budget, it would bound nothing (disruption.py)
    assert "create poddisruptionbudgets" not in per_model, written
    assert per_model.pop("patch residentmodels") == 1, written     # kopf's finalizer; no diff-base
    assert per_model.pop("create events") == 1, written            # one Event tells the four
    # the first pass writes its revision, records and derived status at once; the second
    # says why the owner Pod waits (the scheduler's answer came after the first)
    assert per_model.pop("patch residentmodels/status") <= 2, written
    assert per_model == {}, written   # nothing else: 8 in all (docs/operator.md)
    assert model_reads == [], model_reads   # every pass started from the watch's copy


def test_owner_pods_carry_card_volume_token_and_owner_reference(cluster, namespace, tiny):
    api = Api(cluster, namespace)
    with running_operator(namespace):
        model = api.create_model("npu-lm", npu_spec(tiny))
        uid = model["metadata"]["uid"]
        pods = wait_for(lambda: len(owner_pods(api, "npu-lm")) == 2 and owner_pods(api, "npu-lm"),
                        what="two owner Pods")
        assert [p.metadata.name for p in pods] == ["npu-lm-owner-0", "npu-lm-owner-1"]
        for pod in pods:
            c = pod.spec.containers[0]
            assert c.resources.limits == {"furiosa.ai/rngd": "1"}
            assert c.resources.requests == {"furiosa.ai/rngd": "1"}
            assert c.image == "resident-owner:test"
            assert c.readiness_probe.http_get.path == "/readyz" and c.readiness_probe.http_get.port == "control"
            assert {p.name: p.container_port for p in c.ports} == {"control": 9100, "http": 8000}
            csi = next(v.csi for v in pod.spec.volumes if v.csi)
            assert csi.driver == "bundles.resident.dev" and csi.read_only is True
            assert csi.volume_attributes == {**tiny["bundle"],
                                             "model": "npu-lm"}
            assert next(v.secret for v in pod.spec.volumes if v.secret).secret_name == "npu-lm-owner-token"
            ref, = pod.metadata.owner_references
            assert (ref.kind, ref.name, ref.uid, ref.controller) == ("ResidentModel", "npu-lm", uid, True)
            assert pod.metadata.labels["resident.dev/model-uid"] == uid
            assert pod.spec.node_selector == {"resident.dev/pool": "npu"}
            assert pod.spec.tolerations[0].key == "npu"
        secret = api.core.read_namespaced_secret("npu-lm-owner-token", namespace)
        assert len(secret.data["token"]) > 20

        def recorded():
            m = api.model("npu-lm")
            kids = {(c["kind"], c["name"]): c["uid"] for c in (m.get("status") or {}).get("children") or []}
            return len(kids) == 6 and m
        m = wait_for(recorded, what="six recorded children")
        kids = {(c["kind"], c["name"]): c["uid"] for c in m["status"]["children"]}
        assert kids[("Pod", "npu-lm-owner-0")] == pods[0].metadata.uid
        assert kids[("Secret", "npu-lm-owner-token")] == secret.metadata.uid
        svc = api.core.read_namespaced_service("npu-lm", namespace)
        assert kids[("Service", "npu-lm")] == svc.metadata.uid
        assert svc.spec.selector == {"resident.dev/model-uid": uid, "resident.dev/component": "owner"}
        port, = svc.spec.ports
        assert (port.name, port.port, port.target_port) == ("http", 8000, "http")
        assert svc.metadata.owner_references[0].uid == uid
        pdb = api.custom.get_namespaced_custom_object("policy", "v1", namespace,
                                                      "poddisruptionbudgets", "npu-lm")
        assert kids[("PodDisruptionBudget", "npu-lm")] == pdb["metadata"]["uid"]
        assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": svc.spec.selector}}
        policy = networking(api).read_namespaced_network_policy("npu-lm-owner-control", namespace)
        assert kids[("NetworkPolicy", "npu-lm-owner-control")] == policy.metadata.uid
        m = wait_for(lambda: (api.model("npu-lm").get("status") or {}).get("ready") == "0/2"
                     and api.model("npu-lm"), what="status.ready 0/2")
        assert m["status"]["phase"] == "Pending" and m["status"]["observedGeneration"] == 1
        assert "resident.dev/cleanup" in m["metadata"]["finalizers"]
        assert condition(m, "Ready")["status"] == "False" and condition(m, "Degraded")["status"] == "False"
        assert m["status"]["endpoint"] == f"http://npu-lm.{namespace}.svc:8000"
        table = cluster.kubectl("get", "rm", "-n", namespace).stdout
        assert table.split("\n")[0].split() == ["NAME", "PHASE", "BUNDLE", "READY", "ENDPOINT", "AGE"]
        assert "npu-lm" in table and tiny["bundle"]["digest"] in table and "0/2" in table
        assert f"http://npu-lm.{namespace}.svc:8000" in table

        api.patch_spec("npu-lm", {"replicas": 1})
        wait_for(lambda: [p.metadata.name for p in owner_pods(api, "npu-lm")] == ["npu-lm-owner-0"],
                 what="scale down to one Pod")
        assert "OwnerPodDeleted" in wait_for(lambda: "OwnerPodDeleted" in api.reasons("npu-lm")
                                             and api.reasons("npu-lm"), what=f"event {api.all_events()}", timeout=10)
        # one owner left: the budget would bound nothing, and goes by UID with its record
        wait_for(lambda: not api.custom.list_namespaced_custom_object(
            "policy", "v1", namespace, "poddisruptionbudgets")["items"]
            and ("PodDisruptionBudget", "npu-lm") not in {(c["kind"], c["name"]) for c in children_of(api.model("npu-lm"))},
            timeout=10, what="the budget deleted and forgotten after the scale-down to one owner")

        api.delete_model("npu-lm")
        wait_for(lambda: api.model("npu-lm") is None, what="the model (finalizer removed)")
        assert owner_pods(api, "npu-lm") == []
        try:
            api.core.read_namespaced_secret("npu-lm-owner-token", namespace)
            raise AssertionError("the token Secret survived its model")
        except ApiException as e:
            assert e.status == 404
        assert api.core.list_namespaced_service(namespace).items == []
        assert api.custom.list_namespaced_custom_object("policy", "v1", namespace,
                                                        "poddisruptionbudgets")["items"] == []
        assert networking(api).list_namespaced_network_policy(namespace).items == []


def test_the_service_and_budget_follow_the_spec_and_come_back_when_deleted(cluster, namespace, tiny):
    api = Api(cluster, namespace)

    def budget():
        listed = api.custom.list_namespaced_custom_object("policy", "v1", namespace,
                                                          "poddisruptionbudgets")["items"]
        return listed[0] if listed else {"spec": {}}
    with running_operator(namespace):
        api.create_model("tiny", dict(tiny, replicas=3))   # a budget bounds more owners than maxUnavailable
        svc = wait_for(lambda: api.core.list_namespaced_service(namespace).items, what="Service")[0]
        wait_for(lambda: budget()["spec"].get("maxUnavailable") == 1, what="the budget")
        api.patch_spec("tiny", {"transition": {"maxUnavailable": 2}})
        wait_for(lambda: budget()["spec"].get("maxUnavailable") == 2, what="the budget follows maxUnavailable")
        api.patch_spec("tiny", {"serving": {"port": 8443}})
        wait_for(lambda: api.core.read_namespaced_service("tiny", namespace).spec.ports[0].port == 8443
                 and api.model("tiny")["status"].get("endpoint") == f"http://tiny.{namespace}.svc:8443",
                 what="Service port and endpoint follow spec.serving.port")
        assert len(api.core.read_namespaced_service("tiny", namespace).spec.ports) == 1
        api.core.delete_namespaced_service("tiny", namespace, _preload_content=False)
        again = wait_for(lambda: [x for x in api.core.list_namespaced_service(namespace).items
                                  if x.metadata.uid != svc.metadata.uid and not x.metadata.deletion_timestamp],
                         what="the Service re-created")[0]
        # recorded and the old record forgotten in the pass's one write of its children
        recorded = lambda: {c["uid"] for c in children_of(api.model("tiny"))}  # noqa: E731
        wait_for(lambda: again.metadata.uid in recorded() and svc.metadata.uid not in recorded(),
                 what="the new Service recorded and the deleted one forgotten")
        # passes reuse the checked companions; their own watch events (the safety resync is
        # 120 s here) make the next pass look again: an edited port and a deleted budget
        api.core.patch_namespaced_service("tiny", namespace, [
            {"op": "replace", "path": "/spec/ports/0/port", "value": 9999}])
        wait_for(lambda: api.core.read_namespaced_service("tiny", namespace).spec.ports[0].port == 8443,
                 timeout=10, what="the edited Service port put back")
        old_budget = budget()["metadata"]["uid"]
        api.custom.delete_namespaced_custom_object("policy", "v1", namespace,
                                                   "poddisruptionbudgets", "tiny")
        wait_for(lambda: budget().get("metadata", {}).get("uid") not in (None, old_budget)
                 and budget()["spec"].get("maxUnavailable") == 2, timeout=10,
                 what="the deleted budget re-created")


def networking(api: Api) -> client.NetworkingV1Api:
    return client.NetworkingV1Api(api.core.api_client)


def control_policies(api: Api) -> list:
    return [p for p in networking(api).list_namespaced_network_policy(api.ns).items
            if not p.metadata.deletion_timestamp]


def children_of(model):
    return ((model or {}).get("status") or {}).get("children") or []


def test_each_model_gets_a_network_policy_admitting_its_control_port_only_from_the_operator(
        cluster, namespace, tiny, chart_accounts):
    """In the model's own namespace, not the release's: the chart's operator Pods (by the
    namespace and Pod labels its Deployment gives the operator) reach the control port,
    anyone the inference port. Drift is put back, a deleted policy comes back, and it goes
    with the model."""
    assert namespace != chart_accounts.namespace
    api = Api(cluster, namespace)
    deploy = client.AppsV1Api(api.core.api_client).read_namespaced_deployment(
        "accounts-resident-operator", chart_accounts.namespace)
    with running_operator(namespace):
        model = api.create_model("tiny", tiny)
        uid = model["metadata"]["uid"]
        pod = wait_for(lambda: owner_pods(api, "tiny"), what="owner Pod")[0]
        policy = wait_for(lambda: control_policies(api), what="the NetworkPolicy")[0]
        assert policy.metadata.name == "tiny-owner-control"
        ref, = policy.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == ("ResidentModel", "tiny", uid, True)
        svc = wait_for(lambda: api.core.list_namespaced_service(namespace).items, what="Service")[0]
        spec = policy.spec
        assert spec.pod_selector.match_labels == svc.spec.selector   # this model's owners only
        assert spec.pod_selector.match_labels.items() <= pod.metadata.labels.items()
        assert spec.policy_types == ["Ingress"]
        control, inference = spec.ingress
        assert [(p.port, p.protocol) for p in control.ports] == [("control", "TCP")]
        peer, = control._from
        assert peer.namespace_selector.match_labels == {"kubernetes.io/metadata.name": chart_accounts.namespace}
        assert peer.pod_selector.match_labels == deploy.spec.selector.match_labels
        assert peer.pod_selector.match_labels.items() <= deploy.spec.template.metadata.labels.items()
        assert peer.ip_block is None
        assert [(p.port, p.protocol) for p in inference.ports] == [("http", "TCP")]
        assert inference._from is None                                  # every client
        assert {p.name for p in pod.spec.containers[0].ports} == {"control", "http"}
        # recorded with the other children in one status write at the end of the first pass
        wait_for(lambda: policy.metadata.uid in {c["uid"] for c in children_of(api.model("tiny"))},
                 what="the policy recorded")

        # someone opens the control port to everyone: the policy's watch event puts it back
        networking(api).patch_namespaced_network_policy("tiny-owner-control", namespace, [
            {"op": "replace", "path": "/spec/ingress", "value": [{}]}])
        wait_for(lambda: len(networking(api).read_namespaced_network_policy(
            "tiny-owner-control", namespace).spec.ingress) == 2, timeout=10, what="the ingress rules put back")
        assert networking(api).read_namespaced_network_policy(
            "tiny-owner-control", namespace).spec.ingress[0]._from[0].pod_selector.match_labels == \
            deploy.spec.selector.match_labels

        # deleted: re-created under a new UID, which replaces the old record
        networking(api).delete_namespaced_network_policy("tiny-owner-control", namespace)
        again = wait_for(lambda: [p for p in control_policies(api) if p.metadata.uid != policy.metadata.uid],
                         timeout=10, what="the policy re-created")[0]
        # the pass records the new one as it creates it and forgets the old one (the same
        # write or the next), so the two are awaited together
        wait_for(lambda: ((recorded := {c["uid"] for c in children_of(api.model("tiny"))})
                          and again.metadata.uid in recorded and policy.metadata.uid not in recorded),
                 what="the new policy recorded in place of the old one")
        assert again.spec.pod_selector.match_labels == svc.spec.selector

        api.delete_model("tiny")
        wait_for(lambda: api.model("tiny") is None, what="the model (finalizer removed)")
        assert networking(api).list_namespaced_network_policy(namespace).items == []


def test_no_network_policy_while_the_setting_is_off_and_earlier_ones_go(cluster, namespace, tiny):
    api = Api(cluster, namespace)

    def checked(name):   # status.endpoint is written after every companion was checked
        m = api.model(name)
        return (m.get("status") or {}).get("endpoint") and m
    with running_operator(namespace):   # on, as the chart installs it
        api.create_model("before", tiny)
        policy = wait_for(lambda: control_policies(api), what="the first model's NetworkPolicy")[0]
        wait_for(lambda: policy.metadata.uid in {c["uid"] for c in children_of(api.model("before"))},
                 what="the policy recorded")
    with running_operator(namespace, RESIDENT_OWNER_NETWORK_POLICY="false"):
        # the earlier model's policy is deleted by UID and forgotten
        wait_for(lambda: control_policies(api) == [], what="the earlier policy deleted")
        wait_for(lambda: "NetworkPolicy" not in {c["kind"] for c in children_of(api.model("before"))},
                 what="its record forgotten")
        # a new model gets its Service but no policy
        api.create_model("after", tiny)
        m = wait_for(lambda: checked("after"), what="the new model's companions checked")
        kinds = {c["kind"] for c in m["status"]["children"]}
        assert "Service" in kinds and "NetworkPolicy" not in kinds
        assert control_policies(api) == []
        api.delete_model("after")
        api.delete_model("before")
        wait_for(lambda: api.model("after") is None and api.model("before") is None, what="models gone")


def test_kubectl_scale_changes_the_owners_and_the_scale_subresource_counts_them(cluster, namespace, tiny):
    api = Api(cluster, namespace)
    with running_operator(namespace):
        model = api.create_model("tiny", tiny)
        wait_for(lambda: len(owner_pods(api, "tiny")) == 1, what="one owner Pod")
        cluster.kubectl("scale", "rm", "tiny", "--replicas=3", "-n", namespace)
        wait_for(lambda: len(owner_pods(api, "tiny")) == 3, what="three owner Pods after kubectl scale")

        def scale():
            return api.custom.get_namespaced_custom_object_scale(
                "resident.dev", "v1alpha1", namespace, "residentmodels", "tiny")
        got = wait_for(lambda: (scale().get("status") or {}).get("replicas") == 3 and scale(),
                       what="scale status 3")
        assert got["spec"]["replicas"] == 3
        selector = got["status"]["selector"]
        assert selector == f"resident.dev/model-uid={model['metadata']['uid']},resident.dev/component=owner"
        assert len(api.pods(selector)) == 3


def test_scheduling_controls_are_accepted_by_the_api_server_on_owner_pods(cluster, namespace, tiny):
    api = Api(cluster, namespace)
    spec = dict(tiny, affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "resident.dev/pool", "operator": "In", "values": ["npu"]}]}]}}},
        topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                    "whenUnsatisfiable": "ScheduleAnyway"}])
    with running_operator(namespace):
        api.create_model("tiny", spec)
        pod = wait_for(lambda: owner_pods(api, "tiny"), what="owner Pod")[0]
        terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert terms.node_selector_terms[0].match_expressions[0].values == ["npu"]
        tsc, = pod.spec.topology_spread_constraints
        assert tsc.topology_key == "kubernetes.io/hostname" and tsc.label_selector.match_labels[
            "resident.dev/component"] == "owner"


def test_invalid_spec_gets_a_condition_and_no_children(cluster, namespace, tiny):
    api = Api(cluster, namespace)
    # a rule the CRD leaves to the operator (affinity is open to the API server); the
    # CRD's own rules refuse their specs at apply (test_crd_residentmodel.py)
    bad = {**tiny, "affinity": {"nodeAfinity": {}}, "transition": {"maxUnavailable": 1}}
    with running_operator(namespace):
        api.create_model("bad", bad)
        m = wait_for(lambda: condition(api.model("bad"), "Degraded").get("reason") == "InvalidSpec"
                     and api.model("bad"), what="Degraded/InvalidSpec")
        assert condition(m, "Degraded")["status"] == "True"
        assert "spec.affinity: only nodeAffinity" in condition(m, "Degraded")["message"]
        assert m["status"]["phase"] == "Degraded"
        wait_for(lambda: "InvalidSpec" in api.reasons("bad"), what="an InvalidSpec Event")
        assert api.pods() == []
        assert [s for s in api.core.list_namespaced_secret(namespace).items
                if s.metadata.name.startswith("bad-")] == []
        assert not (m["status"].get("children"))
        # fixing the spec lets the operator place the model
        api.patch_spec("bad", {"affinity": None})
        wait_for(lambda: owner_pods(api, "bad"), what="an owner Pod after the fix")
        m = wait_for(lambda: condition(api.model("bad"), "Degraded").get("status") == "False"
                     and api.model("bad"), what="Degraded=False")
        assert m["status"]["observedGeneration"] == 2


def test_same_named_pod_of_someone_else_is_never_deleted(cluster, namespace, tiny):
    api = Api(cluster, namespace)
    with running_operator(namespace):
        api.create_model("tiny", tiny)
        first = wait_for(lambda: owner_pods(api, "tiny"), what="owner Pod")[0]
        assert first.metadata.name == "tiny-owner-0"
        wait_for(lambda: any(c["kind"] == "Pod" and c["uid"] == first.metadata.uid
                             for c in (api.model("tiny").get("status") or {}).get("children") or []),
                 what="the Pod recorded")
    # while the operator is down, someone deletes the owner Pod and creates their own Pod
    # under the same name (the operator's record still names the old UID)
    api.core.delete_namespaced_pod("tiny-owner-0", namespace)
    wait_for(lambda: all(p.metadata.uid != first.metadata.uid for p in api.pods()), what="deletion")
    theirs = api.core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="tiny-owner-0", labels={"app": "theirs"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")])))
    with running_operator(namespace):
        # the operator moves the slot to a new incarnation instead of touching their Pod
        wait_for(lambda: [p.metadata.name for p in owner_pods(api, "tiny")] == ["tiny-owner-0-r1"],
                 what="a replacement under a new name")
        api.delete_model("tiny")
        wait_for(lambda: api.model("tiny") is None, what="model gone")
    survivor = api.core.read_namespaced_pod("tiny-owner-0", namespace)
    assert survivor.metadata.uid == theirs.metadata.uid and not survivor.metadata.deletion_timestamp
    assert owner_pods(api, "tiny") == []


def test_deleting_a_model_spares_a_same_named_successor_of_its_pod(cluster, namespace, tiny):
    api = Api(cluster, namespace)
    with running_operator(namespace):
        api.create_model("tiny", tiny)
        first = wait_for(lambda: owner_pods(api, "tiny"), what="owner Pod")[0]
        wait_for(lambda: any(c["kind"] == "Pod" and c["uid"] == first.metadata.uid
                             for c in (api.model("tiny").get("status") or {}).get("children") or []),
                 what="the Pod recorded")
    # operator down: the Pod is swapped for someone else's, then the model is deleted
    api.core.delete_namespaced_pod("tiny-owner-0", namespace)
    wait_for(lambda: all(p.metadata.uid != first.metadata.uid for p in api.pods()), what="deletion")
    theirs = api.core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="tiny-owner-0", labels={"resident.dev/model": "someone"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")])))
    api.delete_model("tiny")
    with running_operator(namespace):
        wait_for(lambda: api.model("tiny") is None, what="model gone (finalizer removed)")
    survivor = api.core.read_namespaced_pod("tiny-owner-0", namespace)
    assert survivor.metadata.uid == theirs.metadata.uid and not survivor.metadata.deletion_timestamp


def test_orphans_labelled_for_the_model_are_swept(cluster, namespace, tiny):
    api = Api(cluster, namespace)
    with running_operator(namespace):
        model = api.create_model("tiny", tiny)
        pod = wait_for(lambda: owner_pods(api, "tiny"), what="owner Pod")[0]
        # left over from before a crash: labelled for this model, never recorded
        orphan = api.core.create_namespaced_secret(namespace, client.V1Secret(
            metadata=client.V1ObjectMeta(name="tiny-leftover", labels={
                "resident.dev/model": "tiny", "resident.dev/model-uid": model["metadata"]["uid"]}),
            string_data={"x": "y"}))
        unrelated = api.core.create_namespaced_secret(namespace, client.V1Secret(
            metadata=client.V1ObjectMeta(name="unrelated", labels={"resident.dev/model": "other"})))

        def gone():
            try:
                api.core.read_namespaced_secret("tiny-leftover", namespace)
                return False
            except ApiException as e:
                return e.status == 404
        wait_for(gone, timeout=40, what="the orphan Secret to be swept")  # ORPHAN_MIN_AGE_SECONDS old
        # kopf posts Events from a queue of its own, so the Event may trail the deletion
        wait_for(lambda: "OrphanDeleted" in api.reasons("tiny"), what="the OrphanDeleted Event")
        assert api.core.read_namespaced_secret("unrelated", namespace).metadata.uid == unrelated.metadata.uid
        assert owner_pods(api, "tiny")[0].metadata.uid == pod.metadata.uid  # recorded child kept
        assert orphan.metadata.uid not in {c["uid"] for c in api.model("tiny")["status"]["children"]}


def _with_a_lost_record(api: Api, name: str, tiny) -> ModelHandle:
    """A new model whose status records a Service that does not exist (its delete's watch
    event lost), and the operator's handle of it."""
    model = api.create_model(name, tiny)
    record = {"apiVersion": "v1", "kind": "Service", "name": name, "uid": f"0000-gone-{name}"}
    api.custom.patch_namespaced_custom_object_status(
        "resident.dev", "v1alpha1", api.ns, "residentmodels", name, {"status": {"children": [record]}})
    handle = ModelHandle(api.ns, name, model["metadata"]["uid"])
    handle.record({record["uid"]})
    return handle


def test_the_sweep_wakes_a_model_whose_recorded_child_went_unseen(cluster, namespace, tiny):
    """A child deleted while its watch event was lost (the safety resync no longer reads
    companions): the sweep finds the record without an object, forgets it, and wakes that
    model alone to read its companions again. Run directly, under the operator's account."""
    api = Api(cluster, namespace)
    intact = api.create_model("intact", tiny)
    handles = [_with_a_lost_record(api, "lost", tiny), ModelHandle(namespace, "intact", intact["metadata"]["uid"])]
    kube = Kube(kubernetes.config.new_client_from_config(config_file=OPERATOR_ENV["KUBECONFIG"]))
    woken = []
    sweep_once(kube, settings_from_env({}), handles, woken.append)
    assert [h.name for h in woken] == ["lost"]
    assert not api.model("lost")["status"].get("children")     # the stale record is forgotten


def test_the_sweep_repairs_the_pod_cache_after_a_missed_delete(cluster, namespace, tiny):
    """Passes read owner Pods from the watch cache (child_cache.py). A Pod deleted while
    its watch event was lost stays in the cache until the next sweep: its LIST of the Pods'
    metadata disagrees with the cache, a LIST of whole Pods drops the Pod, the model is
    woken, and the Pod is known gone (no LIST needed for its record). A sweep that finds the
    cache as listed reads metadata only. Run directly, under the operator's account."""
    api = Api(cluster, namespace)
    model = api.create_model("ghosted", tiny)
    uid = model["metadata"]["uid"]
    pod = api.core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="ghosted-owner-0", labels={
            "resident.dev/model": "ghosted", "resident.dev/model-uid": uid}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="owner", image="none")])))
    record = {"apiVersion": "v1", "kind": "Pod", "name": "ghosted-owner-0", "uid": pod.metadata.uid}
    api.custom.patch_namespaced_custom_object_status(
        "resident.dev", "v1alpha1", namespace, "residentmodels", "ghosted", {"status": {"children": [record]}})
    handle = ModelHandle(namespace, "ghosted", uid)
    handle.recorded = {pod.metadata.uid}
    kube = Kube(kubernetes.config.new_client_from_config(config_file=OPERATOR_ENV["KUBECONFIG"]), ChildCache())
    assert kube.cache.children(namespace, "Pod", "ghosted", [pod.metadata.uid]) is None   # not listed yet
    woken = []
    sweep_once(kube, settings_from_env({}), [handle], woken.append)
    assert woken == []                                        # children as recorded
    [cached] = kube.cache.children(namespace, "Pod", "ghosted", [pod.metadata.uid])
    assert cached["metadata"]["uid"] == pod.metadata.uid
    [listed], _ = kube.list_at(namespace, "Pod", "resident.dev/model-uid", metadata_only=True)
    assert listed["kind"] == "Pod" and "spec" not in listed and listed["metadata"]["uid"] == pod.metadata.uid
    api.core.delete_namespaced_pod("ghosted-owner-0", namespace, grace_period_seconds=0)
    wait_for(lambda: not api.pods("resident.dev/model=ghosted"), what="the Pod to go")
    # no watch told the cache: it still holds the Pod, until the sweep lists again
    assert len(kube.cache.children(namespace, "Pod", "ghosted", [pod.metadata.uid])) == 1
    whole = []   # the kinds the sweep LISTs whole in the namespace: only where the cache disagrees
    list_at = kube.list_at

    def counted(ns, kind, selector, metadata_only=False):
        if not metadata_only and selector == "resident.dev/model-uid":   # not a model's close look
            whole.append(kind)
        return list_at(ns, kind, selector, metadata_only)
    kube.list_at = counted
    sweep_once(kube, settings_from_env({}), [handle], woken.append)
    assert woken == [handle] and whole == ["Pod"], whole
    assert kube.cache.children(namespace, "Pod", "ghosted", [pod.metadata.uid]) == []   # known gone
    assert not api.model("ghosted")["status"].get("children")   # and its record forgotten
    whole.clear()
    sweep_once(kube, settings_from_env({}), [handle], woken.append)   # settled: metadata only
    assert whole == [], whole


def test_the_sweep_keeps_to_its_budget_past_a_model_whose_pass_holds_it(cluster, namespace, tiny):
    """A pass that holds its model's lock (waiting on an API server, or on owners) does
    not hold the sweep: the sweep waits for the lock no longer than its budget, wakes the
    model all the same, and the next sweep does what this one skipped. Run directly, under
    the operator's account."""
    api = Api(cluster, namespace)
    handle = _with_a_lost_record(api, "held", tiny)
    record = api.model("held")["status"]["children"][0]
    kube = Kube(kubernetes.config.new_client_from_config(config_file=OPERATOR_ENV["KUBECONFIG"]))
    settings = settings_from_env({"RESIDENT_SWEEP_BUDGET_SECONDS": "1"})
    taken, release = threading.Event(), threading.Event()

    def a_long_pass():
        with handle.lock:
            taken.set()
            release.wait(10)
    passing = threading.Thread(target=a_long_pass, daemon=True)
    passing.start()
    taken.wait(5)
    woken = []
    try:
        t0 = time.monotonic()
        sweep_once(kube, settings, [handle], woken.append)
        took = time.monotonic() - t0
    finally:
        release.set()
        passing.join(5)
    assert took < 3.0, took                                     # its budget (1 s), not the pass (10 s)
    assert woken == [handle]                                    # its own pass sees to it meanwhile
    assert api.model("held")["status"]["children"] == [record]  # skipped: not pruned under the pass
    sweep_once(kube, settings, [handle], woken.append)          # the next sweep, the lock free
    assert not api.model("held")["status"].get("children")


def test_the_sweep_stops_between_models_once_its_budget_is_spent(cluster, namespace, tiny):
    """Three models with a lost record each; the first one's pass holds its lock past the
    sweep's budget, so the sweep stops before the other two, and the next sweep looks at
    them first (the models looked at least recently). Run directly, under the operator's
    account."""
    api = Api(cluster, namespace)
    handles = [_with_a_lost_record(api, name, tiny) for name in ("first", "second", "third")]
    kube = Kube(kubernetes.config.new_client_from_config(config_file=OPERATOR_ENV["KUBECONFIG"]))
    settings = settings_from_env({"RESIDENT_SWEEP_BUDGET_SECONDS": "1"})
    taken, release = threading.Event(), threading.Event()

    def a_long_pass():
        with handles[0].lock:
            taken.set()
            release.wait(10)
    passing = threading.Thread(target=a_long_pass, daemon=True)
    passing.start()
    taken.wait(5)
    woken: list[ModelHandle] = []
    try:
        sweep_once(kube, settings, handles, woken.append)
    finally:
        release.set()
        passing.join(5)
    assert [h.name for h in woken] == ["first"]                 # the budget went on its lock
    assert all(api.model(h.name)["status"].get("children") for h in handles)
    woken.clear()
    sweep_once(kube, settings, handles, woken.append)
    assert [h.name for h in woken][:2] == ["second", "third"]   # not looked at yet: first
    assert not api.model("second")["status"].get("children")
