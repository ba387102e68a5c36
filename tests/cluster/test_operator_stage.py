"""Pre-staged revisions (spec.stage, spec.transition.keepPrevious) through the real bridge.

Two played nodes, each with a real CSI bridge (python -m csi_bridge, the chart's bridge
ServiceAccount, authorization from the API): the bridge publishes the owners' volumes and
stages every BundleDelivery, the pre-staged ones beside the live revision.
"""

from __future__ import annotations

import os

import pytest

from bundle.cpu_model import make_demo, make_revision
from localcluster.processes import free_port
from localcluster.scenario import db_rows

from conftest_operator import Api, PlayedNode, condition, running_operator
from polling import wait_for

SIZE, CHUNK = 256 * 1024, 64 * 1024
TAINT = "resident.dev/test-stage"


@pytest.fixture(scope="module")
def revisions(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage-bundles")
    d = {"base": make_demo(root / "base", SIZE, seed=31, chunk_size=CHUNK).digest,
         "rows": make_revision(root / "base", root / "rows", "rows", seed=32, fraction=0.05,
                               chunk_size=CHUNK).digest,
         "bad": make_revision(root / "base", root / "bad", "rows", seed=33, fraction=0.05,
                              chunk_size=CHUNK).digest}
    weights = root / "bad" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF            # corrupt after the manifest was written
    weights.write_bytes(bytes(data))
    return root, d


def ref(revisions, name):
    root, d = revisions
    return {"source": f"file://{root / name}", "digest": d[name]}


def status(api, name="lm"):
    return (api.model(name) or {}).get("status") or {}


def ready_on(api, digest, replicas=1, name="lm"):
    s = status(api, name)
    return (s.get("phase") == "Ready" and s.get("ready") == f"{replicas}/{replicas}"
            and (s.get("identity") or {}).get("bundle") == digest and not s.get("transition") and s)


def revision_dirs(volume):
    return sorted(os.listdir(volume / "revisions"))


def dirname(digest):
    return digest.replace(":", "-")


@pytest.fixture
def nodes(cluster, namespace, tmp_path):
    names = [f"stage-{x}-{namespace}" for x in "ab"]
    with PlayedNode(cluster, namespace, tmp_path / "a", names[0], capacity={"pods": "1"},
                    real_bridge=True) as a, \
            PlayedNode(cluster, namespace, tmp_path / "b", names[1], capacity={"pods": "1"},
                       ip="127.0.0.2", real_bridge=True) as b:
        api = Api(cluster, namespace)
        for n in names:   # only this test's owners land here, and they land nowhere else
            api.core.patch_node(n, {"spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}]}})
        yield a, b
    assert not a.errors and not b.errors, (a.errors + b.errors)[-1]


def placed(names):
    return {"tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": names}]}]}}}}


def leased(node):
    """The digests the node's store holds a lease on (its bridge's SQLite catalog)."""
    return {digest for digest, in db_rows(node.bridge.root / "data" / "store" / "store.db",
                                          "SELECT digest FROM leases")}


def volume_of(nodes, owner):
    node = next(n for n in nodes if n.name == owner["node"])
    return node.volume(owner["uid"])


