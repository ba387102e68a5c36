"""Children by UID: the record that makes cleanup exact.

Every object the operator creates for a model is appended to ``status.children`` as
``{apiVersion, kind, name, uid}`` right after the create succeeds and before anything
depends on it. Names are reused (deterministic naming), UIDs never are: a delete always
carries the recorded UID as a precondition, so a same-named object someone else created
later can never be deleted by a stale record.

The finalizer is removed only when no recorded child exists any more. A periodic sweep
deletes objects labelled for the model whose UID is not recorded (e.g. created just
before an operator crash, or left by an earlier model of the same name).
"""

from __future__ import annotations

from typing import Any, Iterable

from . import naming

Child = dict[str, str]


def child_ref(obj: dict[str, Any]) -> Child:
    meta = obj.get("metadata") or {}
    return {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""),
            "name": meta.get("name", ""), "uid": meta.get("uid", "")}


def record(children: Iterable[Child] | None, ref: Child) -> list[Child]:
    """``children`` plus ``ref`` (no duplicate of the same UID)."""
    out = [dict(ch) for ch in children or []]
    if not ref.get("uid"):
        raise ValueError(f"refusing to record {ref.get('kind')} {ref.get('name')} without a UID")
    if not any(ch.get("uid") == ref["uid"] for ch in out):
        out.append(dict(ref))
    return out


def forget(children: Iterable[Child] | None, uid: str) -> list[Child]:
    return [dict(ch) for ch in children or [] if ch.get("uid") != uid]


def recorded_uids(children: Iterable[Child] | None) -> set[str]:
    return {ch["uid"] for ch in children or [] if ch.get("uid")}


def of_kind(children: Iterable[Child] | None, kind: str) -> list[Child]:
    return [ch for ch in children or [] if ch.get("kind") == kind]


def is_recorded(children: Iterable[Child] | None, obj: dict[str, Any]) -> bool:
    return (obj.get("metadata") or {}).get("uid") in recorded_uids(children)


def belongs_to(obj: dict[str, Any], model_uid: str) -> bool:
    """True if ``obj`` is labelled for the model with this UID (safe to adopt after a 409)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(naming.LABEL_MODEL_UID) == model_uid


def orphans(labelled: Iterable[dict[str, Any]], children: Iterable[Child] | None
            ) -> list[dict[str, Any]]:
    """Objects labelled for the model whose UID is not recorded and not already going away.

    This includes objects labelled for an earlier model of the same name (another
    ``resident.dev/model-uid``): nothing recorded them either.
    """
    known = recorded_uids(children)
    out = []
    for obj in labelled:
        meta = obj.get("metadata") or {}
        if meta.get("uid") in known or meta.get("deletionTimestamp"):
            continue
        out.append(obj)
    return out
