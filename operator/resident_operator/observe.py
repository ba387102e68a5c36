"""What the model looks like right now: owners, identity, phase and conditions.

Each pass the operator reads its owner Pods and asks every reachable owner for
``/v1/identity``; :func:`derive_status` turns those observations (plus the spec's
validity, any transition in flight and the last one's result) into the status fields
a human reads: ``phase``, ``ready`` ("1/2"), ``identity``, ``owners[]`` and the five
conditions. It is a pure function: the same observations give the same status.

What the Pod says when no owner can (:mod:`.pod_verdicts`): an owner Pod the scheduler
cannot place makes ``Delivered=False`` reason ``Unschedulable`` with the scheduler's
message; an owner container that exited and has not been ready since makes the model
``Degraded`` with the owner's own reason (``BackendUnavailable``), not a crash loop
shown as Loading. An owner Pod whose bundle volume cannot be mounted (the bridge's
answer in kubelet's newest FailedMount Event) makes ``Delivered=False`` reason
``MountFailed`` and ``Degraded`` reason ``DeliveryFailed``, both with the bridge's
message; while the bridge still fetches, ``WaitingForDelivery`` carries its progress.

An owner that gives no answer to ``/v1/identity`` within the owner-call timeout (it
accepts connections and hangs) is not ready, whatever its Pod says: its ``owners[]`` entry
has reason ``OwnerUnresponsive`` and the model is ``Degraded`` reason ``OwnerUnresponsive``
naming it (``owner_client.py``).

An owner lost with its node (its Pod deleted by the taint-eviction controller, and left
Terminating because no kubelet confirms it) keeps its entry in ``owners[]``, with its
node and reason ``NodeLost``, for as long as its Pod exists. Until its slot's replacement
is Ready the model is ``Degraded`` reason ``NodeLost``, naming the owner, its node and
the replacement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import conditions as c
from . import naming
from .pod_verdicts import (MOUNT_IN_PROGRESS, UNSCHEDULABLE, container_exit, evicted_by_taint,
                           unschedulable_message)
from .transition import BROKEN_STATES, TransitionState


MOUNT_FAILED, WAITING_FOR_DELIVERY = "MountFailed", "WaitingForDelivery"
NODE_LOST = "NodeLost"
OWNER_UNRESPONSIVE = "OwnerUnresponsive"


@dataclass(frozen=True)
class OwnerView:
    """One owner Pod and, when reachable, its owner's answer to ``/v1/identity``."""

    slot: int
    incarnation: int
    pod: str
    uid: str
    node: str = ""
    pod_ip: str = ""
    control_port: int | None = None  # the Pod's port named "control" (slot ports differ)
    pod_phase: str = "Pending"
    ready: bool = False
    terminating: bool = False
    bundle_digest: str = ""          # the revision the Pod's volume was created with
    state: str | None = None         # owner state; None when not asked or unreachable
    identity: dict[str, str] = field(default_factory=dict)
    in_place: bool | None = None
    error: str = ""
    unschedulable: str = ""          # the scheduler's message while it cannot place the Pod
    exit_reason: str = ""            # why the owner container last exited, while not ready
    exit_message: str = ""
    mount_code: str = ""             # the bridge's gRPC code in kubelet's newest FailedMount
    mount_message: str = ""
    node_lost: bool = False          # evicted by the taint manager: its node stopped reporting
    unresponsive: bool = False       # its owner gave no answer in time: not ready, whatever the Pod says
    preload: dict[str, str] = field(default_factory=dict)   # digest, state, reason: loaded beside the live one

    @property
    def running(self) -> bool:
        return self.pod_phase == "Running" and not self.terminating

    @property
    def awaiting_volume(self) -> bool:
        """On a node, not started, not failed: kubelet is (or will be) mounting its volume."""
        return bool(self.node) and self.pod_phase == "Pending" and not self.terminating \
            and not self.exit_reason

    @property
    def mount_failed(self) -> bool:
        return bool(self.mount_code) and self.mount_code != MOUNT_IN_PROGRESS

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pod": self.pod, "uid": self.uid, "slot": self.slot,
                               "ready": self.ready, "phase": self.pod_phase}
        if self.node:
            out["node"] = self.node
        if self.state:
            out["state"] = self.state
        if self.identity:
            out["identity"] = dict(self.identity)
        if self.in_place is not None:
            out["inPlace"] = self.in_place
        if self.error:
            out["error"] = self.error
        if self.node_lost:
            out["reason"], out["message"] = NODE_LOST, self.lost_message()
        elif self.unresponsive:
            out["reason"], out["message"] = OWNER_UNRESPONSIVE, self.error
        elif self.unschedulable:
            out["reason"], out["message"] = UNSCHEDULABLE, self.unschedulable
        elif self.exit_reason:
            out["reason"], out["message"] = self.exit_reason, self.exit_message
        elif self.mount_code:
            out["reason"] = MOUNT_FAILED if self.mount_failed else WAITING_FOR_DELIVERY
            out["message"] = self.mount_message
        return out

    def lost_message(self) -> str:
        return (f"owner {self.pod} was lost with node {self.node or '(none)'}: the node stopped "
                f"reporting and the taint manager evicted the owner; its Pod stays Terminating "
                f"until the node comes back")


