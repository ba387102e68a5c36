"""A transition as a state machine, one owner at a time, with no side effects.

When ``spec.bundle`` names a new revision the operator plans once (which path, which
method, how many bytes) and then walks every owner through these steps:

``Waiting`` -> ``Delivering`` (a BundleDelivery stages the revision into the owner's live
volume; a revision pre-staged there is already staged, and Applying follows at once) ->
``Applying`` (the owner's ``POST /v1/transitions``) -> ``Verifying`` (the owner's
``/v1/identity`` names the target) -> ``Releasing`` (the old revision's BundleDelivery is
deleted, or kept pre-staged for a rollback; the bridge has pointed the volume's ``current``
at the target) -> ``Done``.

With ``commit: Lockstep`` every owner starts at once and stops before it changes anything:
``Delivering`` -> ``Preparing`` (the owner's transition is posted with ``commit: Deferred``:
it stages and verifies what it will apply and answers ``prepared``) -> ``Prepared``. When
every owner is Prepared the executor commits them all at once (the barrier) and each goes
on to ``Applying``. Until then any failure (an owner that cannot prepare, a delivery that
fails, an owner lost or not running, the timeout) aborts every owner: none commits.

An owner that is quarantined or unloaded, or whose Pod never started, goes to ``Replacing``:
a new Pod is created on the target revision. Any other failure ends the owner in ``Failed``
with a reason; the owner keeps (or the owner rolls back to) its old identity and no further
owners are started. At most ``maxUnavailable`` owners are between Waiting and Done at once.

:func:`advance` takes one owner's recorded progress and what was just observed about it
and returns the new progress plus the actions to perform. The executor
(``rollout.py``) performs them and records the result in ``status.transition``, so a
restarted operator resumes from the recorded step without repeating done work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .delivery import DeliveryObservation

BROKEN_STATES = ("quarantined", "unloaded")


class Step(str, Enum):
    waiting = "Waiting"
    delivering = "Delivering"
    preparing = "Preparing"     # Lockstep: the owner prepares (commit Deferred)
    prepared = "Prepared"       # Lockstep: waiting at the barrier
    applying = "Applying"
    verifying = "Verifying"
    releasing = "Releasing"
    replacing = "Replacing"
    done = "Done"
    failed = "Failed"


ACTIVE_STEPS = (Step.delivering, Step.preparing, Step.prepared, Step.applying, Step.verifying,
                Step.releasing, Step.replacing)
BEFORE_COMMIT = (Step.waiting, Step.delivering, Step.preparing, Step.prepared)


class Action(str, Enum):
    create_delivery = "CreateDelivery"
    start_owner_transition = "StartOwnerTransition"
    commit_owner_transition = "CommitOwnerTransition"
    abort_owner_transition = "AbortOwnerTransition"
    release_old_deliveries = "ReleaseOldDeliveries"
    release_target_delivery = "ReleaseTargetDelivery"
    replace_owner = "ReplaceOwner"


class _Camel(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        """Status read back may hold null where an empty value was written: use the default."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class Bytes(_Camel):
    fetched: int = 0
    reused: int = 0
    written: int = 0
    peers: int = 0      # of ``fetched``, what other nodes' bridges sent (peer delivery)


class OwnerProgress(_Camel):
    """One owner's progress through a transition (an item of ``status.transition.owners``)."""

    slot: int
    pod: str
    pod_uid: str = Field(alias="podUID")
    node: str = ""
    step: Step = Step.waiting
    delivery: str = ""
    owner_transition: str = Field(default="", alias="ownerTransition")
    replaced: bool = False
    prestaged: bool = False   # the target was staged ahead (spec.stage, a kept revision)
    started_at: float | None = Field(default=None, alias="startedAt")
    delivered_at: float | None = Field(default=None, alias="deliveredAt")
    applied_at: float | None = Field(default=None, alias="appliedAt")
    finished_at: float | None = Field(default=None, alias="finishedAt")
    method: str = ""
    strategy: str = ""
    bytes: Bytes = Bytes()
    first_token_seconds: float | None = Field(default=None, alias="firstTokenSeconds")
    committed_at: float | None = Field(default=None, alias="committedAt")   # the owner's wall clock
    first_token_at: float | None = Field(default=None, alias="firstTokenAt")   # the same clock
    # a reload prepared by loading the target beside the live revision (None: not a prepared reload)
    loaded_beside: bool | None = Field(default=None, alias="loadedBeside")
    preloaded: bool | None = None   # the reload swapped in the target its owner preloaded (spec.stage.preload)
    staging_seconds: float | None = Field(default=None, alias="stagingSeconds")  # the bridge's own
    owner_seconds: float | None = Field(default=None, alias="ownerSeconds")      # the owner's own
    reason: str = ""
    message: str = ""


