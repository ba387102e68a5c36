"""Running a transition: plan it once, then walk owners through ``transition.advance``.

Each pass observes every started owner (its Pod, its BundleDelivery, its owner's answer),
asks the pure state machine for the next step, performs the returned actions and saves
``status.transition`` before moving on, so a restarted operator resumes where it stopped:
deterministic names make a repeated create a 409, and before ``POST /v1/transitions`` the
owner's identity is checked, so a transition an owner already applied is not sent again.

A spec change while a transition runs is recorded in ``status.pendingTransition`` and
started after this one ends; transitions never interleave.
"""

from __future__ import annotations

import uuid
from typing import Any

from bundle.errors import BundleError, PlanError
from bundle.manifest import ManifestError
from bundle.sources import open_source

from . import children as ch
from . import metrics, naming
from .context import ModelContext, log
from .delivery import build_bundle_delivery, observe_delivery
from .model_state import ModelState
from .observe import Blocker, OwnerView
from .owner_client import OwnerClient, OwnerUnreachable
from .owners import create_child, create_owner_pod, owner_address
from .planning import InPlaceImpossible, plan_transition
from .spec import ModelSpec
from .transition import (Action, OwnerObservation, OwnerProgress, Step, TransitionState, advance,
                         outcome, owners_to_start)
from .transition_summary import summarize


BLOCKED_RETRY_SECONDS = 10.0      # a transition that could not start (source down, plan failed)
OWNER_STATE_RETRY_SECONDS = 1.0   # waiting for an owner to be ready without a transition to wait on


def fetch_manifest(source: str, digest: str):
    with open_source(source) as src:
        return src.fetch_manifest(digest)


def start_transition(ctx: ModelContext, state: ModelState, spec: ModelSpec,
                     views: list[OwnerView]) -> Blocker | None:
    """Plan the move from the committed revision to spec.bundle and record it."""
    frm, to = state.bundle, spec.bundle
    try:
        target = fetch_manifest(to.source, to.digest)
        donor = fetch_manifest(frm["source"], frm["digest"])
    except (BundleError, ManifestError, OSError) as e:
        return Blocker("SourceUnavailable", f"cannot read the manifests: {type(e).__name__}: {e}")
    caps = [v.in_place for v in views if v.in_place is not None]
    in_place = None if not caps else all(caps)
    try:
        plan = plan_transition(target, donor, spec, in_place)
    except InPlaceImpossible as e:
        return Blocker("InPlaceNotPossible", str(e))
    except PlanError as e:
        return Blocker("PlanFailed", str(e))
    live = sorted((v for v in views if not v.terminating and 0 <= v.slot < spec.replicas),
                  key=lambda v: v.slot)
    state.transition = TransitionState(
        id=uuid.uuid4().hex[:12], **{"from": frm["digest"]}, fromSource=frm["source"],
        to=to.digest, toSource=to.source, strategy=plan.strategy, path=plan.path,
        method=plan.method, predicted=plan.predicted,
        generation=int(ctx.body["metadata"].get("generation") or 0), startedAt=ctx.clock(),
        owners=[OwnerProgress(slot=v.slot, pod=v.pod, podUID=v.uid, node=v.node) for v in live])
    state.set_pending(None)
    state.save_transition()
    ctx.event("TransitionPlanned", f"transition {frm['digest'][:19]} -> {to.digest[:19]}: "
                                   f"{plan.describe()}; {len(live)} owners")
    return None


def _observe(ctx: ModelContext, spec: ModelSpec, t: TransitionState, p: OwnerProgress,
             view: OwnerView | None, deliveries: dict[str, dict[str, Any]]) -> OwnerObservation:
    exists = view is not None and view.uid == p.pod_uid and not view.terminating
    obs: dict[str, Any] = {"pod_exists": exists}
    if exists:
        obs.update(pod_uid=view.uid, node=view.node, running=view.running, ready=view.ready,
                   state=view.state, identity_bundle=view.identity.get("bundle"))
    if p.step == Step.delivering and p.delivery:
        obs["delivery"] = observe_delivery(deliveries.get(p.delivery))
    if p.step == Step.applying and p.owner_transition and exists:
        client = OwnerClient(owner_address(ctx, {"status": {"podIP": view.pod_ip}}),
                             spec.runtime.port, ctx.token, ctx.settings.owner_timeout_seconds)
        try:
            obs["owner_transition"] = client.transition(p.owner_transition)
        except OwnerUnreachable as e:
            obs["state"] = None  # unreachable: the step waits (until the timeout)
            log.info("owner unreachable while applying", extra={"model": f"{ctx.namespace}/{ctx.name}",
                                                                "error": str(e)})
        # the driver waits on the owner and wakes the model when it answers
        if (obs.get("owner_transition") or {}).get("result", "running") == "running":
            ctx.follow_up.owner_waits.append(client.wait(p.owner_transition))
    return OwnerObservation(**obs)


