"""``status.lastTransition``: one finished transition, summed up for humans and dashboards.

From and to, the strategy and path used, the predicted and the actual bytes (fetched,
reused, written, summed over owners, and per node: ``nodes``, a list, so a merge patch
replaces it whole), the durations (deliver and apply are the slowest
owner's, first-token the slowest reported, total is wall clock from planning to the end;
``stagingSeconds`` and ``ownerSeconds`` are what the bridge and the owner report of their own
work, and ``overheadSeconds`` is the rest of ``totalSeconds``: planning, watch latency,
API writes - the operator's own share, exact for one owner, an upper bound for several),
the result and, when it failed, the reason. Every key is always present (empty ones as
null, which a merge patch turns into "remove"), so no stale key from an earlier transition
stays behind.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from .transition import OwnerProgress, TransitionState, first_failure


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _max(values: list[float | None]) -> float:
    real = [v for v in values if v is not None and v >= 0]
    return round(max(real), 3) if real else 0.0


def _per_node(owners) -> list[dict[str, Any]]:
    """Bytes each node's bridge moved for this transition, by node name."""
    nodes: dict[str, dict[str, Any]] = {}
    for o in owners:
        if o.node:
            row = nodes.setdefault(o.node, {"node": o.node, "owners": 0, "fetched": 0, "reused": 0, "written": 0,
                                            "peers": 0})
            row["owners"] += 1
            for key in ("fetched", "reused", "written", "peers"):
                row[key] += getattr(o.bytes, key)
    return [nodes[n] for n in sorted(nodes)]


def summarize(t: TransitionState, now: float) -> dict[str, Any]:
    owners = t.owners
    deliver = [o.delivered_at - o.started_at for o in owners if o.delivered_at and o.started_at]
    apply = [o.applied_at - o.delivered_at for o in owners if o.applied_at and o.delivered_at]
    staging = _max([o.staging_seconds for o in owners])
    owner_work = _max([o.owner_seconds for o in owners])
    total = round(max(0.0, now - t.started_at), 3)
    strategies = sorted({o.strategy for o in owners if o.strategy})
    commits = sorted(o.committed_at for o in owners if o.committed_at)
    out = {
        "id": t.id,
        "commit": t.commit,
        # first to last owner's commit by the owners' clocks: how long two revisions answered
        # side by side (owners one after another under Rolling, one barrier under Lockstep)
        "skewSeconds": round(commits[-1] - commits[0], 6) if len(commits) > 1 else 0.0,
        "from": t.from_digest,
        "to": t.to,
        "generation": t.generation,
        "strategy": "/".join(strategies) if strategies else t.strategy,
        "path": t.path,
        "method": "/".join(sorted({o.method for o in owners if o.method})) or t.method,
        "predicted": dict(t.predicted),
        "bytes": {"fetched": sum(o.bytes.fetched for o in owners),
                  "reused": sum(o.bytes.reused for o in owners),
                  "written": sum(o.bytes.written for o in owners),
                  "peers": sum(o.bytes.peers for o in owners)},
        "nodes": _per_node(owners),
        "durations": {"deliverSeconds": _max(deliver), "applySeconds": _max(apply),
                      "firstTokenSeconds": _max([o.first_token_seconds for o in owners]),
                      "stagingSeconds": staging, "ownerSeconds": owner_work,
                      "overheadSeconds": round(max(0.0, total - staging - owner_work), 3),
                      "totalSeconds": total},
        "owners": len(owners),
        # when each owner began to change its live revision and when the new one answered
        # its first token, by the owner's clock; for a prepared (Lockstep) reload, whether the
        # owner had loaded the target beside the live one, so its commit was a swap
        "commits": [{"pod": o.pod, "node": o.node, "committedAt": _rfc3339(o.committed_at),
                     "firstTokenAt": _rfc3339(o.first_token_at) if o.first_token_at else None,
                     **({} if o.loaded_beside is None else {"loadedBeside": o.loaded_beside})}
                    for o in owners if o.committed_at] or None,
        # every owner's target was staged ahead (spec.stage, or the revision kept for a rollback)
        "prestaged": bool(owners) and all(o.prestaged for o in owners),
        # and every owner had loaded it beside the live revision (spec.stage.preload): a swap
        "preloaded": bool(owners) and all(o.preloaded for o in owners),
        "replaced": sum(1 for o in owners if o.replaced),
        "result": t.result,
        "reason": t.reason,
        "message": t.message,
        "failedOwner": (first_failure(t) or OwnerProgress(slot=-1, pod="", podUID="")).pod,
    }
    return {k: (None if v == "" else v) for k, v in out.items()}
