"""The orphan sweep: one cluster-wide pass every ``RESIDENT_SWEEP_SECONDS``, or less often
when sweeps take long (:func:`pause_after`).

It lists each swept kind (``cleanup.SWEPT_KINDS``) once per namespace that holds
models, by the ``resident.dev/model-uid`` label, and compares what it finds with the
children each model's status records (kept in memory from the model watch). It reads only
the objects' metadata (all it compares), and the whole objects of a cached kind only where
the cache disagrees with them (below). Only a model
with a difference is looked at closely: under its pass lock and from a fresh read, objects
labelled for it but not recorded are deleted by UID (Event ``OrphanDeleted``) and records
of objects that went away are forgotten; then the model is woken (cause ``sweep``) to read
its token and companions again and put back what is missing, as the watch event that
should have woken it was missed. An object whose controller, by owner reference,
is a model that no longer exists is deleted by UID as well. A settled cluster costs one
LIST request per swept kind, namespace and sweep, whatever the number of models. The
LISTs of owner Pods and BundleDeliveries also check the operator's cache of them
(``child_cache.py``): where it holds other objects or versions, a LIST of the whole objects
refreshes it, which drops what a missed watch event left in it. At 3,000 settled models
the sweep's LISTs were two thirds of the operator's CPU, most of it decoding JSON, and
still half of it with metadata only (experiments/10, "Where a settled operator's time goes").

The sweep has a budget of its own: it runs on its own thread (handlers.py), so passes
cannot starve it nor it them, and one sweep runs at most ``RESIDENT_SWEEP_BUDGET_SECONDS``:
it waits for a model's pass lock no longer than what is left of it, skips a model whose
pass holds the lock longer, and stops between models when the budget is spent. The next
sweep starts at the next namespace (``rounds``), and within a namespace looks first at the
models it looked at least recently (``ModelHandle.swept_at``), so every model gets its turn.

What is not a difference (``differing``): a model whose records changed after its
namespace's LISTs began (they may predate the child: the next sweep compares again), and
an unrecorded object younger than ``ORPHAN_MIN_AGE_SECONDS`` (a create whose record is on
its way). Without these, models being created or switched in numbers all differed: at
3,000 models one sweep looked closely at nearly every one, for 17 minutes.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Callable, Iterable

from . import naming
from .child_cache import KINDS as CACHED_KINDS
from .cleanup import ORPHAN_MIN_AGE_SECONDS, SWEPT_KINDS, prune_records, seconds_old, sweep_orphans
from .driver import ModelHandle
from .kube import Kube
from .passes import model_context
from .reconcile import state_of
from .settings import OperatorSettings

log = logging.getLogger("resident.operator")


def pause_after(settings: OperatorSettings, took: float) -> float:
    """How long to wait after a sweep that took ``took`` seconds: ``sweep_seconds``, or
    longer, so that sweeping takes at most ``sweep_share`` of the time. The sweep is a
    safety net behind the watches: at 3,000 settled models its LISTs (six kinds, every
    object) were two thirds of the operator's CPU at one a minute (experiments/10)."""
    return max(settings.sweep_seconds, took / settings.sweep_share)


