"""Companions: the children a model has exactly one of, kept in line with its spec.

The Service in front of the owners (``serving.py``), the PodDisruptionBudget over them
(``disruption.py``) and the NetworkPolicy around their control port
(``control_policy.py``). A pass creates the companion (recorded by UID) when it was never
recorded, else reads it by name and creates it again when it is missing; it adopts one
left by a crash (the create's 409) when it is labelled for and owned by this model,
forgets records of earlier ones (someone deleted them), and patches the spec fields the
model decides when they drifted. A name held by an object that is not this
model's is left alone, with a Warning Event. A companion no longer wanted (the budget of a
model with no more owners than ``maxUnavailable``, the policy with its setting off) is
deleted by UID.
"""

from __future__ import annotations

from typing import Any

from . import children as ch
from .context import ModelContext
from .model_state import ModelState
from .owners import adoptable, create_child


def ensure_companion(ctx: ModelContext, state: ModelState, wanted: dict[str, Any],
                     spec_keys: tuple[str, ...]) -> dict[str, Any] | None:
    """The model's ``wanted`` companion as it now exists, or None while its name is taken."""
    kind, name = wanted["kind"], wanted["metadata"]["name"]
    # Never recorded (a new model): created straight away, a 409 answers with what holds
    # the name. Recorded: read, to see that it is still there and in line with the spec;
    # from the API server, not a cache, as a pass gets here only after an event about a
    # companion or the spec, or a sweep that found a difference (driver.FORGETS), and
    # the operator keeps no copy of every model's companions for a read this rare.
    obj = ctx.kube.get(ctx.namespace, kind, name) if ch.of_kind(state.children, kind) else None
    if obj is None:
        obj = create_child(ctx, state, wanted, announce=(f"{kind}Created", f"{kind} {name}"))
    elif not ch.is_recorded(state.children, obj):
        if adoptable(obj, ctx.uid):
            state.record_child(dict(obj, kind=kind, apiVersion=wanted["apiVersion"]))
        else:
            obj = None
    if obj is None:
        ctx.event(f"{kind}NameTaken", f"{kind} {name} exists and is not this model's", warning=True)
        return None
    for rec in ch.of_kind(state.children, kind):
        if rec["uid"] != obj["metadata"]["uid"]:
            state.forget_child(rec["uid"])
    drift = {k: wanted["spec"][k] for k in spec_keys
             if (obj.get("spec") or {}).get(k) != wanted["spec"][k]}
    if drift:
        ctx.kube.patch(ctx.namespace, kind, name, {"spec": drift})
    return obj


def retire_companion(ctx: ModelContext, state: ModelState, kind: str, why: str) -> None:
    """Delete, by UID, the recorded companions of ``kind`` no longer wanted (``why``)."""
    for rec in ch.of_kind(state.children, kind):
        if ctx.kube.delete(ctx.namespace, kind, rec["name"], rec["uid"]) == "deleted":
            ctx.event("ChildDeleted", f"deleted {kind} {rec['name']} (uid {rec['uid']}): {why}")
        state.forget_child(rec["uid"])
