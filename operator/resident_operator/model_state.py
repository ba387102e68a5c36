"""The operator's durable memory of one model, kept in its ``status``, written safely.

Everything a restarted operator needs to continue lives in the ResidentModel's status,
never in process memory: the recorded children (``children``), the committed revision the
owners run (``bundle``), the incarnation counter of each owner slot (``incarnations``), the
transition in flight (``transition``), the one queued behind it (``pendingTransition``) and
the last finished one (``lastTransition``). :class:`ModelState` reads them once per pass
and writes each change to the API server immediately, so "record before depend" holds:
a child's UID is stored before the next step relies on it. Inside :meth:`ModelState.together`
the changes of one step (a child created and the progress that names it, or a pass's
children and the status it derived, :meth:`ModelState.report`) go out as one status write
when the step ends; a crash between the create and that write leaves a child labelled with
the model's UID that the next pass adopts (``owners.create_child``).

**Every write is conditional** on the model's ``resourceVersion`` this state was computed
from (a merge patch carrying ``metadata.resourceVersion``). Two operators can write the same
model at once (a leader handover, where the old leader has not yet stopped), and an
unconditional patch of ``children`` would silently drop the other one's record: its child
would then be swept as an orphan, or created a second time. On a 409 the state reads the
model again and :func:`rebase` replays what this write meant onto the fresh status:

- ``children``: the UIDs this pass recorded are added and those it forgot are removed,
  whatever the other writer recorded is kept (records are a set, merged by UID);
- ``incarnations``: per slot, the higher counter wins (a counter only ever moves on);
- what a pass derives (``conditions``, ``phase``, ``owners``...) is written as this pass
  saw it: the next pass derives it again;
- the progress fields (``bundle``, ``transition``, ``pendingTransition``,
  ``lastTransition``) are compare-and-set: written if the fresh value is still the one
  this pass started from, else another writer moved them and this pass's view is stale.
  The records still go out, then :class:`StatusSuperseded` ends the pass and the next one
  starts from the fresh status (what this pass did is found again by name and label, as
  after a crash).

After :data:`MAX_WRITE_ATTEMPTS` conflicts in a row it gives up: a Warning Event
``StatusWriteGaveUp`` on the model, a log line, and :class:`StatusWriteGaveUp` ends the pass
(the next pass reads everything fresh; a child created meanwhile is adopted by name or
label, as after a crash). docs/operator.md, "Safe status writes", says why this and not
server-side apply.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import kopf

from . import children as ch
from . import metrics, retry_policy
from .kube import StatusConflict
from .transition import TransitionState

log = logging.getLogger("resident.operator")
MAX_WRITE_ATTEMPTS = 5
RECORDS = ("children", "incarnations")   # merged with what another writer wrote
PROGRESS = ("bundle", "previousBundle", "transition", "pendingTransition",   # compare-and-set
            "lastTransition")


@dataclass
class StatusStore:
    """Where a model's status is read and written.

    ``write(patch, resource_version)`` merge-patches the status only if the model is still
    at ``resource_version`` and returns the model as written; it raises
    :class:`~.kube.StatusConflict` if not. ``read()`` returns the model now (None: gone).
    ``gave_up(message)`` tells the humans (an Event) that a write was abandoned."""

    write: Callable[[dict[str, Any], str | None], dict[str, Any]]
    read: Callable[[], dict[str, Any] | None]
    gave_up: Callable[[str], None] = lambda message: None


class StatusSuperseded(kopf.TemporaryError):
    """Another writer moved this model's progress: the pass ends and runs again fresh."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(f"another writer changed status {', '.join(keys)} meanwhile; "
                         "the next pass starts from it", delay=retry_policy.SUPERSEDED_SECONDS)
        self.keys = keys


class StatusWriteGaveUp(kopf.TemporaryError):
    """Every conditional write attempt met a newer model (see MAX_WRITE_ATTEMPTS)."""