def _release(ctx: ModelContext, state: ModelState, deliveries: dict[str, dict[str, Any]],
             slot: int, keep_revision: str | None, only_revision: str | None = None) -> list[str]:
    """Delete recorded deliveries of ``slot`` (all but ``keep_revision``, or only one)."""
    released = []
    for name, bd in deliveries.items():
        labels = bd["metadata"].get("labels") or {}
        rev = labels.get(naming.LABEL_REVISION)
        if labels.get(naming.LABEL_SLOT) != str(slot) or not ch.is_recorded(state.children, bd):
            continue
        if keep_revision is not None and rev == naming.revision_label(keep_revision):
            continue
        if only_revision is not None and rev != naming.revision_label(only_revision):
            continue
        if bd["metadata"].get("deletionTimestamp"):
            continue
        if ctx.kube.delete(ctx.namespace, "BundleDelivery", name, bd["metadata"]["uid"]) == "deleted":
            released.append(name)
    return released


def _perform(ctx: ModelContext, state: ModelState, spec: ModelSpec, t: TransitionState,
             p: OwnerProgress, action: Action, view: OwnerView | None,
             deliveries: dict[str, dict[str, Any]]) -> OwnerProgress:
    inc = int(view.incarnation) if view else state.incarnation(p.slot)
    if action == Action.create_delivery:
        donor = (view.identity.get("bundle") if view else "") or t.from_digest
        bd = build_bundle_delivery(ctx.name, ctx.uid, spec, slot=p.slot, incarnation=inc,
                                   pod_name=p.pod, pod_uid=p.pod_uid, node_name=p.node,
                                   target_digest=t.to, target_source=t.to_source, path=t.path,
                                   donor_digest=donor)
        got = create_child(ctx, state, bd)
        if got is None:
            raise RuntimeError(f"BundleDelivery {bd['metadata']['name']} is taken by another object")
        if got["metadata"].get("deletionTimestamp"):
            return p  # an earlier delivery of this name is still being released: next pass
        deliveries[got["metadata"]["name"]] = got
        ctx.event("DeliveryCreated", f"BundleDelivery {got['metadata']['name']}: stage {t.to[:19]} "
                                     f"into {p.pod} on {p.node} ({t.path})")
        return p.model_copy(update={"delivery": got["metadata"]["name"]})
    if action == Action.start_owner_transition:
        if view is None or not view.state == "ready":
            return p
        client = OwnerClient(owner_address(ctx, {"status": {"podIP": view.pod_ip}}),
                             spec.runtime.port, ctx.token, ctx.settings.owner_timeout_seconds)
        answer = client.start_transition(t.to, t.path, spec.transition.strategy)
        tid = str(answer.get("id") or "")
        ctx.event("OwnerTransitionStarted", f"owner {p.pod}: transition {tid} to "
                                            f"{t.to[:19]} ({spec.transition.strategy})")
        ctx.follow_up.owner_waits.append(client.wait(tid))
        return p.model_copy(update={"owner_transition": tid})
    if action == Action.release_old_deliveries:
        for name in _release(ctx, state, deliveries, p.slot, keep_revision=t.to):
            ctx.event("OldRevisionReleased", f"deleted BundleDelivery {name} of {p.pod}: "
                                             "its revision is no longer used")
        return p
    if action == Action.release_target_delivery:
        _release(ctx, state, deliveries, p.slot, keep_revision=None, only_revision=t.to)
        return p
    if action == Action.replace_owner:
        if view is not None and view.uid == p.pod_uid and not view.terminating:
            ctx.kube.delete(ctx.namespace, "Pod", view.pod, view.uid)
        _release(ctx, state, deliveries, p.slot, keep_revision=None)
        pod = create_owner_pod(ctx, state, spec, p.slot, t.to, t.to_source, new_incarnation=True)
        meta = pod["metadata"]
        ctx.event("OwnerReplaced", f"replaced owner {p.pod} with {meta['name']} on {t.to[:19]}: "
                                   f"{p.message}", warning=True)
        return p.model_copy(update={"replaced": True, "pod": meta["name"], "pod_uid": meta["uid"],
                                    "node": ""})
    raise AssertionError(action)


STEP_EVENTS = {Step.applying: ("DeliveryStaged", "staged {to} into {pod}"),
               Step.verifying: ("OwnerTransitionApplied", "owner {pod} applied {to}"),
               Step.releasing: ("IdentityVerified", "owner {pod} reports identity {to}"),
               Step.done: ("OwnerTransitionDone", "owner {pod} is on {to}")}


