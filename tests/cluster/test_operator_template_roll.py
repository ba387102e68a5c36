"""A Pod-template change rolls the owners: real API server, real operator, real owners.

Two played nodes (conftest_operator.PlayedNode) with room for one Pod each run the real
owner runtime on their own loopback address (127.0.0.1 and 127.0.0.2), so the two owners
of one model can use the same port, as they would on two machines. The operator reaches
them at their Pod IPs.
"""

from __future__ import annotations

import threading
import time

from bundle.cpu_model import make_demo
from localcluster.processes import free_port

from conftest_operator import Api, PlayedNode, running_operator
from polling import wait_for

TEMPLATE = "resident.dev/pod-template-hash"
TAINT = "resident.dev/played-for-template-roll"


def live_owners(api: Api):
    return [p for p in api.pods("resident.dev/model=lm") if not p.metadata.deletion_timestamp]


def is_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def test_an_image_change_rolls_two_owners_one_at_a_time(cluster, namespace, tmp_path):
    api, port = Api(cluster, namespace), free_port()
    digest = make_demo(tmp_path / "bundle", 256 * 1024, seed=5).digest
    # Nodes of their own: a Pod another test left bound to "node-a" would take the one slot
    # of a new Node of that name, and a Pod left Pending must not land on these.
    nodes = [f"roll-{x}-{namespace}" for x in "ab"]
    spec = {"replicas": 2, "bundle": {"source": f"file://{tmp_path / 'bundle'}", "digest": digest},
            "runtime": {"port": port},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}}}
    one_pod = {"pods": "1"}
    with PlayedNode(cluster, namespace, tmp_path / "a", nodes[0], capacity=one_pod) as a, \
            PlayedNode(cluster, namespace, tmp_path / "b", nodes[1], capacity=one_pod, ip="127.0.0.2") as b, \
            running_operator(namespace, RESIDENT_OWNER_HOST=""):
        for node in nodes:
            api.core.patch_node(node, {"spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}]}})
        api.create_model("lm", spec)
        wait_for(lambda: (api.model("lm").get("status") or {}).get("ready") == "2/2", timeout=90,
                 what="2/2 ready")
        before = api.model("lm")["status"]
        old = {p.metadata.uid: p.metadata.annotations[TEMPLATE] for p in live_owners(api)}
        assert len(old) == 2 and len(set(old.values())) == 1

        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                samples.append({p.metadata.uid: is_ready(p) for p in live_owners(api)})
                time.sleep(0.05)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            api.patch_spec("lm", {"runtime": {"image": "resident-owner:v2", "port": port}})
            wait_for(lambda: len([p for p in live_owners(api) if p.metadata.uid not in old and is_ready(p)]) == 2
                     and (api.model("lm").get("status") or {}).get("ready") == "2/2", timeout=60,
                     what="both owners replaced and ready")
        finally:
            stop.set()
            sampler.join(5)
        pods = live_owners(api)
        assert {p.spec.containers[0].image for p in pods} == {"resident-owner:v2"}
        new_hash = {p.metadata.annotations[TEMPLATE] for p in pods}
        assert len(new_hash) == 1 and new_hash != set(old.values())
        assert {p.spec.node_name for p in pods} == set(nodes)
        # one at a time: never fewer than one ready owner, and the second new owner
        # appeared only once the first was ready
        assert min(sum(s.values()) for s in samples if s) >= 1
        new = [uid for s in samples for uid in s if uid not in old]
        first, second = dict.fromkeys(new)
        assert next(s for s in samples if second in s)[first] is True
        # the revision did not change, and no transition ran
        after = api.model("lm")["status"]
        assert after["bundle"] == before["bundle"] and after["identity"]["bundle"] == digest
        assert after.get("lastTransition") == before.get("lastTransition") is None
        wait_for(lambda: api.reasons("lm").count("OwnerPodRolled") == 2, timeout=30,
                 what="an OwnerPodRolled Event per owner")
    assert not a.errors and not b.errors, (a.errors + b.errors)[-1]
