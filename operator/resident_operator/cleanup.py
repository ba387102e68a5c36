"""Cleanup by UID: the finalizer's work and the orphan sweep.

``delete_recorded_children`` deletes every recorded child with a UID precondition and
forgets records whose object is gone (or whose name now belongs to another UID: that
object is not ours and is left alone). The finalizer ``resident.dev/cleanup`` is
removed only when it returns no remaining child; BundleDeliveries stay until the bridge
has released them (its own finalizer), Pods until kubelet has stopped them.

``sweep_orphans`` deletes objects labelled for the model whose UID is not recorded, and
``prune_records`` forgets records of objects that went away on their own.
"""

from __future__ import annotations

from . import children as ch
from .context import ModelContext
from .model_state import ModelState

SWEPT_KINDS = ("BundleDelivery", "Pod", "Service", "PodDisruptionBudget", "Secret")


def delete_recorded_children(ctx: ModelContext, state: ModelState) -> list[ch.Child]:
    """Ask every recorded child to go; return the records of those still present."""
    remaining = []
    for rec in sorted(state.children, key=lambda r: SWEPT_KINDS.index(r["kind"])
                      if r["kind"] in SWEPT_KINDS else len(SWEPT_KINDS)):
        obj = ctx.kube.get(ctx.namespace, rec["kind"], rec["name"])
        if obj is None or obj["metadata"].get("uid") != rec["uid"]:
            state.forget_child(rec["uid"])
            continue
        if not obj["metadata"].get("deletionTimestamp"):
            result = ctx.kube.delete(ctx.namespace, rec["kind"], rec["name"], rec["uid"])
            if result == "deleted":
                ctx.event("ChildDeleted", f"deleted {rec['kind']} {rec['name']} (uid {rec['uid']})")
            elif result in ("gone", "not-ours"):
                state.forget_child(rec["uid"])
                continue
        remaining.append(rec)
    return remaining


def prune_records(ctx: ModelContext, state: ModelState) -> int:
    """Forget records whose object is gone or whose name now has another UID."""
    forgotten = 0
    for rec in list(state.children):
        obj = ctx.kube.get(ctx.namespace, rec["kind"], rec["name"])
        if obj is None or obj["metadata"].get("uid") != rec["uid"]:
            state.forget_child(rec["uid"])
            forgotten += 1
    return forgotten


def sweep_orphans(ctx: ModelContext, state: ModelState) -> list[str]:
    """Delete unrecorded objects labelled for this model; return their ``kind/name``."""
    swept = []
    for kind in SWEPT_KINDS:
        for obj in ch.orphans(ctx.kube.list(ctx.namespace, kind, ctx.selector), state.children):
            meta = obj["metadata"]
            if ctx.kube.delete(ctx.namespace, kind, meta["name"], meta["uid"]) == "deleted":
                swept.append(f"{kind}/{meta['name']}")
                ctx.event("OrphanDeleted", f"deleted {kind} {meta['name']} (uid {meta['uid']}): "
                                           "labelled for this model but not recorded as its child")
    return swept
