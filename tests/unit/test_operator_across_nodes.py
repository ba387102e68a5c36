"""Across nodes: default spread, node-loss tolerations, no pinning, a lost owner in status,
and the deliveries of replaced owners."""

import pytest

from resident_operator.delivery import deliveries_of_gone_owners
from resident_operator.disruption import RESYNC_ANNOTATION, resync_due, sync_failure
from resident_operator.observe import derive_status, owner_view
from resident_operator.placement import build_owner_pod
from resident_operator.pod_template import template_hash
from resident_operator.pod_verdicts import evicted_by_taint
from resident_operator.settings import OperatorSettings, SettingsError, settings_from_env
from resident_operator.spec import parse_spec
from resident_operator.transition import OwnerProgress, Step, TransitionState, slots_in_hand

A = "sha256:" + "aa" * 32
SETTINGS = OperatorSettings(owner_image="resident:dev")
UNREACHABLE, NOT_READY = "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"


def spec(**over):
    return parse_spec({"bundle": {"source": "file:///m/tiny", "digest": A}, **over})


def pod_spec(s, settings=SETTINGS):
    return build_owner_pod("tiny", "uid-1", s, settings, 0, 0, A, "file:///m/tiny")["spec"]


# -- spread ---------------------------------------------------------------------------------
def test_owners_spread_one_per_node_by_default_as_a_preference():
    tsc, = pod_spec(spec())["topologySpreadConstraints"]
    assert tsc == {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                   "whenUnsatisfiable": "ScheduleAnyway",
                   "labelSelector": {"matchLabels": {"resident.dev/model-uid": "uid-1",
                                                     "resident.dev/component": "owner"}}}