def rebase(base: dict[str, Any], fresh: dict[str, Any], wanted: dict[str, Any]
           ) -> tuple[dict[str, Any], list[str]]:
    """The patch that applies to ``fresh`` what ``wanted`` meant to change in ``base``.

    ``base`` is the status the write was computed from, ``fresh`` the status another
    writer left, ``wanted`` the patch meant for ``base``. Returns the patch for ``fresh``
    and the progress keys dropped because another writer changed them (see the module
    docstring for the rule per key)."""
    patch: dict[str, Any] = {}
    superseded: list[str] = []
    for key, value in wanted.items():
        if key == "children":
            was = ch.recorded_uids(base.get("children"))
            now = ch.recorded_uids(value)
            out = [dict(c) for c in fresh.get("children") or [] if c.get("uid") not in was - now]
            for ref in value or []:
                if ref.get("uid") in now - was:
                    out = ch.record(out, ref)
            patch[key] = out
        elif key == "incarnations":
            merged = {k: int(v) for k, v in (fresh.get(key) or {}).items()}
            for slot, n in (value or {}).items():
                merged[slot] = max(int(n), merged.get(slot, 0))
            patch[key] = merged
        elif key not in PROGRESS:   # derived (conditions, owners, phase...): this pass's view
            patch[key] = value
        elif fresh.get(key) == base.get(key):
            patch[key] = value
        elif fresh.get(key) != value:    # already as wanted: nothing lost either way
            superseded.append(key)
    return patch, superseded


