"""One owner in a transition: what is observed of it, and what is done to it.

:func:`observe_owner` gathers what the pure state machine (``transition.advance``) needs
about one owner: its Pod (as seen at the start of the pass), its BundleDelivery, its
owner transition, and, once that transition has ended or the step is Verifying, the
owner's state and identity *now*. :func:`perform` carries out one action the machine
returned: create the delivery, start the owner's transition (and ask the driver to wait
on it), release deliveries by UID, or replace the owner with a new Pod.
"""

from __future__ import annotations

from typing import Any

from . import children as ch
from . import naming
from .context import ModelContext, log
from .delivery import build_bundle_delivery, observe_delivery, prestaged
from .prestage import kept_revisions
from .model_state import ModelState
from .observe import OwnerView
from .owner_client import OwnerUnreachable
from .owners import create_child, owner_client, replace_owner
from .settings import OperatorSettings
from .spec import ModelSpec
from .transition import Action, OwnerObservation, OwnerProgress, Step, TransitionState

DRAIN_MARGIN_SECONDS = 2.0


def _owner_now(ctx: ModelContext, spec: ModelSpec, view: OwnerView) -> dict[str, Any]:
    """The owner's state and bundle as it answers now (state None if it does not answer)."""
    try:
        answer = owner_client(ctx, spec, view).identity()
    except OwnerUnreachable:
        return {"state": None}
    return {"state": answer.get("state"), "identity_bundle": (answer.get("identity") or {}).get("bundle")}


def observe_owner(ctx: ModelContext, spec: ModelSpec, t: TransitionState, p: OwnerProgress,
                  view: OwnerView | None, deliveries: dict[str, dict[str, Any]]
                  ) -> OwnerObservation:
    exists = view is not None and view.uid == p.pod_uid and not view.terminating
    obs: dict[str, Any] = {"pod_exists": exists}
    if exists:
        obs.update(pod_uid=view.uid, node=view.node, running=view.running, ready=view.ready,
                   state=view.state, identity_bundle=view.identity.get("bundle"))
    if p.step in (Step.delivering, Step.releasing) and p.delivery:
        obs["delivery"] = observe_delivery(deliveries.get(p.delivery))
    if p.step in (Step.preparing, Step.applying) and p.owner_transition and exists:
        client = owner_client(ctx, spec, view)
        try:
            obs["owner_transition"] = client.transition(p.owner_transition)
        except OwnerUnreachable as e:
            obs["state"] = None  # unreachable: the step waits (until the timeout)
            log.info("owner unreachable while applying", extra={"model": f"{ctx.namespace}/{ctx.name}",
                                                                "error": str(e)})
        # the driver waits on the owner and wakes the model when it answers
        if (obs.get("owner_transition") or {}).get("result", "running") == "running":
            ctx.follow_up.owner_waits.append(client.wait(p.owner_transition))
    finished = (obs.get("owner_transition") or {}).get("result", "running") != "running"
    if exists and (p.step == Step.verifying or finished):
        obs.update(_owner_now(ctx, spec, view))   # not as seen at the start of the pass
    return OwnerObservation(**obs)


def decide(ctx: ModelContext, spec: ModelSpec, owners: list[tuple[OwnerView, str]], decision: str) -> None:
    """Tell prepared owners' transitions to ``commit`` or ``abort``, all at once (the lockstep
    barrier: one wait for every answer). A 409 is an owner past ``prepared`` (a commit sent
    again after a restart); one that does not answer is logged, and its step sees to it."""
    clients = [owner_client(ctx, spec, view) for view, _ in owners]
    if not clients:
        return
    answers = clients[0].calls.call_many([c.request("POST", f"/v1/transitions/{tid}/{decision}", {},
                                                    allow=(409,)) for c, (_, tid) in zip(clients, owners)])
    for (view, _), answer in zip(owners, answers):
        if isinstance(answer, OwnerUnreachable):
            log.warning("owner did not take the decision", extra={
                "model": f"{ctx.namespace}/{ctx.name}", "owner": view.pod, "decision": decision,
                "error": str(answer)})


def drain_seconds(spec: ModelSpec, settings: OperatorSettings) -> float:
    """How long a reloading owner keeps serving while not ready: one readiness period plus
    time for the Endpoints and every proxy to follow, when other replicas can take its
    traffic; with one replica there is nowhere to drain to: it stays in the Endpoints
    (``leaveEndpoints: false``) and its clients get 503 + Retry-After."""
    if spec.replicas < 2:
        return 0.0
    return float(settings.readiness_period_seconds) + DRAIN_MARGIN_SECONDS


def release_deliveries(ctx: ModelContext, state: ModelState, deliveries: dict[str, dict[str, Any]],
                       slot: int, keep: set[str] = frozenset(), only_revision: str | None = None
                       ) -> list[str]:
    """Delete recorded deliveries of ``slot`` (all but those of revisions in ``keep``, or only one)."""
    kept = {naming.revision_label(d) for d in keep}
    released = []
    for name, bd in deliveries.items():
        labels = bd["metadata"].get("labels") or {}
        rev = labels.get(naming.LABEL_REVISION)
        if labels.get(naming.LABEL_SLOT) != str(slot) or not ch.is_recorded(state.children, bd):
            continue
        if rev in kept:
            continue
        if only_revision is not None and rev != naming.revision_label(only_revision):
            continue
        if bd["metadata"].get("deletionTimestamp"):
            continue
        if ctx.kube.delete(ctx.namespace, "BundleDelivery", name, bd["metadata"]["uid"]) == "deleted":
            released.append(name)
    return released