def owner_view(pod: dict[str, Any], identity: dict[str, Any] | None = None,
               error: str = "", unresponsive: bool = False) -> OwnerView:
    """Build an :class:`OwnerView` from a Pod (as a dict) and an optional identity answer;
    an owner that gave no answer in time (``unresponsive``) is not ready."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    ready = any(cond.get("type") == "Ready" and cond.get("status") == "True"
                for cond in status.get("conditions") or [])
    ident = (identity or {}).get("identity") or {}
    caps = (identity or {}).get("capabilities") or {}
    exit_reason, exit_message = container_exit(pod)
    return OwnerView(
        slot=int(labels.get(naming.LABEL_SLOT, -1)),
        incarnation=int(labels.get(naming.LABEL_INCARNATION, 0)),
        pod=meta.get("name", ""), uid=meta.get("uid", ""),
        node=(pod.get("spec") or {}).get("nodeName") or "",
        pod_ip=status.get("podIP") or "", control_port=_named_port(pod, naming.PORT_CONTROL),
        pod_phase=status.get("phase") or "Pending",
        ready=ready and not meta.get("deletionTimestamp") and not unresponsive,
        terminating=bool(meta.get("deletionTimestamp")),
        bundle_digest=(meta.get("annotations") or {}).get("resident.dev/bundle-digest", ""),
        state=(identity or {}).get("state"),
        identity={k: v for k, v in ident.items() if k in ("bundle", "graph", "weights") and v},
        in_place=caps.get("inPlace") if "inPlace" in caps else None,
        error=error, unschedulable=unschedulable_message(pod),
        exit_reason=exit_reason, exit_message=exit_message, node_lost=evicted_by_taint(pod),
        unresponsive=unresponsive, preload=dict((identity or {}).get("preload") or {}))


@dataclass(frozen=True)
class Blocker:
    """Something that stops progress and makes the model Degraded (reason, message)."""

    reason: str
    message: str


def common_identity(owners: list[OwnerView]) -> dict[str, str]:
    """The identity every ready owner agrees on; empty when none is ready or they differ."""
    seen = {tuple(sorted(o.identity.items())) for o in owners if o.ready and o.identity}
    return dict(next(iter(seen))) if len(seen) == 1 else {}


def derive_status(*, replicas: int, owners: list[OwnerView], problems: list[str],
                  transition: TransitionState | None, last_transition: dict[str, Any] | None,
                  blocker: Blocker | None, desired_digest: str) -> dict[str, Any]:
    """phase, ready, identity, owners and the wanted conditions (times merged later)."""
    live = [o for o in owners if not o.terminating]
    n_ready = sum(1 for o in live if o.ready)
    n_running = sum(1 for o in live if o.running)
    broken = [o for o in live if o.state in BROKEN_STATES]
    exited = sorted((o for o in live if o.exit_reason), key=lambda o: o.slot)
    unplaced = sorted((o for o in live if o.unschedulable), key=lambda o: o.slot)
    unmounted = sorted((o for o in live if o.mount_failed), key=lambda o: o.slot)
    hung = sorted((o for o in live if o.unresponsive), key=lambda o: o.slot)
    fetching = sorted((o for o in live if o.mount_code and not o.mount_failed), key=lambda o: o.slot)
    lost = [(o, successor) for o, successor in unreplaced_losses(owners) if o.slot < replicas]
    conds = []
    if problems:
        degraded = c.condition(c.DEGRADED, True, "InvalidSpec", "; ".join(problems))
    elif broken:
        o = broken[0]
        degraded = c.condition(c.DEGRADED, True, "Owner" + o.state.capitalize(),
                               f"owner {o.pod} is {o.state}")
    elif lost:
        o, successor = lost[0]
        after = (f"its replacement {successor.pod} is not ready yet" if successor
                 else "no replacement is placed yet")
        degraded = c.condition(c.DEGRADED, True, NODE_LOST,
                               f"{_owners(len(lost))} lost with {'its' if len(lost) == 1 else 'their'} "
                               f"node; owner {o.pod} on node {o.node}: {after}")
    elif exited:
        o = exited[0]
        degraded = c.condition(c.DEGRADED, True, o.exit_reason,
                               f"{_owners(len(exited))} cannot start; {o.pod}: {o.exit_message}")
    elif unmounted:
        o = unmounted[0]
        degraded = c.condition(c.DEGRADED, True, "DeliveryFailed",
                               f"{_owners(len(unmounted))} cannot mount the bundle; {o.pod}: "
                               f"{o.mount_message}")
    elif hung:
        degraded = c.condition(c.DEGRADED, True, OWNER_UNRESPONSIVE,
                               f"{_owners(len(hung))} not answering; "
                               + "; ".join(f"owner {o.pod}: {o.error}" for o in hung[:3]))
    elif blocker:
        degraded = c.condition(c.DEGRADED, True, blocker.reason, blocker.message)
    elif last_transition and last_transition.get("result") == "failed" \
            and last_transition.get("to") == desired_digest and transition is None:
        degraded = c.condition(c.DEGRADED, True, last_transition.get("reason") or "TransitionFailed",
                               last_transition.get("message") or "the last transition failed")
    else:
        degraded = c.condition(c.DEGRADED, False, "AsExpected", "")
    conds.append(degraded)

    if transition is not None:
        done = sum(1 for o in transition.owners if o.step.value == "Done")
        conds.append(c.condition(c.TRANSITIONING, True, "TransitionInProgress",
                                 f"{transition.from_digest} -> {transition.to}: "
                                 f"{done}/{len(transition.owners)} owners done"))
    else:
        result = (last_transition or {}).get("result")
        reason = {"succeeded": "TransitionSucceeded", "failed": "TransitionFailed"}.get(result, "Idle")
        conds.append(c.condition(c.TRANSITIONING, False, reason, ""))

    want = replicas
    if want == 0:
        conds.append(c.condition(c.DELIVERED, True, "NoOwners", "spec.replicas is 0"))
    elif n_running >= want:
        conds.append(c.condition(c.DELIVERED, True, "AllDelivered",
                                 f"{n_running}/{want} owner volumes published"))
    elif unplaced:
        o = unplaced[0]
        conds.append(c.condition(c.DELIVERED, False, UNSCHEDULABLE,
                                 f"{n_running}/{want} owner volumes published; {_owners(len(unplaced))} "
                                 f"not scheduled; {o.pod}: {o.unschedulable}"))
    elif unmounted:
        o = unmounted[0]
        conds.append(c.condition(c.DELIVERED, False, MOUNT_FAILED,
                                 f"{n_running}/{want} owner volumes published; {o.pod}: "
                                 f"{o.mount_message}"))
    else:
        progress = f"; {fetching[0].pod}: {fetching[0].mount_message}" if fetching else ""
        conds.append(c.condition(c.DELIVERED, False, WAITING_FOR_DELIVERY,
                                 f"{n_running}/{want} owner volumes published{progress}"))
    resident = [o for o in live if o.state in ("ready", "transitioning")]
    if want and len(resident) >= want:
        conds.append(c.condition(c.RESIDENT, True, "OwnersResident",
                                 f"{len(resident)}/{want} owners hold the model"))
    else:
        conds.append(c.condition(c.RESIDENT, want == 0, "NoOwners" if want == 0 else "OwnersLoading",
                                 f"{len(resident)}/{want} owners hold the model"))
    ready_ok = n_ready >= want
    conds.append(c.condition(c.READY, ready_ok, "AllOwnersReady" if ready_ok else "OwnersNotReady",
                             f"{n_ready}/{want} owners ready"))

    if problems:
        phase = "Degraded"
    elif transition is not None:
        phase = "Transitioning"
    elif degraded["status"] == "True":
        phase = "Degraded"
    elif ready_ok:
        phase = "Ready"
    elif n_running >= want:
        phase = "Loading"
    elif unplaced:
        phase = "Pending"
    elif any(o.node for o in live):
        phase = "Delivering"
    else:
        phase = "Pending"
    return {
        "phase": phase, "ready": f"{n_ready}/{want}", "identity": common_identity(live),
        "owners": [o.to_status() for o in sorted(owners, key=lambda o: (o.slot, o.incarnation))],
        "conditions": conds,
    }


def unreplaced_losses(owners: list[OwnerView]) -> list[tuple[OwnerView, OwnerView | None]]:
    """Owners lost with their node whose slot has no ready owner yet, each with the slot's
    live successor (None before one is placed); the newest loss of a slot only."""
    live = {o.slot: o for o in owners if not o.terminating}
    newest: dict[int, OwnerView] = {}
    for o in owners:
        if o.node_lost and (o.slot not in newest or o.incarnation > newest[o.slot].incarnation):
            newest[o.slot] = o
    return [(o, live.get(slot)) for slot, o in sorted(newest.items())
            if not (live.get(slot) and live[slot].ready)]


def _owners(n: int) -> str:
    return "1 owner" if n == 1 else f"{n} owners"


def _named_port(pod: dict[str, Any], name: str) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name:
                return port.get("containerPort")
    return None