class ModelState:
    def __init__(self, status: dict[str, Any] | None, resource_version: str | None,
                 store: StatusStore) -> None:
        status = status or {}
        self._store = store
        self._held: dict[str, Any] | None = None
        self._base: dict[str, Any] = {k: status.get(k) for k in RECORDS + PROGRESS}
        self.resource_version = resource_version
        self.children: list[ch.Child] = [dict(c) for c in status.get("children") or []]
        self.bundle: dict[str, str] = dict(status.get("bundle") or {})
        self.previous: dict[str, str] | None = status.get("previousBundle") or None
        self.incarnations: dict[str, int] = {k: int(v) for k, v in (status.get("incarnations") or {}).items()}
        raw = status.get("transition")
        self.transition: TransitionState | None = TransitionState.model_validate(raw) if raw else None
        self.pending: dict[str, Any] | None = status.get("pendingTransition") or None
        self.last_transition: dict[str, Any] | None = status.get("lastTransition") or None

    def _patch(self, patch: dict[str, Any]) -> None:
        if self._held is None:
            self._write(patch)
        else:
            self._held.update(patch)

    @contextmanager
    def together(self) -> Iterator[None]:
        """Write the changes made inside as one status patch at the end (also on an error)."""
        if self._held is not None:
            yield
            return
        self._held = {}
        try:
            yield
        finally:
            held, self._held = self._held, None
            if held:
                self._write(held)

    # -- the conditional write -----------------------------------------------------
    def _write(self, wanted: dict[str, Any]) -> None:
        """Write ``wanted`` conditionally; on a conflict rebase it onto the model as it is
        now and try again, at most MAX_WRITE_ATTEMPTS times in all. The in-memory state
        follows the model as written; it is left alone between attempts, so a caller's
        hold on it (the transition being stepped) stays valid."""
        origin = self._base
        patch, superseded = dict(wanted), []
        fresh: dict[str, Any] = {}
        for attempt in range(1, MAX_WRITE_ATTEMPTS + 1):
            try:
                if patch:
                    written = self._store.write(patch, self.resource_version)
                else:   # every key was another writer's by now: nothing left to write
                    written = fresh
            except StatusConflict:
                metrics.STATUS_CONFLICTS.inc()
                fresh = self._store.read()
                if fresh is None:
                    raise kopf.TemporaryError("the model is gone",
                                              delay=retry_policy.STATUS_SECONDS) from None
                patch, superseded = rebase(origin, fresh.get("status") or {}, wanted)
                self.resource_version = fresh["metadata"].get("resourceVersion")
                continue
            self._adopt(written.get("status") or {}, written["metadata"].get("resourceVersion"),
                        keep=tuple(k for k in wanted if k not in superseded))
            if attempt > 1:
                log.info("status written after a conflict", extra={"attempts": attempt,
                                                                    "keys": sorted(wanted)})
            if superseded:
                raise StatusSuperseded(superseded)
            return
        message = (f"gave up writing status {', '.join(sorted(wanted))} after {MAX_WRITE_ATTEMPTS} "
                   "conflicts with other writers; the next pass starts again from the model as it is")
        log.warning(message)
        self._store.gave_up(message)
        raise StatusWriteGaveUp(message, delay=retry_policy.STATUS_SECONDS)

    def _adopt(self, status: dict[str, Any], resource_version: str | None,
               keep: tuple[str, ...] = ()) -> None:
        """Take ``status`` as the new base. The records always follow it (they are the
        union now); a progress key follows it unless this write just set it (``keep``:
        the in-memory value is the written one, and callers may hold it, e.g. the
        transition being stepped)."""
        self.resource_version = resource_version
        self._base = {k: status.get(k) for k in RECORDS + PROGRESS}
        self.children = [dict(c) for c in status.get("children") or []]
        self.incarnations = {k: int(v) for k, v in (status.get("incarnations") or {}).items()}
        if "bundle" not in keep:
            self.bundle = dict(status.get("bundle") or {})
        if "previousBundle" not in keep:
            self.previous = status.get("previousBundle") or None
        if "transition" not in keep:
            raw = status.get("transition")
            self.transition = TransitionState.model_validate(raw) if raw else None
        if "pendingTransition" not in keep:
            self.pending = status.get("pendingTransition") or None
        if "lastTransition" not in keep:
            self.last_transition = status.get("lastTransition") or None

    # -- what a pass derives ----------------------------------------------------------
    def report(self, fields: dict[str, Any]) -> None:
        """Write the status a pass derived (conditions, phase, owners...): with what the
        pass holds, if it holds anything, so a pass that created children writes once."""
        self._patch(fields)

    # -- children ------------------------------------------------------------------
    def record_child(self, obj: dict[str, Any]) -> None:
        self.children = ch.record(self.children, ch.child_ref(obj))
        self._patch({"children": self.children})

    def forget_child(self, uid: str) -> None:
        before = len(self.children)
        self.children = ch.forget(self.children, uid)
        if len(self.children) != before:
            self._patch({"children": self.children})

    # -- revision, slots -----------------------------------------------------------
    def commit_bundle(self, digest: str, source: str, keep_previous: bool | None = None) -> None:
        """The owners run ``digest`` now. After a switch, ``keep_previous`` says whether the
        revision they left is remembered (``previousBundle``) to stay staged for a rollback;
        None leaves ``previousBundle`` as it is (the same revision at a new source)."""
        patch: dict[str, Any] = {}
        if keep_previous is not None:
            left = self.bundle.get("digest") not in (None, digest)
            self.previous = dict(self.bundle) if keep_previous and left else None
            patch["previousBundle"] = self.previous
        self.bundle = {"digest": digest, "source": source}
        self._patch(dict(patch, bundle=self.bundle))

    def forget_previous(self) -> None:
        self.previous = None
        self._patch({"previousBundle": None})

    def incarnation(self, slot: int) -> int:
        return self.incarnations.get(str(slot), 0)

    def bump_incarnation(self, slot: int) -> int:
        self.incarnations[str(slot)] = self.incarnation(slot) + 1
        self._patch({"incarnations": dict(self.incarnations)})
        return self.incarnations[str(slot)]

    # -- transitions ---------------------------------------------------------------
    def save_transition(self) -> None:
        self._patch({"transition": self.transition.dump() if self.transition else None})

    def finish_transition(self, summary: dict[str, Any]) -> None:
        self.transition = None
        self.last_transition = summary
        self._patch({"transition": None, "lastTransition": summary})

    def set_pending(self, pending: dict[str, Any] | None) -> None:
        if pending != self.pending:
            self.pending = pending
            self._patch({"pendingTransition": pending})
