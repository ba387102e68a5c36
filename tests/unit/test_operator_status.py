"""Conditions with stable times, status derivation from owners, children and orphans."""

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from resident_operator import conditions as c
from resident_operator.children import forget, orphans, record
from resident_operator.observe import Blocker, derive_status, owner_view
from resident_operator.pod_verdicts import mount_verdict
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


# -- what only the Pod can say: the scheduler's verdict, the owner's exit -------------------
INSUFFICIENT = "0/1 nodes are available: 1 Insufficient furiosa.ai/rngd."
SDK_MISSING = ("BackendUnavailable: the rngd backend needs the Python module 'furiosa_llm' "
               "(pip install furiosa-llm, with the RNGD driver and a furiosa.ai/rngd device); "
               "it is not importable here: No module named 'furiosa_llm'")


def unschedulable_pod(name="m-owner-2-0", slot=2):
    """As kube-scheduler leaves a Pod no node has a card for (no nodeName, no containers)."""
    return {"metadata": {"name": name, "uid": "uid-" + name,
                         "labels": {"resident.dev/slot": str(slot), "resident.dev/incarnation": "0"}},
            "spec": {"containers": [{"name": "owner"}]},
            "status": {"phase": "Pending", "qosClass": "BestEffort",
                       "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                       "message": INSUFFICIENT, "lastProbeTime": None,
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


def crashing_pod(name="m-owner-0-0", slot=0, message=SDK_MISSING, backoff=True, exit_code=1, reason="Error"):
    """As kubelet reports an owner that exited at start: terminated the first time, then
    waiting in CrashLoopBackOff with the exit in lastState (the Pod stays Running)."""
    terminated = {"exitCode": exit_code, "reason": reason, "startedAt": "2026-01-01T00:00:01Z",
                  "finishedAt": "2026-01-01T00:00:02Z", "containerID": "containerd://abc"}
    if message is not None:
        terminated["message"] = message + "\n"
    if backoff:
        state = {"waiting": {"reason": "CrashLoopBackOff",
                             "message": f"back-off 20s restarting failed container=owner pod={name}"}}
        last = {"terminated": terminated}
    else:
        state, last = {"terminated": terminated}, {}
    p = pod(name, slot, ready=False)
    p["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
        {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"}]
    p["status"]["containerStatuses"] = [{"name": "owner", "ready": False, "restartCount": 2, "started": False,
                                         "image": "resident:dev", "imageID": "", "state": state,
                                         "lastState": last}]
    return p


def test_an_unschedulable_owner_names_the_schedulers_message():
    v = owner_view(unschedulable_pod())
    assert v.unschedulable == INSUFFICIENT and v.exit_reason == ""
    s = derive(replicas=3, owners=[owner_view(pod("m-owner-0-0", 0), ident()),
                                   owner_view(pod("m-owner-1-0", 1), ident()), v])
    delivered = s["by_type"]["Delivered"]
    assert (delivered["status"], delivered["reason"]) == ("False", "Unschedulable")
    assert delivered["message"] == f"2/3 owner volumes published; 1 owner not scheduled; m-owner-2-0: {INSUFFICIENT}"
    assert s["phase"] == "Pending" and s["ready"] == "2/3"
    assert s["by_type"]["Degraded"]["status"] == "False"   # waiting for a card is not a failure
    entry = s["owners"][2]
    assert (entry["phase"], entry["reason"], entry["message"]) == ("Pending", "Unschedulable", INSUFFICIENT)
    assert "node" not in entry


def test_an_owner_without_its_vendor_sdk_degrades_the_model_not_loading():
    for p in (crashing_pod(), crashing_pod(backoff=False)):
        v = owner_view(p)
        assert (v.exit_reason, v.running) == ("BackendUnavailable", True)
        assert v.exit_message.startswith("the rngd backend needs the Python module 'furiosa_llm'")
    owners = [owner_view(crashing_pod("m-owner-0-0", 0)), owner_view(crashing_pod("m-owner-1-0", 1)),
              owner_view(unschedulable_pod())]
    s = derive(replicas=3, owners=owners)
    degraded = s["by_type"]["Degraded"]
    assert (s["phase"], degraded["status"], degraded["reason"]) == ("Degraded", "True", "BackendUnavailable")
    assert degraded["message"].startswith("2 owners cannot start; m-owner-0-0: the rngd backend needs")
    assert "Insufficient furiosa.ai/rngd" in s["by_type"]["Delivered"]["message"]
    assert [o.get("reason") for o in s["owners"]] == ["BackendUnavailable", "BackendUnavailable", "Unschedulable"]
    assert s["owners"][0]["message"].endswith("No module named 'furiosa_llm'")


def test_other_exits_and_recovery():
    v = owner_view(crashing_pod(message=None, exit_code=137, reason="OOMKilled"))
    assert (v.exit_reason, v.exit_message) == ("OwnerExited", "exit code 137 (OOMKilled)")
    v = owner_view(crashing_pod(message="Traceback (most recent call last):\n  boom"))
    assert v.exit_reason == "OwnerExited" and v.exit_message.startswith("exit code 1 (Error): Traceback")
    s = derive(owners=[v])
    assert (s["phase"], s["by_type"]["Degraded"]["reason"]) == ("Degraded", "OwnerExited")
    # restarted and ready since: the old exit no longer counts
    healed = crashing_pod()
    healed["status"]["containerStatuses"][0].update(ready=True, state={"running": {"startedAt": "t"}})
    healed["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    s = derive(owners=[owner_view(healed, ident())])
    assert (s["phase"], s["by_type"]["Degraded"]["status"]) == ("Ready", "False")
    assert "reason" not in s["owners"][0]
    # a clean exit (code 0) is no failure, and a quarantined owner still comes first
    assert owner_view(crashing_pod(exit_code=0)).exit_reason == ""
    s = derive(replicas=2, owners=[owner_view(pod(), ident(state="quarantined")),
                                   owner_view(crashing_pod("m-owner-1-0", 1))])
    assert s["by_type"]["Degraded"]["reason"] == "OwnerQuarantined"


def failed_mount(message, last="2026-01-01T00:00:05Z", reason="FailedMount"):
    return {"reason": reason, "message": message, "lastTimestamp": last,
            "metadata": {"creationTimestamp": last}}


NOT_FOUND = ("delivering sha256:aa from http://127.0.0.1:1/m: http://127.0.0.1:1/m/blobs/w: "
             "not found (HTTP 404)")
PROGRESS = "fetching sha256:aa from http://127.0.0.1:1/m: 1 of 4 bytes (25%) after 2s"


def kubelet(code, desc):
    return f'MountVolume.SetUp failed for volume "bundle" : rpc error: code = {code} desc = {desc}'


def test_the_newest_failed_mount_is_the_bridges_verdict():
    events = [failed_mount(kubelet("Aborted", PROGRESS), "2026-01-01T00:00:01Z"),
              failed_mount(kubelet("Unavailable", NOT_FOUND), "2026-01-01T00:00:09Z"),
              failed_mount("Unable to attach or mount volumes: timed out", "2026-01-01T00:00:03Z"),
              failed_mount("Pulling image", "2026-01-01T00:00:30Z", reason="Pulling")]
    assert mount_verdict(events) == ("Unavailable", NOT_FOUND)
    assert mount_verdict(events[2:3]) == ("Unknown", "Unable to attach or mount volumes: timed out")
    assert mount_verdict(events[3:]) == ("", "")


def test_a_failing_mount_degrades_the_model_with_the_bridges_message():
    waiting = owner_view(pod(phase="Pending", ready=False))
    assert waiting.awaiting_volume
    assert not owner_view(pod(phase="Pending", ready=False, node="")).awaiting_volume
    s = derive(replicas=2, owners=[replace(waiting, mount_code="Unavailable", mount_message=NOT_FOUND),
                                   owner_view(pod("m-owner-1", 1), ident())])
    degraded, delivered = s["by_type"]["Degraded"], s["by_type"]["Delivered"]
    assert (s["phase"], degraded["status"], degraded["reason"]) == ("Degraded", "True", "DeliveryFailed")
    assert degraded["message"] == f"1 owner cannot mount the bundle; m-owner-0: {NOT_FOUND}"
    assert (delivered["status"], delivered["reason"]) == ("False", "MountFailed")
    assert delivered["message"] == f"1/2 owner volumes published; m-owner-0: {NOT_FOUND}"
    assert (s["owners"][0]["reason"], s["owners"][0]["message"]) == ("MountFailed", NOT_FOUND)


def test_a_fetch_in_progress_is_waiting_with_its_progress_not_a_failure():
    waiting = replace(owner_view(pod(phase="Pending", ready=False)), mount_code="Aborted",
                      mount_message=PROGRESS)
    s = derive(owners=[waiting])
    assert (s["phase"], s["by_type"]["Degraded"]["status"]) == ("Delivering", "False")
    delivered = s["by_type"]["Delivered"]
    assert (delivered["reason"], delivered["message"]) == \
        ("WaitingForDelivery", f"0/1 owner volumes published; m-owner-0: {PROGRESS}")