def sweep_once(kube: Kube, settings: OperatorSettings, handles: Iterable[ModelHandle],
               wake: Callable[[ModelHandle], None], rounds: int = 0) -> list[str]:
    """One sweep over the namespaces with models, within the sweep's budget, starting at
    namespace ``rounds`` (modulo their number); returns the ``kind/name`` deleted.
    ``wake`` is called (from this thread) for each model whose children differed."""
    deadline = time.monotonic() + settings.sweep_budget_seconds
    by_namespace: dict[str, list[ModelHandle]] = defaultdict(list)
    for h in handles:
        by_namespace[h.namespace].append(h)
    order = sorted(by_namespace)
    order = order[rounds % len(order):] + order[:rounds % len(order)] if order else []
    swept: list[str] = []
    for namespace in order:
        models = by_namespace[namespace]
        if _spent(deadline, settings, namespace):
            break
        listed_from = time.monotonic()
        listed: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for kind in SWEPT_KINDS:
            objs, version = kube.list_at(namespace, kind, naming.LABEL_MODEL_UID, metadata_only=True)
            if kube.cache is not None and kind in CACHED_KINDS and not kube.cache.agrees(namespace, kind, objs):
                # the whole objects, for the cache (before any model is woken)
                objs, version = kube.list_at(namespace, kind, naming.LABEL_MODEL_UID)
                kube.cache.refresh(namespace, kind, objs, version)
            for obj in objs:
                listed[obj["metadata"]["labels"][naming.LABEL_MODEL_UID]].append(obj)
        known = {h.uid for h in models}
        for model_uid, objs in listed.items():
            if model_uid not in known:
                swept += _delete_if_parent_gone(kube, namespace, objs)
        for h in differing(models, listed, listed_from, time.time()):
            if _spent(deadline, settings, namespace):
                return swept
            swept += _sweep_model(kube, settings, h, deadline)
            h.swept_at = time.monotonic()
            wake(h)
    return swept


def differing(models: Iterable[ModelHandle], listed: dict[str, list[dict[str, Any]]],
              listed_from: float, now: float) -> list[ModelHandle]:
    """The models whose listed children (by model UID) differ from their records, the ones
    looked at least recently first. ``listed_from``: ``time.monotonic()`` when the LISTs
    began; ``now``: the wall clock, for objects' ages."""
    found = [h for h in models
             if h.recorded_at < listed_from and _differs(h, listed.get(h.uid, []), now)]
    return sorted(found, key=lambda h: h.swept_at)


def _differs(h: ModelHandle, objs: list[dict[str, Any]], now: float) -> bool:
    present = {o["metadata"]["uid"] for o in objs}
    unrecorded = any(o["metadata"]["uid"] not in h.recorded and not o["metadata"].get("deletionTimestamp")
                     and seconds_old(o, now) >= ORPHAN_MIN_AGE_SECONDS for o in objs)
    return unrecorded or bool(h.recorded - present)


def _spent(deadline: float, settings: OperatorSettings, namespace: str) -> bool:
    if time.monotonic() < deadline:
        return False
    log.warning("the sweep's budget is spent; the rest waits for the next sweep",
                extra={"namespace": namespace, "budget_seconds": settings.sweep_budget_seconds})
    return True


def _sweep_model(kube: Kube, settings: OperatorSettings, h: ModelHandle, deadline: float
                 ) -> list[str]:
    """Under the model's pass lock, waited for no longer than the sweep's budget allows (a
    model skipped now is woken all the same, and its pass or the next sweep sees to it)."""
    if not h.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
        log.info("sweep skips a model whose pass holds its lock", extra={"model": f"{h.namespace}/{h.name}"})
        return []
    try:
        ctx = model_context(kube, settings, h.namespace, h.name)
        if ctx is None or ctx.uid != h.uid or ctx.body["metadata"].get("deletionTimestamp"):
            return []
        state = state_of(ctx)
        prune_records(ctx, state)
        return sweep_orphans(ctx, state)
    finally:
        h.lock.release()


def _delete_if_parent_gone(kube: Kube, namespace: str, objs: list[dict[str, Any]]) -> list[str]:
    """Objects labelled for a model this operator does not know: deleted only when their
    controller model is really gone (read back by the owner reference's name)."""
    swept = []
    for obj in objs:
        meta = obj["metadata"]
        ref = next((r for r in meta.get("ownerReferences") or []
                    if r.get("controller") and r.get("kind") == "ResidentModel"), None)
        if ref is None or meta.get("deletionTimestamp"):
            continue
        parent = kube.get_model(namespace, ref["name"])
        if parent is not None and parent["metadata"]["uid"] == ref["uid"]:
            continue   # alive: its operator has not seen it yet
        if kube.delete(namespace, obj["kind"], meta["name"], meta["uid"]) == "deleted":
            log.info("deleted a child of a deleted model", extra={
                "object": f"{obj['kind']}/{namespace}/{meta['name']}", "model_uid": ref["uid"]})
            swept.append(f"{obj['kind']}/{meta['name']}")
    return swept
