"""One reconcile pass of one model: validate, place, observe, transition, report.

The pass is level-triggered and idempotent: it reads the model fresh from the API
server, compares what the spec asks for with what exists and moves one step closer.
Handlers call it on create/update/resume and a timer calls it every
``RESIDENT_RESYNC_SECONDS``, always under the model's lock, so passes never interleave.

An invalid spec stops the pass right after writing ``Degraded=True, reason InvalidSpec``:
nothing is created, changed or deleted for that model. Before the first placement the
source must hold ``spec.bundle`` (``source_check.py``); until it does, the pass writes
``Degraded`` with the source's error and creates nothing either.
"""

from __future__ import annotations

from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any, Callable

from . import conditions as c
from . import metrics, naming
from .context import ModelContext
from .model_state import ModelState, StatusStore
from .observe import OwnerView, derive_status
from .owners import ensure_owner_pods, ensure_token, observe_owners, replace_broken_owners
from .prestage import ensure_preloads, ensure_stages, stage_status
from .rollout import step_transition
from .cleanup import release_deliveries_of_gone_owners
from .control_policy import ensure_control_policy
from .disruption import ensure_disruption_budget
from .serving import ensure_service
from .source_check import check_first_placement
from .spec import ModelSpec, SpecError, parse_spec, spec_problems
from .template_roll import roll_pod_template
from .transition import slots_in_hand, step_deadline

OK, INVALID, GONE, BLOCKED = "ok", "invalid", "gone", "blocked"


def state_of(ctx: ModelContext) -> ModelState:
    """The model's durable state as ``ctx.body`` holds it; its writes are conditional on
    the body's resourceVersion (``model_state.py``)."""
    store = StatusStore(
        write=lambda patch, rv: ctx.kube.patch_model_status(ctx.namespace, ctx.name, patch, rv),
        read=lambda: _same_model(ctx.kube.get_model(ctx.namespace, ctx.name), ctx.uid),
        gave_up=lambda message: ctx.event("StatusWriteGaveUp", message, warning=True))
    return ModelState(ctx.body.get("status") or {}, ctx.body["metadata"].get("resourceVersion"), store)


def _same_model(body: dict[str, Any] | None, uid: str) -> dict[str, Any] | None:
    """``body`` if it is the model with ``uid`` (not a successor of the same name)."""
    return body if body is not None and body["metadata"].get("uid") == uid else None


def reconcile(ctx: ModelContext) -> tuple[str, str]:
    """Run one pass; returns (outcome, message). The body in ``ctx`` must be fresh."""
    body = ctx.body
    if body["metadata"].get("deletionTimestamp"):
        return GONE, "being deleted"
    state = state_of(ctx)
    raw = body.get("spec") or {}
    try:
        spec = parse_spec(raw)
        problems = spec_problems(spec, ctx.settings)
    except SpecError as e:
        spec, problems = None, [str(e)]
    if problems:
        replicas = raw.get("replicas") if isinstance(raw.get("replicas"), int) else 0
        report(ctx, state, derive_status(replicas=replicas, owners=[], problems=problems,
                                         transition=state.transition, last_transition=state.last_transition,
                                         blocker=None, desired_digest=""))
        return INVALID, "; ".join(problems)
    assert spec is not None
    # What this pass writes before a transition step (the first placement's revision, the
    # children it creates and their records, the status it derives) goes out as one status
    # write: at the report, or before the transition step, which saves its progress step
    # by step. A crash before the write loses no child: each has a deterministic name and
    # the model's UID label, so the next pass's create answers 409 and adopts it
    # (owners.create_child).
    with ExitStack() as held:
        held.enter_context(state.together())
        blocked = check_first_placement(ctx, state, spec)
        if blocked is not None:   # nothing is created until the source holds spec.bundle
            report(ctx, state, derive_status(replicas=spec.replicas, owners=[], problems=[], transition=None,
                                             last_transition=state.last_transition, blocker=blocked,
                                             desired_digest=spec.bundle.digest))
            return BLOCKED, blocked.message
        ctx.token = ctx.token or ensure_token(ctx, state)   # known from an earlier pass, else read
        t = state.transition
        managed = slots_in_hand(t) if t else set()
        revision = (t.to, t.to_source) if t else (state.bundle["digest"], state.bundle["source"])
        pods = ensure_owner_pods(ctx, state, spec, managed, revision)
        endpoint = ctx.endpoint
        if endpoint is None:   # companions not checked since they or the spec last changed
            endpoint = ensure_service(ctx, state, spec)
            budget_settled = ensure_disruption_budget(ctx, state, spec)
            ensure_control_policy(ctx, state)
            # '' (the name is taken) or a budget the disruption controller could not compute:
            # look again next pass
            ctx.endpoint = (endpoint or None) if budget_settled else None
        views = observe_owners(ctx, pods, spec)
        release_deliveries_of_gone_owners(ctx, state, pods)
        if state.transition is None:
            views = replace_broken_owners(ctx, state, spec, views)
            views = roll_pod_template(ctx, state, spec, pods, views)
        if state.transition is not None or spec.bundle.digest != state.bundle.get("digest"):
            held.close()   # a transition runs or starts: its steps write as they go
        blocker = step_transition(ctx, state, spec, views)
        metrics.set_transition_deadline(f"{ctx.namespace}/{ctx.name}",
                                        step_deadline(state.transition, spec.transition.timeout_seconds))
        derived = derive_status(replicas=spec.replicas, owners=views, problems=[],
                                transition=state.transition, last_transition=state.last_transition,
                                blocker=blocker, desired_digest=spec.bundle.digest)
        live = sum(1 for v in views if not v.terminating)
        derived = dict(derived, endpoint=endpoint or None, replicas=live, selector=naming.owner_selector(ctx.uid))
        if state.transition is None:   # a transition owns the deliveries while it runs
            derived = _with_stages(ctx, state, spec, views, derived)
        report(ctx, state, derived)
    return OK, ""


