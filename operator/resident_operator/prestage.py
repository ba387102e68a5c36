"""Pre-staged revisions: ``spec.stage``, and the revision kept for a rollback.

Outside transitions each pass makes sure that the volume of every live owner holds these
revisions beside the live one, each through a BundleDelivery with ``activate: false`` (the
bridge stages it, leases it and leaves ``current`` alone). The delivery is named as the
transition's delivery of the same owner and revision would be (``naming.delivery_name``),
so a switch to the revision finds it by name and activates it instead of creating one,
and does not wait for it when it is staged already (``owner_step.perform``).
After a switch the revision the owners left stays staged when
``spec.transition.keepPrevious`` is on (``status.previousBundle``), so a rollback is a
pre-staged switch too; the next switch releases it.

A delivery of a revision no longer wanted (``spec.stage`` removed or changed, the kept
revision replaced) is deleted by UID, and the bridge takes the revision out of the volume.
Owners added later (scale-up, a replaced owner: a new incarnation, so new names) get their
own. ``status.stage`` and the ``Staged`` condition say how far ``spec.stage`` got on each
owner's node.

With ``spec.stage.preload`` each owner whose volume holds the staged revision is asked to
load it beside the live one (``POST /v1/preload``, owner/preload.py), so a reload to it is
a swap; a preload no longer wanted (the stage removed, changed or made live) is dropped
(``DELETE``). Each node's row in ``status.stage`` says how its owner's preload stands.
"""

from __future__ import annotations

from typing import Any

from . import children as ch
from . import conditions as c
from . import naming
from .context import ModelContext
from .delivery import build_bundle_delivery, observe_delivery, prestaged
from .model_state import ModelState
from .observe import OwnerView
from .owner_client import OwnerUnreachable
from .owners import create_child, owner_client
from .spec import ModelSpec

STAGED, STAGING, FAILED, LIVE = "Staged", "Staging", "Failed", "Live"


def kept_revisions(spec: ModelSpec, previous: dict[str, str] | None) -> dict[str, str]:
    """digest -> source of the revisions to keep staged beside the live one: ``spec.stage``
    and, with keepPrevious, ``previous`` (the revision the owners left at the last switch)."""
    out: dict[str, str] = {}
    if spec.transition.keep_previous and previous and previous.get("digest"):
        out[previous["digest"]] = previous.get("source", "")
    if spec.stage is not None:
        out[spec.stage.digest] = spec.stage.source
    return out


def wanted_stages(spec: ModelSpec, committed: dict[str, str], previous: dict[str, str] | None
                  ) -> dict[str, str]:
    """What every live owner's volume should hold staged now: the kept revisions but the live one."""
    kept = kept_revisions(spec, previous)
    kept.pop(committed.get("digest", ""), None)
    return kept


def stage_owners(spec: ModelSpec, views: list[OwnerView]) -> list[OwnerView]:
    """The owners whose volumes hold staged revisions: running, placed, in a wanted slot."""
    return sorted((v for v in views if v.running and v.node and 0 <= v.slot < spec.replicas),
                  key=lambda v: v.slot)


def ensure_stages(ctx: ModelContext, state: ModelState, spec: ModelSpec, views: list[OwnerView],
                  deliveries: list[dict[str, Any]]) -> None:
    """Create the missing pre-staged deliveries and delete those no longer wanted."""
    wanted = wanted_stages(spec, state.bundle, state.previous)
    owners = stage_owners(spec, views)
    by_name = {bd["metadata"]["name"]: bd for bd in deliveries}
    # In node-name order: the first of a rollout's nodes by name fetches the revision from the
    # origin for the others (docs/peer-delivery.md), so its delivery must exist before theirs,
    # or a bridge that sees its own alone fetches from the origin too.
    for v in sorted(owners, key=lambda v: (v.node, v.slot)):
        for digest, source in wanted.items():
            if v.identity.get("bundle") == digest:
                continue   # this owner runs it already (a partly failed transition)
            name = naming.delivery_name(ctx.name, v.slot, v.incarnation, digest)
            if name in by_name:
                continue
            bd = build_bundle_delivery(ctx.name, ctx.uid, spec, slot=v.slot, incarnation=v.incarnation,
                                       pod_name=v.pod, pod_uid=v.uid, node_name=v.node,
                                       target_digest=digest, target_source=source, path="WholeBundle",
                                       donor_digest=state.bundle.get("digest", ""), activate=False)
            got = create_child(ctx, state, bd)
            if got is not None:
                by_name[name] = got
                ctx.event("StageRequested", f"BundleDelivery {name}: stage {digest[:19]} beside the "
                                            f"live revision of {v.pod} on {v.node}")
    live_uids = {v.uid for v in owners}
    for bd in deliveries:
        spec_ = bd.get("spec") or {}
        if not prestaged(bd) or bd["metadata"].get("deletionTimestamp"):
            continue
        if spec_.get("podUID") in live_uids and spec_["bundle"]["digest"] in wanted:
            continue
        if not ch.is_recorded(state.children, bd):
            continue
        name = bd["metadata"]["name"]
        if ctx.kube.delete(ctx.namespace, "BundleDelivery", name, bd["metadata"]["uid"]) == "deleted":
            ctx.event("StageReleased", f"deleted BundleDelivery {name}: revision "
                                       f"{spec_['bundle']['digest'][:19]} is no longer kept staged")


