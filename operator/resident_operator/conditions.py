"""metav1.Condition bookkeeping with a stable ``lastTransitionTime``.

``status.conditions[]`` is the durable record of what the operator believes. A condition's
``lastTransitionTime`` changes only when its ``status`` changes (True/False/Unknown), so a
reconcile pass that re-derives the same facts rewrites nothing a client would notice.
Reason and message may change without moving the time, as in Kubernetes' own
``meta.SetStatusCondition``.

A condition's message is never empty: it falls back to the reason. (The local 1.20 API
server build turns an empty string in a custom resource's merge patch into null, which
the schema then rejects; a non-empty message is clearer for humans anyway.)
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable

DELIVERED = "Delivered"
RESIDENT = "Resident"
READY = "Ready"
TRANSITIONING = "Transitioning"
DEGRADED = "Degraded"
STAGED = "Staged"   # only while spec.stage is set (or was, until the next pass says so)
ALL_TYPES = (DELIVERED, RESIDENT, READY, TRANSITIONING, DEGRADED, STAGED)


def rfc3339(now: datetime) -> str:
    return now.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def seconds_since(stamp: str, now: float) -> float:
    """Seconds from an RFC 3339 time the API server wrote (``...Z``) to ``now`` (epoch);
    raises ValueError when ``stamp`` is not one."""
    return now - datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp()


def condition(type_: str, status: bool | None, reason: str, message: str = "") -> dict[str, Any]:
    """A condition without times; ``status`` None means Unknown."""
    text = "Unknown" if status is None else ("True" if status else "False")
    return {"type": type_, "status": text, "reason": reason, "message": message or reason}


def merge_conditions(previous: Iterable[dict[str, Any]] | None, wanted: Iterable[dict[str, Any]],
                     *, now: datetime, generation: int | None) -> list[dict[str, Any]]:
    """Conditions ``wanted`` with ``lastTransitionTime`` kept from ``previous`` when unchanged.

    Conditions of types not in ``wanted`` are kept as they were (another writer may own
    them). The result is ordered: our types first, in ``ALL_TYPES`` order.
    """
    old = {c.get("type"): c for c in (previous or []) if isinstance(c, dict)}
    out: dict[str, dict[str, Any]] = {}
    for cond in wanted:
        new = dict(cond)
        prior = old.get(new["type"])
        if prior and prior.get("status") == new["status"] and prior.get("lastTransitionTime"):
            new["lastTransitionTime"] = prior["lastTransitionTime"]
        else:
            new["lastTransitionTime"] = rfc3339(now)
        if generation is not None:
            new["observedGeneration"] = generation
        out[new["type"]] = new
    for type_, cond in old.items():
        out.setdefault(type_, cond)
    order = {t: i for i, t in enumerate(ALL_TYPES)}
    return sorted(out.values(), key=lambda c: (order.get(c["type"], len(order)), c["type"]))


def find(conditions: Iterable[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)