def set_activate(ctx: ModelContext, bd: dict[str, Any], activate: bool) -> None:
    """Turn a delivery into a transition's (``activate``: the bridge moves ``current`` to it)
    or into a pre-staged one (the revision stays beside the live one, for a rollback)."""
    if prestaged(bd) is not activate:
        return
    try:   # the UID makes it a precondition: a successor of the same name is not touched
        ctx.kube.patch(ctx.namespace, "BundleDelivery", bd["metadata"]["name"],
                       {"metadata": {"uid": bd["metadata"]["uid"]}, "spec": {"activate": activate}})
    except Exception as e:
        if getattr(e, "status", None) not in (404, 409):   # gone, or not this one any more
            raise


def perform(ctx: ModelContext, state: ModelState, spec: ModelSpec, t: TransitionState,
            p: OwnerProgress, action: Action, view: OwnerView | None,
            deliveries: dict[str, dict[str, Any]]) -> OwnerProgress:
    inc = int(view.incarnation) if view else state.incarnation(p.slot)
    if action == Action.create_delivery:
        donor = (view.identity.get("bundle") if view else "") or t.from_digest
        bd = build_bundle_delivery(ctx.name, ctx.uid, spec, slot=p.slot, incarnation=inc,
                                   pod_name=p.pod, pod_uid=p.pod_uid, node_name=p.node,
                                   target_digest=t.to, target_source=t.to_source, path=t.path,
                                   donor_digest=donor)
        known = deliveries.get(bd["metadata"]["name"])   # listed this pass: a pre-staged one, mostly
        got = known if known is not None and ch.is_recorded(state.children, known) else create_child(ctx, state, bd)
        if got is None:
            raise RuntimeError(f"BundleDelivery {bd['metadata']['name']} is taken by another object")
        if got["metadata"].get("deletionTimestamp"):
            return p  # an earlier delivery of this name is still being released: next pass
        name = got["metadata"]["name"]
        deliveries[name] = got
        ahead = prestaged(got)
        if ahead:   # staged ahead under the same name: the switch only activates it
            set_activate(ctx, got, True)
            ahead = observe_delivery(got).staged
            ctx.event("PrestagedRevisionUsed", f"BundleDelivery {name} staged {t.to[:19]} into {p.pod} "
                                               f"on {p.node} ahead of the switch"
                                               + ("" if ahead else " (still staging)"))
        else:
            ctx.event("DeliveryCreated", f"BundleDelivery {name}: stage {t.to[:19]} "
                                         f"into {p.pod} on {p.node} ({t.path})")
        return p.model_copy(update={"delivery": name, "prestaged": ahead})
    if action == Action.start_owner_transition:
        if view is None or not view.state == "ready":
            return p
        client = owner_client(ctx, spec, view)
        if t.commit == "Lockstep":   # every owner switches at once: no drain, none leaves the Service
            hold = max(1.0, (p.started_at or ctx.clock()) + spec.transition.timeout_seconds - ctx.clock()) + 60
            answer = client.start_transition(t.to, t.path, spec.transition.strategy, 0.0,
                                             leave_endpoints=False, hold_seconds=hold)
        else:
            answer = client.start_transition(t.to, t.path, spec.transition.strategy,
                                             drain_seconds(spec, ctx.settings), leave_endpoints=spec.replicas > 1)
        tid = str(answer.get("id") or "")
        ctx.event("OwnerTransitionStarted", f"owner {p.pod}: transition {tid} to {t.to[:19]} "
                                            f"({spec.transition.strategy}"
                                            + (", prepare only: lockstep)" if t.commit == "Lockstep" else ")"))
        ctx.follow_up.owner_waits.append(client.wait(tid))
        return p.model_copy(update={"owner_transition": tid})
    if action in (Action.commit_owner_transition, Action.abort_owner_transition):
        if view is not None and p.owner_transition:
            decide(ctx, spec, [(view, p.owner_transition)],
                   "commit" if action == Action.commit_owner_transition else "abort")
        return p
    if action == Action.release_old_deliveries:
        staged = set(kept_revisions(spec, {"digest": t.from_digest, "source": t.from_source}))
        for name in release_deliveries(ctx, state, deliveries, p.slot, keep={t.to} | staged):
            ctx.event("OldRevisionReleased", f"deleted BundleDelivery {name} of {p.pod}: "
                                             "its revision is no longer used")
        # The revision left stays staged for a rollback. The target stays activated even when
        # spec.stage still names it: demoted, it would be a stage of the live revision, which
        # the next pass deletes, and the live revision would lose its lease on the node.
        for name, bd in deliveries.items():
            labels = bd["metadata"].get("labels") or {}
            if labels.get(naming.LABEL_SLOT) == str(p.slot) and ch.is_recorded(state.children, bd) \
                    and bd["spec"]["bundle"]["digest"] in staged - {t.to}:
                set_activate(ctx, bd, False)
        return p
    if action == Action.release_target_delivery:
        release_deliveries(ctx, state, deliveries, p.slot, only_revision=t.to)
        return p
    if action == Action.replace_owner:
        live = view is not None and view.uid == p.pod_uid and not view.terminating
        pod = replace_owner(ctx, state, spec, p.slot, (view.pod, view.uid) if live else None,
                            (t.to, t.to_source))
        release_deliveries(ctx, state, deliveries, p.slot)   # the old incarnation's
        meta = pod["metadata"]
        ctx.event("OwnerReplaced", f"replaced owner {p.pod} with {meta['name']} on {t.to[:19]}: "
                                   f"{p.message}", warning=True)
        return p.model_copy(update={"replaced": True, "pod": meta["name"], "pod_uid": meta["uid"],
                                    "node": ""})
    raise AssertionError(action)
