"""An owner that gives no answer: how status reports it, and the settings that bound it."""

from resident_operator.observe import OWNER_UNRESPONSIVE, derive_status, owner_view
from resident_operator.settings import OperatorSettings, settings_from_env

A = "sha256:" + "aa" * 32


def pod(name, slot):
    return {"metadata": {"name": name, "uid": "uid-" + name,
                         "labels": {"resident.dev/slot": str(slot), "resident.dev/incarnation": "0"}},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def answered(name, slot):
    return owner_view(pod(name, slot), {"state": "ready", "identity": {"bundle": A}})


def test_an_unresponsive_owner_is_not_ready_whatever_its_pod_says_and_is_named():
    hung = owner_view(pod("m-owner-1", 1), error="GET http://10.0.0.1:8080/v1/identity: no answer within 2s",
                      unresponsive=True)
    assert not hung.ready and hung.running and hung.state is None
    entry = hung.to_status()
    assert (entry["reason"], entry["ready"]) == (OWNER_UNRESPONSIVE, False)
    assert "no answer within 2s" in entry["message"]

    s = derive_status(replicas=2, owners=[answered("m-owner-0", 0), hung], problems=[], transition=None,
                      last_transition=None, blocker=None, desired_digest=A)
    conds = {x["type"]: x for x in s["conditions"]}
    assert (conds["Degraded"]["status"], conds["Degraded"]["reason"]) == ("True", OWNER_UNRESPONSIVE)
    assert "owner m-owner-1" in conds["Degraded"]["message"] and "no answer" in conds["Degraded"]["message"]
    assert conds["Ready"]["status"] == "False" and s["ready"] == "1/2" and s["phase"] == "Degraded"


def test_an_owner_that_refuses_is_not_unresponsive():
    refused = owner_view(pod("m-owner-0", 0), error="GET ...: ClientConnectorError: refused")
    assert refused.ready and "reason" not in refused.to_status()   # as before: its Pod decides
    s = derive_status(replicas=1, owners=[answered("m-owner-0", 0)], problems=[], transition=None,
                      last_transition=None, blocker=None, desired_digest=A)
    assert {x["type"]: x for x in s["conditions"]}["Degraded"]["status"] == "False"


def test_owner_call_bounds_are_installation_settings():
    s = OperatorSettings()
    assert (s.owner_timeout_seconds, s.owner_calls, s.owner_calls_per_model, s.owner_recheck_seconds,
            s.sweep_budget_seconds) == (2.0, 32, 4, 5.0, 20.0)
    s = settings_from_env({"RESIDENT_OWNER_CALLS": "8", "RESIDENT_OWNER_CALLS_PER_MODEL": "2",
                           "RESIDENT_OWNER_TIMEOUT_SECONDS": "0.5", "RESIDENT_SWEEP_BUDGET_SECONDS": "3"})
    assert (s.owner_calls, s.owner_calls_per_model, s.owner_timeout_seconds, s.sweep_budget_seconds) == (8, 2, 0.5, 3.0)
