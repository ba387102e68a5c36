"""Planning a transition: which path, which method, in place or reload, and the bytes.

The bundle package answers the delivery half (``bundle.plan.plan_delivery``: graph-only or
whole-bundle, rebase or reconstruct, predicted bytes). This module adds the owner half:
an in-place update (B2) changes rows of resident tensors, so it is possible only when the
graph is unchanged and the owners say they support it; otherwise the owner reloads (B1).
``spec.transition.strategy`` InPlace makes an impossible in-place update an error before
any owner is touched; Auto falls back to Reload; Reload always reloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bundle.manifest import Manifest
from bundle.plan import plan_delivery

from .spec import ModelSpec


class InPlaceImpossible(ValueError):
    """spec.transition.strategy is InPlace but this change cannot be applied in place."""


@dataclass(frozen=True)
class TransitionPlan:
    path: str               # GraphOnly | WholeBundle
    method: str             # graph-only | rebase | reconstruct
    strategy: str           # predicted: InPlace | Reload
    request: str            # what the owner is asked for: spec.transition.strategy
    predicted: dict[str, Any]

    def describe(self) -> str:
        b = self.predicted.get("bytes") or {}
        return (f"path {self.path}, method {self.method}, strategy {self.strategy}; predicted "
                f"fetch {b.get('fetch', 0)} B, reuse {b.get('reuse', 0)} B, "
                f"write {b.get('write', 0)} B")


def choose_strategy(requested: str, graph_changed: bool, owners_in_place: bool | None) -> str:
    """The strategy the transition will use; raise :class:`InPlaceImpossible` if InPlace cannot."""
    why = None
    if graph_changed:
        why = "the graph changed, so the owners must reload"
    elif owners_in_place is False:
        why = "the owners do not support in-place updates"
    if requested == "Reload":
        return "Reload"
    if why is None:
        return "InPlace"
    if requested == "InPlace":
        raise InPlaceImpossible(f"spec.transition.strategy is InPlace but {why}")
    return "Reload"


def plan_transition(target: Manifest, donor: Manifest | None, spec: ModelSpec,
                    owners_in_place: bool | None) -> TransitionPlan:
    """Plan the delivery and the owner strategy; raises PlanError or InPlaceImpossible."""
    d = spec.delivery
    plan = plan_delivery(target, donor, mode=d.mode, rebase=d.rebase, min_reuse=d.min_reuse)
    graph_changed = donor is None or donor.graph_digest != target.graph_digest
    strategy = choose_strategy(spec.transition.strategy, graph_changed, owners_in_place)
    predicted = {k: v for k, v in plan.to_status().items() if v is not None}
    predicted["strategy"] = strategy
    return TransitionPlan(path=plan.path, method=plan.method, strategy=strategy,
                          request=spec.transition.strategy, predicted=predicted)
