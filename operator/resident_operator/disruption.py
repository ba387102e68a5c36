"""The model's PodDisruptionBudget: a node drain evicts at most ``maxUnavailable`` owners.

One PDB per model whose ``spec.replicas`` is above ``spec.transition.maxUnavailable``,
named after it, selecting its owner Pods, with ``maxUnavailable =
spec.transition.maxUnavailable`` (the bound the operator keeps during a rollout too). A
model with no more owners than that (one owner, by default) gets none: such a budget
allows every eviction, as no budget does, and would only cost the API server an object
and the disruption controller its upkeep; it is deleted when a scale-down makes it so. A
companion child (``companions.py``): recorded, adopted, kept in line with
the spec, deleted by UID with the model. It is ``policy/v1``, served by every Kubernetes the
operator supports (``policy/v1beta1`` is gone since 1.25).

How many owners to expect, the disruption controller learns from the owners' controller,
the ResidentModel, through its scale subresource (``spec.replicas``); its ClusterRole
``system:controller:disruption-controller`` may ``get`` ``*/scale`` in every group. It
maps the owner reference's kind to a resource with the controller-manager's discovery
cache, which is refreshed every 30 s, so a model placed within 30 s of the CRD's
installation can find it stale ("no matches for kind ResidentModel"). The controller then
writes ``DisruptionAllowed=False`` reason ``SyncFailed`` (``disruptionsAllowed: 0``) and an
Event ``CalculateExpectedPodCountFailed``, and does not try again until a Pod or the PDB
changes: with settled owners, never, and every eviction (``kubectl drain``) is refused.
While the PDB says so, the operator touches it (an annotation) every
``retry_policy.BUDGET_RESYNC_SECONDS``, which makes the controller compute it again.
"""

from __future__ import annotations

from typing import Any

from . import naming, retry_policy
from .companions import ensure_companion, retire_companion
from .conditions import find
from .context import ModelContext
from .model_state import ModelState
from .spec import ModelSpec

KIND = "PodDisruptionBudget"
API_VERSION = "policy/v1"
SYNC_FAILED = "SyncFailed"                      # the controller's reason, policy/v1 SyncFailedReason
RESYNC_ANNOTATION = "resident.dev/budget-resync"


def build_disruption_budget(model: str, model_uid: str, spec: ModelSpec) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": naming.fit(model),
                     "labels": naming.model_labels(model, model_uid, naming.COMPONENT_BUDGET)},
        "spec": {"maxUnavailable": spec.transition.max_unavailable,
                 "selector": {"matchLabels": naming.owner_match(model_uid)}},
    }


def sync_failure(budget: dict[str, Any]) -> str:
    """The disruption controller's error while it could not compute the budget; else ""."""
    cond = find((budget.get("status") or {}).get("conditions"), "DisruptionAllowed")
    if cond and cond.get("status") == "False" and cond.get("reason") == SYNC_FAILED:
        return cond.get("message") or SYNC_FAILED
    return ""


def resync_due(budget: dict[str, Any], now: float) -> bool:
    """Has the budget not been touched for a resync in the last ``BUDGET_RESYNC_SECONDS``?"""
    last = ((budget.get("metadata") or {}).get("annotations") or {}).get(RESYNC_ANNOTATION, "")
    try:
        return now - float(last) >= retry_policy.BUDGET_RESYNC_SECONDS
    except ValueError:
        return True


def bounds_evictions(spec: ModelSpec) -> bool:
    """Would a budget refuse an eviction? Only with more owners than ``maxUnavailable``."""
    return spec.replicas > spec.transition.max_unavailable


def ensure_disruption_budget(ctx: ModelContext, state: ModelState, spec: ModelSpec) -> bool:
    """Keep the budget in line with the spec (none where it would bound nothing); False
    while the disruption controller could not compute it (the pass then checks it again
    after ``BUDGET_RESYNC_SECONDS``)."""
    if not bounds_evictions(spec):
        retire_companion(ctx, state, KIND, f"{spec.replicas} owners, maxUnavailable "
                         f"{spec.transition.max_unavailable}: a budget would bound nothing")
        return True
    wanted = build_disruption_budget(ctx.name, ctx.uid, spec)
    budget = ensure_companion(ctx, state, wanted, ("maxUnavailable", "selector"))
    failure = sync_failure(budget or {})
    if not failure:
        return True
    now = ctx.clock()
    if resync_due(budget, now):
        ctx.kube.patch(ctx.namespace, KIND, budget["metadata"]["name"],
                       {"metadata": {"annotations": {RESYNC_ANNOTATION: f"{now:.0f}"}}})
        ctx.event("BudgetResyncRequested", f"the disruption controller could not compute "
                  f"PodDisruptionBudget {budget['metadata']['name']} ({failure}); asked it to look again")
    ctx.follow_up.recheck_in(retry_policy.BUDGET_RESYNC_SECONDS)
    return False
