"""The operator is event-driven: what wakes a model, what a settled model costs, bursts,
and a lost watch (API server restart).

The safety resync is set to 120 s in these tests (conftest_operator.OPERATOR_ENV), so
anything that happens within a few seconds was driven by an event, not by a timer.
"""

from __future__ import annotations

import time

from localcluster.processes import free_port
from resident_operator.metrics import REGISTRY

from conftest_operator import Api, PlayedNode, Supervised, running_operator
from polling import wait_for
from test_operator_transitions import (bundles, deliveries, last_result, ready_on,  # noqa: F401
                                       spec_for, status)


def passes() -> float:
    return sum(REGISTRY.get_sample_value("resident_operator_reconciles_total", {"result": r}) or 0
               for r in ("ok", "waiting", "invalid", "error"))


def test_status_follows_an_owner_pod_deletion_at_once_and_a_settled_model_costs_no_pass(
        cluster, namespace, tmp_path, bundles):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with PlayedNode(cluster, namespace, tmp_path) as node, running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "base", port))
        s = wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")
        time.sleep(1.0)                       # let the events of getting there drain
        before = passes()
        time.sleep(3.0)
        assert passes() == before, "a settled model was passed again without any event"

        pod, old_uid = s["owners"][0]["pod"], s["owners"][0]["uid"]
        t0 = time.monotonic()
        api.core.delete_namespaced_pod(pod, namespace)
        s = wait_for(lambda: (status(api).get("ready") == "0/1" or None) and status(api), every=0.02,
                     what="ready 0/1 after the owner Pod's deletion")
        lag = time.monotonic() - t0
        assert s["phase"] != "Ready" and lag < 2.0, (lag, s["phase"])
        s = wait_for(lambda: ready_on(api, d["base"]), what="a new owner Ready")
        assert s["owners"][0]["uid"] != old_uid

        api.patch_spec("lm", {"replicas": 0})
        s = wait_for(lambda: status(api).get("ready") == "0/0" and status(api), what="ready 0/0")
        wait_for(lambda: not api.pods("resident.dev/model=lm"), what="no owner Pod at zero replicas")
        assert status(api)["ready"] == "0/0" and status(api)["phase"] == "Ready"
    assert not node.errors, node.errors[-1]


def test_a_burst_of_spec_changes_coalesces_and_the_last_spec_wins(cluster, namespace, tmp_path, bundles):
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with PlayedNode(cluster, namespace, tmp_path) as node, running_operator(namespace):
        api.create_model("lm", spec_for(bundles, "base", port))
        wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")
        node.stage_deliveries.clear()
        api.patch_spec("lm", {"bundle": spec_for(bundles, "rows", port)["bundle"]})
        wait_for(lambda: deliveries(api), what="the delivery of rows")
        for name in ("base", "rows", "base", "graph"):     # a burst while rows is in flight
            api.patch_spec("lm", {"bundle": spec_for(bundles, name, port)["bundle"]})
        s = wait_for(lambda: (status(api).get("pendingTransition") or {}).get("to") == d["graph"] and status(api),
                     what="graph queued behind rows")
        assert s["transition"]["to"] == d["rows"]
        node.stage_deliveries.set()
        s = wait_for(lambda: ready_on(api, d["graph"]), timeout=45, what="Ready on graph")
        assert s["lastTransition"]["from"] == d["rows"] and not s.get("pendingTransition")
        wait_for(lambda: api.reasons("lm").count("TransitionPlanned") == 2,
                 what="two TransitionPlanned Events (rows, then graph)")
        # base and the intermediate specs never ran; rows' delivery is released
        wait_for(lambda: {bd["spec"]["bundle"]["digest"] for bd in api.deliveries()} == {d["graph"]},
                 what="only graph's delivery left")
    assert not node.errors, node.errors[-1]


def test_a_restarted_api_server_loses_no_step(cluster, namespace, tmp_path, bundles):
    """Watches break while a delivery stages; the Staged status written after the restart
    still moves the transition on, and it ends without the safety resync. The operator runs
    as ``resident operator`` under a supervisor, as deployed: if kopf gives up on a watch
    (a 404 while the restarted server does not serve custom resources yet), the process
    exits with status 1 and is started again, and the transition resumes from status."""
    root, d = bundles
    api, port = Api(cluster, namespace), free_port()
    with PlayedNode(cluster, namespace, tmp_path) as node, \
            Supervised(namespace, tmp_path / "operator.log") as operator:
        api.create_model("lm", spec_for(bundles, "base", port))
        wait_for(lambda: ready_on(api, d["base"]), what="Ready on base")
        node.stage_deliveries.clear()
        api.patch_spec("lm", {"bundle": spec_for(bundles, "rows", port)["bundle"]})
        wait_for(lambda: deliveries(api), what="the delivery of rows")
        before = len(node.errors)
        cluster.restart_apiserver(down_seconds=2.0)
        time.sleep(2.0)     # the played kubelet and bridge reconnect (their errors meanwhile are expected)
        outage = len(node.errors)
        node.stage_deliveries.set()
        s = wait_for(lambda: ready_on(api, d["rows"]), timeout=40, what="Ready on rows after the restart")
        assert s["lastTransition"]["result"] == "succeeded"
        assert api.reasons("lm").count("TransitionPlanned") == 1
        assert set(operator.exits) <= {1}     # if it stopped, it said it failed
    unexpected = node.errors[:before] + node.errors[outage:]
    assert not unexpected, unexpected[-1]
