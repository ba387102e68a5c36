"""What ``stage``, ``switch`` and ``rollback`` write to a ResidentModel, and how far it got.

Pure: a model (the dict the API server returns) in, a merge patch or a :class:`Progress`
out. Each patch carries the ``resourceVersion`` the command read, so a change made by
someone else in between is refused by the API server (409) instead of overwritten.

- ``stage`` sets ``spec.stage`` (or removes it); it has got there when the ``Staged``
  condition is True for that digest, and failed when it says ``StageFailed``.
- ``switch`` sets ``spec.bundle`` to the staged revision (or to a given one), and
  ``rollback`` to the revision before: the one the owners left at the last switch
  (``status.previousBundle``), or, while a switch is pending or in flight, the committed
  one (``status.bundle``). Either has got there when ``status.bundle`` is the target with
  no transition in flight and every owner reports it, and failed when a transition to the
  target ended ``failed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .view import short


class Refused(Exception):
    """The command makes no sense for this model; the message says why and what to do."""


@dataclass(frozen=True)
class Revision:
    source: str
    digest: str


@dataclass(frozen=True)
class Progress:
    """How far a change got: ``done`` of ``total`` owners, and whether it ended."""
    done: int
    total: int
    finished: bool = False
    failure: str = ""   # set when it ended without getting there


def _spec(model: dict[str, Any]) -> dict[str, Any]:
    return model.get("spec") or {}


def _status(model: dict[str, Any]) -> dict[str, Any]:
    return model.get("status") or {}


def _revision(d: dict[str, Any] | None) -> Revision | None:
    return Revision(d.get("source") or "", d["digest"]) if d and d.get("digest") else None


def _guarded(model: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": model["metadata"]["resourceVersion"]}, "spec": spec}


def _condition(model: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in _status(model).get("conditions") or [] if c.get("type") == kind), {})


def stage_patch(model: dict[str, Any], target: Revision | None, preload: bool = False) -> dict[str, Any]:
    """``spec.stage`` set to ``target`` (``preload``: loaded beside the live revision too),
    or removed (None)."""
    if target is None and not _spec(model).get("stage"):
        raise Refused("nothing is staged (spec.stage is not set)")
    return _guarded(model, {"stage": None if target is None else
                            {"source": target.source, "digest": target.digest,
                             **({"preload": True} if preload else {})}})


def switch_target(model: dict[str, Any], given: Revision | None) -> Revision:
    """The revision ``switch`` moves to: ``given``, else the one in ``spec.stage``."""
    if given is not None:
        return given
    staged = _revision(_spec(model).get("stage"))
    if staged is None:
        raise Refused("no revision is staged (spec.stage): stage one first with `kubectl resident stage "
                      "MODEL --source SOURCE --digest DIGEST`, or pass --source and --digest")
    return staged


def rollback_target(model: dict[str, Any]) -> Revision:
    """The revision ``rollback`` moves back to (see the module's docstring)."""
    wanted, committed = _revision(_spec(model).get("bundle")), _revision(_status(model).get("bundle"))
    if committed is not None and wanted is not None and wanted.digest != committed.digest:
        return committed   # a switch is pending or in flight: back to what runs
    previous = _revision(_status(model).get("previousBundle"))
    if previous is None:
        raise Refused("no earlier revision is recorded (status.previousBundle is empty: the model has "
                      "not switched since it was created, or spec.transition.keepPrevious is off); "
                      "switch to one with `kubectl resident switch MODEL --source SOURCE --digest DIGEST`")
    return previous


def switch_patch(model: dict[str, Any], target: Revision, commit: str | None) -> dict[str, Any]:
    """``spec.bundle`` set to ``target`` (and ``spec.transition.commit`` when given)."""
    spec: dict[str, Any] = {"bundle": {"source": target.source, "digest": target.digest}}
    if commit:
        spec["transition"] = {"commit": commit}
    return _guarded(model, spec)


def already_on(model: dict[str, Any], target: Revision) -> bool:
    """The model wants and runs ``target`` already, with nothing in flight."""
    status = _status(model)
    return ((_spec(model).get("bundle") or {}).get("digest") == target.digest
            and (status.get("bundle") or {}).get("digest") == target.digest and not status.get("transition"))


def delivery_note(model: dict[str, Any], target: Revision) -> str:
    """What a switch to ``target`` will deliver, when it is not staged on every owner's
    node ("" when it is, or when it is the revision kept after the last switch)."""
    if (_status(model).get("previousBundle") or {}).get("digest") == target.digest:
        return ""
    got = staging_progress(model, target.digest)
    if got.total and got.finished and not got.failure:
        return ""
    if got.total:
        return (f"{short(target.digest)} is staged on {got.done}/{got.total} owners' nodes: the switch "
                "delivers it to the others")
    return f"{short(target.digest)} is not pre-staged: the switch delivers it"


def staging_progress(model: dict[str, Any], digest: str, preload: bool = False) -> Progress:
    """How far ``spec.stage`` = ``digest`` got: owners' nodes that hold it, of all; with
    ``preload``, whose owner has also loaded it beside the live revision, or said it cannot."""
    stage = _status(model).get("stage") or {}
    if stage.get("digest") != digest:
        return Progress(0, 0)
    nodes = stage.get("nodes") or []
    done = sum(1 for n in nodes if n.get("state") == "Live" or n.get("state") == "Staged" and (
        not preload or (n.get("preload") or {}).get("state") in ("loaded", "failed")))
    cond = _condition(model, "Staged")
    if cond.get("reason") == "StageFailed":
        return Progress(done, len(nodes), True, cond.get("message") or "StageFailed")
    return Progress(done, len(nodes), cond.get("status") == "True" and done == len(nodes) > 0)


def switch_progress(model: dict[str, Any], target: str, last_id_before: str | None) -> Progress:
    """How far a switch to ``target`` got: owners on it, of all; finished when committed,
    failed when a transition to it that ended after the command began says so."""
    status = _status(model)
    owners = status.get("owners") or []
    t = status.get("transition") or {}
    if t.get("to") == target:
        steps = t.get("owners") or []
        return Progress(sum(1 for o in steps if o.get("step") == "Done"), len(steps))
    on = sum(1 for o in owners if (o.get("identity") or {}).get("bundle") == target)
    last = status.get("lastTransition") or {}
    if last.get("id") != last_id_before and last.get("to") == target and last.get("result") == "failed":
        reason = f"{last.get('reason') or 'failed'}: {last.get('message') or ''}".rstrip(": ")
        return Progress(on, len(owners), True, f"the transition to {short(target)} failed: {reason}")
    committed = (status.get("bundle") or {}).get("digest") == target
    return Progress(on, len(owners), committed and not t and on == len(owners))