class TransitionState(_Camel):
    """``status.transition``: the transition in flight (absent when none is)."""

    id: str
    from_digest: str = Field(alias="from")
    from_source: str = Field(default="", alias="fromSource")
    to: str
    to_source: str = Field(alias="toSource")
    strategy: str
    path: str
    method: str = ""
    predicted: dict[str, Any] = Field(default_factory=dict)
    generation: int = 0
    started_at: float = Field(alias="startedAt")
    # With other replicas serving, an owner counts as unavailable (maxUnavailable) until
    # kubelet has it Ready again, i.e. back in the Service's Endpoints.
    await_endpoints: bool = Field(default=False, alias="awaitEndpoints")
    commit: str = "Rolling"      # spec.transition.commit when planned
    committed: bool = False      # Lockstep: the barrier was passed (saved before any commit is sent)
    owners: list[OwnerProgress] = Field(default_factory=list)
    result: str = "running"
    reason: str = ""
    message: str = ""

    def dump(self) -> dict[str, Any]:
        """camelCase, without None or empty strings (see ``conditions`` on empty strings)."""
        return _without_empty(self.model_dump(mode="json", by_alias=True, exclude_none=True))


def _without_empty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_empty(v) for k, v in value.items() if v != ""}
    if isinstance(value, list):
        return [_without_empty(v) for v in value]
    return value


@dataclass(frozen=True)
class OwnerObservation:
    """What was seen of one owner in this pass. ``state`` is None when unreachable."""

    pod_exists: bool = True
    pod_uid: str = ""
    node: str = ""
    running: bool = False
    ready: bool = False
    state: str | None = None
    identity_bundle: str | None = None
    delivery: DeliveryObservation | None = None
    owner_transition: dict[str, Any] | None = None

    @property
    def broken(self) -> bool:
        return self.state in BROKEN_STATES


@dataclass
class Decision:
    progress: OwnerProgress
    actions: list[Action] = field(default_factory=list)


def _fail(p: OwnerProgress, now: float, reason: str, message: str) -> Decision:
    held = p.step in (Step.preparing, Step.prepared) and p.owner_transition   # prepared: let it go
    p = p.model_copy(update={"step": Step.failed, "reason": reason, "message": message,
                             "finished_at": now})
    return Decision(p, ([Action.abort_owner_transition] if held else []) + [Action.release_target_delivery])


def abort(p: OwnerProgress, now: float, why: str) -> Decision:
    """Lockstep: another owner failed before the barrier, so this one does not commit."""
    return _fail(p, now, ABORTED, f"owner {p.pod} did not commit: {why}")


ABORTED = "Aborted"


def _to(p: OwnerProgress, step: Step, **update: Any) -> OwnerProgress:
    return p.model_copy(update={"step": step, **update})


def advance(t: TransitionState, p: OwnerProgress, obs: OwnerObservation, *, now: float,
            timeout_seconds: float) -> Decision:
    """The next step of one owner, given what was just observed about it."""
    if p.step in (Step.done, Step.failed):
        return Decision(p)
    # an owner prepared at the barrier waits for the others: their timeouts end the switch
    if p.step not in (Step.waiting, Step.prepared) and p.started_at is not None \
            and now - p.started_at > timeout_seconds:
        retried = p.step == Step.delivering and p.reason == "DeliveryFailed"  # the bridge kept failing
        return _fail(p, now, p.reason if retried else "Timeout", f"owner {p.pod} did not finish step "
                     f"{p.step.value} within {timeout_seconds:.0f}s" + (f": {p.message}" if retried else ""))
    if t.commit == "Lockstep" and not t.committed and p.step in BEFORE_COMMIT and (
            not obs.pod_exists or obs.broken or (p.step != Step.waiting and not obs.running)):
        return _fail(p, now, "OwnerLost", f"owner {p.pod} is {obs.state or 'not running'} before the "
                     "lockstep commit; no owner commits")   # a replacement would switch alone
    if p.step in (Step.delivering, Step.applying, Step.verifying) and not obs.pod_exists:
        return Decision(_to(p, Step.replacing, reason="OwnerReplaced",
                            message=f"owner Pod {p.pod} disappeared during {p.step.value}"),
                        [Action.replace_owner])
    handler = _STEPS[p.step]
    return handler(t, p, obs, now)


