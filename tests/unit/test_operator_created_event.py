"""The children a pass creates are told in one Event: a new model's first pass creates
five, and an Event each would be five writes to the API server."""

from resident_operator.context import ModelContext


def context():
    posted = []
    ctx = ModelContext(kube=None, settings=None, namespace="ns", name="m", uid="u", body={},
                       post_event=lambda reason, message, warning: posted.append((reason, message, warning)))
    return ctx, posted


def test_a_first_pass_tells_its_owner_pod_and_companions_in_one_event():
    ctx, posted = context()
    ctx.child_created("TokenSecretCreated", "owner token Secret m-owner-token")
    ctx.child_created("OwnerPodCreated", "owner Pod m-owner-0 (slot 0) on bundle sha256:1")
    ctx.child_created("ServiceCreated", "Service m")
    assert posted == []                       # nothing until the pass ends
    ctx.announce_created()
    assert posted == [("OwnerPodCreated", "created owner token Secret m-owner-token, owner Pod m-owner-0 "
                                          "(slot 0) on bundle sha256:1, Service m", False)]
    ctx.announce_created()
    assert len(posted) == 1                   # told once


def test_one_child_keeps_its_own_reason_and_several_companions_are_children_created():
    ctx, posted = context()
    ctx.child_created("ServiceCreated", "Service m")
    ctx.announce_created()
    ctx.child_created("ServiceCreated", "Service m")
    ctx.child_created("PodDisruptionBudgetCreated", "PodDisruptionBudget m")
    ctx.announce_created()
    assert [(r, msg) for r, msg, _ in posted] == [
        ("ServiceCreated", "created Service m"),
        ("ChildrenCreated", "created Service m, PodDisruptionBudget m")]
