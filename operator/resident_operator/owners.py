"""Placement in action: the token Secret and one owner Pod per slot, then what they say.

``ensure_token`` and ``ensure_owner_pods`` create what is missing (recording each UID
before anything depends on it), adopt an object left by a crashed pass (409, labelled
with this model's UID, owned by it), delete Pods of slots above ``spec.replicas`` by UID,
and skip a slot whose name is taken by something that is not ours by moving the slot to
its next incarnation. ``observe_owners`` reads the Pods and asks every running owner for
its identity, all at once through the operator's owner-call gate (``owner_client.py``): an
owner that does not answer in time is ``OwnerUnresponsive`` and not ready.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import replace
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from . import children as ch
from . import naming, retry_policy
from .context import ModelContext
from .model_state import ModelState
from .observe import OwnerView, owner_view
from .transition import BROKEN_STATES
from .owner_client import OwnerClient, OwnerUnreachable, OwnerUnresponsive, identities
from .placement import build_owner_pod, build_token_secret, new_token
from .pod_verdicts import mount_verdict
from .pod_template import stamp
from .spec import ModelSpec

log = logging.getLogger("resident.operator")


def adoptable(obj: dict[str, Any], model_uid: str) -> bool:
    """A 409'd object we may record: labelled for this model UID and owned by it."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return ch.belongs_to(obj, model_uid) and any(r.get("uid") == model_uid for r in refs)


def create_child(ctx: ModelContext, state: ModelState, obj: dict[str, Any],
                 announce: tuple[str, str] | None = None) -> dict[str, Any] | None:
    """Adopt, create and record ``obj``; None if its name is held by something not ours.
    ``announce`` (reason, what) goes into the pass's Event of what it created, if this
    create made it (not when it answered 409 with an object left by an earlier pass)."""
    kopf.adopt(obj, owner=ctx.body)
    obj["metadata"]["namespace"] = ctx.namespace
    got, created = ctx.kube.create(ctx.namespace, obj)
    if not created and not ch.is_recorded(state.children, got) and not adoptable(got, ctx.uid):
        return None
    got.setdefault("kind", obj["kind"])
    got.setdefault("apiVersion", obj["apiVersion"])
    state.record_child(got)
    if created and announce:
        ctx.child_created(*announce)
    return got


def ensure_token(ctx: ModelContext, state: ModelState) -> str:
    """The owners' bearer token, creating the Secret on first use. A Secret never recorded
    is created straight away (a 409 answers with what holds the name: adopted if it is
    this model's); a recorded one is read."""
    name = naming.token_secret_name(ctx.name)
    if ch.of_kind(state.children, "Secret"):
        # From the API server, not a cache: a pass gets here only when the token is not
        # known from an earlier pass (the first pass after a start, an event about the
        # Secret, a sweep that found a difference: driver.FORGETS), and the operator keeps
        # no copy of every model's Secret for a read this rare.
        secret = ctx.kube.get(ctx.namespace, "Secret", name)
        if secret is not None and ch.is_recorded(state.children, secret):
            return base64.b64decode(secret["data"][naming.TOKEN_KEY]).decode()
    secret = create_child(ctx, state, build_token_secret(ctx.name, ctx.uid, new_token()),
                          announce=("TokenSecretCreated", f"owner token Secret {name}"))
    if secret is None:
        raise kopf.TemporaryError(f"Secret {name} exists and is not ours; waiting for it to go",
                                  delay=retry_policy.NAME_HELD_SECONDS)
    return base64.b64decode(secret["data"][naming.TOKEN_KEY]).decode()


def our_pods(ctx: ModelContext, state: ModelState) -> list[dict[str, Any]]:
    """Recorded owner Pods that still exist; records of vanished Pods are forgotten."""
    listed = ctx.children("Pod", state.children)
    uids = {(p.get("metadata") or {}).get("uid") for p in listed}
    for rec in ch.of_kind(state.children, "Pod"):
        if rec["uid"] not in uids:
            state.forget_child(rec["uid"])
    return [p for p in listed if ch.is_recorded(state.children, p)]