def _waiting(t: TransitionState, p: OwnerProgress, obs: OwnerObservation, now: float) -> Decision:
    p = p.model_copy(update={"started_at": now})
    if obs.identity_bundle == t.to and obs.state == "ready":
        return Decision(_to(p, Step.done, finished_at=now, reason="AlreadyOnTarget"))
    if t.commit == "Lockstep" and (not obs.pod_exists or obs.broken or not obs.running or not obs.node):
        return _fail(p, now, "OwnerNotReady", f"owner {p.pod} is not running and ready, so it cannot "
                     "prepare; a lockstep switch needs every owner; no owner commits")
    if not obs.pod_exists or obs.broken or not obs.running or not obs.node:
        why = ("quarantined" if obs.state == "quarantined" else "unloaded" if obs.broken
               else "not running")
        return Decision(_to(p, Step.replacing, reason="OwnerReplaced",
                            message=f"owner {p.pod} is {why}; replacing it on the target"),
                        [Action.replace_owner])
    return Decision(_to(p, Step.delivering, node=obs.node), [Action.create_delivery])


def _delivering(t: TransitionState, p: OwnerProgress, obs: OwnerObservation, now: float) -> Decision:
    d = obs.delivery
    if d is None:
        return Decision(p, [Action.create_delivery])
    if not d.current and not d.staged:
        # the bridge has not answered this generation yet: a Failed status is an earlier
        # one's (a kept revision the switch just activated again), not this switch's
        return Decision(p)
    if d.failed or d.retrying:  # retrying: the bridge tries again, the model says why meanwhile
        why = f"delivery {p.delivery} failed: {d.reason or 'no reason'} {d.message}".strip()
        return (Decision(p.model_copy(update={"reason": "DeliveryFailed", "message": why}))
                if d.retrying else _fail(p, now, "DeliveryFailed", why))
    if d.staged:
        moved = Bytes() if p.prestaged else Bytes(fetched=d.fetched, reused=d.reused, written=d.written,
                                                          peers=d.peers)
        p = _to(p, Step.preparing if t.commit == "Lockstep" else Step.applying, delivered_at=now,
                method=d.method, reason="", message="",
                staging_seconds=None if p.prestaged else d.duration_seconds or None, bytes=moved)
        # The next step starts the owner's transition, as it does when it resumes: a start
        # whose save was lost (the API server went away) left the progress here, and the
        # owner already reloading or on the target must not be asked again (a no-op in-place
        # transition would then stand for the switch's reload).
        return _STEPS[p.step](t, p, obs, now)
    return Decision(p)


def _lost(p: OwnerProgress, obs: OwnerObservation, now: float) -> Decision:
    """The owner's record of its transition is missing: wait while the owner does not answer
    (until the timeout); an owner that answers and does not know it lost it."""
    if obs.state is None:
        return Decision(p)
    return _fail(p, now, "OwnerTransitionLost", f"owner {p.pod} no longer knows transition {p.owner_transition}")


def _preparing(t: TransitionState, p: OwnerProgress, obs: OwnerObservation, now: float) -> Decision:
    ot = obs.owner_transition
    if not p.owner_transition:
        return Decision(p, [Action.start_owner_transition] if obs.state == "ready" else [])
    if ot is None:
        return _lost(p, obs, now)
    result = ot.get("result")
    if result == "running":
        return Decision(p)
    if result == "prepared":
        return Decision(_to(p, Step.prepared))
    return _fail(p, now, "PrepareFailed", f"owner {p.pod} could not prepare {t.to}: "
                                          f"{ot.get('reason') or result}")


def _prepared(t: TransitionState, p: OwnerProgress, obs: OwnerObservation, now: float) -> Decision:
    if t.committed:   # past the barrier: the owner applies (a commit it missed is sent again there)
        return Decision(_to(p, Step.applying))
    return Decision(p)


def _applying(t: TransitionState, p: OwnerProgress, obs: OwnerObservation, now: float) -> Decision:
    if obs.broken:
        return Decision(_to(p, Step.replacing, reason="OwnerReplaced",
                            message=f"owner {p.pod} became {obs.state} while applying"),
                        [Action.replace_owner])
    ot = obs.owner_transition
    if not p.owner_transition:
        if obs.identity_bundle == t.to and obs.state == "ready":
            return Decision(_to(p, Step.verifying, applied_at=now))
        if obs.state in ("ready",):
            return Decision(p, [Action.start_owner_transition])
        return Decision(p)  # loading, transitioning or unreachable: not yet
    if ot is None:
        if obs.identity_bundle == t.to:
            return Decision(_to(p, Step.verifying, applied_at=now))
        return _lost(p, obs, now)
    result = ot.get("result")
    if result == "running":
        return Decision(p)
    if result == "prepared":   # Lockstep past the barrier: its commit was lost (a restart): again
        return Decision(p, [Action.commit_owner_transition])
    timings = ot.get("timings") or {}
    update = {"applied_at": now, "strategy": ot.get("strategy") or p.strategy,
              "first_token_seconds": timings.get("firstTokenSeconds"),
              "owner_seconds": timings.get("totalSeconds"), "committed_at": ot.get("committedAt"),
              "first_token_at": ot.get("firstTokenAt"), "loaded_beside": ot.get("loadedBeside"),
              "preloaded": ot.get("preloaded")}
    if result == "succeeded":
        return Decision(_to(p, Step.verifying, **update))
    if result == "needs-reload":
        return _fail(p, now, "InPlaceNotPossible",
                     f"owner {p.pod}: {ot.get('reason') or 'the change cannot be applied in place'}"
                     "; set spec.transition.strategy to Auto or Reload")
    return _fail(p, now, "OwnerTransitionFailed",
                 f"owner {p.pod} failed the transition: {ot.get('reason') or result}")


