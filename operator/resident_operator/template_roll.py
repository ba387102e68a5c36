"""Rolling owners onto a changed Pod template, one ``maxUnavailable`` batch at a time.

When the spec changes what owner Pods are made of (image, port, resources, backend,
variants, placement; see ``pod_template.py``) but not the bundle revision, running owners
are replaced: the old Pod is deleted by UID and the slot's next incarnation is created on
the committed revision, so ``status.bundle`` and the transition history stay as they
are. At most ``spec.transition.maxUnavailable`` owners are unavailable at once, counting
those already not ready, so with the default of 1 each new owner is Ready before the
next old one goes. The Pod events the roll causes (deletion, readiness) wake the model,
so the next batch follows at once.

No roll starts while a transition runs or is about to start (spec.bundle differs from the
committed revision): the transition's own replacements use the new template, and what
remains is rolled after it.
"""

from __future__ import annotations

from typing import Any

from .context import ModelContext
from .model_state import ModelState
from .observe import OwnerView, owner_view
from .owners import replace_owner
from .pod_template import outdated, template_hash
from .spec import ModelSpec


def roll_pod_template(ctx: ModelContext, state: ModelState, spec: ModelSpec,
                      pods: list[dict[str, Any]], views: list[OwnerView]) -> list[OwnerView]:
    """Replace owners made from an older template, within the unavailability budget;
    return the views with replaced owners swapped for their successors."""
    if state.transition is not None or spec.bundle.digest != state.bundle.get("digest"):
        return views
    current = template_hash(ctx.name, spec, ctx.settings)
    old = {p["metadata"]["uid"] for p in pods if outdated(p, current)}
    live = [v for v in views if not v.terminating and 0 <= v.slot < spec.replicas]
    budget = spec.transition.max_unavailable - (spec.replicas - sum(1 for v in live if v.ready))
    replaced: dict[str, OwnerView] = {}
    for v in sorted((v for v in live if v.uid in old), key=lambda v: (v.ready, v.slot)):
        if v.ready:                  # replacing an owner that is not ready costs no budget
            if budget <= 0:
                break
            budget -= 1
        pod = replace_owner(ctx, state, spec, v.slot, (v.pod, v.uid),
                            (state.bundle["digest"], state.bundle["source"]))
        ctx.event("OwnerPodRolled", f"owner Pod {v.pod} was made from an older Pod template; "
                                    f"replaced by {pod['metadata']['name']} (template {current}) "
                                    f"on the same revision {state.bundle['digest'][:19]}")
        replaced[v.uid] = owner_view(pod)
    return [replaced.get(v.uid, v) for v in views]
