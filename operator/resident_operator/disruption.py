"""The model's PodDisruptionBudget: a node drain evicts at most ``maxUnavailable`` owners.

One PDB per model, named after it, selecting its owner Pods, with
``maxUnavailable = spec.transition.maxUnavailable`` (the bound the operator keeps during a
rollout too). A companion child (``companions.py``): recorded, adopted, kept in line with
the spec, deleted by UID with the model. It uses ``policy/v1`` where the API server serves
it (1.21 and newer) and ``policy/v1beta1`` before.
"""

from __future__ import annotations

from typing import Any

from . import naming
from .companions import ensure_companion
from .context import ModelContext
from .model_state import ModelState
from .spec import ModelSpec

KIND = "PodDisruptionBudget"


def build_disruption_budget(model: str, model_uid: str, spec: ModelSpec, api_version: str
                            ) -> dict[str, Any]:
    return {
        "apiVersion": api_version, "kind": KIND,
        "metadata": {"name": naming.fit(model),
                     "labels": naming.model_labels(model, model_uid, naming.COMPONENT_BUDGET)},
        "spec": {"maxUnavailable": spec.transition.max_unavailable,
                 "selector": {"matchLabels": naming.owner_match(model_uid)}},
    }


def ensure_disruption_budget(ctx: ModelContext, state: ModelState, spec: ModelSpec) -> None:
    wanted = build_disruption_budget(ctx.name, ctx.uid, spec, ctx.kube.api_version(KIND))
    ensure_companion(ctx, state, wanted, ("maxUnavailable", "selector"))
