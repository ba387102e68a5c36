"""``kubectl resident stage|switch|rollback``: what they write and how they tell how far it
got, from status shaped as the operator writes it (prestage's node states, the Staged
condition's reasons, ``transition_summary``'s result)."""

from __future__ import annotations

import pytest

from kubectl_resident import change
from kubectl_resident.change import Progress, Revision
from resident_operator import prestage

A, B, C = ("sha256:" + x * 64 for x in "abc")
SRC = "oci://registry/llm"


def model(spec: dict | None = None, **status) -> dict:
    return {"metadata": {"name": "llm", "namespace": "models", "resourceVersion": "41"},
            "spec": {"replicas": 2, "bundle": {"source": SRC, "digest": A}, **(spec or {})},
            "status": {"bundle": {"source": SRC, "digest": A}, **status}}


def staged_status(digest: str, states: list[str], reason: str, status: str = "False") -> dict:
    return {"stage": {"digest": digest, "ready": "?", "nodes": [{"node": f"n{i}", "state": s}
                                                               for i, s in enumerate(states)]},
            "conditions": [{"type": "Staged", "status": status, "reason": reason, "message": "why"}]}


def test_every_patch_carries_the_resource_version_it_read():
    m = model()
    assert change.stage_patch(m, Revision(SRC, B)) == {
        "metadata": {"resourceVersion": "41"}, "spec": {"stage": {"source": SRC, "digest": B}}}
    assert change.switch_patch(m, Revision(SRC, B), "Lockstep") == {
        "metadata": {"resourceVersion": "41"},
        "spec": {"bundle": {"source": SRC, "digest": B}, "transition": {"commit": "Lockstep"}}}
    assert "transition" not in change.switch_patch(m, Revision(SRC, B), None)["spec"]


def test_clearing_a_stage_removes_the_field_and_needs_one():
    assert change.stage_patch(model({"stage": {"source": SRC, "digest": B}}), None)["spec"] == {"stage": None}
    with pytest.raises(change.Refused, match="nothing is staged"):
        change.stage_patch(model(), None)


def test_switch_goes_to_the_staged_revision_unless_one_is_given():
    m = model({"stage": {"source": SRC + ":v2", "digest": B}})
    assert change.switch_target(m, None) == Revision(SRC + ":v2", B)
    assert change.switch_target(m, Revision(SRC, C)) == Revision(SRC, C)
    with pytest.raises(change.Refused, match="no revision is staged"):
        change.switch_target(model(), None)


def test_rollback_goes_to_the_previous_revision_or_back_to_the_committed_one_mid_switch():
    assert change.rollback_target(model(previousBundle={"source": SRC, "digest": C})) == Revision(SRC, C)
    mid_switch = model({"bundle": {"source": SRC, "digest": B}}, previousBundle={"source": SRC, "digest": C})
    assert change.rollback_target(mid_switch) == Revision(SRC, A)
    with pytest.raises(change.Refused, match="no earlier revision"):
        change.rollback_target(model())


def test_already_on_needs_spec_status_and_nothing_in_flight():
    assert change.already_on(model(), Revision(SRC, A))
    assert not change.already_on(model(), Revision(SRC, B))
    assert not change.already_on(model(transition={"to": A}), Revision(SRC, A))


def test_staging_progress_counts_nodes_that_hold_it_and_ends_on_staged_or_failed():
    S, L, F, G = prestage.STAGED, prestage.LIVE, prestage.FAILED, prestage.STAGING
    assert change.staging_progress(model(**staged_status(B, [S, G], G)), B) == Progress(1, 2)
    assert change.staging_progress(model(**staged_status(B, [S, L], S, "True")), B) == Progress(2, 2, True)
    failed = change.staging_progress(model(**staged_status(B, [S, F], "StageFailed")), B)
    assert failed.finished and failed.failure == "why" and failed.done == 1
    # a status still about the revision staged before is not progress on this one
    assert change.staging_progress(model(**staged_status(C, [S, S], S, "True")), B) == Progress(0, 0)


def test_with_preload_a_stage_is_done_once_every_owner_loaded_it_or_said_it_cannot():
    S, L = prestage.STAGED, prestage.LIVE
    m = model(**staged_status(B, [S, S, L], S, "True"))
    m["status"]["stage"]["nodes"][0]["preload"] = {"state": "loaded"}
    m["status"]["stage"]["nodes"][1]["preload"] = {"state": "loading"}
    assert change.staging_progress(m, B) == Progress(3, 3, True)
    assert change.staging_progress(m, B, preload=True) == Progress(2, 3, False)
    m["status"]["stage"]["nodes"][1]["preload"] = {"state": "failed", "reason": "no memory for two revisions"}
    assert change.staging_progress(m, B, preload=True) == Progress(3, 3, True)
    assert change.stage_patch(model(), Revision(SRC, B), preload=True)["spec"] == {
        "stage": {"source": SRC, "digest": B, "preload": True}}


def test_delivery_note_says_when_a_switch_will_deliver():
    assert change.delivery_note(model(**staged_status(B, [prestage.STAGED] * 2, "Staged", "True")),
                                Revision(SRC, B)) == ""
    assert "staged on 1/2 owners' nodes" in change.delivery_note(
        model(**staged_status(B, [prestage.STAGED, prestage.STAGING], "Staging")), Revision(SRC, B))
    assert "not pre-staged" in change.delivery_note(model(), Revision(SRC, B))
    assert change.delivery_note(model(previousBundle={"source": SRC, "digest": C}), Revision(SRC, C)) == ""


def owner(pod: str, bundle: str) -> dict:
    return {"pod": pod, "identity": {"bundle": bundle}}


def test_switch_progress_follows_the_transition_then_the_committed_bundle():
    in_flight = model({"bundle": {"source": SRC, "digest": B}},
                      owners=[owner("p0", B), owner("p1", A)],
                      transition={"to": B, "owners": [{"step": "Done"}, {"step": "Applying"}]},
                      lastTransition={"id": "t-1", "to": A, "result": "succeeded"})
    assert change.switch_progress(in_flight, B, "t-1") == Progress(1, 2)
    done = model({"bundle": {"source": SRC, "digest": B}}, owners=[owner("p0", B), owner("p1", B)],
                 lastTransition={"id": "t-2", "to": B, "result": "succeeded"})
    done["status"]["bundle"]["digest"] = B
    assert change.switch_progress(done, B, "t-1") == Progress(2, 2, True)
    done["status"]["owners"][1]["identity"]["bundle"] = A   # an owner that has not said so yet
    assert change.switch_progress(done, B, "t-1") == Progress(1, 2)


def test_switch_progress_reports_a_failed_transition_to_the_target_but_not_an_older_one():
    failed = model({"bundle": {"source": SRC, "digest": B}}, owners=[owner("p0", A)],
                   lastTransition={"id": "t-2", "to": B, "result": "failed", "reason": "PrepareFailed",
                                   "message": "owner p1 could not prepare"})
    got = change.switch_progress(failed, B, "t-1")
    assert got.finished and got.failure.endswith("failed: PrepareFailed: owner p1 could not prepare")
    # the same failed transition, read before the command began: an old result, not this switch's
    assert change.switch_progress(failed, B, "t-2") == Progress(0, 1)