def _verifying(t: TransitionState, p: OwnerProgress, obs: OwnerObservation, now: float) -> Decision:
    if obs.broken:
        return Decision(_to(p, Step.replacing, reason="OwnerReplaced",
                            message=f"owner {p.pod} is {obs.state} after the transition"),
                        [Action.replace_owner])
    if obs.state == "ready":
        if obs.identity_bundle != t.to:
            return _fail(p, now, "IdentityMismatch",
                         f"owner {p.pod} reports bundle {obs.identity_bundle}, expected {t.to}")
        if obs.ready or not t.await_endpoints:
            return Decision(_to(p, Step.releasing), [Action.release_old_deliveries])
    return Decision(p)


def _releasing(t: TransitionState, p: OwnerProgress, obs: OwnerObservation, now: float) -> Decision:
    if obs.delivery is not None and not obs.delivery.settled and not obs.delivery.failed:
        return Decision(p)   # an activated pre-staged revision: the bridge moves `current` first
    return Decision(_to(p, Step.done, finished_at=now))


def _replacing(t: TransitionState, p: OwnerProgress, obs: OwnerObservation, now: float) -> Decision:
    if not p.replaced:
        return Decision(p, [Action.replace_owner])
    if obs.ready and obs.state == "ready" and obs.identity_bundle == t.to:
        return Decision(_to(p, Step.done, finished_at=now))
    return Decision(p)


_STEPS = {Step.waiting: _waiting, Step.delivering: _delivering, Step.preparing: _preparing,
          Step.prepared: _prepared, Step.applying: _applying,
          Step.verifying: _verifying, Step.releasing: _releasing, Step.replacing: _replacing}


def owners_to_start(t: TransitionState, max_unavailable: int) -> list[int]:
    """Slots of waiting owners that may start now; none once any owner has failed. Lockstep
    starts them all: preparing takes no owner out of service."""
    if any(o.step == Step.failed for o in t.owners):
        return []
    if t.commit == "Lockstep":
        return [o.slot for o in t.owners if o.step == Step.waiting]
    active = sum(1 for o in t.owners if o.step in ACTIVE_STEPS)
    room = max(0, max_unavailable - active)
    return [o.slot for o in t.owners if o.step == Step.waiting][:room]


def slots_in_hand(t: TransitionState) -> set[int]:
    """Slots whose owner Pods the transition creates and replaces itself: all but those done.
    A done owner lost before the transition ends is replaced like any other (on the target)."""
    return {o.slot for o in t.owners if o.step != Step.done}


def outcome(t: TransitionState) -> str:
    """``running`` while any owner is active (or may still start), else succeeded/failed."""
    if any(o.step in ACTIVE_STEPS for o in t.owners):
        return "running"
    if any(o.step == Step.failed for o in t.owners):
        return "failed"
    if any(o.step == Step.waiting for o in t.owners):
        return "running"
    return "succeeded"


def step_deadline(t: TransitionState | None, timeout_seconds: float) -> float | None:
    """The earliest time a running owner step of ``t`` times out; None when no step runs."""
    if t is None:
        return None
    running = [p.started_at + timeout_seconds for p in t.owners
               if p.started_at is not None and p.step in ACTIVE_STEPS]
    return min(running, default=None)


def at_barrier(t: TransitionState) -> bool:
    """Lockstep: every owner is prepared (or already on the target) and none has committed."""
    return (t.commit == "Lockstep" and not t.committed and any(o.step == Step.prepared for o in t.owners)
            and all(o.step in (Step.prepared, Step.done) for o in t.owners))


def must_abort(t: TransitionState) -> bool:
    """Lockstep: an owner failed before the barrier; the others must not commit."""
    return (t.commit == "Lockstep" and not t.committed and any(o.step == Step.failed for o in t.owners)
            and any(o.step in BEFORE_COMMIT for o in t.owners))


def first_failure(t: TransitionState) -> OwnerProgress | None:
    """The owner whose failure ended the transition (not one aborted because of it)."""
    failed = [o for o in t.owners if o.step == Step.failed]
    return next((o for o in failed if o.reason != ABORTED), failed[0] if failed else None)
