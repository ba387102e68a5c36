"""Across nodes, with the real controller-manager: the disruption budget under eviction,
and an owner lost with its node.

Played nodes (conftest_operator.PlayedNode) stand in for kubelet and the bridge; each runs
the real owner runtime on its own loopback address, so owners of one model on different
nodes use the same port, and the operator reaches them at their Pod IPs. The nodes are
named after the test's namespace and tainted, so no other test's Pod lands on them. What
decides here is real: the disruption controller computes the budget from the
ResidentModel's scale subresource, the eviction API enforces it, the node lifecycle
controller taints a node whose Ready condition is Unknown, and the taint-eviction
controller deletes owners whose toleration ran out.
"""

from __future__ import annotations

from contextlib import ExitStack

from kubernetes import client
from kubernetes.client.rest import ApiException

from bundle.cpu_model import make_demo
from localcluster.processes import free_port

from conftest_operator import Api, PlayedNode, condition, running_operator
from polling import wait_for

TAINT = "resident.dev/played-for-nodes"
UNREACHABLE = "node.kubernetes.io/unreachable"


def spec_for(tmp_path, names, port, replicas=2, seed=7, name="bundle"):
    digest = make_demo(tmp_path / name, 256 * 1024, seed=seed).digest
    return {"replicas": replicas, "bundle": {"source": f"file://{tmp_path / name}", "digest": digest},
            "runtime": {"port": port},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": names}]}]}}}}


def played_nodes(stack, cluster, namespace, tmp_path, names):
    nodes = {}
    for i, name in enumerate(names):
        nodes[name] = stack.enter_context(PlayedNode(cluster, namespace, tmp_path / name, name,
                                                     capacity={"pods": "1"}, ip=f"127.0.0.{i + 1}"))
        Api(cluster, namespace).core.patch_node(name, {"spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}]}})
    return nodes


def live_owners(api: Api, model: str):
    return sorted((p for p in api.pods(f"resident.dev/model={model}") if not p.metadata.deletion_timestamp),
                  key=lambda p: p.metadata.name)


def budget(api: Api, model: str) -> dict:
    return client.PolicyV1Api(api.core.api_client).read_namespaced_pod_disruption_budget(
        model, api.ns).to_dict()


def budget_events(api: Api, model: str) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in api.core.list_namespaced_event(api.ns).items
            if e.involved_object.kind == "PodDisruptionBudget" and e.involved_object.name == model]


def evict(api: Api, pod: str) -> int:
    """POST the Pod's eviction (what kubectl drain does); the HTTP status."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=api.ns))
    try:
        api.core.create_namespaced_pod_eviction(pod, api.ns, body)
        return 201
    except ApiException as e:
        return e.status


def test_evictions_follow_the_budget_and_kubectl_scale_moves_it(cluster, namespace, tmp_path):
    api, port = Api(cluster, namespace), free_port()
    names = [f"pdb-{x}-{namespace}" for x in "abc"]
    with ExitStack() as stack:
        nodes = played_nodes(stack, cluster, namespace, tmp_path, names)
        stack.enter_context(running_operator(namespace, RESIDENT_OWNER_HOST=""))
        api.create_model("lm", spec_for(tmp_path, names, port))
        wait_for(lambda: (api.model("lm").get("status") or {}).get("ready") == "2/2", timeout=90, what="2/2 ready")
        # the disruption controller reads the expected owners from the scale subresource;
        # when the session's CRD is younger than the controller-manager's 30 s discovery
        # refresh it fails first, and the operator's resync makes it compute the budget again
        status = wait_for(lambda: (budget(api, "lm")["status"] or {}).get("expected_pods") == 2
                          and budget(api, "lm")["status"]["disruptions_allowed"] == 1
                          and budget(api, "lm")["status"], timeout=60, what="the budget allows one disruption")
        assert (status["current_healthy"], status["desired_healthy"]) == (2, 1)
        failures = [m for r, m in budget_events(api, "lm") if r == "CalculateExpectedPodCountFailed"]
        assert all('no matches for kind "ResidentModel"' in m for m in failures), failures

        (first, evicted), (second, _) = ((p.metadata.name, p.metadata.uid) for p in live_owners(api, "lm"))
        assert evict(api, first) == 201
        assert evict(api, second) == 429     # the first is not back yet: the budget refuses
        assert api.core.read_namespaced_pod(second, namespace).metadata.deletion_timestamp is None
        # the evicted owner is replaced, and the budget recovers. The replacement is told by
        # its UID: it keeps the name when the operator sees the eviction only once the Pod is
        # gone (a new incarnation only while the old Pod still terminates: naming.py)
        wait_for(lambda: len([p for p in live_owners(api, "lm") if p.metadata.uid != evicted]) == 2
                 and (api.model("lm").get("status") or {}).get("ready") == "2/2", timeout=60,
                 what="the evicted owner replaced and ready")
        wait_for(lambda: budget(api, "lm")["status"]["disruptions_allowed"] == 1, timeout=30,
                 what="the budget allows one disruption again")

        cluster.kubectl("scale", "residentmodel/lm", "--replicas=3", "-n", namespace)
        wait_for(lambda: (api.model("lm").get("status") or {}).get("ready") == "3/3", timeout=90, what="3/3 ready")
        wait_for(lambda: budget(api, "lm")["status"]["expected_pods"] == 3
                 and budget(api, "lm")["status"]["disruptions_allowed"] == 1, timeout=30,
                 what="the budget expects three owners")
        assert {p.spec.node_name for p in live_owners(api, "lm")} == set(names)   # one per node
        assert [m for r, m in budget_events(api, "lm") if r == "CalculateExpectedPodCountFailed"] == failures
        for n in nodes.values():
            assert not n.errors, n.errors[-1]


def is_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def lose(api: Api, node: PlayedNode) -> None:
    """The node stops: its kubelet and bridge stop answering (the played loop ends). Then
    what the node lifecycle controller does after --node-monitor-grace-period without a
    heartbeat (50 s in this cluster, so the test does it at once): the Node's Ready turns
    Unknown and its Pods' Ready False (MarkPodsNotReady). The controller itself then taints
    the node, and the taint-eviction controller evicts."""
    node._stop.set()
    node._thread.join(15)
    api.core.patch_node_status(node.name, {"status": {"conditions": [{
        "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": "2020-01-01T00:00:00Z", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}})
    for pod in api.pods():
        if pod.spec.node_name == node.name:
            api.core.patch_namespaced_pod_status(pod.metadata.name, api.ns, {"status": {
                "conditions": [{"type": "Ready", "status": "False"}]}})


def test_a_lost_node_is_named_its_owner_replaced_and_its_lease_released(cluster, namespace, tmp_path):
    api, port = Api(cluster, namespace), free_port()
    names = [f"loss-{x}-{namespace}" for x in "abc"]
    with ExitStack() as stack:
        nodes = played_nodes(stack, cluster, namespace, tmp_path, names)
        stack.enter_context(running_operator(namespace, RESIDENT_OWNER_HOST="",
                                             RESIDENT_NODE_LOSS_TOLERATION_SECONDS="2"))
        spec = spec_for(tmp_path, names, port)
        api.create_model("lm", spec)
        wait_for(lambda: (api.model("lm").get("status") or {}).get("ready") == "2/2", timeout=90, what="2/2 ready")
        # a transition leaves one BundleDelivery (the live revision's lease) per owner
        target = spec_for(tmp_path, names, port, seed=8, name="next")["bundle"]
        api.patch_spec("lm", {"bundle": target})
        wait_for(lambda: ((api.model("lm").get("status") or {}).get("lastTransition") or {}).get("result")
                 == "succeeded" and api.model("lm")["status"]["ready"] == "2/2", timeout=120,
                 what="the transition")
        owners = {p.metadata.name: p for p in live_owners(api, "lm")}
        lost_pod = next(p for p in owners.values() if p.metadata.labels["resident.dev/slot"] == "1")
        lost_node = nodes[lost_pod.spec.node_name]
        lost_delivery = next(bd for bd in api.deliveries() if bd["spec"]["podUID"] == lost_pod.metadata.uid)
        pods = client.CoreV1Api(api.core.api_client).read_namespaced_pod(lost_pod.metadata.name, namespace)
        tolerations = {t.key: t.toleration_seconds for t in pods.spec.tolerations if t.effect == "NoExecute"}
        assert tolerations[UNREACHABLE] == 2 and tolerations["node.kubernetes.io/not-ready"] == 2

        lose(api, lost_node)
        # the controller-manager taints the node; the taint manager evicts the owner 2 s later
        wait_for(lambda: any(t.key == UNREACHABLE and t.effect == "NoExecute"
                             for t in api.core.read_node(lost_node.name).spec.taints or []),
                 timeout=30, what="the node lifecycle controller's unreachable taint")
        gone = wait_for(lambda: api.core.read_namespaced_pod(lost_pod.metadata.name, namespace)
                        if api.core.read_namespaced_pod(lost_pod.metadata.name, namespace).metadata.deletion_timestamp
                        else None, timeout=30, what="the taint manager's eviction")
        assert any(c.type == "DisruptionTarget" and c.reason == "DeletionByTaintManager"
                   for c in gone.status.conditions)
        # the owner is replaced on the free node while the old Pod stays Terminating
        def whole_again():
            s = api.model("lm")["status"]
            successor = [o for o in s["owners"] if o["slot"] == 1 and o["pod"] != lost_pod.metadata.name]
            return s["ready"] == "2/2" and successor and successor[0]["ready"] and s
        s = wait_for(whole_again, timeout=60, what="serving at full strength again")
        old = next(o for o in s["owners"] if o["pod"] == lost_pod.metadata.name)
        assert (old["node"], old["reason"]) == (lost_node.name, "NodeLost") and lost_node.name in old["message"]
        successor = next(o for o in s["owners"] if o["slot"] == 1 and o["pod"] != lost_pod.metadata.name)
        assert successor["ready"] and successor["node"] not in (lost_node.name, lost_pod.spec.node_name)
        assert successor["node"] in names and successor["identity"]["bundle"] == target["digest"]
        assert api.core.read_namespaced_pod(lost_pod.metadata.name, namespace).metadata.deletion_timestamp
        degraded = [e.message for e in api.events("lm") if e.reason == "NodeLost"]
        assert degraded and f"owner {lost_pod.metadata.name} on node {lost_node.name}" in degraded[0]
        assert condition(api.model("lm"), "Degraded")["status"] == "False"
        # the lost owner's delivery is deleted; its lease waits for the node's bridge
        bd = wait_for(lambda: next((b for b in api.deliveries() if b["metadata"]["uid"] == lost_delivery["metadata"]["uid"]
                                    and b["metadata"].get("deletionTimestamp")), None),
                      timeout=30, what="the lost owner's BundleDelivery deleted")
        assert "bundles.resident.dev/lease" in bd["metadata"]["finalizers"]

        # the node comes back: its kubelet finishes the Pod's deletion, its bridge releases
        # the lease; nothing of the old incarnation is left, in the cluster or in the records
        lost_node.sync()
        wait_for(lambda: not [p for p in api.pods("resident.dev/model=lm") if p.metadata.uid == lost_pod.metadata.uid]
                 and not [b for b in api.deliveries() if b["metadata"]["uid"] == lost_delivery["metadata"]["uid"]],
                 timeout=30, what="the old Pod and its delivery gone")
        old_uids = {lost_pod.metadata.uid, lost_delivery["metadata"]["uid"]}
        s = wait_for(lambda: not old_uids & {c["uid"] for c in api.model("lm")["status"]["children"]}
                     and not [o for o in api.model("lm")["status"]["owners"] if o["pod"] == lost_pod.metadata.name]
                     and api.model("lm")["status"], timeout=30, what="the records forget the old incarnation")
        assert s["ready"] == "2/2" and s["phase"] == "Ready"
        assert lost_node.owners == {}
        for n in nodes.values():
            assert not n.errors, n.errors[-1]