def test_stage_then_switch_then_roll_back_without_delivery(cluster, namespace, nodes, revisions):
    _, d = revisions
    api, port = Api(cluster, namespace), free_port()
    spec = {"bundle": ref(revisions, "base"), "stage": ref(revisions, "rows"), "runtime": {"port": port},
            "transition": {"timeoutSeconds": 60}, **placed([n.name for n in nodes])}
    with running_operator(namespace, RESIDENT_OWNER_HOST=""):
        api.create_model("lm", spec)
        s = wait_for(lambda: ready_on(api, d["base"]) and (status(api).get("stage") or {}).get("ready") == "1/1"
                     and status(api), timeout=60, what="Ready on base with rows staged")
        assert condition({"status": s}, "Staged")["status"] == "True"
        assert condition({"status": s}, "Staged")["reason"] == "Staged"
        row, = s["stage"]["nodes"]
        assert row["state"] == "Staged" and row["bytes"]["fetched"] > 0 and row["finishedAt"]
        volume = volume_of(nodes, s["owners"][0])
        # staged beside the live revision, which still serves
        assert revision_dirs(volume) == sorted([dirname(d["base"]), dirname(d["rows"])])
        assert os.readlink(volume / "current") == f"revisions/{dirname(d['base'])}"

        api.patch_spec("lm", {"replicas": 2})   # a later owner gets it staged too
        s = wait_for(lambda: ready_on(api, d["base"], 2) and (status(api).get("stage") or {}).get("ready") == "2/2"
                     and status(api), timeout=90, what="the second owner with rows staged")
        assert {n["node"] for n in s["stage"]["nodes"]} == {n.name for n in nodes}

        api.patch_spec("lm", {"bundle": ref(revisions, "rows")})
        s = wait_for(lambda: ready_on(api, d["rows"], 2), timeout=60, what="Ready on rows")
        lt = s["lastTransition"]
        assert lt["result"] == "succeeded" and lt["prestaged"] is True
        assert lt["bytes"]["fetched"] == 0 and lt["durations"]["stagingSeconds"] == 0
        assert "PrestagedRevisionUsed" in api.reasons("lm") and "DeliveryCreated" not in api.reasons("lm")
        for owner in s["owners"]:   # the bridge pointed `current` at it once the switch activated it
            assert os.readlink(volume_of(nodes, owner) / "current") == f"revisions/{dirname(d['rows'])}"
        s = wait_for(lambda: condition(api.model("lm"), "Staged")["reason"] == "Live" and status(api),
                     what="spec.stage is the live revision")
        assert s["previousBundle"]["digest"] == d["base"]

        # base, the revision left, was kept staged: the rollback skips delivery too
        wait_for(lambda: len([bd for bd in api.deliveries() if bd["spec"]["bundle"]["digest"] == d["base"]
                              and (bd.get("status") or {}).get("phase") == "Staged"]) == 2,
                 what="base kept staged on both owners' nodes")
        # rows, live now and still named by spec.stage, keeps its activated delivery, so each
        # node's store keeps it leased (the volume's own lease stays on base, its first revision)
        live = [bd for bd in api.deliveries() if bd["spec"]["bundle"]["digest"] == d["rows"]]
        assert len(live) == 2 and all(bd["spec"]["activate"] is True for bd in live), live
        for node in nodes:
            assert d["rows"] in leased(node), (node.name, leased(node))
        api.patch_spec("lm", {"bundle": ref(revisions, "base")})
        s = wait_for(lambda: ready_on(api, d["base"], 2), timeout=60, what="rolled back to base")
        assert s["lastTransition"]["prestaged"] is True and s["lastTransition"]["bytes"]["fetched"] == 0

        # nothing kept any more: every pre-staged delivery goes, and its revision leaves the volumes
        api.patch_spec("lm", {"stage": None, "transition": {"keepPrevious": False}})
        wait_for(lambda: {bd["spec"]["bundle"]["digest"] for bd in api.deliveries()} <= {d["base"]}
                 and "stage" not in status(api) and "previousBundle" not in status(api),
                 timeout=30, what="the staged revisions released")
        assert condition(api.model("lm"), "Staged")["reason"] == "NoStage"
        for owner in status(api)["owners"]:
            assert dirname(d["rows"]) not in revision_dirs(volume_of(nodes, owner))
        reasons = api.reasons("lm")
        assert "RevisionStaged" in reasons and "StageReleased" in reasons
        api.delete_model("lm")
        wait_for(lambda: api.model("lm") is None, timeout=45, what="the model gone")
        assert api.deliveries() == []


def test_a_stage_that_fails_says_where_and_why_and_the_live_revision_serves_on(
        cluster, namespace, nodes, revisions):
    _, d = revisions
    api, port = Api(cluster, namespace), free_port()
    spec = {"bundle": ref(revisions, "base"), "stage": ref(revisions, "bad"), "runtime": {"port": port},
            **placed([nodes[0].name])}
    with running_operator(namespace, RESIDENT_OWNER_HOST=""):
        api.create_model("lm", spec)
        cond = wait_for(lambda: condition(api.model("lm"), "Staged").get("reason") == "StageFailed"
                        and condition(api.model("lm"), "Staged"), timeout=60, what="Staged False")
        assert cond["status"] == "False"
        assert nodes[0].name in cond["message"] and "IntegrityMismatch" in cond["message"]
        s = wait_for(lambda: ready_on(api, d["base"]), what="the live revision serving")
        row, = s["stage"]["nodes"]
        assert (row["state"], row["reason"]) == ("Failed", "IntegrityMismatch")
        assert s["stage"]["ready"] == "0/1"
        assert condition({"status": s}, "Degraded")["status"] == "False"   # the live revision is fine
        volume = volume_of(nodes, s["owners"][0])
        assert revision_dirs(volume) == [dirname(d["base"])]
        assert "StageFailed" in api.reasons("lm")
        api.delete_model("lm")
        wait_for(lambda: api.model("lm") is None, timeout=45, what="the model gone")
