"""The model's PodDisruptionBudget: a node drain evicts at most ``maxUnavailable`` owners.

One PDB per model, named after it, selecting its owner Pods, with
``maxUnavailable = spec.transition.maxUnavailable`` (the bound the operator keeps during a
rollout too). A companion child (``companions.py``): recorded, adopted, kept in line with
the spec, deleted by UID with the model. It is ``policy/v1``, served by every Kubernetes the
operator supports (``policy/v1beta1`` is gone since 1.25).
"""

from __future__ import annotations

from typing import Any

from . import naming
from .companions import ensure_companion
from .context import ModelContext
from .model_state import ModelState
from .spec import ModelSpec

KIND = "PodDisruptionBudget"
API_VERSION = "policy/v1"


def build_disruption_budget(model: str, model_uid: str, spec: ModelSpec) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": naming.fit(model),
                     "labels": naming.model_labels(model, model_uid, naming.COMPONENT_BUDGET)},
        "spec": {"maxUnavailable": spec.transition.max_unavailable,
                 "selector": {"matchLabels": naming.owner_match(model_uid)}},
    }


def ensure_disruption_budget(ctx: ModelContext, state: ModelState, spec: ModelSpec) -> None:
    wanted = build_disruption_budget(ctx.name, ctx.uid, spec)
    ensure_companion(ctx, state, wanted, ("maxUnavailable", "selector"))
