"""Conditions with stable times, status derivation from owners, children and orphans."""

from datetime import datetime, timedelta, timezone

from resident_operator import conditions as c
from resident_operator.children import forget, orphans, record
from resident_operator.observe import Blocker, derive_status, owner_view
from resident_operator.transition import OwnerProgress, TransitionState

import pytest

A = "sha256:" + "aa" * 32
B = "sha256:" + "bb" * 32
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_last_transition_time_only_moves_when_status_changes():
    first = c.merge_conditions([], [c.condition("Ready", False, "OwnersNotReady", "0/1")], now=T0, generation=1)
    later = T0 + timedelta(minutes=5)
    same = c.merge_conditions(first, [c.condition("Ready", False, "StillWaiting", "0/1")], now=later, generation=2)
    assert same[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert same[0]["reason"] == "StillWaiting" and same[0]["observedGeneration"] == 2
    flipped = c.merge_conditions(same, [c.condition("Ready", True, "AllOwnersReady", "1/1")], now=later, generation=2)
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T00:05:00Z"


def test_foreign_conditions_are_kept_and_ours_ordered():
    prev = [{"type": "Custom", "status": "True", "reason": "x", "message": "", "lastTransitionTime": "t"}]
    out = c.merge_conditions(prev, [c.condition(t, True, "r") for t in reversed(c.ALL_TYPES)], now=T0, generation=1)
    assert [x["type"] for x in out] == list(c.ALL_TYPES) + ["Custom"]


def pod(name="m-owner-0", slot=0, phase="Running", ready=True, node="n1", deleting=False):
    meta = {"name": name, "uid": "uid-" + name,
            "labels": {"resident.dev/slot": str(slot), "resident.dev/incarnation": "0"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node},
            "status": {"phase": phase, "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def ident(state="ready", bundle=A):
    return {"state": state, "identity": {"bundle": bundle, "graph": "g", "weights": "w"},
            "capabilities": {"inPlace": True}}


def derive(**kw):
    args = dict(replicas=1, owners=[], problems=[], transition=None, last_transition=None,
                blocker=None, desired_digest=A)
    args.update(kw)
    out = derive_status(**args)
    out["by_type"] = {x["type"]: x for x in out["conditions"]}
    return out


def test_ready_model():
    s = derive(owners=[owner_view(pod(), ident())])
    assert s["phase"] == "Ready" and s["ready"] == "1/1"
    assert s["identity"] == {"bundle": A, "graph": "g", "weights": "w"}
    assert all(s["by_type"][t]["status"] == "True" for t in ("Delivered", "Resident", "Ready"))
    assert s["by_type"]["Degraded"]["status"] == "False"
    o, = s["owners"]
    assert (o["pod"], o["uid"], o.get("node"), o["ready"], o["state"], o["inPlace"]) == \
        ("m-owner-0", "uid-m-owner-0", "n1", True, "ready", True)


def test_pending_delivering_loading():
    assert derive(owners=[owner_view(pod(phase="Pending", ready=False, node=""))])["phase"] == "Pending"
    assert derive(owners=[owner_view(pod(phase="Pending", ready=False))])["phase"] == "Delivering"
    s = derive(owners=[owner_view(pod(ready=False), ident(state="loading"))])
    assert s["phase"] == "Loading" and s["by_type"]["Resident"]["status"] == "False"


def test_invalid_spec_is_degraded_invalid_spec():
    s = derive(problems=["spec.x is wrong"], replicas=0)
    assert s["phase"] == "Degraded"
    assert s["by_type"]["Degraded"]["reason"] == "InvalidSpec"
    assert "spec.x is wrong" in s["by_type"]["Degraded"]["message"]


def test_quarantined_owner_and_blocker_and_failed_transition_degrade():
    s = derive(owners=[owner_view(pod(), ident(state="quarantined"))])
    assert (s["phase"], s["by_type"]["Degraded"]["reason"]) == ("Degraded", "OwnerQuarantined")
    s = derive(owners=[owner_view(pod(), ident())], blocker=Blocker("SourceUnavailable", "gone"))
    assert s["by_type"]["Degraded"]["reason"] == "SourceUnavailable"
    last = {"to": B, "result": "failed", "reason": "DeliveryFailed", "message": "boom"}
    s = derive(owners=[owner_view(pod(), ident())], last_transition=last, desired_digest=B)
    assert s["by_type"]["Degraded"]["reason"] == "DeliveryFailed" and s["phase"] == "Degraded"
    assert s["by_type"]["Transitioning"]["reason"] == "TransitionFailed"
    s = derive(owners=[owner_view(pod(), ident())], last_transition=last, desired_digest="sha256:" + "cc" * 32)
    assert s["by_type"]["Degraded"]["status"] == "False"


def test_transitioning():
    t = TransitionState(id="t", **{"from": A}, to=B, toSource="s", strategy="InPlace", path="GraphOnly",
                        startedAt=0, owners=[OwnerProgress(slot=0, pod="p", podUID="u")])
    s = derive(owners=[owner_view(pod(), ident())], transition=t)
    assert s["phase"] == "Transitioning" and s["by_type"]["Transitioning"]["status"] == "True"
    assert "0/1 owners done" in s["by_type"]["Transitioning"]["message"]


def test_terminating_pods_do_not_count_and_mixed_identity_is_empty():
    s = derive(replicas=2, owners=[owner_view(pod(), ident()),
                                   owner_view(pod("m-owner-1", 1), ident(bundle=B))])
    assert s["identity"] == {} and s["ready"] == "2/2"
    s = derive(owners=[owner_view(pod(deleting=True), ident())])
    assert s["ready"] == "0/1" and s["phase"] != "Ready"


def test_children_record_forget_and_orphans():
    kids = record([], {"kind": "Pod", "name": "p", "uid": "1", "apiVersion": "v1"})
    kids = record(kids, {"kind": "Pod", "name": "p", "uid": "1", "apiVersion": "v1"})
    assert len(kids) == 1
    with pytest.raises(ValueError, match="without a UID"):
        record(kids, {"kind": "Pod", "name": "q", "uid": ""})
    objs = [{"metadata": {"name": "p", "uid": "1"}}, {"metadata": {"name": "p", "uid": "2"}},
            {"metadata": {"name": "z", "uid": "3", "deletionTimestamp": "x"}}]
    assert [o["metadata"]["uid"] for o in orphans(objs, kids)] == ["2"]
    assert forget(kids, "1") == []


def test_unchanged_status_is_not_patched_again():
    from resident_operator.reconcile import changed
    status = {"phase": "Ready", "ready": "1/1", "owners": [{"pod": "p"}]}
    assert not changed(status, {"phase": "Ready", "ready": "1/1", "owners": [{"pod": "p"}], "identity": None})
    assert changed(status, {"phase": "Degraded"})
    assert changed({**status, "identity": {"bundle": A}}, {"identity": None})