def ensure_preloads(ctx: ModelContext, spec: ModelSpec, views: list[OwnerView],
                    deliveries: list[dict[str, Any]]) -> None:
    """With ``spec.stage.preload``, ask each owner whose volume holds the staged revision to
    load it beside the live one; drop every preload no longer wanted. A failed preload is not
    asked for again (its reason is in ``status.stage``) until the stage changes."""
    want = spec.stage.digest if spec.stage is not None and spec.stage.preload else ""
    by_name = {bd["metadata"]["name"]: bd for bd in deliveries}
    asks, loading = [], False
    for v in stage_owners(spec, views):
        if v.state not in ("ready", "transitioning"):
            continue   # not answering, or nothing to load beside
        have = v.preload.get("digest", "")
        staged = bool(want) and v.identity.get("bundle") != want and bool(
            (d := observe_delivery(by_name.get(naming.delivery_name(ctx.name, v.slot, v.incarnation, want))))
            and d.staged)
        if staged and have != want:
            asks.append((v, owner_client(ctx, spec, v).request("POST", "/v1/preload", {"target": want},
                                                               allow=(404, 409))))
        elif have and have != want:
            asks.append((v, owner_client(ctx, spec, v).request("DELETE", "/v1/preload", allow=(404,))))
        loading |= staged and have == want and v.preload.get("state") == "loading"
    answers = ctx.owner_calls.call_many([r for _, r in asks]) if asks else []
    for (v, r), answer in zip(asks, answers):   # an unreachable owner or a refusal: the next pass asks again
        if r.method == "POST" and not isinstance(answer, OwnerUnreachable) and answer[0] < 400:
            ctx.event("PreloadRequested", f"owner {v.pod} on {v.node}: load {want[:19]} beside the live revision")
            loading = True
    if loading:   # no watch reports an owner's preload: look again shortly
        ctx.follow_up.recheck_in(ctx.settings.owner_recheck_seconds)


def stage_status(ctx_name: str, spec: ModelSpec, views: list[OwnerView],
                 deliveries: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``status.stage`` and the ``Staged`` condition for ``spec.stage`` (None, None without one)."""
    if spec.stage is None:
        return None, None
    digest = spec.stage.digest
    by_name = {bd["metadata"]["name"]: bd for bd in deliveries}
    nodes, owners = [], stage_owners(spec, views)
    for v in owners:
        row: dict[str, Any] = {"node": v.node, "pod": v.pod}
        if v.identity.get("bundle") == digest:
            row["state"] = LIVE
        else:
            d = observe_delivery(by_name.get(naming.delivery_name(ctx_name, v.slot, v.incarnation, digest)))
            if d is not None and d.staged:
                row.update(state=STAGED, seconds=round(d.duration_seconds, 3),
                           bytes={"fetched": d.fetched, "reused": d.reused, "written": d.written,
                                  "peers": d.peers})
                if d.finished_at:
                    row["finishedAt"] = d.finished_at
            elif d is not None and d.phase == "Failed":
                row.update(state=FAILED, reason=d.reason or "DeliveryFailed", message=d.message)
            else:
                row["state"] = STAGING
                if d is not None and d.reason:
                    row.update(reason=d.reason, message=d.message)
        if spec.stage.preload and row["state"] != LIVE:
            mine = v.preload if v.preload.get("digest") == digest else {}
            row["preload"] = {"state": mine.get("state") or "pending",
                              **({"reason": mine["reason"]} if mine.get("reason") else {})}
        nodes.append(row)
    held = sum(1 for n in nodes if n["state"] in (STAGED, LIVE))
    status = {"digest": digest, "ready": f"{held}/{len(owners)}", "nodes": nodes}
    failed = [n for n in nodes if n["state"] == FAILED]
    if failed:
        cond = c.condition(c.STAGED, False, "StageFailed", "; ".join(
            f"node {n['node']} ({n['pod']}): {n['reason']}: {n['message']}" for n in failed))
    elif owners and held == len(owners):
        live = all(n["state"] == LIVE for n in nodes)
        cond = c.condition(c.STAGED, True, "Live" if live else STAGED,
                           f"{digest} is the live revision" if live else
                           f"{digest} is staged on the nodes of all {len(owners)} owners")
    else:
        cond = c.condition(c.STAGED, False, STAGING, f"{digest} is staged on the nodes of "
                                                     f"{held} of {len(owners)} owners")
    return status, cond