def test_the_models_own_spread_replaces_the_default():
    own = {"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
    tsc, = pod_spec(spec(topologySpreadConstraints=[own]))["topologySpreadConstraints"]
    assert tsc["topologyKey"] == "zone" and tsc["whenUnsatisfiable"] == "DoNotSchedule"


def test_the_installation_sets_or_turns_off_the_default_spread():
    hard = OperatorSettings(owner_spread_topology_key="zone", owner_spread_max_skew=2,
                            owner_spread_when_unsatisfiable="DoNotSchedule")
    tsc, = pod_spec(spec(), hard)["topologySpreadConstraints"]
    assert (tsc["topologyKey"], tsc["maxSkew"], tsc["whenUnsatisfiable"]) == ("zone", 2, "DoNotSchedule")
    assert "topologySpreadConstraints" not in pod_spec(spec(), OperatorSettings(owner_spread_topology_key=""))


def test_spread_and_toleration_settings_come_from_the_environment():
    got = settings_from_env({"RESIDENT_NODE_LOSS_TOLERATION_SECONDS": "0",
                             "RESIDENT_OWNER_SPREAD_TOPOLOGY_KEY": "",
                             "RESIDENT_OWNER_SPREAD_WHEN_UNSATISFIABLE": "DoNotSchedule"})
    assert got.node_loss_toleration_seconds == 0 and got.owner_spread_topology_key == ""
    assert got.owner_spread_when_unsatisfiable == "DoNotSchedule"
    with pytest.raises(SettingsError):
        settings_from_env({"RESIDENT_OWNER_SPREAD_WHEN_UNSATISFIABLE": "Sometimes"})
    with pytest.raises(SettingsError):
        settings_from_env({"RESIDENT_NODE_LOSS_TOLERATION_SECONDS": "-1"})


# -- node loss tolerations ------------------------------------------------------------------
def test_owners_tolerate_a_lost_node_briefly_instead_of_five_minutes():
    tolerations = pod_spec(spec())["tolerations"]
    assert tolerations == [
        {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10},
        {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10}]
    quick = pod_spec(spec(), OperatorSettings(node_loss_toleration_seconds=3))["tolerations"]
    assert {t["tolerationSeconds"] for t in quick} == {3}


def test_a_models_own_toleration_of_a_node_loss_taint_is_kept():
    own = {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 600}
    tolerations = pod_spec(spec(tolerations=[own]))["tolerations"]
    assert [(t["key"], t.get("tolerationSeconds")) for t in tolerations] == [(UNREACHABLE, 600), (NOT_READY, 10)]
    everything = pod_spec(spec(tolerations=[{"operator": "Exists"}]))["tolerations"]
    assert everything == [{"key": "", "operator": "Exists", "value": "", "effect": ""}]
    # a NoSchedule toleration of the same key does not cover the eviction
    no_schedule = {"key": NOT_READY, "operator": "Exists", "effect": "NoSchedule"}
    keys = [t["key"] for t in pod_spec(spec(tolerations=[no_schedule]))["tolerations"]]
    assert keys == [NOT_READY, UNREACHABLE, NOT_READY]


def test_the_template_hash_follows_the_toleration_and_spread_settings():
    base = template_hash("tiny", spec(), SETTINGS)
    assert template_hash("tiny", spec(), OperatorSettings(owner_image="resident:dev",
                                                          node_loss_toleration_seconds=30)) != base
    assert template_hash("tiny", spec(), OperatorSettings(owner_image="resident:dev",
                                                          owner_spread_topology_key="")) != base


# -- cordon -------------------------------------------------------------------------------------
def test_placement_is_the_schedulers_so_a_cordoned_node_gets_no_owner():
    """No owner Pod names its node or tolerates the cordon taint; a replacement is built
    like any owner, whatever node its predecessor ran on."""
    for s in (spec(), spec(replicas=3, nodeSelector={"pool": "npu"})):
        for incarnation in (0, 3):
            p = build_owner_pod("tiny", "uid-1", s, SETTINGS, 1, incarnation, A, "file:///m/tiny")["spec"]
            assert "nodeName" not in p and "affinity" not in p
            assert not any(t.get("key") == "node.kubernetes.io/unschedulable" for t in p["tolerations"])


# -- a lost owner ---------------------------------------------------------------------------
def pod(name, slot=0, incarnation=0, node="n1", ready=True, deleting=False, evicted=False):
    meta = {"name": name, "uid": "uid-" + name,
            "labels": {"resident.dev/slot": str(slot), "resident.dev/incarnation": str(incarnation)}}
    if deleting or evicted:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    conditions = [{"type": "Ready", "status": "True" if ready and not evicted else "False"}]
    if evicted:   # what the taint-eviction controller writes before its delete
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                           "message": "Taint manager: deleting due to NoExecute taint"})
    return {"metadata": meta, "spec": {"nodeName": node},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": conditions}}


def ident():
    return {"state": "ready", "identity": {"bundle": A}}


def derive(owners, replicas=2):
    out = derive_status(replicas=replicas, owners=owners, problems=[], transition=None,
                        last_transition=None, blocker=None, desired_digest=A)
    return out, {x["type"]: x for x in out["conditions"]}


def test_only_the_taint_managers_deletion_is_a_node_loss():
    assert evicted_by_taint(pod("m-owner-0", evicted=True))
    assert not evicted_by_taint(pod("m-owner-0", deleting=True))   # deleted by someone else
    drained = pod("m-owner-0", deleting=True)
    drained["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                            "reason": "EvictionByEvictionAPI"})
    assert not evicted_by_taint(drained)


def test_a_lost_owner_degrades_the_model_naming_owner_node_and_replacement():
    lost = owner_view(pod("m-owner-1", slot=1, node="node-b", evicted=True))
    other = owner_view(pod("m-owner-0", slot=0, node="node-a"), ident())
    out, by = derive([other, lost])
    assert by["Degraded"]["status"] == "True" and by["Degraded"]["reason"] == "NodeLost"
    assert "owner m-owner-1 on node node-b" in by["Degraded"]["message"]
    assert "no replacement is placed yet" in by["Degraded"]["message"]
    entry = next(o for o in out["owners"] if o["pod"] == "m-owner-1")
    assert entry["node"] == "node-b" and entry["reason"] == "NodeLost"
    assert "node-b" in entry["message"] and entry["ready"] is False
    assert out["phase"] == "Degraded" and out["ready"] == "1/2"

    pending = owner_view(pod("m-owner-1-r1", slot=1, incarnation=1, node="", ready=False))
    _, by = derive([other, lost, pending])
    assert "its replacement m-owner-1-r1 is not ready yet" in by["Degraded"]["message"]


def test_once_the_replacement_is_ready_the_model_is_whole_and_the_lost_owner_still_listed():
    lost = owner_view(pod("m-owner-1", slot=1, node="node-b", evicted=True))
    successor = owner_view(pod("m-owner-1-r1", slot=1, incarnation=1, node="node-c"), ident())
    other = owner_view(pod("m-owner-0", slot=0, node="node-a"), ident())
    out, by = derive([other, lost, successor])
    assert by["Degraded"]["status"] == "False" and out["phase"] == "Ready" and out["ready"] == "2/2"
    assert [(o["pod"], o["node"], o.get("reason")) for o in out["owners"]] == [
        ("m-owner-0", "node-a", None), ("m-owner-1", "node-b", "NodeLost"), ("m-owner-1-r1", "node-c", None)]


def test_a_lost_owner_of_a_slot_scaled_away_is_not_waited_for():
    lost = owner_view(pod("m-owner-1", slot=1, node="node-b", evicted=True))
    other = owner_view(pod("m-owner-0", slot=0, node="node-a"), ident())
    _, by = derive([other, lost], replicas=1)
    assert by["Degraded"]["status"] == "False"


# -- the deliveries of replaced owners ----------------------------------------------------------
def delivery(name, pod_uid, deleting=False):
    meta = {"name": name, "uid": "bd-" + name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"podUID": pod_uid, "podName": "p", "nodeName": "n"}}


def test_deliveries_into_pods_that_are_no_live_owner_are_released():
    kept, old, going = delivery("m-1-r1-aa", "uid-new"), delivery("m-1-aa", "uid-old"), \
        delivery("m-0-aa", "uid-gone", deleting=True)
    assert deliveries_of_gone_owners([kept, old, going], {"uid-new"}) == [old]


# -- a transition's own slots -------------------------------------------------------------------
def test_a_transition_leaves_the_replacement_of_its_done_owners_to_placement():
    t = TransitionState(id="t", **{"from": A}, fromSource="s", to=A, toSource="s", strategy="Reload",
                        path="WholeBundle", generation=1, startedAt=0.0,
                        owners=[OwnerProgress(slot=0, pod="p0", podUID="u0", step=Step.done),
                                OwnerProgress(slot=1, pod="p1", podUID="u1", step=Step.applying),
                                OwnerProgress(slot=2, pod="p2", podUID="u2")])
    assert slots_in_hand(t) == {1, 2}


# -- the disruption budget ------------------------------------------------------------------
def failed_budget(annotations=None):
    return {"metadata": {"name": "m", "annotations": annotations or {}},
            "status": {"disruptionsAllowed": 0, "conditions": [{
                "type": "DisruptionAllowed", "status": "False", "reason": "SyncFailed",
                "message": 'no matches for kind "ResidentModel" in version "resident.dev/v1alpha1"'}]}}


def test_a_budget_the_disruption_controller_could_not_compute_is_touched_every_ten_seconds():
    assert "no matches for kind" in sync_failure(failed_budget())
    fine = {"status": {"conditions": [{"type": "DisruptionAllowed", "status": "True", "reason": "SufficientPods"}]}}
    assert sync_failure(fine) == "" and sync_failure({}) == ""
    assert resync_due(failed_budget(), now=1000.0)
    assert not resync_due(failed_budget({RESYNC_ANNOTATION: "995"}), now=1000.0)
    assert resync_due(failed_budget({RESYNC_ANNOTATION: "990"}), now=1000.0)
    assert resync_due(failed_budget({RESYNC_ANNOTATION: "garbage"}), now=1000.0)
