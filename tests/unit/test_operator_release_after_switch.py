"""What a switch's release step does to the deliveries of one owner (owner_step.perform,
``release_old_deliveries``): the revision left is kept staged for a rollback, and the
revision switched to keeps its activated delivery, even when ``spec.stage`` still names it.
Its delivery is what leases the live revision in the node's store."""

from resident_operator.context import ModelContext
from resident_operator.delivery import build_bundle_delivery
from resident_operator.kube import Kube
from resident_operator.model_state import ModelState
from resident_operator.owner_step import perform
from resident_operator.spec import parse_spec
from resident_operator.transition import Action, OwnerProgress, TransitionState

A, B, C = ("sha256:" + x * 64 for x in "abc")
SOURCE = "file:///m/tiny"


class Recording(Kube):
    """A Kube that records the writes a pass makes (no API server: the decision is tested)."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict]] = []
        self.deleted: list[str] = []

    def patch(self, namespace, kind, name, patch):
        self.patches.append((name, patch["spec"]))
        return {}

    def delete(self, namespace, kind, name, uid):
        self.deleted.append(name)
        return "deleted"


def released(spec_fields: dict, live: list[str]) -> tuple[Recording, dict]:
    """Run the release step of a switch from A to B on an owner whose deliveries are those
    of ``live`` (each activated), and return the recorded writes and the deliveries by digest."""
    spec = parse_spec({"bundle": {"source": SOURCE, "digest": B}, **spec_fields})
    deliveries, children = {}, []
    for digest in live:
        bd = build_bundle_delivery("m", "model-uid", spec, slot=0, incarnation=0, pod_name="m-owner-0",
                                   pod_uid="pod-uid", node_name="n", target_digest=digest,
                                   target_source=SOURCE, path="WholeBundle")
        bd["metadata"]["uid"] = f"uid-{digest[7]}"
        deliveries[bd["metadata"]["name"]] = bd
        children.append({"kind": "BundleDelivery", "name": bd["metadata"]["name"], "uid": bd["metadata"]["uid"]})
    kube = Recording()
    ctx = ModelContext(kube=kube, settings=None, namespace="ns", name="m", uid="model-uid", body={})
    state = ModelState({"children": children}, None, store=None)
    p = OwnerProgress(slot=0, pod="m-owner-0", podUID="pod-uid", node="n")
    t = TransitionState(id="t1", **{"from": A}, fromSource=SOURCE, to=B, toSource=SOURCE,
                        strategy="InPlace", path="WholeBundle", startedAt=0.0, owners=[p])
    perform(ctx, state, spec, t, p, Action.release_old_deliveries, None, deliveries)
    return kube, {bd["spec"]["bundle"]["digest"]: bd["metadata"]["name"] for bd in deliveries.values()}


def test_the_revision_switched_to_stays_activated_when_spec_stage_still_names_it():
    kube, name = released({"stage": {"source": SOURCE, "digest": B}}, live=[A, B])
    assert kube.patches == [(name[A], {"activate": False})], kube.patches   # A kept for a rollback
    assert kube.deleted == []


def test_without_keep_previous_the_revision_left_goes_and_the_target_stays():
    kube, name = released({"stage": {"source": SOURCE, "digest": B}, "transition": {"keepPrevious": False}},
                          live=[A, B, C])
    assert sorted(kube.deleted) == sorted([name[A], name[C]])
    assert kube.patches == [], kube.patches
