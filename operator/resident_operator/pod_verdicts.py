"""What an owner Pod says when its owner cannot: the scheduler's verdict, the container's exit.

The operator learns an owner's state from its ``/v1/identity``, but an owner that was
never placed, or that exited at start, answers nothing. Two things remain on its Pod:

- the scheduler's verdict: ``PodScheduled=False``, reason ``Unschedulable``, with a
  message such as "0/1 nodes are available: 1 Insufficient furiosa.ai/rngd.";
- the container's failed exit, current (``state.terminated``) or, once kubelet restarts
  or backs off, the last one (``lastState.terminated``), with the termination message
  the owner wrote: ``<Reason>: <message>`` (``owner/termination.py``). Any other
  non-zero exit (killed, out of memory, a crash before the owner could write) is
  ``OwnerExited`` with the exit code. A container that became ready since has recovered
  and says nothing.

A Pod on a node that is lost (stopped, cut off) keeps saying what it said last, until
the control plane speaks for it. After ``--node-monitor-grace-period`` (50 s by default)
without a heartbeat, the node lifecycle controller sets the node's Ready to Unknown, taints
it ``node.kubernetes.io/unreachable:NoExecute`` and sets the Pod's ``Ready`` condition to
False (it changes only the status; kubelet's reason stays, and a Warning Event
``NodeNotReady`` "Node is not ready" goes to the Pod). When the owner's toleration of that
taint runs out, the taint-eviction controller adds the condition ``DisruptionTarget=True``
reason ``DeletionByTaintManager`` ("Taint manager: deleting due to NoExecute taint") and
deletes the Pod. No kubelet confirms the deletion, so the Pod stays Terminating until the
node comes back (its kubelet then stops the container and removes the Pod) or the Node
object is deleted (the pod garbage collector removes it). :func:`evicted_by_taint` reads
that condition: the owner is lost with its node.

A Pod on a node whose bundle volume cannot be mounted says nothing in its own status: it
stays ``Pending`` (ContainerCreating). What the bridge answered reaches only kubelet's
``FailedMount`` Event on the Pod, as ``... rpc error: code = <Code> desc = <message>``.
:func:`mount_verdict` reads the newest one: ``Aborted`` is the bridge's "still fetching"
(the message carries the progress); any other code is a failure (a 404 at the source, a
digest mismatch, a full store, a refused namespace).
"""

from __future__ import annotations

import re
from typing import Any

from . import naming

UNSCHEDULABLE = "Unschedulable"
DISRUPTION_TARGET = "DisruptionTarget"
TAINT_EVICTION = "DeletionByTaintManager"   # the taint-eviction controller's reason
FAILED_MOUNT = "FailedMount"         # kubelet's Event reason
MOUNT_IN_PROGRESS = "Aborted"        # the bridge's answer while a fetch progresses
OWNER_EXITED = "OwnerExited"         # the container exited without saying why in our form
_REASON_LINE = re.compile(r"^([A-Z][A-Za-z0-9]*): (.+)$")
_RPC_ERROR = re.compile(r"code = (\w+) desc = (.*)$", re.S)


def unschedulable_message(pod: dict[str, Any]) -> str:
    """The scheduler's message while the Pod is ``PodScheduled=False/Unschedulable``; else ""."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == UNSCHEDULABLE:
            return cond.get("message") or "the scheduler found no node for the Pod"
    return ""


def evicted_by_taint(pod: dict[str, Any]) -> bool:
    """Was the Pod deleted by the taint-eviction controller (a NoExecute taint it no longer
    tolerates, such as its node's ``unreachable``)?"""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) and any(
        cond.get("type") == DISRUPTION_TARGET and cond.get("status") == "True"
        and cond.get("reason") == TAINT_EVICTION
        for cond in (pod.get("status") or {}).get("conditions") or [])


def container_exit(pod: dict[str, Any]) -> tuple[str, str]:
    """(reason, message) of the owner container's failed exit while it is not ready;
    ("", "") when it did not fail or became ready since."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    status = next((s for s in statuses if s.get("name") == naming.OWNER_CONTAINER), None)
    if status is None or status.get("ready"):
        return "", ""
    for terminated in ((status.get("state") or {}).get("terminated"),
                       (status.get("lastState") or {}).get("terminated")):
        if terminated and terminated.get("exitCode", 0) != 0:
            text = (terminated.get("message") or "").strip()
            line = _REASON_LINE.match(text.splitlines()[0]) if text else None
            if line:
                return line.group(1), line.group(2)
            why = f"exit code {terminated.get('exitCode')}"
            if terminated.get("reason"):
                why += f" ({terminated['reason']})"
            return OWNER_EXITED, f"{why}: {text}" if text else why
    return "", ""


def mount_verdict(events: list[dict[str, Any]]) -> tuple[str, str]:
    """(gRPC code, message) of the newest kubelet ``FailedMount`` Event among ``events``
    (the Pod's Events, as dicts); ("", "") when there is none. A message not in gRPC's
    form (kubelet's own errors, e.g. a timeout) keeps its whole text under ``Unknown``."""
    failed = [e for e in events if e.get("reason") == FAILED_MOUNT]
    if not failed:
        return "", ""
    newest = max(failed, key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "",
                                        (e.get("metadata") or {}).get("creationTimestamp") or ""))
    text = (newest.get("message") or "").strip()
    rpc = _RPC_ERROR.search(text)
    return (rpc.group(1), rpc.group(2).strip()) if rpc else ("Unknown", text)
