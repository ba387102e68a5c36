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

from bundle.errors import PlanError

from . import metrics, retry_policy
from .context import ModelContext
from .model_state import ModelState
from .observe import Blocker, OwnerView
from .owner_step import decide, observe_owner, perform
from .planning import InPlaceImpossible, plan_transition
from .source_check import SOURCE_REASONS, SourceProblem, read_manifest, retry_later
from .spec import ModelSpec
from .transition import (BEFORE_COMMIT, OwnerProgress, Step, TransitionState, abort, advance,
                         at_barrier, first_failure, must_abort, outcome, owners_to_start)
from .transition_summary import summarize




def start_transition(ctx: ModelContext, state: ModelState, spec: ModelSpec,
                     views: list[OwnerView]) -> Blocker | None:
    """Plan the move from the committed revision to spec.bundle and record it."""
    frm, to = state.bundle, spec.bundle
    try:
        target = read_manifest(ctx, to.source, to.digest, to.credentials_secret)
        donor = read_manifest(ctx, frm["source"], frm["digest"], to.credentials_secret)
    except SourceProblem as e:
        return e.blocker
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
        awaitEndpoints=spec.replicas > 1, commit=spec.transition.commit,
        owners=[OwnerProgress(slot=v.slot, pod=v.pod, podUID=v.uid, node=v.node) for v in live])
    with state.together():
        state.set_pending(None)
        state.save_transition()
    ctx.event("TransitionPlanned", f"transition {frm['digest'][:19]} -> {to.digest[:19]}: "
                                   f"{plan.describe()}; {len(live)} owners"
                                   + ("; lockstep: all prepare, then all commit" if spec.transition.commit == "Lockstep" else ""))
    return None


STEP_EVENTS = {Step.applying: ("DeliveryStaged", "staged {to} into {pod}"),
               Step.preparing: ("DeliveryStaged", "staged {to} into {pod}"),
               Step.prepared: ("OwnerPrepared", "owner {pod} prepared {to} and waits for the lockstep commit"),
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
        if blocker is not None and blocker.reason in SOURCE_REASONS:   # it may come back
            retry_later(ctx)
            return blocker
        if blocker is not None or state.transition is None:
            ctx.follow_up.recheck_in(retry_policy.BLOCKED_SECONDS)
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
                  for bd in ctx.children("BundleDelivery", state.children)}
    startable = set(owners_to_start(t, spec.transition.max_unavailable))
    for i, p in enumerate(list(t.owners)):
        if p.step == Step.waiting and p.slot not in startable:
            continue
        _step_owner(ctx, state, spec, t, i, by_slot.get(p.slot), deliveries)
    if must_abort(t):
        _abort_all(ctx, state, spec, t, by_slot, deliveries)
    elif at_barrier(t):
        _commit_all(ctx, state, spec, t, by_slot)
    result = outcome(t)
    if result != "running":
        _finish(ctx, state, spec, t, result)
        ctx.follow_up.again = True   # a queued transition may start
        return None
    retrying = next((o for o in t.owners if o.step == Step.delivering and o.reason == "DeliveryFailed"),
                    None)   # a delivery the bridge retries: Degraded says why until it stages
    return Blocker("DeliveryFailed", retrying.message) if retrying else None


def _step_owner(ctx: ModelContext, state: ModelState, spec: ModelSpec, t: TransitionState, i: int,
                view: OwnerView | None, deliveries: dict[str, dict[str, Any]]) -> None:
    """Advance owner ``t.owners[i]`` as far as it goes now: a step whose next observation
    needs no event (an owner that just answered is asked for its identity at once, a
    release is done at once) follows in the same pass. Progress is saved right after an
    action with side effects (a delivery created, an owner transition started, an owner
    replaced, deliveries released) and at the end; a step without one is saved with the next."""
    p = saved = t.owners[i]
    for _ in range(len(Step)):
        obs = observe_owner(ctx, spec, t, p, view, deliveries)
        decision = advance(t, p, obs, now=ctx.clock(), timeout_seconds=spec.transition.timeout_seconds)
        new = decision.progress
        with state.together():   # e.g. a delivery created and the progress naming it
            for action in decision.actions:
                new = perform(ctx, state, spec, t, new, action, view, deliveries)
            if new != p:
                t.owners[i] = new
                if decision.actions:
                    state.save_transition()
                    saved = new
        if new == p:
            break
        moved = new.step != p.step
        p = new
        if moved:
            _announce(ctx, t, p)
        if not moved or p.step in (Step.done, Step.failed, Step.replacing):
            ctx.follow_up.again = ctx.follow_up.again or moved   # another owner may start now
            break
    if p != saved:
        state.save_transition()
    _schedule_recheck(ctx, spec, p, ctx.clock())