def step_transition(ctx: ModelContext, state: ModelState, spec: ModelSpec,
                    views: list[OwnerView]) -> Blocker | None:
    """One pass over the transition in flight (starting one if the spec asks for it)."""
    if state.transition is None:
        if spec.bundle.digest == state.bundle.get("digest"):
            if spec.bundle.source != state.bundle.get("source"):   # same bytes, new location
                state.commit_bundle(spec.bundle.digest, spec.bundle.source)
            state.set_pending(None)
            return None
        last = state.last_transition or {}
        gen = int(ctx.body["metadata"].get("generation") or 0)
        if last.get("result") == "failed" and last.get("to") == spec.bundle.digest \
                and int(last.get("generation") or -1) == gen:
            return None  # failed for this generation: wait for a spec change
        blocker = start_transition(ctx, state, spec, views)
        if blocker is not None or state.transition is None:
            ctx.follow_up.recheck_in(BLOCKED_RETRY_SECONDS)  # the source may come back
            return blocker
    t = state.transition
    if spec.bundle.digest != t.to:
        pending = {"to": spec.bundle.digest, "toSource": spec.bundle.source}
        if state.pending != pending:
            ctx.event("TransitionQueued", f"spec.bundle changed to {spec.bundle.digest[:19]} during "
                                          f"the transition to {t.to[:19]}; it starts after this one")
        state.set_pending(pending)
    by_slot = {v.slot: v for v in views if not v.terminating}
    deliveries = {bd["metadata"]["name"]: bd
                  for bd in ctx.kube.list(ctx.namespace, "BundleDelivery", ctx.selector)}
    startable = set(owners_to_start(t, spec.transition.max_unavailable))
    now = ctx.clock()
    for i, p in enumerate(list(t.owners)):
        if p.step == Step.waiting and p.slot not in startable:
            continue
        view = by_slot.get(p.slot)
        obs = _observe(ctx, spec, t, p, view, deliveries)
        decision = advance(t, p, obs, now=now, timeout_seconds=spec.transition.timeout_seconds)
        new = decision.progress
        for action in decision.actions:
            new = _perform(ctx, state, spec, t, new, action, view, deliveries)
        if new != p:
            t.owners[i] = new
            state.save_transition()
            if new.step != p.step:
                _announce(ctx, t, new)
                ctx.follow_up.again = True   # the next step may be possible now
        _schedule_recheck(ctx, spec, new, now)
    result = outcome(t)
    if result != "running":
        _finish(ctx, state, t, result)
        ctx.follow_up.again = True   # a queued transition may start
    return None


def _schedule_recheck(ctx: ModelContext, spec: ModelSpec, p: OwnerProgress, now: float) -> None:
    """The times this owner's step must be looked at again even if no event arrives: its
    timeout, and short retries for waits that no watch or owner answer reports."""
    if p.step in (Step.waiting, Step.done, Step.failed):
        return
    if p.started_at is not None:
        ctx.follow_up.recheck_in(p.started_at + spec.transition.timeout_seconds - now + 0.1)
    if (p.step == Step.applying and not p.owner_transition) or p.step == Step.verifying:
        ctx.follow_up.recheck_in(OWNER_STATE_RETRY_SECONDS)  # the owner's state, not a watch


def _announce(ctx: ModelContext, t: TransitionState, p: OwnerProgress) -> None:
    if p.step == Step.failed:
        ctx.event(p.reason or "OwnerTransitionFailed", p.message, warning=True)
    elif p.step in STEP_EVENTS:
        reason, text = STEP_EVENTS[p.step]
        ctx.event(reason, text.format(pod=p.pod, to=t.to[:19]))


def _finish(ctx: ModelContext, state: ModelState, t: TransitionState, result: str) -> None:
    now = ctx.clock()
    t.result = result
    failed = next((o for o in t.owners if o.step == Step.failed), None)
    if failed is not None:
        t.reason, t.message = failed.reason, failed.message
    summary = summarize(t, now)
    for o in t.owners:
        for phase, secs in (("deliver", o.delivered_at and o.started_at and o.delivered_at - o.started_at),
                            ("apply", o.applied_at and o.delivered_at and o.applied_at - o.delivered_at),
                            ("total", o.finished_at and o.started_at and o.finished_at - o.started_at)):
            if secs:
                metrics.TRANSITION_SECONDS.labels(strategy=o.strategy or t.strategy, path=t.path,
                                                  phase=phase).observe(secs)
    metrics.TRANSITIONS.labels(result=result).inc()
    if result == "succeeded":
        state.commit_bundle(t.to, t.to_source)
    state.finish_transition(summary)
    if result == "succeeded":
        ctx.event("TransitionSucceeded", f"all {len(t.owners)} owners are on {t.to[:19]} "
                                         f"in {summary['durations']['totalSeconds']:.1f}s")
    else:
        ctx.event("TransitionFailed", f"transition to {t.to[:19]} failed: {t.reason}: {t.message}",
                  warning=True)
