"""Why the owner did not start, where Kubernetes keeps it: the container's termination message.

An owner that cannot start exits 1; with ``restartPolicy: Always`` kubelet restarts it
and the Pod sits in CrashLoopBackOff, reachable by nobody. What kubelet does keep is the
file at the container's ``terminationMessagePath`` (``/dev/termination-log`` by default,
bind-mounted into every container, writable even on a read-only root filesystem): it
copies it into ``status.containerStatuses[].state.terminated.message``, later
``lastState.terminated.message``. The owner writes one line there, ``<Reason>: <message>``,
with ``Reason`` a CamelCase word; the operator makes it the model's ``Degraded`` reason
(docs/operator.md), so a missing vendor SDK reads ``BackendUnavailable`` and not "Loading".

Outside Kubernetes the file does not exist and nothing is written: creating files in
``/dev`` is not the owner's business.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger("resident.owner")

TERMINATION_LOG = Path("/dev/termination-log")
MAX_BYTES = 4096            # kubelet keeps at most this much of the file
REASON_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")

# The reasons an owner gives for not starting (docs/owner.md, "Start and warmup").
BACKEND_UNAVAILABLE = "BackendUnavailable"   # the backend's SDK or device is not here
BACKEND_FAILED = "BackendFailed"             # the backend refused its options
LOAD_FAILED = "LoadFailed"                   # the start revision did not load or warm up
PORT_UNAVAILABLE = "PortUnavailable"         # a port could not be bound
CREDENTIALS_UNREADABLE = "CredentialsUnreadable"   # the token or API key file


def termination_line(reason: str, message: str) -> str:
    """``Reason: message`` on one line, cut to what kubelet keeps."""
    if not REASON_RE.match(reason):
        raise ValueError(f"termination reason {reason!r} is not a CamelCase word")
    line = f"{reason}: {' '.join(message.split())}"
    return line.encode()[:MAX_BYTES].decode(errors="ignore")


def record_start_failure(reason: str, message: str, path: Path = TERMINATION_LOG) -> bool:
    """Log the failure and write its termination line if ``path`` exists; True if written."""
    line = termination_line(reason, message)
    log.error("owner cannot start", extra={"reason": reason, "detail": message})
    if not path.exists():
        return False
    try:
        path.write_text(line + "\n")
    except OSError as e:
        log.warning("cannot write the termination message", extra={"path": str(path), "error": str(e)})
        return False
    return True