def create_owner_pod(ctx: ModelContext, state: ModelState, spec: ModelSpec, slot: int,
                     digest: str, source: str, *, new_incarnation: bool = False
                     ) -> dict[str, Any]:
    """Create the slot's Pod on ``digest``, moving to a fresh incarnation if the name is taken."""
    if new_incarnation:
        state.bump_incarnation(slot)
    for _ in range(3):
        inc = state.incarnation(slot)
        pod = stamp(build_owner_pod(ctx.name, ctx.uid, spec, ctx.settings, slot, inc, digest, source),
                    ctx.name, spec, ctx.settings)
        got = create_child(ctx, state, pod)
        if got is not None:
            if got["metadata"].get("deletionTimestamp"):
                state.bump_incarnation(slot)
                continue
            return got
        state.bump_incarnation(slot)
    raise kopf.TemporaryError(f"owner slot {slot}: every Pod name tried is taken",
                              delay=retry_policy.SLOT_NAMES_TAKEN_SECONDS)


def replace_owner(ctx: ModelContext, state: ModelState, spec: ModelSpec, slot: int,
                  old: tuple[str, str] | None, revision: tuple[str, str]) -> dict[str, Any]:
    """The one way an owner is replaced: its Pod ``old`` (name, UID; None when it is gone or
    already going) is deleted by UID, and the slot's next incarnation is created on
    ``revision`` (digest, source). The caller says why, in its own Event."""
    if old is not None:
        ctx.kube.delete(ctx.namespace, "Pod", *old)
    return create_owner_pod(ctx, state, spec, slot, *revision, new_incarnation=True)


def ensure_owner_pods(ctx: ModelContext, state: ModelState, spec: ModelSpec,
                      managed_slots: set[int], revision: tuple[str, str]) -> list[dict[str, Any]]:
    """One live owner Pod per slot below replicas (except ``managed_slots``); none above.

    A slot whose Pod is terminating (evicted by a drain, lost with its node, deleted) gets
    its next incarnation at once: the old Pod may stay Terminating for as long as its node
    is away, and a Pod bound to a lost node holds no card anyone can use.

    New Pods start on ``revision`` (digest, source): the committed one, or the target of
    the transition in flight, so a scale-up during a transition does not land behind it.
    """
    pods = our_pods(ctx, state)
    live = {}
    for p in pods:
        if not p["metadata"].get("deletionTimestamp"):
            live[int(p["metadata"]["labels"].get(naming.LABEL_SLOT, -1))] = p
    for slot in range(spec.replicas):
        if slot in live or slot in managed_slots:
            continue
        fresh = any(int(p["metadata"]["labels"].get(naming.LABEL_SLOT, -1)) == slot for p in pods)
        pod = create_owner_pod(ctx, state, spec, slot, revision[0], revision[1],
                               new_incarnation=fresh)
        ctx.child_created("OwnerPodCreated", f"owner Pod {pod['metadata']['name']} (slot {slot}) "
                                             f"on bundle {revision[0]}")
        pods.append(pod)
    for slot, p in sorted(live.items()):
        if slot >= spec.replicas and slot not in managed_slots:
            meta = p["metadata"]
            if ctx.kube.delete(ctx.namespace, "Pod", meta["name"], meta["uid"]) == "deleted":
                ctx.event("OwnerPodDeleted", f"deleted owner Pod {meta['name']}: "
                                             f"spec.replicas is {spec.replicas}")
    return pods


