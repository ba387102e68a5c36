"""Cleanup by UID: the finalizer's work and the orphan sweep.

``delete_recorded_children`` deletes every recorded child with a UID precondition and
forgets records whose object is gone (or whose name now belongs to another UID: that
object is not ours and is left alone). The finalizer ``resident.dev/cleanup`` is
removed only when it returns no remaining child; BundleDeliveries stay until the bridge
has released them (its own finalizer), Pods until kubelet has stopped them.

``abandon_stuck_children`` makes deletion always finish: a child still there
``delete_grace_seconds`` after it was asked to go (the bridge uninstalled, its node gone
or down) is no longer waited for. A BundleDelivery loses the bridge's finalizer (only
BundleDeliveries of this model, only that finalizer); an owner Pod is left to kubelet or
the pod garbage collector. Each gets a Warning Event naming what may remain on which node.

``release_deliveries_of_gone_owners`` deletes, by UID, the BundleDeliveries of owner Pods
that are gone or terminating: an owner replaced outside a transition (lost with its node,
evicted by a drain, deleted by hand) leaves its incarnation's delivery behind, and its
lease would pin the revision in that node's store. The bridge there releases it (now, or
when its node comes back) and removes its finalizer; the record goes with the object.

``sweep_orphans`` deletes objects labelled for the model whose UID is not recorded, once
they are ``ORPHAN_MIN_AGE_SECONDS`` old, and ``prune_records`` forgets records of objects
that went away on their own. The age is what keeps two operators apart at a leader
handover: one operator's child lives unrecorded between its create and the status write
that records it, and the other operator's sweep (which does not hold the first one's pass
lock) must not take it for an orphan in that window.
"""

from __future__ import annotations

from typing import Any

from . import children as ch
from . import naming
from .conditions import seconds_since
from .context import ModelContext
from .delivery import deliveries_of_gone_owners
from .model_state import ModelState

ORPHAN_MIN_AGE_SECONDS = 10.0   # longer than a create and its record take, owner calls included
SWEPT_KINDS = ("BundleDelivery", "Pod", "Service", "PodDisruptionBudget", "NetworkPolicy", "Secret")


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


def abandon_stuck_children(ctx: ModelContext, state: ModelState, remaining: list[ch.Child],
                           grace_seconds: float) -> list[ch.Child]:
    """Stop waiting for children asked to go more than ``grace_seconds`` ago; return the
    records still waited for."""
    waiting = []
    for rec in remaining:
        obj = ctx.kube.get(ctx.namespace, rec["kind"], rec["name"])
        if obj is None or obj["metadata"].get("uid") != rec["uid"]:
            state.forget_child(rec["uid"])
            continue
        if _seconds_deleting(obj, ctx.clock()) < grace_seconds:
            waiting.append(rec)
            continue
        if rec["kind"] == "BundleDelivery" and not _release_delivery(ctx, obj, grace_seconds):
            waiting.append(rec)   # changed meanwhile: look again next time
            continue
        if rec["kind"] == "Pod":
            node = (obj.get("spec") or {}).get("nodeName") or "no node"
            ctx.event("CleanupAbandoned", f"owner Pod {rec['name']} is still terminating on node "
                      f"{node} {grace_seconds:.0f}s after its deletion; not waiting for it: kubelet "
                      f"or the pod garbage collector removes it, and until then its container may "
                      f"still run and hold its card on {node}", warning=True)
        state.forget_child(rec["uid"])
    return waiting


def _release_delivery(ctx: ModelContext, obj: dict[str, Any], grace_seconds: float) -> bool:
    meta, spec = obj["metadata"], obj.get("spec") or {}
    if naming.BRIDGE_FINALIZER not in (meta.get("finalizers") or []):
        return True
    if not ctx.kube.remove_finalizer(ctx.namespace, obj, naming.BRIDGE_FINALIZER):
        return False
    node = spec.get("nodeName") or "no node"
    digest = (spec.get("bundle") or {}).get("digest", "?")
    ctx.event("CleanupAbandoned", f"the bridge did not release BundleDelivery {meta['name']} "
              f"{grace_seconds:.0f}s after its deletion; removed its finalizer "
              f"{naming.BRIDGE_FINALIZER}. Node {node} may still hold revision {digest} staged "
              f"in its store, with a lease, until the bridge there runs again", warning=True)
    return True


def release_deliveries_of_gone_owners(ctx: ModelContext, state: ModelState,
                                      pods: list[dict[str, Any]]) -> list[str]:
    """Delete recorded BundleDeliveries whose owner Pod is not among the live ``pods``
    (the model's owner Pods as this pass found them); return their names."""
    if not ch.of_kind(state.children, "BundleDelivery"):
        return []
    live = {p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}
    ours = [bd for bd in ctx.children("BundleDelivery", state.children)
            if ch.is_recorded(state.children, bd)]
    released = []
    for bd in deliveries_of_gone_owners(ours, live):
        meta, spec = bd["metadata"], bd.get("spec") or {}
        if ctx.kube.delete(ctx.namespace, "BundleDelivery", meta["name"], meta["uid"]) == "deleted":
            released.append(meta["name"])
            ctx.event("OwnerDeliveryReleased", f"deleted BundleDelivery {meta['name']}: its owner Pod "
                      f"{spec.get('podName')} is gone or terminating; the bridge on node "
                      f"{spec.get('nodeName') or '(none)'} releases its lease (when it runs again)")
    return released


def _seconds_deleting(obj: dict[str, Any], now: float) -> float:
    stamp = obj["metadata"].get("deletionTimestamp")
    return seconds_since(stamp, now) if stamp else 0.0


def seconds_old(obj: dict[str, Any], now: float) -> float:
    stamp = obj["metadata"].get("creationTimestamp")
    return seconds_since(stamp, now) if stamp else ORPHAN_MIN_AGE_SECONDS


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
    """Delete unrecorded objects labelled for this model, once ``ORPHAN_MIN_AGE_SECONDS``
    old (younger ones may be another operator's create, not yet recorded); return their
    ``kind/name``."""
    swept = []
    for kind in SWEPT_KINDS:   # the API server's LIST: a delete must not act on a stale cache
        for obj in ch.orphans(ctx.kube.list(ctx.namespace, kind, ctx.selector), state.children):
            meta = obj["metadata"]
            if seconds_old(obj, ctx.clock()) < ORPHAN_MIN_AGE_SECONDS:
                continue   # a later sweep looks again: it still differs from the records
            if ctx.kube.delete(ctx.namespace, kind, meta["name"], meta["uid"]) == "deleted":
                swept.append(f"{kind}/{meta['name']}")
                ctx.event("OrphanDeleted", f"deleted {kind} {meta['name']} (uid {meta['uid']}): "
                                           "labelled for this model but not recorded as its child")
    return swept