def _with_stages(ctx: ModelContext, state: ModelState, spec: ModelSpec, views: list[OwnerView],
                 derived: dict[str, Any]) -> dict[str, Any]:
    """Keep the pre-staged revisions on every owner's node, and report ``status.stage``."""
    status = ctx.body.get("status") or {}
    if not (spec.stage or state.previous or status.get("stage")):
        return derived
    deliveries = ctx.children("BundleDelivery", state.children)
    ensure_stages(ctx, state, spec, views, deliveries)
    ensure_preloads(ctx, spec, views, deliveries)
    if state.previous and not spec.transition.keep_previous:
        state.forget_previous()   # its deliveries went just now
    stage, cond = stage_status(ctx.name, spec, views, deliveries)
    if cond is None and c.find(status.get("conditions"), c.STAGED):
        cond = c.condition(c.STAGED, False, "NoStage", "spec.stage is not set")
    conditions = derived["conditions"] + ([cond] if cond else [])
    return dict(derived, stage=stage, conditions=conditions)


def report(ctx: ModelContext, state: ModelState, derived: dict[str, Any]) -> None:
    """Write the derived status (keeping condition times) with what the pass holds, and post
    condition-change Events."""
    patch = {
        "observedGeneration": ctx.body["metadata"].get("generation"), "phase": derived["phase"],
        "ready": derived["ready"], "identity": derived["identity"] or None, "owners": derived["owners"],
    }
    for key in ("endpoint", "replicas", "selector", "stage"):   # not known when the spec is invalid
        if key in derived:
            patch[key] = derived[key]
    write_status(ctx, derived["conditions"], patch, state.report)
    metrics.set_model_phase(f"{ctx.namespace}/{ctx.name}", derived["phase"])


def write_status(ctx: ModelContext, conditions: list[dict[str, Any]], fields: dict[str, Any],
                 write: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Merge ``conditions`` into the model's (keeping their times and the other types), post
    an Event for each that changed, and write them with ``fields`` unless nothing changed:
    with ``write`` (a pass's :meth:`~.model_state.ModelState.report`), else as a plain
    merge patch (a failed pass, whose state may be the thing that failed)."""
    previous = (ctx.body.get("status") or {}).get("conditions") or []
    merged = c.merge_conditions(previous, conditions, now=datetime.now(timezone.utc),
                                generation=ctx.body["metadata"].get("generation"))
    _announce_changes(ctx, previous, merged)
    patch = dict(fields, conditions=merged)
    if changed(ctx.body.get("status") or {}, patch):
        if write is not None:
            write(patch)
        else:
            ctx.kube.patch_model_status(ctx.namespace, ctx.name, patch)


def changed(status: dict[str, Any], patch: dict[str, Any]) -> bool:
    """Would this merge patch change ``status``? (Unchanged passes write nothing.)"""
    for key, value in patch.items():
        if value is None:
            if status.get(key) is not None:
                return True
        elif status.get(key) != value:
            return True
    return False


def _announce_changes(ctx: ModelContext, previous: list[dict[str, Any]],
                      merged: list[dict[str, Any]]) -> None:
    old = {x.get("type"): x for x in previous}
    for cond in merged:
        prior = old.get(cond["type"]) or {}
        changed = (prior.get("status"), prior.get("reason")) != (cond["status"], cond["reason"])
        if not changed:
            continue
        if cond["type"] == c.DEGRADED and cond["status"] == "True":
            ctx.event(cond["reason"], cond["message"], warning=True)
        elif cond["type"] == c.DEGRADED and prior.get("status") == "True":
            ctx.event("Recovered", f"no longer degraded (was {prior.get('reason')})")
        elif cond["type"] == c.READY and cond["status"] == "True":
            ctx.event("ModelReady", cond["message"])
        elif cond["type"] == c.READY and prior.get("status") == "True":
            ctx.event("ModelNotReady", cond["message"], warning=True)
        elif cond["type"] == c.STAGED and cond["reason"] in ("Staged", "StageFailed"):
            ctx.event("RevisionStaged" if cond["status"] == "True" else "StageFailed", cond["message"],
                      warning=cond["status"] != "True")
