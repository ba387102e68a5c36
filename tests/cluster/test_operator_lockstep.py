"""Lockstep switches (spec.transition.commit: Lockstep) of three owners on three played nodes.

Each played node runs the real owner HTTP server (two-step transitions: prepare, then
commit or abort) and stages its BundleDeliveries; a node's staging can be held, which
keeps its owner from preparing. Everything the operator sees is real API objects and real
owner answers.
"""

from __future__ import annotations

import signal

import pytest

from bundle.cpu_model import make_demo, make_revision
from localcluster.processes import free_port

from conftest_operator import Api, PlayedNode, operator_process, running_operator
from polling import wait_for

SIZE, CHUNK = 256 * 1024, 64 * 1024
TAINT = "resident.dev/test-lockstep"


@pytest.fixture(scope="module")
def revisions(tmp_path_factory):
    root = tmp_path_factory.mktemp("lockstep-bundles")
    d = {"base": make_demo(root / "base", SIZE, seed=51, chunk_size=CHUNK).digest}
    for i, name in enumerate(("rows", "rows2", "rows3")):
        d[name] = make_revision(root / "base", root / name, "rows", seed=52 + i, fraction=0.05,
                                chunk_size=CHUNK).digest
    return root, d


@pytest.fixture
def nodes(cluster, namespace, tmp_path):
    names = [f"lock-{x}-{namespace}" for x in "abc"]
    played = [PlayedNode(cluster, namespace, tmp_path / n, n, capacity={"pods": "1"}, ip=f"127.0.0.{i + 1}")
              for i, n in enumerate(names)]
    for node in played:
        node.__enter__()
    try:
        api = Api(cluster, namespace)
        for n in names:
            api.core.patch_node(n, {"spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}]}})
        yield played
    finally:
        for node in played:
            node.__exit__(None, None, None)
    errors = [e for node in played for e in node.errors]
    assert not errors, errors[-1]


def spec_for(revisions, name, port, names, **transition):
    root, d = revisions
    return {"replicas": 3, "bundle": {"source": f"file://{root / name}", "digest": d[name]},
            "runtime": {"port": port},
            "transition": {"commit": "Lockstep", "timeoutSeconds": 60, "keepPrevious": False, **transition},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": names}]}]}}}}


def status(api):
    return (api.model("lm") or {}).get("status") or {}


def ready_on(api, digest):
    s = status(api)
    return (s.get("phase") == "Ready" and s.get("ready") == "3/3" and not s.get("transition")
            and (s.get("identity") or {}).get("bundle") == digest and s)


def owner_transitions(nodes):
    """Every owner's transitions, as the owners recorded them."""
    return [st for node in nodes for owner, _, _ in node.owners.values() for st in owner.transitions.values()]


def assert_one_barrier(records):
    """Every owner committed only after every owner had prepared."""
    assert len(records) == 3 and all(r.commit == "Deferred" and r.result == "succeeded" for r in records)
    assert min(r.committed_at for r in records) >= max(r.prepared_at for r in records)


def test_three_owners_prepare_then_commit_at_one_barrier(cluster, namespace, nodes, revisions):
    _, d = revisions
    api, port, names = Api(cluster, namespace), free_port(), [n.name for n in nodes]
    with running_operator(namespace, RESIDENT_OWNER_HOST=""):
        api.create_model("lm", spec_for(revisions, "base", port, names))
        wait_for(lambda: ready_on(api, d["base"]), timeout=90, what="3/3 on base")
        api.patch_spec("lm", {"bundle": spec_for(revisions, "rows", port, names)["bundle"]})
        s = wait_for(lambda: ready_on(api, d["rows"]), timeout=60, what="3/3 on rows")
        lt = s["lastTransition"]
        assert (lt["result"], lt["commit"], lt["owners"]) == ("succeeded", "Lockstep", 3)
        assert 0 <= lt["skewSeconds"] < 5
        records = [r for r in owner_transitions(nodes) if r.to == d["rows"]]
        assert_one_barrier(records)
        assert lt["skewSeconds"] == pytest.approx(max(r.committed_at for r in records)
                                                  - min(r.committed_at for r in records), abs=1e-3)
        reasons = api.reasons("lm")
        assert reasons.count("OwnerPrepared") == 3 and "LockstepCommitted" in reasons


def test_an_owner_that_cannot_prepare_keeps_every_replica_on_the_old_revision(
        cluster, namespace, nodes, revisions):
    _, d = revisions
    api, port, names = Api(cluster, namespace), free_port(), [n.name for n in nodes]
    with running_operator(namespace, RESIDENT_OWNER_HOST=""):
        api.create_model("lm", spec_for(revisions, "base", port, names, timeoutSeconds=8))
        wait_for(lambda: ready_on(api, d["base"]), timeout=90, what="3/3 on base")
        stuck = nodes[2]
        stuck.stage_deliveries.clear()   # its owner never gets the revision, so never prepares
        api.patch_spec("lm", {"bundle": spec_for(revisions, "rows2", port, names)["bundle"]})
        s = wait_for(lambda: (status(api).get("lastTransition") or {}).get("to") == d["rows2"] and status(api),
                     timeout=60, what="the lockstep switch to end")
        lt = s["lastTransition"]
        assert (lt["result"], lt["reason"]) == ("failed", "Timeout"), lt
        stuck_pod = next(o["pod"] for o in s["owners"] if o["node"] == stuck.name)
        assert lt["failedOwner"] == stuck_pod and stuck_pod in lt["message"]
        # the two that prepared were told to abort: nothing changed anywhere
        records = [r for r in owner_transitions(nodes) if r.to == d["rows2"]]
        assert len(records) == 2 and {r.result for r in records} == {"aborted"}
        for node in nodes:
            for owner, _, _ in node.owners.values():
                assert owner.identity().identity.bundle == d["base"]
        assert "LockstepAborted" in api.reasons("lm")
        # Degraded follows the failed switch, not always in the same status write
        wait_for(lambda: next(c for c in status(api)["conditions"] if c["type"] == "Degraded")["status"] == "True",
                 timeout=30, what="Degraded after the aborted switch")
        stuck.stage_deliveries.set()


def test_an_operator_restarted_at_the_barrier_still_switches_all_or_nothing(
        cluster, namespace, nodes, revisions, tmp_path):
    _, d = revisions
    api, port, names = Api(cluster, namespace), free_port(), [n.name for n in nodes]
    with running_operator(namespace, RESIDENT_OWNER_HOST=""):
        api.create_model("lm", spec_for(revisions, "base", port, names))
        wait_for(lambda: ready_on(api, d["base"]), timeout=90, what="3/3 on base")
    held = nodes[1]
    held.stage_deliveries.clear()
    with operator_process(namespace, tmp_path / "op.log", RESIDENT_OWNER_HOST="") as proc:
        api.patch_spec("lm", {"bundle": spec_for(revisions, "rows3", port, names)["bundle"]})
        wait_for(lambda: [o.get("step") for o in (status(api).get("transition") or {}).get("owners", [])]
                 .count("Prepared") == 2, timeout=60, what="two owners prepared, one held")
        proc.send_signal(signal.SIGKILL)   # between prepare and commit, saving nothing more
        proc.wait(10)
    held.stage_deliveries.set()            # the third can prepare now, with no operator running
    with running_operator(namespace, RESIDENT_OWNER_HOST=""):
        s = wait_for(lambda: ready_on(api, d["rows3"]), timeout=60, what="3/3 on rows3 after the restart")
    assert s["lastTransition"]["result"] == "succeeded"
    assert_one_barrier([r for r in owner_transitions(nodes) if r.to == d["rows3"]])