def replace_broken_owners(ctx: ModelContext, state: ModelState, spec: ModelSpec,
                          views: list[OwnerView]) -> list[OwnerView]:
    """Outside transitions: a quarantined or unloaded owner gets a new Pod on the committed
    revision (the old one is deleted by UID). Returns the views still standing."""
    kept = []
    for v in views:
        if v.state not in BROKEN_STATES or v.terminating:
            kept.append(v)
            continue
        pod = replace_owner(ctx, state, spec, v.slot, (v.pod, v.uid),
                            (state.bundle["digest"], state.bundle["source"]))
        ctx.event("OwnerReplaced", f"owner {v.pod} is {v.state}; replaced by "
                                   f"{pod['metadata']['name']} on {state.bundle['digest'][:19]}",
                  warning=True)
        kept.append(owner_view(pod))
    return kept


def owner_address(ctx: ModelContext, pod_ip: str) -> str:
    """Where an owner is reached: the installation's owner host, else its Pod IP."""
    return ctx.settings.owner_host or pod_ip


def owner_client(ctx: ModelContext, spec: ModelSpec, view: OwnerView) -> OwnerClient:
    """A client of the owner's control API, at the port its Pod declares."""
    assert ctx.owner_calls is not None, "owner calls go through the operator's gate"
    return OwnerClient(ctx.owner_calls, ctx.uid, view.uid, owner_address(ctx, view.pod_ip),
                       view.control_port or spec.runtime.port, ctx.token)


def with_mount_verdict(ctx: ModelContext, view: OwnerView) -> OwnerView:
    """``view`` with the bridge's answer from kubelet's newest FailedMount on its Pod. The
    operator watches those Events and the next one wakes the model; where it cannot know
    them from the watch, the model looks again in a few seconds. Events that cannot be
    read (the installation withholds ``list events``) only cost that answer."""
    try:
        events, watched = ctx.kube.failed_mounts(ctx.namespace, view.uid)
    except ApiException as e:
        log.warning("cannot read the owner Pod's Events", extra={
            "model": f"{ctx.namespace}/{ctx.name}", "pod": view.pod, "error": f"{e.status} {e.reason}"})
        events, watched = [], False
    if not watched:
        ctx.follow_up.recheck_in(retry_policy.MOUNT_RECHECK_SECONDS)
    code, message = mount_verdict(events)
    return replace(view, mount_code=code, mount_message=message)


def observe_owners(ctx: ModelContext, pods: list[dict[str, Any]], spec: ModelSpec
                   ) -> list[OwnerView]:
    """A view per Pod; running Pods' owners are asked for their identity, except one whose
    container exited and has not been ready since (it says why in its termination
    message; its Pod's next change wakes the model, so no recheck is needed).

    A Pod waiting for its volume gets kubelet's newest FailedMount (the bridge's answer);
    the next one wakes the model (``with_mount_verdict``).

    The owners are asked together: a pass waits at most one owner-call timeout for all of
    them. An owner that gave no answer is ``unresponsive`` (not ready); one marked so
    earlier is not waited on again (``owner_client.OwnerCalls``)."""
    views: list[OwnerView | None] = []
    asked: list[tuple[int, dict[str, Any], OwnerClient]] = []
    for pod in pods:
        seen = owner_view(pod)
        if seen.awaiting_volume:
            views.append(with_mount_verdict(ctx, seen))
            continue
        if not seen.running or seen.exit_reason or not owner_address(ctx, seen.pod_ip):
            views.append(seen)
            continue
        asked.append((len(views), pod, owner_client(ctx, spec, seen)))
        views.append(None)
    if ctx.owner_calls is not None:   # hung owners no longer asked are not probed on
        ctx.owner_calls.retain(ctx.uid, {client.owner for _, _, client in asked})
    for (i, pod, _), answer in zip(asked, identities([client for _, _, client in asked])):
        if isinstance(answer, OwnerUnresponsive):   # its probe wakes the model when it answers
            views[i] = owner_view(pod, error=str(answer), unresponsive=True)
        elif isinstance(answer, OwnerUnreachable):
            views[i] = owner_view(pod, error=str(answer))
            ctx.follow_up.recheck_in(ctx.settings.owner_recheck_seconds)  # no watch reports an owner's HTTP
        else:
            views[i] = owner_view(pod, answer)
    return [v for v in views if v is not None]