def _abort_all(ctx: ModelContext, state: ModelState, spec: ModelSpec, t: TransitionState,
               by_slot: dict[int, OwnerView], deliveries: dict[str, dict[str, Any]]) -> None:
    """Lockstep, an owner failed before the barrier: no other owner commits. Prepared owners
    are told to abort (their live revision never changed) and the target's deliveries go."""
    failed = first_failure(t)
    why = f"owner {failed.pod} failed before the lockstep commit: {failed.reason}: {failed.message}"
    now = ctx.clock()
    with state.together():
        for i, p in enumerate(list(t.owners)):
            if p.step not in BEFORE_COMMIT:
                continue
            decision = abort(p, now, why)
            new = decision.progress
            for action in decision.actions:
                new = perform(ctx, state, spec, t, new, action, by_slot.get(p.slot), deliveries)
            t.owners[i] = new
        state.save_transition()
    ctx.event("LockstepAborted", f"no owner switches to {t.to[:19]}: {why}", warning=True)


def _commit_all(ctx: ModelContext, state: ModelState, spec: ModelSpec, t: TransitionState,
                by_slot: dict[int, OwnerView]) -> None:
    """Lockstep: every owner is prepared. The barrier is recorded first (a restarted operator
    then commits, never aborts), then every owner is told to commit at once."""
    t.committed = True
    state.save_transition()
    prepared = [(i, p) for i, p in enumerate(t.owners) if p.step == Step.prepared]
    owners = [(by_slot[p.slot], p.owner_transition) for _, p in prepared if p.slot in by_slot]
    decide(ctx, spec, owners, "commit")
    for i, p in prepared:   # each then applies; one whose commit got lost is sent it again
        t.owners[i] = p.model_copy(update={"step": Step.applying})
    state.save_transition()
    ctx.event("LockstepCommitted", f"all {len(prepared)} owners prepared {t.to[:19]}; committed at once")
    ctx.follow_up.again = True


def _schedule_recheck(ctx: ModelContext, spec: ModelSpec, p: OwnerProgress, now: float) -> None:
    """The times this owner's step must be looked at again even if no event arrives: its
    timeout, and short retries for waits that no watch or owner answer reports."""
    if p.step in (Step.waiting, Step.done, Step.failed):
        return
    if p.started_at is not None:
        ctx.follow_up.recheck_in(p.started_at + spec.transition.timeout_seconds - now + 0.1)
    if (p.step == Step.applying and not p.owner_transition) or p.step == Step.verifying:
        ctx.follow_up.recheck_in(retry_policy.OWNER_STATE_SECONDS)  # the owner's state, not a watch


def _announce(ctx: ModelContext, t: TransitionState, p: OwnerProgress) -> None:
    if p.step == Step.failed:
        ctx.event(p.reason or "OwnerTransitionFailed", p.message, warning=True)
    elif p.step in STEP_EVENTS:
        reason, text = STEP_EVENTS[p.step]
        ctx.event(reason, text.format(pod=p.pod, to=t.to[:19]))


def _finish(ctx: ModelContext, state: ModelState, spec: ModelSpec, t: TransitionState,
            result: str) -> None:
    now = ctx.clock()
    t.result = result
    failed = first_failure(t)
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
    metrics.TRANSITIONS.labels(path=t.path, strategy=t.strategy, result=result).inc()
    with state.together():
        if result == "succeeded":
            state.commit_bundle(t.to, t.to_source, keep_previous=spec.transition.keep_previous)
        state.finish_transition(summary)
    if result == "succeeded":
        ctx.event("TransitionSucceeded", f"all {len(t.owners)} owners are on {t.to[:19]} "
                                         f"in {summary['durations']['totalSeconds']:.1f}s")
    else:
        ctx.event("TransitionFailed", f"transition to {t.to[:19]} failed: {t.reason}: {t.message}",
                  warning=True)
