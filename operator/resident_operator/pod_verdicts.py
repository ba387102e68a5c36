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
"""

from __future__ import annotations

import re
from typing import Any

from . import naming

UNSCHEDULABLE = "Unschedulable"
OWNER_EXITED = "OwnerExited"         # the container exited without saying why in our form
_REASON_LINE = re.compile(r"^([A-Z][A-Za-z0-9]*): (.+)$")


def unschedulable_message(pod: dict[str, Any]) -> str:
    """The scheduler's message while the Pod is ``PodScheduled=False/Unschedulable``; else ""."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == UNSCHEDULABLE:
            return cond.get("message") or "the scheduler found no node for the Pod"
    return ""


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
